"""Session: one lease on the daemon, and every call made under it.

A session is opened by Client.open_session and kept alive by a background thread every ttl/3
until close() (or the end of its `with` block). Sequences (open_sequence, extend, commit,
release, fork), block bytes (put_blocks, get_blocks_into) and the pool mapping (map_pool) all
belong to a session: the daemon releases a session's sequences when its lease ends.

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
wrong size, a destination that is not a writable buffer); OUT_OF_RANGE for a get_blocks_into
destination too small; DATA_LOSS for received bytes that fail their checksum.

Thread safety: thread-safe. Calls may come from several threads at once; close() must not be
called from a callback.
"""

import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

import grpc

from . import hashing
from ._proto import kvcache_pb2
from .block_stream import BlockVerifier, block_checksums, put_data_message
from .client import Client
from .errors import (KvCacheError, check_tokens, epoch_from_trailers, invalid_argument,
                     make_request)
from .values import (Commit, Extension, Fork, GetInfo, PutResult, Sequence as SequenceTable,
                     fill_extra_keys, tier_tokens_from_proto)

if TYPE_CHECKING:
    from .mapped_pool import MappedPool

_BYTES_PER_EXTRA_SECOND = 64 << 20  # a stream's deadline grows 1 s per this many bytes moved
_MESSAGE_OVERHEAD = 1024  # room for a data message's framing within max_message_bytes
_MIN_CHUNK_BYTES = 4096
_CLOSE_ON_EXIT_TIMEOUT = 1.0  # leaving a `with` block must not hold up for a full rpc_timeout


def _as_bytes_view(call: str, data: Any, writable: bool) -> memoryview:
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


