"""The kvcache client for asyncio, on grpc.aio: the same calls, values, errors, retries and
epoch fencing as the blocking Client and Session (client.py, session.py), each a coroutine.

    async with aio.Client() as client:             # waits for the daemon (connect_timeout)
        print((await client.lookup("default", tokens)).num_cached_tokens)
        async with await client.open_session("router") as session:
            sequence = await session.open_sequence("default", tokens)
        async for batch in client.watch_events():   # KV events, resumed across restarts
            ...

Requests and replies are built and read by the same code as the blocking client's
(_calls.py, _session_core.py); only the waiting differs. A session's keep-alive is a task on the
event loop that opened it, not a thread; its callbacks run on that loop.

Thread safety: use a Client and its sessions from the event loop that made them.
"""

import asyncio
from typing import (TYPE_CHECKING, Any, AsyncIterator, Callable, List, Optional, Sequence,
                    Tuple, TypeVar)

import grpc
import grpc.aio

from . import _calls, hashing
from ._calls import RetryPolicy, UnaryCall
from ._proto import kvcache_pb2
from ._session_core import (CLOSE_ON_EXIT_TIMEOUT, SessionCore, as_bytes_view, destination_of,
                            new_buffer_into)
from .client import ClientBase, TlsOptions, retry_budget, retry_failure
from .errors import KvCacheError, token_ids
from .events import RESUME_PAUSE, EventBatch, ResumePoint, WatchCursor
from .values import (AcquiredPages, Commit, CompatibilityManifest, Extension, Fork, GetInfo,
                     GotPages, ListedSession, LookupResult, OpenedSequence, PageHits,
                     PageReservation, PagesPut, PoolDescription, PoolInfo, PutResult, Stats)

if TYPE_CHECKING:
    from .mapped_pool import MappedPool

T = TypeVar("T")

__all__ = ["Client", "Session"]


