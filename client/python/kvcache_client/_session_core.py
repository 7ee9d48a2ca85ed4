"""What a session is apart from how it waits: its lease state, epoch fencing, the block streams'
messages and checks. session.Session (threads) and aio.Session (asyncio) share it and add only
the calls themselves.

Thread safety: the state is guarded by a lock held only briefly, never across a call, so the
asyncio session may use it from its event loop as well.
"""

import contextlib
import threading
import weakref
from typing import (TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence,
                    Tuple)

import grpc

from . import _calls, _pages, hashing
from ._calls import UnaryCall
from ._proto import kvcache_pb2
from .block_stream import BlockVerifier, GetMessage, block_checksums, put_data_message
from .errors import KvCacheError, epoch_from_trailers, invalid_argument, make_request
from .values import GetInfo, PoolDescription, PoolInfo, PutResult, fill_extra_keys

if TYPE_CHECKING:
    from .mapped_pool import MappedPool

_BYTES_PER_EXTRA_SECOND = 64 << 20  # a stream's deadline grows 1 s per this many bytes moved
_MESSAGE_OVERHEAD = 1024  # room for a data message's framing within max_message_bytes
_MIN_CHUNK_BYTES = 4096
# What gets ask the daemon for unless told (its own default is 1 MiB). Each message is copied
# from gRPC into a bytes object, then into the destination and hashed: a message that stays in
# the CPU's cache through the three costs a quarter less client CPU per byte than 1 MiB ones
# (bench/python_client_bench.py; 128 KiB gains little more).
GET_CHUNK_BYTES = 256 << 10
CLOSE_ON_EXIT_TIMEOUT = 1.0  # leaving a `with` block must not hold up for a full rpc_timeout

SessionKey = Tuple[int, int]  # (session id, epoch) a call was made under


def as_bytes_view(call: str, data: Any, writable: bool) -> memoryview:
    """`data` (bytes, bytearray, memoryview, a numpy array, anything with the buffer protocol)
    as a flat view of its bytes; INVALID_ARGUMENT when it is none, not contiguous, or (for a
    destination) read-only."""
    try:
        view = memoryview(data)
    except TypeError:
        raise invalid_argument(f"{call}: expected a buffer (bytes, bytearray, memoryview, numpy "
                               f"array), got {type(data).__name__}") from None
    if writable and view.readonly:
        raise invalid_argument(f"{call}: the destination is read-only")
    if not view.c_contiguous:
        raise invalid_argument(f"{call}: the buffer must be C-contiguous")
    return view.cast("B") if view.format != "B" or view.ndim != 1 else view


class PutPlan:
    """A PutBlocks stream ready to send: its messages (the header, then the bytes in chunks),
    its deadline, and how to read the reply."""

    def __init__(self, header: bytes, view: memoryview, chunk: int, timeout: float) -> None:
        self.timeout = timeout
        self._header = header
        self._view = view
        self._chunk = chunk

    def messages(self) -> Iterator[bytes]:
        yield self._header
        for start in range(0, len(self._view), self._chunk):
            yield put_data_message(self._view[start:start + self._chunk])

    @staticmethod
    def result(response: kvcache_pb2.PutBlocksResponse) -> PutResult:
        return PutResult(num_blocks=response.num_blocks,
                         num_already_cached=response.num_already_cached,
                         num_stored=response.num_stored)


