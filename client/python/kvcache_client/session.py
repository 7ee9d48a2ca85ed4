"""Session: one lease on the daemon, and every call made under it.

A session is opened by Client.open_session and kept alive by a background thread every ttl/3
until close() (or the end of its `with` block). Sequences (open_sequence, extend, commit,
release, fork), block bytes (put_blocks, get_blocks_into) and the pool mapping (map_pool) all
belong to a session: the daemon releases a session's sequences when its lease ends. So do pages
named by the engine's own keys (exists_pages, write_pages / read_pages_into on the daemon's node
through the session's own mapping, put_pages / get_pages from another node, and the steps
beneath: reserve_pages, commit_pages, acquire_pages, pin_pages).

Epoch fencing, as the C++ client (client/kv_cache_client.h): the session remembers the epoch of
the daemon that opened it and sends it with every request. A reply with another epoch, or the
daemon's FAILED_PRECONDITION for a request that carried it, means the daemon restarted: every
block id and sequence id from before is meaningless. The call then raises FAILED_PRECONDITION,
`epoch_changed` turns true, the pools mapped through the session are closed and
on_epoch_change runs once; open a new session and recompute. A lease found ended without
close() (the keep-alive's ABORTED, NOT_FOUND or FAILED_PRECONDITION, or a session call's
ABORTED) sets `lost`: the daemon has released the sequences.

Errors (KvCacheError): the daemon's codes unchanged, plus FAILED_PRECONDITION locally for a call
on a closed session; INVALID_ARGUMENT for bad input (tokens that are not uint32, a put of the
wrong size, a destination that is not a writable buffer, an empty batch of page keys or a key
over 64 bytes); OUT_OF_RANGE for a get_blocks_into destination too small; DATA_LOSS for received
bytes, or pages read from the pool, that fail their checksum.

Thread safety: thread-safe. Calls may come from several threads at once; close() must not be
called from a callback. aio.Session is the same session for asyncio.
"""

import threading
from typing import TYPE_CHECKING, Any, List, Optional, Sequence, Tuple

import grpc

from . import _calls, hashing
from ._calls import UnaryCall
from ._proto import kvcache_pb2
from ._session_core import (CLOSE_ON_EXIT_TIMEOUT, SessionCore, as_bytes_view, destination_of,
                            new_buffer_into)
from .client import Client
from .errors import KvCacheError, token_ids
from .values import (AcquiredPages, Commit, Extension, Fork, GetInfo, GotPages, OpenedSequence,
                     PageHits, PageReservation, PagesPut, PoolInfo, PutResult)

if TYPE_CHECKING:
    from .mapped_pool import MappedPool