class Client(ClientBase):
    """A grpc.aio channel to one daemon; the blocking Client's options and calls. Use it as an
    async context manager (which waits for the daemon), or call connect() and close()."""

    def __init__(self, target: Optional[str] = None, *, tls: Optional[TlsOptions] = None,
                 bearer_token: Optional[str] = None, allow_plaintext_token: bool = False,
                 connect_timeout: float = 5.0, rpc_timeout: float = 5.0,
                 wait_for_ready: bool = False, max_message_bytes: int = 16 << 20,
                 retry: RetryPolicy = RetryPolicy()) -> None:
        """As kvcache_client.Client, without the wait: connect() (or `async with`) waits."""
        super().__init__(grpc.aio, target, tls, bearer_token, allow_plaintext_token,
                         connect_timeout, rpc_timeout, wait_for_ready, max_message_bytes, retry)

    async def connect(self) -> "Client":
        """Waits up to connect_timeout for the daemon; UNAVAILABLE when it is not ready."""
        try:
            await asyncio.wait_for(self._channel.channel_ready(), self.connect_timeout)
        except asyncio.TimeoutError:
            raise self._settings.unreachable(self.connect_timeout) from None
        return self

    async def close(self) -> None:
        """Closes the channel; calls in flight fail CANCELLED."""
        self._closed = True
        await self._channel.close()

    async def __aenter__(self) -> "Client":
        try:
            return await self.connect()
        except BaseException:
            await self.close()
            raise

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    # --- plumbing shared with Session -----------------------------------------------------------

    async def _invoke(self, call: UnaryCall, request: Any = None,
                      timeout: Optional[float] = None) -> Any:
        """As Client._invoke: the reply, retried per the RetryPolicy; grpc.RpcError left to the
        caller."""
        method, request, timeout, deadline = self._call_arguments(call, request, timeout)
        try:
            return await self._start(call.name, method, request, timeout)
        except grpc.RpcError as error:
            remaining = retry_budget(self._retry, call, error, deadline)
            if remaining is None:
                raise
            first = error
        try:
            return await self._start(call.name, method, request, remaining, wait_for_ready=True)
        except grpc.RpcError as error:
            raise retry_failure(first, error) from None

    async def _unary(self, call: UnaryCall[T]) -> T:
        try:
            return call.parse(await self._invoke(call))
        except grpc.RpcError as error:
            raise KvCacheError.from_rpc_error(call.name, error) from None

    # --- read-only calls: idempotent, need no session -------------------------------------------

    async def ping(self) -> int:
        """The daemon's epoch (it changes with every daemon start)."""
        return await self._unary(_calls.ping())

    async def health(self, service: str = "") -> str:
        """As kvcache_client.Client.health."""
        try:
            return await self._unary(_calls.health(service))
        except KvCacheError as error:
            if error.code == grpc.StatusCode.NOT_FOUND:
                return "SERVICE_UNKNOWN"
            raise

    async def list_pools(self) -> List[PoolInfo]:
        """As kvcache_client.Client.list_pools."""
        return await self._unary(_calls.list_pools())

    async def describe_pool(self, pool: str) -> PoolDescription:
        """As kvcache_client.Client.describe_pool."""
        return await self._unary(_calls.describe_pool(pool))

    async def lookup(self, pool: str, tokens: Sequence[int], *, cache_salt: bytes = b"",
                     extra_keys: Optional[hashing.ExtraKeys] = None,
                     tenant: str = "",
                     manifest: Optional[CompatibilityManifest] = None,
                     restore_parts: Sequence[str] = ()) -> LookupResult:
        """As kvcache_client.Client.lookup."""
        return await self._unary(
            _calls.lookup(pool, tokens, cache_salt, extra_keys, tenant, manifest, restore_parts))

    async def stats(self, pool: str = "", *, tenant: str = "") -> Stats:
        """As kvcache_client.Client.stats."""
        return await self._unary(_calls.stats(pool, tenant))

    async def list_sessions(self, tenant: str = "") -> List[ListedSession]:
        """As kvcache_client.Client.list_sessions."""
        return await self._unary(_calls.list_sessions(tenant))

    async def watch_events(self, pool: str = "", *, tenant: str = "",
                           start: ResumePoint = ResumePoint(), resume: bool = True,
                           reconnect_timeout: float = 30.0) -> AsyncIterator[EventBatch]:
        """As kvcache_client.Client.watch_events, an async iterator."""
        cursor = WatchCursor(start, pool, tenant)
        while True:
            stream = self._start("WatchEvents", self.stub.WatchEvents, cursor.request(), None)
            with cursor.reading(stream, resume):
                async for response in stream:
                    yield cursor.advance(response)
            if not resume:
                return
            await asyncio.sleep(RESUME_PAUSE)
            try:
                await asyncio.wait_for(self._channel.channel_ready(), reconnect_timeout)
            except asyncio.TimeoutError:
                raise cursor.gone(reconnect_timeout) from None

    # --- sessions -------------------------------------------------------------------------------

    async def open_session(self, client_name: str = "python", *, ttl: float = 0.0,
                           on_epoch_change: Optional[Callable[[int, int], None]] = None,
                           on_session_lost: Optional[Callable[[KvCacheError], None]] = None,
                           manifest: Optional[CompatibilityManifest] = None) -> "Session":
        """As kvcache_client.Client.open_session; the keep-alive is a task on the running loop
        and the callbacks run on it."""
        response = await self._unary(_calls.open_session(client_name, ttl, manifest))
        return Session(self, response, on_epoch_change, on_session_lost)