class GetBlocksReader:
    """Reads one GetBlocks stream message by message: checks the header against the request,
    asks `on_header(total_bytes)` where the bytes go, verifies each block's checksum as its
    bytes arrive. Raises KvCacheError (INTERNAL for a daemon that breaks the protocol,
    DATA_LOSS for bytes that fail their checksum). The epoch of each message is the session's
    to check (SessionCore._read_message)."""

    def __init__(self, pool: str, max_blocks: int, block_size: int,
                 block_bytes: int, on_header: Callable[[int], memoryview]) -> None:
        self._pool = pool
        self._max_blocks = max_blocks
        self._block_size = block_size
        self._block_bytes = block_bytes
        self._on_header = on_header
        self._verifier: Optional[BlockVerifier] = None
        self.info = GetInfo(num_blocks=0, num_cached_tokens=0, block_bytes=block_bytes)

    def feed(self, message: GetMessage) -> None:
        if message.header is not None:
            self._start(message)
        elif self._verifier is None:
            raise KvCacheError(grpc.StatusCode.INTERNAL,
                               "GetBlocks: data from the daemon before its header")
        elif message.data is not None:
            verifier = self._verifier
            if len(message.data) > verifier.expected_bytes - verifier.received_bytes:
                raise KvCacheError(grpc.StatusCode.INTERNAL,
                                   f"GetBlocks: the daemon sent more than the "
                                   f"{verifier.expected_bytes} bytes announced")
            try:
                verifier.feed(message.data)
            except KvCacheError as error:
                raise KvCacheError(error.code, f"GetBlocks from pool '{self._pool}': "
                                   f"{error.message}") from None

    def _start(self, message: GetMessage) -> None:
        header = message.header
        assert header is not None
        if self._verifier is not None or message.data is not None:
            raise KvCacheError(grpc.StatusCode.INTERNAL, "GetBlocks: the daemon's stream must "
                               "carry one header, first, alone")
        if (header.num_blocks > self._max_blocks
                or len(header.block_checksums) != header.num_blocks
                or len(header.part_masks) not in (0, header.num_blocks)
                or header.num_cached_tokens != header.num_blocks * self._block_size
                or (header.num_blocks > 0 and header.block_bytes != self._block_bytes)):
            raise KvCacheError(grpc.StatusCode.INTERNAL,
                               f"GetBlocks: inconsistent header from the daemon: {header} for a "
                               f"prompt of at most {self._max_blocks} full blocks of "
                               f"{self._block_bytes} bytes")
        self.info = GetInfo(num_blocks=header.num_blocks,
                            num_cached_tokens=header.num_cached_tokens,
                            block_bytes=self._block_bytes,
                            part_masks=list(header.part_masks))
        destination = self._on_header(header.num_blocks * self._block_bytes)

        def sink(offset: int, piece: memoryview) -> None:
            destination[offset:offset + len(piece)] = piece

        self._verifier = BlockVerifier(self._block_bytes, header.block_checksums, sink)

    def finish(self) -> GetInfo:
        """The stream ended: DATA_LOSS unless every announced byte arrived."""
        if self._verifier is None:
            raise KvCacheError(grpc.StatusCode.DATA_LOSS,
                               "GetBlocks: the stream ended before its header")
        if self._verifier.received_bytes != self._verifier.expected_bytes:
            raise KvCacheError(grpc.StatusCode.DATA_LOSS,
                               f"GetBlocks: the stream ended after "
                               f"{self._verifier.received_bytes} of "
                               f"{self._verifier.expected_bytes} bytes")
        return self.info


def destination_of(view: memoryview) -> Callable[[int], memoryview]:
    """get_blocks_into's on_header: `view`, OUT_OF_RANGE when the cached blocks do not fit."""
    def into_destination(total: int) -> memoryview:
        if total > len(view):
            raise KvCacheError(grpc.StatusCode.OUT_OF_RANGE,
                               f"get_blocks_into: the daemon has {total} bytes of cached "
                               f"blocks for the prompt, the destination holds {len(view)}")
        return view
    return into_destination


def new_buffer_into(result: List[bytearray]) -> Callable[[int], memoryview]:
    """get_blocks' on_header: a new bytearray of exactly the cached bytes, kept in `result`."""
    def new_buffer(total: int) -> memoryview:
        result.append(bytearray(total))
        return memoryview(result[0])
    return new_buffer