class Session(SessionCore):
    """A lease; use it as a context manager, or call close(). Made by Client.open_session."""

    def __init__(self, client: Client, response: kvcache_pb2.OpenSessionResponse,
                 on_epoch_change: Any, on_session_lost: Any) -> None:
        super().__init__(client, response, on_epoch_change, on_session_lost)
        self._client: Client = client
        self._stop = threading.Event()
        self._keepalive_call: Optional[grpc.Future] = None
        self._keepalive = threading.Thread(target=self._keep_alive_loop,
                                           name=f"kvcache-keepalive-{self.id}", daemon=True)
        self._keepalive.start()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Closes the session, best effort (a short deadline, errors ignored): the daemon
        releases the sequences now instead of at the end of the lease."""
        self._stop_keep_alive()
        if self._mark_closed():
            call = _calls.close_session()
            try:
                self._client._invoke(call, self._stamp(call.request),
                                     min(self._client.rpc_timeout, CLOSE_ON_EXIT_TIMEOUT))
            except grpc.RpcError:
                pass  # the lease simply runs out

    def close(self) -> int:
        """Closes the session and releases its sequences; returns how many. Later calls raise
        FAILED_PRECONDITION locally. Idempotent on the daemon's side (a second close there is
        ABORTED)."""
        self._stop_keep_alive()
        try:
            return self._session_call(_calls.close_session())
        finally:
            self._mark_closed()  # closed or not, the user is done with it

    # --- sequences ------------------------------------------------------------------------------

    def open_sequence(self, pool: str, tokens: Sequence[int], *, cache_salt: bytes = b"",
                      extra_keys: Optional[hashing.ExtraKeys] = None,
                      max_load_ms: int = 0, restore_parts: Sequence[str] = ()) -> OpenedSequence:
        """Opens a sequence for a prompt: the longest verified cached prefix is acquired, the
        rest freshly allocated (at least one token is left to compute). Not idempotent.
        `max_load_ms`: how long loading the prefix from the pool's lower tiers may take (0: no
        bound); what does not come up in time is left to compute. `cached_tokens_by_tier` says
        where the cached tokens came from. INVALID_ARGUMENT for an empty prompt or an oversize
        salt; NOT_FOUND for an unknown pool; RESOURCE_EXHAUSTED when the pool has too few blocks
        or a quota would be passed. `restore_parts`: the pool's parts the caller restores, by
        name (empty: every part); the hit ends at the greatest block endpoint where each of them
        restores (DESIGN §13), the blocks after it are fresh, and `part_masks` tells each cached
        block's parts. INVALID_ARGUMENT for a part the pool lacks."""
        return self._session_call(_calls.open_sequence(pool, tokens, cache_salt, extra_keys,
                                                       max_load_ms, restore_parts))

    def extend(self, sequence_id: int, tokens: Sequence[int]) -> Extension:
        """Appends decoded tokens, allocating blocks as needed. Not idempotent."""
        return self._session_call(_calls.extend(sequence_id, tokens))

    def commit(self, sequence_id: int, num_written_tokens: int,
               part_masks: Optional[Sequence[int]] = None) -> Commit:
        """Declares the first `num_written_tokens` tokens' KV written; full blocks among them are
        published. REQUIRES: that KV is written (device work synchronized). Idempotent.
        `part_masks`: None (every block holds every part), or one per full block written from
        block 0, the parts written (bit i: the pool's part i), each holding every all-pages part.
        INVALID_ARGUMENT for a count past the sequence, or a bad mask or mask count (nothing is
        published)."""
        return self._session_call(_calls.commit(sequence_id, num_written_tokens, part_masks))

    def release(self, sequence_id: int) -> None:
        """Releases the sequence's blocks, tail first. A second call is NOT_FOUND."""
        self._session_call(_calls.release(sequence_id))

    def fork(self, sequence_id: int) -> Fork:
        """A new sequence sharing the parent's full blocks; the partial last block is copied."""
        return self._session_call(_calls.fork(sequence_id))

    # --- rendezvous -----------------------------------------------------------------------------

    def publish_rendezvous(self, key: str, value: bytes) -> None:
        """Stores `value` (at most 4 KiB) under `key` until this session ends. ALREADY_EXISTS when
        another session holds the key; INVALID_ARGUMENT for an empty or oversize key or value."""
        self._session_call(_calls.publish_rendezvous(key, value))

    def await_rendezvous(self, key: str, timeout: float) -> bytes:
        """The key's value as soon as it has one; DEADLINE_EXCEEDED after `timeout` seconds,
        CANCELLED when the client is closed meanwhile."""
        return self._session_call(_calls.await_rendezvous(key, timeout), timeout)

    # --- block bytes ----------------------------------------------------------------------------

    def put_blocks(self, pool: str, tokens: Sequence[int], data: Any, *,
                   cache_salt: bytes = b"", extra_keys: Optional[hashing.ExtraKeys] = None,
                   first_block: int = 0, chunk_bytes: int = 1 << 20,
                   part_masks: Optional[Sequence[int]] = None) -> PutResult:
        """Stores the KV of `tokens`' full blocks [first_block, len(tokens) // block_size):
        `data` is their bytes concatenated in order (bytes, bytearray, memoryview or a
        C-contiguous numpy array; INVALID_ARGUMENT locally for another size), sent after each
        block's XXH3-64 in messages of at most `chunk_bytes`. The daemon publishes the blocks
        only once every byte arrived and matched (DATA_LOSS otherwise): a failed put stores
        nothing. Blocks already cached are kept. Idempotent (but not retried: the bytes are not
        kept for a second try). FAILED_PRECONDITION when first_block > 0 and the daemon does not
        hold the blocks before it. `part_masks`: as commit's, one per full block of `tokens` from
        block 0 (also when first_block > 0), the parts each block's bytes hold; None: every part.
        INVALID_ARGUMENT for a bad mask or count (nothing is published)."""
        tokens = token_ids("put_blocks", tokens)
        view = as_bytes_view("put_blocks", data, writable=False)
        session = self._require_open("put_blocks")
        plan = self._put_plan(session, self._pool_shape(pool), pool, tokens, view, cache_salt,
                              extra_keys, first_block, chunk_bytes, part_masks)
        try:
            response = self._client._put_blocks_stream(plan.messages(), plan.timeout)
        except grpc.RpcError as error:
            raise self._fenced_error("PutBlocks", error, session) from None
        self._check_epoch("PutBlocks", response.epoch, session)
        return plan.result(response)

    def get_blocks_into(self, pool: str, tokens: Sequence[int], destination: Any, *,
                        cache_salt: bytes = b"", extra_keys: Optional[hashing.ExtraKeys] = None,
                        max_chunk_bytes: int = 0, restore_parts: Sequence[str] = ()) -> GetInfo:
        """Writes the bytes of the longest cached full-block prefix of `tokens` into
        `destination` (a writable buffer: bytearray, memoryview, numpy array, a mapped pool's
        block...), each block verified against the daemon's checksum (DATA_LOSS on a mismatch or
        a stream that ends early). The bytes are copied once, from what gRPC received into the
        destination. OUT_OF_RANGE, and the stream is cancelled, when the daemon has more cached
        blocks than `destination` holds; its contents are unspecified after an error.
        `max_chunk_bytes` of 0 asks for 256 KiB messages (GET_CHUNK_BYTES). Read-only.
        `restore_parts`: as open_sequence's; the prefix ends where the hit rule ends it, and the
        result's `part_masks` tells each block's parts."""
        view = as_bytes_view("get_blocks_into", destination, writable=True)
        return self._read_blocks(pool, tokens, cache_salt, extra_keys, max_chunk_bytes,
                                 restore_parts, destination_of(view))

    def get_blocks(self, pool: str, tokens: Sequence[int], *, cache_salt: bytes = b"",
                   extra_keys: Optional[hashing.ExtraKeys] = None,
                   max_chunk_bytes: int = 0,
                   restore_parts: Sequence[str] = ()) -> Tuple[GetInfo, bytearray]:
        """Same as get_blocks_into, into a new bytearray of exactly the cached blocks' bytes."""
        result: List[bytearray] = []
        info = self._read_blocks(pool, tokens, cache_salt, extra_keys, max_chunk_bytes,
                                 restore_parts, new_buffer_into(result))
        return info, result[0] if result else bytearray()

    def map_pool(self, pool: str) -> "MappedPool":
        """Maps `pool`'s memory into this process (a worker on the daemon's node): see
        MappedPool. The mapping is closed when this session sees a daemon restart."""
        self._require_open("map_pool")
        return self._mapped_pool(self._client.describe_pool(pool))

    # --- pages named by the engine's keys ---------------------------------------------------------

    def exists_pages(self, pool: str, keys: Sequence[bytes], *,
                     parts: Sequence[str] = ()) -> PageHits:
        """How many leading `keys` are restorable under the hit rule (kvcache.proto, ExistsPages)
        for the `parts` asked (empty: every part), and from which tier; acquires nothing. A key
        is 1 to 64 bytes, a batch 1 to 4096 keys in prefix order (INVALID_ARGUMENT locally
        otherwise; the daemon's for an unknown part). Pages live in the namespace of the tenant
        and the session's compatibility manifest: every page call of a session opened without
        one is FAILED_PRECONDITION. Read-only."""
        return self._session_call(_calls.exists_pages(pool, keys, parts))

    def reserve_pages(self, pool: str, keys: Sequence[bytes], *,
                      part_masks: Optional[Sequence[int]] = None) -> PageReservation:
        """Blocks to write the pages of `keys` into (through map_pool; write_pages does it all),
        None for a key present already. `part_masks`: per key the parts its page carries (bit
        i: PoolInfo.parts[i], see PoolInfo.part_mask); None: every part. Publish with
        commit_pages, abandon with release(reservation.sequence_id). Not idempotent.
        RESOURCE_EXHAUSTED when the pool has too few free blocks."""
        return self._session_call(_calls.reserve_pages(pool, keys, part_masks))

    def commit_pages(self, reservation: PageReservation,
                     page_checksums: Sequence[int] = ()) -> PagesPut:
        """Checksums and publishes the reserved pages, each with all its parts or not at all.
        `page_checksums`: XXH3-64 of each written page (the reservation's non-duplicates, in
        order), taken as they were written; empty: the daemon reads the pages back for them.
        REQUIRES: their bytes are written. Not retried: a second commit finds the reservation
        gone."""
        return self._session_call(_calls.commit_pages(reservation.sequence_id, page_checksums))

    def acquire_pages(self, pool: str, keys: Sequence[bytes], *, parts: Sequence[str] = (),
                      max_load_ms: int = 0) -> AcquiredPages:
        """Pins the pages the hit rule gives (loading them up from the lower tiers within
        `max_load_ms`, 0: no bound) and says which blocks hold them; read them through
        map_pool (read_pages_into does it all), then release(acquired.sequence_id). Not
        idempotent."""
        return self._session_call(_calls.acquire_pages(pool, keys, parts, max_load_ms))

    def put_pages(self, pool: str, keys: Sequence[bytes], pages: Any, *,
                  part_masks: Optional[Sequence[int]] = None) -> PagesPut:
        """Stores pages from another node, bytes over gRPC: `pages` is one buffer per key of
        exactly block_bytes, or one buffer of len(keys) * block_bytes (INVALID_ARGUMENT locally
        otherwise). Each page's XXH3-64 goes with it; the daemon publishes nothing unless every
        page matches (DATA_LOSS). The bytes of parts a page's mask leaves out are ignored. The
        request is bounded by the channel's max_message_bytes (RESOURCE_EXHAUSTED): split big
        batches. Idempotent (present pages count as duplicates)."""
        self._require_open("put_pages")
        call, timeout = self._put_pages_call(pool, keys, pages, part_masks,
                                             self._pool_shape(pool))
        return self._session_call(call, timeout)

    def get_pages(self, pool: str, keys: Sequence[bytes], *, parts: Sequence[str] = (),
                  max_load_ms: int = 0) -> GotPages:
        """The pages the hit rule gives, as whole pages over gRPC (another node), each verified
        against the daemon's checksum (DATA_LOSS naming the page). Read-only."""
        call = _calls.get_pages(pool, keys, parts, max_load_ms)
        return self._session_call(call, self._get_pages_timeout(keys, self._pool_shape(pool)))

    def pin_pages(self, pool: str, keys: Sequence[bytes], *, ttl: float,
                  priority: int = 0) -> int:
        """Keeps the present leading pages resident for `ttl` seconds, at most a day (0: only
        touches them, most recently used), held by this session; returns how many. Each call is
        a hold of its own: a page pinned twice is held until the later TTL. `priority` (0 to
        7): when the tenant's quota refuses the pin, the tenant's pins of lower priority are
        released to make room, the lowest first (RESOURCE_EXHAUSTED when none is left)."""
        return self._session_call(_calls.pin_pages(pool, keys, ttl, priority))

    def write_pages(self, pool: str, keys: Sequence[bytes], sources: Sequence[Any], *,
                    part_masks: Optional[Sequence[int]] = None) -> PagesPut:
        """Stores pages on the daemon's node through the mapped pool: reserves, copies each
        non-duplicate page's source into its block (one copy), commits. A source is a whole
        page (a buffer or tensor of block_bytes) or a dict {part name: that part's bytes};
        with dicts and no part_masks a page carries the parts its dict names. Everything is
        checked before the reserve (INVALID_ARGUMENT); any failure after it releases the
        reservation, so nothing is published and nothing is held."""
        mapped = self._page_map(pool)
        plan = self._write_plan(self._pool_info(pool), keys, sources, part_masks)
        reservation = self.reserve_pages(pool, plan.keys, part_masks=plan.part_masks or None)
        try:
            checksums = plan.copy_into(mapped, reservation)
            return self.commit_pages(reservation, checksums)
        except BaseException:
            self._abandon(reservation.sequence_id)
            raise

    def read_pages_into(self, pool: str, keys: Sequence[bytes], destinations: Sequence[Any],
                        *, parts: Sequence[str] = (), max_load_ms: int = 0,
                        verify: bool = True) -> AcquiredPages:
        """Reads the pages the hit rule gives through the mapped pool: acquires them, copies
        each page's asked parts into destinations[i] (one copy), releases them. A destination
        is a writable buffer or tensor (the whole page when `parts` is empty, else the asked
        parts one after another) or a dict {part name: buffer}; one per key, only the first
        len(result.block_ids) are written, and a part a page does not hold leaves its
        destination untouched. `verify` checks each page's checksum in the pool first
        (DATA_LOSS naming the page)."""
        mapped = self._page_map(pool)
        listed, plan = self._read_plan(self._pool_info(pool), keys, destinations, parts)
        pages = self.acquire_pages(pool, listed, parts=parts, max_load_ms=max_load_ms)
        try:
            plan.copy_out(mapped, pages, verify)
        except BaseException:
            self._abandon(pages.sequence_id)
            raise
        if pages.block_ids:
            self.release(pages.sequence_id)
        else:  # nothing pinned: a daemon that opened no sequence for it may say NOT_FOUND
            self._abandon(pages.sequence_id)
        return pages

    # --- internals ------------------------------------------------------------------------------

    def _pool_info(self, pool: str) -> PoolInfo:
        """`pool` as described once per session (one epoch)."""
        return self._cached_pool(pool) or self._remember_pool(
            pool, self._client.describe_pool(pool))

    def _page_map(self, pool: str) -> "MappedPool":
        """The session's mapping of `pool` for pages, made on first use."""
        self._require_open("map_pool")
        return self._cached_page_map(pool) or self._remember_page_map(
            pool, self._client.describe_pool(pool))

    def _abandon(self, sequence_id: int) -> None:
        """Releases a reservation or acquisition on the way out of a failed call; its own
        failure (the lease gone, the daemon down) must not hide the first."""
        try:
            self.release(sequence_id)
        except KvCacheError:
            pass

    def _session_call(self, call: UnaryCall, timeout: Optional[float] = None) -> Any:
        """A unary call that carries the session, fenced on its epoch; its parsed reply."""
        session = self._require_open(call.name)
        try:
            response = self._client._invoke(call, self._stamp(call.request), timeout)
        except grpc.RpcError as error:
            raise self._fenced_error(call.name, error, session) from None
        return self._parsed(call, response, session)

    def _pool_shape(self, pool: str) -> Tuple[int, int]:
        """(block_size, block_bytes) of `pool`, described once per session (one epoch)."""
        return self._cached_shape(pool) or self._remember_shape(
            pool, self._client.describe_pool(pool))

    def _read_blocks(self, pool: str, tokens: Sequence[int], cache_salt: bytes,
                     extra_keys: Optional[hashing.ExtraKeys], max_chunk_bytes: int,
                     restore_parts: Sequence[str], on_header: Any) -> GetInfo:
        """The GetBlocks stream: `on_header(total)` returns where the bytes go (or raises)."""
        tokens = token_ids("get_blocks", tokens)
        session = self._require_open("get_blocks")
        reader, timeout = self._get_reader(session, self._pool_shape(pool), pool, len(tokens),
                                           on_header)
        stream = self._client._get_blocks_stream(
            self._get_request(pool, tokens, cache_salt, extra_keys, max_chunk_bytes,
                              restore_parts), timeout)
        with self._reading(stream, session):
            for message in stream:
                self._read_message(reader, message, session)
        return reader.finish()

    def _stop_keep_alive(self) -> None:
        with self._lock:
            self._stop.set()
            if self._keepalive_call is not None:
                self._keepalive_call.cancel()
        if self._keepalive is not threading.current_thread():
            self._keepalive.join()

    def _keep_alive_loop(self) -> None:
        call = _calls.keep_alive()
        request = self._stamp(call.request)
        while not self._stop.wait(self.keep_alive_period):
            with self._lock:
                if self._stop.is_set():
                    return
                try:
                    future = self._client._future(call, request, self._keep_alive_timeout())
                except KvCacheError:  # the client was closed under the session
                    return
                self._keepalive_call = future
            response, error = None, None
            try:
                response = future.result()
                code = grpc.StatusCode.OK
            except grpc.FutureCancelledError:
                return
            except grpc.RpcError as rpc_error:
                code, error = rpc_error.code(), rpc_error
            finally:
                with self._lock:
                    self._keepalive_call = None
            if self._stop.is_set() or self._keep_alive_ends(code, response, error):
                return