class Session(SessionCore):
    """A lease, as kvcache_client.Session, for asyncio. Made by Client.open_session."""

    def __init__(self, client: Client, response: kvcache_pb2.OpenSessionResponse,
                 on_epoch_change: Optional[Callable[[int, int], None]],
                 on_session_lost: Optional[Callable[[KvCacheError], None]]) -> None:
        super().__init__(client, response, on_epoch_change, on_session_lost)
        self._client: Client = client
        self._keepalive = asyncio.get_running_loop().create_task(
            self._keep_alive_loop(), name=f"kvcache-keepalive-{self.id}")

    async def __aenter__(self) -> "Session":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """As Session.__exit__: closes best effort, with a short deadline."""
        await self._stop_keep_alive()
        if self._mark_closed():
            call = _calls.close_session()
            try:
                await self._client._invoke(call, self._stamp(call.request),
                                           min(self._client.rpc_timeout, CLOSE_ON_EXIT_TIMEOUT))
            except (grpc.RpcError, KvCacheError):
                pass  # the lease simply runs out

    async def close(self) -> int:
        """As kvcache_client.Session.close."""
        await self._stop_keep_alive()
        try:
            return await self._session_call(_calls.close_session())
        finally:
            self._mark_closed()

    async def open_sequence(self, pool: str, tokens: Sequence[int], *, cache_salt: bytes = b"",
                            extra_keys: Optional[hashing.ExtraKeys] = None,
                            max_load_ms: int = 0,
                            restore_parts: Sequence[str] = ()) -> OpenedSequence:
        """As kvcache_client.Session.open_sequence (not idempotent, never retried)."""
        return await self._session_call(_calls.open_sequence(pool, tokens, cache_salt,
                                                             extra_keys, max_load_ms,
                                                             restore_parts))

    async def extend(self, sequence_id: int, tokens: Sequence[int]) -> Extension:
        """As kvcache_client.Session.extend."""
        return await self._session_call(_calls.extend(sequence_id, tokens))

    async def commit(self, sequence_id: int, num_written_tokens: int,
                     part_masks: Optional[Sequence[int]] = None) -> Commit:
        """As kvcache_client.Session.commit."""
        return await self._session_call(_calls.commit(sequence_id, num_written_tokens,
                                                      part_masks))

    async def release(self, sequence_id: int) -> None:
        """As kvcache_client.Session.release."""
        await self._session_call(_calls.release(sequence_id))

    async def fork(self, sequence_id: int) -> Fork:
        """As kvcache_client.Session.fork."""
        return await self._session_call(_calls.fork(sequence_id))

    async def publish_rendezvous(self, key: str, value: bytes) -> None:
        """As kvcache_client.Session.publish_rendezvous."""
        await self._session_call(_calls.publish_rendezvous(key, value))

    async def await_rendezvous(self, key: str, timeout: float) -> bytes:
        """As kvcache_client.Session.await_rendezvous."""
        return await self._session_call(_calls.await_rendezvous(key, timeout), timeout)

    async def put_blocks(self, pool: str, tokens: Sequence[int], data: Any, *,
                         cache_salt: bytes = b"", extra_keys: Optional[hashing.ExtraKeys] = None,
                         first_block: int = 0, chunk_bytes: int = 1 << 20,
                         part_masks: Optional[Sequence[int]] = None) -> PutResult:
        """As kvcache_client.Session.put_blocks."""
        tokens = token_ids("put_blocks", tokens)
        view = as_bytes_view("put_blocks", data, writable=False)
        session = self._require_open("put_blocks")
        plan = self._put_plan(session, await self._pool_shape(pool), pool, tokens, view,
                              cache_salt, extra_keys, first_block, chunk_bytes, part_masks)
        try:
            response = await self._client._start("PutBlocks", self._client._put_blocks,
                                                 plan.messages(), plan.timeout)
        except grpc.RpcError as error:
            raise self._fenced_error("PutBlocks", error, session) from None
        self._check_epoch("PutBlocks", response.epoch, session)
        return plan.result(response)

    async def get_blocks_into(self, pool: str, tokens: Sequence[int], destination: Any, *,
                              cache_salt: bytes = b"",
                              extra_keys: Optional[hashing.ExtraKeys] = None,
                              max_chunk_bytes: int = 0,
                              restore_parts: Sequence[str] = ()) -> GetInfo:
        """As kvcache_client.Session.get_blocks_into."""
        view = as_bytes_view("get_blocks_into", destination, writable=True)
        return await self._read_blocks(pool, tokens, cache_salt, extra_keys, max_chunk_bytes,
                                       restore_parts, destination_of(view))

    async def get_blocks(self, pool: str, tokens: Sequence[int], *, cache_salt: bytes = b"",
                         extra_keys: Optional[hashing.ExtraKeys] = None,
                         max_chunk_bytes: int = 0,
                         restore_parts: Sequence[str] = ()) -> Tuple[GetInfo, bytearray]:
        """As kvcache_client.Session.get_blocks."""
        result: List[bytearray] = []
        info = await self._read_blocks(pool, tokens, cache_salt, extra_keys, max_chunk_bytes,
                                       restore_parts, new_buffer_into(result))
        return info, result[0] if result else bytearray()

    async def map_pool(self, pool: str) -> "MappedPool":
        """As kvcache_client.Session.map_pool (the mapping itself is local and synchronous)."""
        self._require_open("map_pool")
        return self._mapped_pool(await self._client.describe_pool(pool))

    # --- pages named by the engine's keys ---------------------------------------------------------

    async def exists_pages(self, pool: str, keys: Sequence[bytes], *,
                           parts: Sequence[str] = ()) -> PageHits:
        """As kvcache_client.Session.exists_pages."""
        return await self._session_call(_calls.exists_pages(pool, keys, parts))

    async def reserve_pages(self, pool: str, keys: Sequence[bytes], *,
                            part_masks: Optional[Sequence[int]] = None) -> PageReservation:
        """As kvcache_client.Session.reserve_pages."""
        return await self._session_call(_calls.reserve_pages(pool, keys, part_masks))

    async def commit_pages(self, reservation: PageReservation,
                           page_checksums: Sequence[int] = ()) -> PagesPut:
        """As kvcache_client.Session.commit_pages."""
        return await self._session_call(
            _calls.commit_pages(reservation.sequence_id, page_checksums))

    async def acquire_pages(self, pool: str, keys: Sequence[bytes], *,
                            parts: Sequence[str] = (), max_load_ms: int = 0) -> AcquiredPages:
        """As kvcache_client.Session.acquire_pages."""
        return await self._session_call(_calls.acquire_pages(pool, keys, parts, max_load_ms))

    async def put_pages(self, pool: str, keys: Sequence[bytes], pages: Any, *,
                        part_masks: Optional[Sequence[int]] = None) -> PagesPut:
        """As kvcache_client.Session.put_pages."""
        self._require_open("put_pages")
        call, timeout = self._put_pages_call(pool, keys, pages, part_masks,
                                             await self._pool_shape(pool))
        return await self._session_call(call, timeout)

    async def get_pages(self, pool: str, keys: Sequence[bytes], *, parts: Sequence[str] = (),
                        max_load_ms: int = 0) -> GotPages:
        """As kvcache_client.Session.get_pages."""
        call = _calls.get_pages(pool, keys, parts, max_load_ms)
        return await self._session_call(
            call, self._get_pages_timeout(keys, await self._pool_shape(pool)))

    async def pin_pages(self, pool: str, keys: Sequence[bytes], *, ttl: float,
                        priority: int = 0) -> int:
        """As kvcache_client.Session.pin_pages."""
        return await self._session_call(_calls.pin_pages(pool, keys, ttl, priority))

    async def write_pages(self, pool: str, keys: Sequence[bytes], sources: Sequence[Any], *,
                          part_masks: Optional[Sequence[int]] = None) -> PagesPut:
        """As kvcache_client.Session.write_pages (the copies run on the event loop's thread)."""
        mapped = await self._page_map(pool)
        plan = self._write_plan(await self._pool_info(pool), keys, sources, part_masks)
        reservation = await self.reserve_pages(pool, plan.keys,
                                               part_masks=plan.part_masks or None)
        try:
            checksums = plan.copy_into(mapped, reservation)
            return await self.commit_pages(reservation, checksums)
        except BaseException:
            await self._abandon(reservation.sequence_id)
            raise

    async def read_pages_into(self, pool: str, keys: Sequence[bytes],
                              destinations: Sequence[Any], *, parts: Sequence[str] = (),
                              max_load_ms: int = 0, verify: bool = True) -> AcquiredPages:
        """As kvcache_client.Session.read_pages_into."""
        mapped = await self._page_map(pool)
        listed, plan = self._read_plan(await self._pool_info(pool), keys, destinations, parts)
        pages = await self.acquire_pages(pool, listed, parts=parts, max_load_ms=max_load_ms)
        try:
            plan.copy_out(mapped, pages, verify)
        except BaseException:
            await self._abandon(pages.sequence_id)
            raise
        if pages.block_ids:
            await self.release(pages.sequence_id)
        else:  # nothing pinned: a daemon that opened no sequence for it may say NOT_FOUND
            await self._abandon(pages.sequence_id)
        return pages

    # --- internals ------------------------------------------------------------------------------

    async def _pool_info(self, pool: str) -> PoolInfo:
        return self._cached_pool(pool) or self._remember_pool(
            pool, await self._client.describe_pool(pool))

    async def _page_map(self, pool: str) -> "MappedPool":
        self._require_open("map_pool")
        return self._cached_page_map(pool) or self._remember_page_map(
            pool, await self._client.describe_pool(pool))

    async def _abandon(self, sequence_id: int) -> None:
        """As kvcache_client.Session._abandon."""
        try:
            await self.release(sequence_id)
        except KvCacheError:
            pass

    async def _session_call(self, call: UnaryCall, timeout: Optional[float] = None) -> Any:
        session = self._require_open(call.name)
        try:
            response = await self._client._invoke(call, self._stamp(call.request), timeout)
        except grpc.RpcError as error:
            raise self._fenced_error(call.name, error, session) from None
        return self._parsed(call, response, session)

    async def _pool_shape(self, pool: str) -> Tuple[int, int]:
        return self._cached_shape(pool) or self._remember_shape(
            pool, await self._client.describe_pool(pool))

    async def _read_blocks(self, pool: str, tokens: Sequence[int], cache_salt: bytes,
                           extra_keys: Optional[hashing.ExtraKeys], max_chunk_bytes: int,
                           restore_parts: Sequence[str],
                           on_header: Callable[[int], memoryview]) -> GetInfo:
        tokens = token_ids("get_blocks", tokens)
        session = self._require_open("get_blocks")
        reader, timeout = self._get_reader(session, await self._pool_shape(pool), pool,
                                           len(tokens), on_header)
        stream = self._client._start(
            "GetBlocks", self._client._get_blocks,
            self._get_request(pool, tokens, cache_salt, extra_keys, max_chunk_bytes,
                              restore_parts), timeout)
        with self._reading(stream, session):
            async for message in stream:
                self._read_message(reader, message, session)
        return reader.finish()

    async def _stop_keep_alive(self) -> None:
        self._keepalive.cancel()
        try:
            await self._keepalive
        except asyncio.CancelledError:
            pass

    async def _keep_alive_loop(self) -> None:
        call = _calls.keep_alive()
        request = self._stamp(call.request)
        method = self._client.stub.KeepAlive
        while True:
            await asyncio.sleep(self.keep_alive_period)
            response, error = None, None
            try:
                response = await self._client._start(call.name, method, request,
                                                     self._keep_alive_timeout())
                code = grpc.StatusCode.OK
            except KvCacheError:  # the client was closed under the session
                return
            except grpc.RpcError as rpc_error:
                code, error = rpc_error.code(), rpc_error
            if self._keep_alive_ends(code, response, error):
                return