class SessionCore:
    """The state and checks of one lease, with no I/O. `client` is a Client or aio.Client (its
    rpc_timeout and max_message_bytes size the streams)."""

    def __init__(self, client: Any, response: kvcache_pb2.OpenSessionResponse,
                 on_epoch_change: Optional[Callable[[int, int], None]],
                 on_session_lost: Optional[Callable[[KvCacheError], None]]) -> None:
        self._client = client
        self._on_epoch_change = on_epoch_change
        self._on_session_lost = on_session_lost
        self.id: int = response.session_id
        self.epoch: int = response.epoch
        self.ttl: float = response.ttl_ms / 1000  # as granted
        self._lock = threading.Lock()
        self._open = True  # not closed by the user
        self._epoch_changed = False
        self._lost = False
        self._pools: Dict[str, PoolInfo] = {}  # described once per session (one epoch)
        self._page_maps: Dict[str, "MappedPool"] = {}  # write_pages' and read_pages_into's
        self._mapped: "weakref.WeakSet[MappedPool]" = weakref.WeakSet()  # closed on a restart

    @property
    def keep_alive_period(self) -> float:
        # ttl/3 leaves two more tries before the lease ends if one keep-alive is lost or late.
        return max(self.ttl / 3, 0.001)

    @property
    def epoch_changed(self) -> bool:
        """True once a daemon restart was detected; the session is then unusable."""
        with self._lock:
            return self._epoch_changed

    @property
    def lost(self) -> bool:
        """True once the lease was found ended without close(): its sequences are gone."""
        with self._lock:
            return self._lost

    # --- calls ------------------------------------------------------------------------------------

    def _stamp(self, request: Any) -> Any:
        request.session_id = self.id
        request.epoch = self.epoch
        return request

    def _require_open(self, call: str) -> SessionKey:
        with self._lock:
            if not self._open:
                raise KvCacheError(grpc.StatusCode.FAILED_PRECONDITION,
                                   f"{call} needs an open session: this one is closed")
        return self.id, self.epoch

    def _mark_closed(self) -> bool:
        """Marks the session closed by the user; whether it was still usable (worth a
        CloseSession). The session's own page mappings are unmapped: nothing outside holds
        them, and a pool's mapping is as large as the pool."""
        with self._lock:
            usable = self._open and not self._epoch_changed and not self._lost
            self._open = False
            page_maps, self._page_maps = list(self._page_maps.values()), {}
        for mapped in page_maps:
            mapped.close()
        return usable

    def _parsed(self, call: UnaryCall, response: Any, session: SessionKey) -> Any:
        self._check_epoch(call.name, response.epoch, session)
        return call.parse(response)

    def _fenced_error(self, name: str, error: grpc.RpcError, session: SessionKey
                      ) -> KvCacheError:
        """The error of a call that carried the session, noting a restart (FAILED_PRECONDITION
        from a daemon of another epoch) or a lost lease (ABORTED) on the way."""
        failure = KvCacheError.from_rpc_error(name, error)
        if failure.code == grpc.StatusCode.FAILED_PRECONDITION:
            # A reply stamped with the session's own epoch failed for another reason (a put
            # skipping uncached blocks); streams' errors carry no stamp and count as a restart.
            new_epoch = epoch_from_trailers(error)
            if new_epoch != session[1]:
                self._note_epoch_change(new_epoch)
        elif failure.code == grpc.StatusCode.ABORTED:
            self._note_lost(failure)
        return failure

    def _check_epoch(self, name: str, reply_epoch: int, session: SessionKey) -> None:
        if reply_epoch != session[1]:
            self._note_epoch_change(reply_epoch)
            raise KvCacheError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"{name}: the kvcache daemon restarted (epoch {session[1]} is now {reply_epoch}); "
                "this session, its sequences and block ids are gone: open a new session and "
                "recompute")

    def _note_epoch_change(self, new_epoch: int) -> None:
        with self._lock:
            if self._epoch_changed:
                return
            self._epoch_changed = True
            mapped = list(self._mapped)
        for pool in mapped:
            pool.close()
        if self._on_epoch_change is not None:
            self._on_epoch_change(self.epoch, new_epoch)

    def _note_lost(self, error: KvCacheError) -> None:
        with self._lock:
            # A session the user closed is not lost; its ABORTED answers are expected.
            if self._lost or not self._open:
                return
            self._lost = True
        if self._on_session_lost is not None:
            self._on_session_lost(error)

    def _keep_alive_ends(self, code: grpc.StatusCode, response: Any,
                         error: Optional[grpc.RpcError]) -> bool:
        """Reads one keep-alive's outcome; True when the lease is over (stop keeping it)."""
        if code == grpc.StatusCode.OK:
            if response.epoch == self.epoch:
                return False
            self._note_epoch_change(response.epoch)
            self._note_lost(KvCacheError(grpc.StatusCode.FAILED_PRECONDITION,
                                         "KeepAlive: the kvcache daemon restarted"))
            return True
        if code == grpc.StatusCode.FAILED_PRECONDITION and error is not None:
            self._note_epoch_change(epoch_from_trailers(error))
            self._note_lost(KvCacheError.from_rpc_error("KeepAlive", error))
            return True
        if code in (grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND) and error is not None:
            self._note_lost(KvCacheError.from_rpc_error("KeepAlive", error))
            return True
        # UNAVAILABLE, DEADLINE_EXCEEDED...: the daemon may be busy or restarting; a restart
        # shows up as FAILED_PRECONDITION on a later try.
        return False

    def _keep_alive_timeout(self) -> float:
        # A keep-alive must arrive within the lease to matter; waiting longer only delays the next.
        return min(self._client.rpc_timeout, self.keep_alive_period * 3)

    # --- pools ------------------------------------------------------------------------------------

    def _cached_pool(self, pool: str) -> Optional[PoolInfo]:
        with self._lock:
            return self._pools.get(pool)

    def _remember_pool(self, pool: str, description: PoolDescription) -> PoolInfo:
        """`pool` from its description, kept for the session's lifetime (one epoch): its
        layout sizes block streams and pages, its parts name what a page holds."""
        self._check_epoch("DescribePool", description.epoch, (self.id, self.epoch))
        layout = description.pool.layout
        if layout.block_size == 0 or layout.block_bytes == 0:
            raise KvCacheError(grpc.StatusCode.INTERNAL,
                               f"the daemon describes pool '{pool}' with an empty layout")
        with self._lock:
            self._pools[pool] = description.pool
        return description.pool

    def _cached_shape(self, pool: str) -> Optional[Tuple[int, int]]:
        info = self._cached_pool(pool)
        return None if info is None else (info.layout.block_size, info.layout.block_bytes)

    def _remember_shape(self, pool: str, description: PoolDescription) -> Tuple[int, int]:
        """(block_size, block_bytes) of `pool` from its description (_remember_pool)."""
        layout = self._remember_pool(pool, description).layout
        return layout.block_size, layout.block_bytes

    def _cached_page_map(self, pool: str) -> Optional["MappedPool"]:
        with self._lock:
            return self._page_maps.get(pool)

    def _remember_page_map(self, pool: str, description: PoolDescription) -> "MappedPool":
        """The session's own mapping of `pool` for write_pages and read_pages_into, made once
        (mapping a pool costs a populate of all of it). Two threads racing to make it keep the
        first."""
        self._remember_pool(pool, description)
        mapped = self._mapped_pool(description)
        with self._lock:
            kept = self._page_maps.setdefault(pool, mapped)
        if kept is not mapped:
            mapped.close()
        return kept

    def _mapped_pool(self, description: PoolDescription) -> "MappedPool":
        from .mapped_pool import MappedPool  # numpy is needed only for mappings
        self._check_epoch("DescribePool", description.epoch, (self.id, self.epoch))
        mapped = MappedPool(description.pool, description.epoch)
        with self._lock:
            self._mapped.add(mapped)
            changed = self._epoch_changed
        if changed:  # a restart noticed while mapping
            mapped.close()
        return mapped

    # --- pages -----------------------------------------------------------------------------------

    def _put_pages_call(self, pool: str, keys: Sequence[bytes], pages: Any,
                        part_masks: Optional[Sequence[int]],
                        shape: Tuple[int, int]) -> Tuple[UnaryCall, float]:
        """PutPages with its keys, masks and pages checked (the pages against the pool's
        block_bytes), and a deadline that grows with the bytes, as a block stream's."""
        call = "put_pages"
        listed = _pages.page_keys(call, keys)
        masks = _pages.part_masks(call, part_masks, len(listed))
        views = _pages.page_views(call, pages, len(listed), shape[1])
        return (_calls.put_pages(pool, listed, views, masks),
                self._stream_timeout(len(listed) * shape[1]))

    def _get_pages_timeout(self, keys: Sequence[bytes], shape: Tuple[int, int]) -> float:
        return self._stream_timeout(len(keys) * shape[1])

    @staticmethod
    def _write_plan(info: PoolInfo, keys: Sequence[bytes],
                    sources: Sequence[Any], part_masks: Optional[Sequence[int]]) -> Any:
        """write_pages' sources checked before anything is reserved (_page_copy.PageWrite)."""
        from ._page_copy import PageWrite  # numpy, as the mapping
        return PageWrite(info, _pages.page_keys("write_pages", keys), sources, part_masks)

    @staticmethod
    def _read_plan(info: PoolInfo, keys: Sequence[bytes],
                   destinations: Sequence[Any], parts: Sequence[str]) -> Tuple[List[bytes], Any]:
        """read_pages_into's keys and destinations checked before anything is pinned."""
        from ._page_copy import PageRead
        listed = _pages.page_keys("read_pages_into", keys)
        return listed, PageRead(info, len(listed), destinations, parts)

    # --- block streams ----------------------------------------------------------------------------

    def _max_chunk_bytes(self) -> int:
        return max(_MIN_CHUNK_BYTES, self._client.max_message_bytes - _MESSAGE_OVERHEAD)

    def _stream_timeout(self, num_bytes: int) -> float:
        return self._client.rpc_timeout + num_bytes / _BYTES_PER_EXTRA_SECOND

    def _put_plan(self, session: SessionKey, shape: Tuple[int, int], pool: str,
                  tokens: Sequence[int], view: memoryview, cache_salt: bytes,
                  extra_keys: Optional[hashing.ExtraKeys], first_block: int,
                  chunk_bytes: int, part_masks: Optional[Sequence[int]]) -> PutPlan:
        block_size, block_bytes = shape
        full_blocks = len(tokens) // block_size
        if not 0 <= first_block <= full_blocks:
            raise invalid_argument(f"put_blocks: first_block {first_block} is not within the "
                                   f"{full_blocks} full blocks")
        num_blocks = full_blocks - first_block
        if len(view) != num_blocks * block_bytes:
            raise invalid_argument(
                f"put_blocks: {len(view)} bytes given for blocks {first_block} to {full_blocks} "
                f"of a {len(tokens)}-token prompt in pool '{pool}' ({block_size} tokens and "
                f"{block_bytes} bytes per block): want {num_blocks * block_bytes}")
        header = kvcache_pb2.PutBlocksRequest(header=make_request(
            "put_blocks", kvcache_pb2.PutBlocksHeader, session_id=session[0], epoch=session[1],
            pool=pool, tokens=tokens, cache_salt=cache_salt, first_block=first_block,
            block_checksums=block_checksums(view, block_bytes),
            part_masks=_pages.block_part_masks("put_blocks", part_masks)))
        fill_extra_keys(extra_keys, header.header.extra_keys)
        chunk = max(1, min(chunk_bytes, self._max_chunk_bytes()))
        return PutPlan(header.SerializeToString(), view, chunk, self._stream_timeout(len(view)))

    def _get_request(self, pool: str, tokens: Sequence[int], cache_salt: bytes,
                     extra_keys: Optional[hashing.ExtraKeys], max_chunk_bytes: int,
                     restore_parts: Sequence[str]) -> kvcache_pb2.GetBlocksRequest:
        request = self._stamp(make_request(
            "get_blocks", kvcache_pb2.GetBlocksRequest, pool=pool, tokens=tokens,
            cache_salt=cache_salt, restore_parts=_pages.part_names("get_blocks", restore_parts),
            max_chunk_bytes=min(max_chunk_bytes or GET_CHUNK_BYTES, self._max_chunk_bytes())))
        fill_extra_keys(extra_keys, request.extra_keys)
        return request

    def _get_reader(self, session: SessionKey, shape: Tuple[int, int], pool: str,
                    num_tokens: int, on_header: Callable[[int], memoryview]
                    ) -> Tuple[GetBlocksReader, float]:
        block_size, block_bytes = shape
        max_blocks = num_tokens // block_size
        reader = GetBlocksReader(pool, max_blocks, block_size, block_bytes,
                                 on_header)
        return reader, self._stream_timeout(max_blocks * block_bytes)

    @contextlib.contextmanager
    def _reading(self, stream: Any, session: SessionKey) -> Iterator[None]:
        """Around the reading of a GetBlocks stream: its gRPC error fenced on the session's epoch;
        the stream cancelled when the client gives up on it (KvCacheError)."""
        try:
            yield
        except grpc.RpcError as error:
            raise self._fenced_error("GetBlocks", error, session) from None
        except KvCacheError:
            stream.cancel()
            raise

    def _read_message(self, reader: GetBlocksReader, message: GetMessage,
                      session: SessionKey) -> None:
        """One GetBlocks message into `reader`, fenced on the session's epoch."""
        if message.epoch != session[1]:
            self._check_epoch("GetBlocks", message.epoch, session)
        reader.feed(message)