class Session:
    """A lease; use it as a context manager, or call close()."""

    def __init__(self, client: Client, client_name: str, ttl: float,
                 on_epoch_change: Optional[Callable[[int, int], None]],
                 on_session_lost: Optional[Callable[[KvCacheError], None]]) -> None:
        if ttl < 0:
            raise invalid_argument(f"open_session: ttl {ttl} is negative")
        self._client = client
        self._on_epoch_change = on_epoch_change
        self._on_session_lost = on_session_lost
        try:
            response = client.call("OpenSession", make_request(
                "open_session", kvcache_pb2.OpenSessionRequest, client_name=client_name,
                ttl_ms=int(ttl * 1000)))
        except grpc.RpcError as error:
            raise KvCacheError.from_rpc_error("OpenSession", error) from None
        self.id: int = response.session_id
        self.epoch: int = response.epoch
        self.ttl: float = response.ttl_ms / 1000  # as granted
        self._lock = threading.Lock()
        self._open = True  # not closed by the user
        self._epoch_changed = False
        self._lost = False
        self._shapes: Dict[str, Tuple[int, int]] = {}  # pool -> (block_size, block_bytes)
        self._mapped: "weakref.WeakSet[Any]" = weakref.WeakSet()  # MappedPools to close
        self._stop = threading.Event()
        self._keepalive_call: Optional[grpc.Future] = None
        # ttl/3 leaves two more tries before the lease ends if one keep-alive is lost or late.
        period = max(self.ttl / 3, 0.001)
        self._keepalive = threading.Thread(target=self._keep_alive_loop, args=(period,),
                                           name=f"kvcache-keepalive-{self.id}", daemon=True)
        self._keepalive.start()

    # --- state ----------------------------------------------------------------------------------

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

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Closes the session, best effort (a short deadline, errors ignored): the daemon
        releases the sequences now instead of at the end of the lease."""
        self._stop_keep_alive()
        with self._lock:
            usable = self._open and not self._epoch_changed and not self._lost
            self._open = False
        if usable:
            try:
                self._client.call("CloseSession", self._stamp(kvcache_pb2.CloseSessionRequest()),
                                  timeout=min(self._client.rpc_timeout, _CLOSE_ON_EXIT_TIMEOUT))
            except grpc.RpcError:
                pass  # the lease simply runs out

    def close(self) -> int:
        """Closes the session and releases its sequences; returns how many. Later calls raise
        FAILED_PRECONDITION locally. Idempotent on the daemon's side (a second close there is
        ABORTED)."""
        self._stop_keep_alive()
        try:
            response = self._session_call("CloseSession", kvcache_pb2.CloseSessionRequest())
        finally:
            with self._lock:
                # Closed or not, the user is done with it: ABORTED from here on is not a loss.
                self._open = False
        return response.released_sequences

    # --- sequences ------------------------------------------------------------------------------

    def open_sequence(self, pool: str, tokens: Sequence[int], *, cache_salt: bytes = b"",
                      extra_keys: Optional[hashing.ExtraKeys] = None,
                      max_load_ms: int = 0) -> SequenceTable:
        """Opens a sequence for a prompt: the longest verified cached prefix is acquired, the
        rest freshly allocated (at least one token is left to compute). Not idempotent.
        `max_load_ms`: how long loading the prefix from the pool's lower tiers may take (0: no
        bound); what does not come up in time is left to compute. `cached_tokens_by_tier` says
        where the cached tokens came from. INVALID_ARGUMENT for an empty prompt or an oversize
        salt; NOT_FOUND for an unknown pool; RESOURCE_EXHAUSTED when the pool has too few blocks
        or a quota would be passed."""
        request = make_request("open_sequence", kvcache_pb2.OpenSequenceRequest, pool=pool,
                               tokens=check_tokens("open_sequence", tokens),
                               cache_salt=cache_salt, max_load_ms=max_load_ms)
        fill_extra_keys(extra_keys, request.extra_keys)
        response = self._session_call("OpenSequence", request)
        return SequenceTable(sequence_id=response.sequence_id, block_ids=list(response.block_ids),
                             num_cached_tokens=response.num_cached_tokens,
                             cached_tokens_by_tier=tier_tokens_from_proto(
                                 response.cached_tokens_by_tier))

    def extend(self, sequence_id: int, tokens: Sequence[int]) -> Extension:
        """Appends decoded tokens, allocating blocks as needed. Not idempotent."""
        response = self._session_call("ExtendSequence", make_request(
            "extend", kvcache_pb2.ExtendSequenceRequest, sequence_id=sequence_id,
            tokens=check_tokens("extend", tokens)))
        return Extension(new_block_ids=list(response.new_block_ids),
                         num_tokens=response.num_tokens)

    def commit(self, sequence_id: int, num_written_tokens: int) -> Commit:
        """Declares the first `num_written_tokens` tokens' KV written; full blocks among them are
        published. REQUIRES: that KV is written (device work synchronized). Idempotent.
        INVALID_ARGUMENT for a count past the sequence."""
        response = self._session_call("CommitSequence", make_request(
            "commit", kvcache_pb2.CommitSequenceRequest, sequence_id=sequence_id,
            num_written_tokens=num_written_tokens))
        return Commit(num_committed_blocks=response.num_committed_blocks,
                      num_published_blocks=response.num_published_blocks)

    def release(self, sequence_id: int) -> None:
        """Releases the sequence's blocks, tail first. A second call is NOT_FOUND."""
        self._session_call("ReleaseSequence", make_request(
            "release", kvcache_pb2.ReleaseSequenceRequest, sequence_id=sequence_id))

    def fork(self, sequence_id: int) -> Fork:
        """A new sequence sharing the parent's full blocks; the partial last block is copied."""
        response = self._session_call("ForkSequence", make_request(
            "fork", kvcache_pb2.ForkSequenceRequest, sequence_id=sequence_id))
        return Fork(sequence_id=response.sequence_id, block_ids=list(response.block_ids),
                    copied_from_block=(response.copied_from_block
                                       if response.HasField("copied_from_block") else None))

    # --- rendezvous -----------------------------------------------------------------------------

    def publish_rendezvous(self, key: str, value: bytes) -> None:
        """Stores `value` (at most 4 KiB) under `key` until this session ends. ALREADY_EXISTS when
        another session holds the key; INVALID_ARGUMENT for an empty or oversize key or value."""
        self._session_call("PublishRendezvous", make_request(
            "publish_rendezvous", kvcache_pb2.PublishRendezvousRequest, key=key, value=value))

    def await_rendezvous(self, key: str, timeout: float) -> bytes:
        """The key's value as soon as it has one; DEADLINE_EXCEEDED after `timeout` seconds,
        CANCELLED when the client is closed meanwhile."""
        if timeout <= 0:
            raise invalid_argument(f"await_rendezvous: timeout {timeout} is not positive")
        response = self._session_call("AwaitRendezvous", make_request(
            "await_rendezvous", kvcache_pb2.AwaitRendezvousRequest, key=key), timeout)
        return bytes(response.value)

    # --- block bytes ----------------------------------------------------------------------------

    def put_blocks(self, pool: str, tokens: Sequence[int], data: Any, *,
                   cache_salt: bytes = b"", extra_keys: Optional[hashing.ExtraKeys] = None,
                   first_block: int = 0, chunk_bytes: int = 1 << 20) -> PutResult:
        """Stores the KV of `tokens`' full blocks [first_block, len(tokens) // block_size):
        `data` is their bytes concatenated in order (bytes, bytearray, memoryview or a
        C-contiguous numpy array; INVALID_ARGUMENT locally for another size), sent after each
        block's XXH3-64 in messages of at most `chunk_bytes`. The daemon publishes the blocks
        only once every byte arrived and matched (DATA_LOSS otherwise): a failed put stores
        nothing. Blocks already cached are kept. Idempotent. FAILED_PRECONDITION when
        first_block > 0 and the daemon does not hold the blocks before it."""
        tokens = check_tokens("put_blocks", tokens)
        view = _as_bytes_view("put_blocks", data, writable=False)
        session = self._require_open("put_blocks")
        block_size, block_bytes = self._pool_shape(pool)
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
        header = kvcache_pb2.PutBlocksRequest()
        header.header.CopyFrom(make_request(
            "put_blocks", kvcache_pb2.PutBlocksHeader, session_id=session[0], epoch=session[1],
            pool=pool, tokens=tokens, cache_salt=cache_salt, first_block=first_block,
            block_checksums=block_checksums(view, block_bytes)))
        fill_extra_keys(extra_keys, header.header.extra_keys)
        chunk = max(1, min(chunk_bytes, self._max_chunk_bytes()))

        def messages():
            yield header.SerializeToString()
            for start in range(0, len(view), chunk):
                yield put_data_message(view[start:start + chunk])

        try:
            response = self._client.put_blocks_stream(messages(), self._stream_timeout(len(view)))
        except grpc.RpcError as error:
            raise self._fenced_error("PutBlocks", error, session) from None
        self._check_epoch("PutBlocks", response.epoch, session)
        return PutResult(num_blocks=response.num_blocks,
                         num_already_cached=response.num_already_cached,
                         num_stored=response.num_stored)

    def get_blocks_into(self, pool: str, tokens: Sequence[int], destination: Any, *,
                        cache_salt: bytes = b"", extra_keys: Optional[hashing.ExtraKeys] = None,
                        max_chunk_bytes: int = 0) -> GetInfo:
        """Writes the bytes of the longest cached full-block prefix of `tokens` into
        `destination` (a writable buffer: bytearray, memoryview, numpy array, a mapped pool's
        block...), each block verified against the daemon's checksum (DATA_LOSS on a mismatch or
        a stream that ends early). The bytes are copied once, from what gRPC received into the
        destination. OUT_OF_RANGE, and the stream is cancelled, when the daemon has more cached
        blocks than `destination` holds; its contents are unspecified after an error.
        `max_chunk_bytes` of 0 takes the daemon's default chunk size. Read-only."""
        view = _as_bytes_view("get_blocks_into", destination, writable=True)

        def into_destination(total: int) -> memoryview:
            if total > len(view):
                raise KvCacheError(grpc.StatusCode.OUT_OF_RANGE,
                                   f"get_blocks_into: the daemon has {total} bytes of cached "
                                   f"blocks for the prompt, the destination holds {len(view)}")
            return view

        return self._read_blocks(pool, tokens, cache_salt, extra_keys, max_chunk_bytes,
                                 into_destination)

    def get_blocks(self, pool: str, tokens: Sequence[int], *, cache_salt: bytes = b"",
                   extra_keys: Optional[hashing.ExtraKeys] = None,
                   max_chunk_bytes: int = 0) -> Tuple[GetInfo, bytearray]:
        """Same as get_blocks_into, into a new bytearray of exactly the cached blocks' bytes."""
        result: List[bytearray] = []

        def new_buffer(total: int) -> memoryview:
            result.append(bytearray(total))
            return memoryview(result[0])

        info = self._read_blocks(pool, tokens, cache_salt, extra_keys, max_chunk_bytes,
                                 new_buffer)
        return info, result[0] if result else bytearray()

    def map_pool(self, pool: str) -> "MappedPool":
        """Maps `pool`'s memory into this process (a worker on the daemon's node): see
        MappedPool. The mapping is closed when this session sees a daemon restart."""
        from .mapped_pool import MappedPool  # numpy is needed only for mappings
        self._require_open("map_pool")
        description = self._client.describe_pool(pool)
        self._check_epoch("DescribePool", description.epoch, (self.id, self.epoch))
        mapped = MappedPool(description.pool, description.epoch)
        with self._lock:
            self._mapped.add(mapped)
            changed = self._epoch_changed
        if changed:  # a restart noticed while mapping
            mapped.close()
        return mapped

    # --- internals ------------------------------------------------------------------------------

    def _stamp(self, request: Any) -> Any:
        request.session_id = self.id
        request.epoch = self.epoch
        return request

    def _require_open(self, call: str) -> Tuple[int, int]:
        with self._lock:
            if not self._open:
                raise KvCacheError(grpc.StatusCode.FAILED_PRECONDITION,
                                   f"{call} needs an open session: this one is closed")
        return self.id, self.epoch

    def _session_call(self, name: str, request: Any, timeout: Optional[float] = None) -> Any:
        """A unary call that carries the session, fenced on its epoch."""
        session = self._require_open(name)
        try:
            response = self._client.call(name, self._stamp(request), timeout)
        except grpc.RpcError as error:
            raise self._fenced_error(name, error, session) from None
        self._check_epoch(name, response.epoch, session)
        return response

    def _fenced_error(self, name: str, error: grpc.RpcError, session: Tuple[int, int]
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

    def _check_epoch(self, name: str, reply_epoch: int, session: Tuple[int, int]) -> None:
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

    def _stop_keep_alive(self) -> None:
        with self._lock:
            self._stop.set()
            if self._keepalive_call is not None:
                self._keepalive_call.cancel()
        if self._keepalive is not threading.current_thread():
            self._keepalive.join()

    def _keep_alive_loop(self, period: float) -> None:
        request = self._stamp(kvcache_pb2.KeepAliveRequest())
        while not self._stop.wait(period):
            with self._lock:
                if self._stop.is_set():
                    return
                # A keep-alive must arrive within the lease to matter; waiting longer only
                # delays the next.
                try:
                    self._keepalive_call = self._client.future(
                        "KeepAlive", request, min(self._client.rpc_timeout, period * 3))
                except KvCacheError:  # the client was closed under the session
                    return
                call = self._keepalive_call
            try:
                response = call.result()
                code, error = grpc.StatusCode.OK, None
            except grpc.FutureCancelledError:
                return
            except grpc.RpcError as rpc_error:
                code, error = rpc_error.code(), rpc_error
            finally:
                with self._lock:
                    self._keepalive_call = None
            if self._stop.is_set():
                return
            if code == grpc.StatusCode.OK:
                if response.epoch != self.epoch:
                    self._note_epoch_change(response.epoch)
                    self._note_lost(KvCacheError(grpc.StatusCode.FAILED_PRECONDITION,
                                                 "KeepAlive: the kvcache daemon restarted"))
                    return
            elif code == grpc.StatusCode.FAILED_PRECONDITION:
                self._note_epoch_change(epoch_from_trailers(error))
                self._note_lost(KvCacheError.from_rpc_error("KeepAlive", error))
                return
            elif code in (grpc.StatusCode.ABORTED, grpc.StatusCode.NOT_FOUND):
                self._note_lost(KvCacheError.from_rpc_error("KeepAlive", error))
                return
            elif code == grpc.StatusCode.CANCELLED and self._stop.is_set():
                return
            # UNAVAILABLE, DEADLINE_EXCEEDED...: the daemon may be busy or restarting; a restart
            # shows up as FAILED_PRECONDITION on a later try.

    def _pool_shape(self, pool: str) -> Tuple[int, int]:
        """(block_size, block_bytes) of `pool`, described once per session (one epoch)."""
        with self._lock:
            shape = self._shapes.get(pool)
        if shape is not None:
            return shape
        description = self._client.describe_pool(pool)
        self._check_epoch("DescribePool", description.epoch, (self.id, self.epoch))
        layout = description.pool.layout
        if layout.block_size == 0 or layout.block_bytes == 0:
            raise KvCacheError(grpc.StatusCode.INTERNAL,
                               f"the daemon describes pool '{pool}' with an empty layout")
        shape = (layout.block_size, layout.block_bytes)
        with self._lock:
            self._shapes[pool] = shape
        return shape

    def _max_chunk_bytes(self) -> int:
        return max(_MIN_CHUNK_BYTES, self._client.max_message_bytes - _MESSAGE_OVERHEAD)

    def _stream_timeout(self, num_bytes: int) -> float:
        return self._client.rpc_timeout + num_bytes / _BYTES_PER_EXTRA_SECOND

    def _read_blocks(self, pool: str, tokens: Sequence[int], cache_salt: bytes,
                     extra_keys: Optional[hashing.ExtraKeys], max_chunk_bytes: int,
                     on_header: Callable[[int], memoryview]) -> GetInfo:
        """The GetBlocks stream: `on_header(total)` returns where the bytes go (or raises)."""
        tokens = check_tokens("get_blocks", tokens)
        session = self._require_open("get_blocks")
        block_size, block_bytes = self._pool_shape(pool)
        max_blocks = len(tokens) // block_size
        request = self._stamp(make_request(
            "get_blocks", kvcache_pb2.GetBlocksRequest, pool=pool, tokens=tokens,
            cache_salt=cache_salt,
            max_chunk_bytes=min(max_chunk_bytes, self._max_chunk_bytes()) if max_chunk_bytes
            else 0))
        fill_extra_keys(extra_keys, request.extra_keys)
        stream = self._client.get_blocks_stream(request,
                                                self._stream_timeout(max_blocks * block_bytes))
        verifier: Optional[BlockVerifier] = None
        info = GetInfo(num_blocks=0, num_cached_tokens=0, block_bytes=block_bytes)
        try:
            for message in stream:
                if message.epoch != session[1]:
                    stream.cancel()
                    self._check_epoch("GetBlocks", message.epoch, session)
                if message.header is not None:
                    if verifier is not None or message.data is not None:
                        raise KvCacheError(grpc.StatusCode.INTERNAL, "GetBlocks: the daemon's "
                                           "stream must carry one header, first, alone")
                    header = message.header
                    if (header.num_blocks > max_blocks
                            or len(header.block_checksums) != header.num_blocks
                            or header.num_cached_tokens != header.num_blocks * block_size
                            or (header.num_blocks > 0 and header.block_bytes != block_bytes)):
                        raise KvCacheError(grpc.StatusCode.INTERNAL,
                                           f"GetBlocks: inconsistent header from the daemon: "
                                           f"{header} for a prompt of at most {max_blocks} "
                                           f"full blocks of {block_bytes} bytes")
                    info = GetInfo(num_blocks=header.num_blocks,
                                   num_cached_tokens=header.num_cached_tokens,
                                   block_bytes=block_bytes)
                    destination = on_header(header.num_blocks * block_bytes)

                    def sink(offset: int, piece: memoryview, out: memoryview = destination
                             ) -> None:
                        out[offset:offset + len(piece)] = piece

                    verifier = BlockVerifier(block_bytes, header.block_checksums, sink)
                elif verifier is None:
                    raise KvCacheError(grpc.StatusCode.INTERNAL,
                                       "GetBlocks: data from the daemon before its header")
                elif message.data is not None:
                    if len(message.data) > verifier.expected_bytes - verifier.received_bytes:
                        raise KvCacheError(grpc.StatusCode.INTERNAL,
                                           f"GetBlocks: the daemon sent more than the "
                                           f"{verifier.expected_bytes} bytes announced")
                    verifier.feed(message.data)
        except grpc.RpcError as error:
            raise self._fenced_error("GetBlocks", error, session) from None
        except KvCacheError as error:
            stream.cancel()
            if error.code == grpc.StatusCode.DATA_LOSS:
                raise KvCacheError(error.code,
                                   f"GetBlocks from pool '{pool}': {error.message}") from None
            raise
        if verifier is None:
            raise KvCacheError(grpc.StatusCode.DATA_LOSS,
                               "GetBlocks: the stream ended before its header")
        if verifier.received_bytes != verifier.expected_bytes:
            raise KvCacheError(grpc.StatusCode.DATA_LOSS,
                               f"GetBlocks: the stream ended after {verifier.received_bytes} of "
                               f"{verifier.expected_bytes} bytes")
        return info
