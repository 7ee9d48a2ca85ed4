"""Client: a connection to a kvcache daemon, for routers, schedulers, offline jobs and workers.

It wraps the generated kvcache.v1 stubs (kvcache_client/_proto) into typed calls that return the
plain values of values.py and raise KvCacheError with the gRPC code, puts a deadline on every
call, and opens sessions (Session, session.py): leases kept alive in the background, through
which sequences, block bytes and the pool mapping are used.

    with Client() as client:                      # the daemon's default Unix socket
        print(client.lookup("default", tokens).num_cached_tokens)
        with client.open_session("my-worker") as session:
            sequence = session.open_sequence("default", tokens)

Identity, as the C++ ClientOptions (client/kv_cache_client.h): `bearer_token` puts
`authorization: Bearer <token>` on every call (keep-alives and block streams included);
`tls` makes the channel TLS, mutual TLS with a client certificate. The token and key never
appear in an error. A daemon that checks identities answers with its own codes
(UNAUTHENTICATED, PERMISSION_DENIED), passed on unchanged.

Thread safety: thread-safe; calls may come from any number of threads at once (gRPC channels
are). Sessions are independent of each other.
"""

import ipaddress
import os
import time
from dataclasses import dataclass
from typing import (TYPE_CHECKING, Any, Callable, Iterable, Iterator, List, Optional, Sequence,
                    Tuple, TypeVar)

import grpc
import grpc.aio
import grpc.experimental

from . import _calls, hashing
from ._calls import RetryPolicy, UnaryCall
from ._proto import kvcache_pb2, kvcache_pb2_grpc
from .block_stream import split_get_message
from .errors import KvCacheError, invalid_argument
from .events import RESUME_PAUSE, EventBatch, ResumePoint, WatchCursor
from .values import (CompatibilityManifest, ListedSession, LookupResult, PoolDescription,
                     PoolInfo, Stats)

if TYPE_CHECKING:
    from .session import Session

T = TypeVar("T")

# A daemon on the same machine restarts in well under a second; gRPC's default first reconnect
# backoff (1 s, growing to 120 s) would keep a client away much longer (as the C++ client).
_RECONNECT_BACKOFF_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 100),
                              ("grpc.max_reconnect_backoff_ms", 2000)]
HTTP2_FRAME_BYTES = (1 << 24) - 1  # the largest frame HTTP/2 allows
HTTP2_WINDOW_BYTES = 8 << 20  # per stream
GET_BLOCKS_METHOD = "/kvcache.v1.KvCache/GetBlocks"
PUT_BLOCKS_METHOD = "/kvcache.v1.KvCache/PutBlocks"


def default_target() -> str:
    """Where the daemon listens unless told otherwise (common/rpc/listen_address.h):
    unix://$XDG_RUNTIME_DIR/kvcache/kv.sock, else unix:///tmp/kvcache-$UID/kv.sock."""
    runtime_dir = os.environ.get("XDG_RUNTIME_DIR", "")
    if runtime_dir:
        return f"unix://{runtime_dir}/kvcache/kv.sock"
    return f"unix:///tmp/kvcache-{os.getuid()}/kv.sock"


@dataclass(frozen=True)
class TlsOptions:
    """TLS for a TCP target (a unix:// target is local and takes no TLS). Files are PEM.

    ca_file: CA certificates that verify the daemon's certificate; empty: gRPC's default roots.
    cert_file, key_file: a client certificate and its key, for mutual TLS: both or neither.
    server_name: the name the daemon's certificate must carry when it differs from the target's
    host (a daemon reached by IP address or through a tunnel).
    """
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    server_name: str = ""


def check_bearer_token(token: str) -> None:
    """INVALID_ARGUMENT unless `token` can go in a gRPC header: visible ASCII, no spaces. Quotes
    nothing of the token."""
    if not token or any(not 0x21 <= ord(c) <= 0x7E for c in token):
        raise invalid_argument("the bearer token must be non-empty visible ASCII with no spaces "
                               "(what a gRPC header can carry)")


def _is_unix_target(target: str) -> bool:
    return target.startswith("unix:") or target.startswith("unix-abstract:")


def _target_host(target: str) -> str:
    """The host of a gRPC TCP target ("dns:///h:p", "dns:h:p", "ipv4:h:p", "ipv6:[h]:p",
    "[h]:p", "h:p", "h"), brackets removed (as the C++ client's TargetHost)."""
    for scheme in ("dns:", "ipv4:", "ipv6:"):
        if target.startswith(scheme):
            target = target[len(scheme):]
            break
    if target.startswith("//"):  # an authority ("dns://8.8.8.8/host:port")
        _, slash, rest = target[2:].partition("/")
        target = rest if slash else ""
    if target.startswith("["):
        return target[1:].partition("]")[0]
    if target.count(":") == 1:
        return target.partition(":")[0]
    return target  # no port, or a bare IPv6 address


def is_loopback_target(target: str) -> bool:
    """Whether `target`'s host is loopback: 127.0.0.0/8, ::1 (or ::ffff:127.x.x.x) or
    "localhost". False for Unix sockets and anything it cannot parse."""
    if _is_unix_target(target):
        return False
    host = _target_host(target)
    if host.lower() == "localhost":
        return True
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback


def _check_token_transport(target: str, tls: Optional[TlsOptions],
                           allow_plaintext_token: bool) -> None:
    """INVALID_ARGUMENT for a token over plaintext TCP to a host other than loopback, where
    anyone on the path could read it; names the target and the option, never the token."""
    if tls is not None or allow_plaintext_token or _is_unix_target(target):
        return
    if not is_loopback_target(target):
        raise invalid_argument(
            f"refusing to send the bearer token over plaintext TCP to {target}, which is not a "
            "loopback address: use TLS (tls=TlsOptions(...)), or allow it on a trusted network "
            "with allow_plaintext_token=True")


def _read_pem(what: str, path: str) -> bytes:
    """A PEM file's bytes; INVALID_ARGUMENT naming the file, never its contents (a key)."""
    try:
        with open(path, "rb") as file:
            data = file.read()
    except OSError as error:
        raise invalid_argument(f"TLS {what} file '{path}': {error.strerror}") from None
    if b"-----BEGIN " not in data:
        raise invalid_argument(f"the TLS {what} file '{path}' holds no PEM block")
    return data


def _channel_credentials(target: str, tls: TlsOptions) -> grpc.ChannelCredentials:
    if _is_unix_target(target):
        raise invalid_argument(f"TLS is for TCP targets; {target} is a local socket: connect "
                               "without TLS")
    if bool(tls.cert_file) != bool(tls.key_file):
        raise invalid_argument(
            f"a TLS client certificate goes with its key: certificate file '{tls.cert_file}', "
            f"key file '{tls.key_file}'")
    return grpc.ssl_channel_credentials(
        root_certificates=_read_pem("CA", tls.ca_file) if tls.ca_file else None,
        private_key=_read_pem("key", tls.key_file) if tls.key_file else None,
        certificate_chain=_read_pem("certificate", tls.cert_file) if tls.cert_file else None)


class ChannelSettings:
    """A client's options checked and turned into what a gRPC channel takes; the same for the
    blocking Client and aio.Client. Raises KvCacheError INVALID_ARGUMENT as Client documents."""

    def __init__(self, target: Optional[str], tls: Optional[TlsOptions],
                 bearer_token: Optional[str], allow_plaintext_token: bool,
                 connect_timeout: float, rpc_timeout: float, max_message_bytes: int) -> None:
        self.target = target or default_target()
        if connect_timeout <= 0 or rpc_timeout <= 0 or max_message_bytes <= 0:
            raise invalid_argument("connect_timeout, rpc_timeout and max_message_bytes must be "
                                   "positive")
        self.tls = tls
        self.metadata: Tuple[Tuple[str, str], ...] = ()
        if bearer_token is not None:
            check_bearer_token(bearer_token)
            _check_token_transport(self.target, tls, allow_plaintext_token)
            self.metadata = (("authorization", "Bearer " + bearer_token),)
        self.options: List[Tuple[str, Any]] = _RECONNECT_BACKOFF_OPTIONS + [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            # As the C++ client (common/rpc/http2_tuning.h): block bytes come in MiB-sized
            # messages, which 16 KiB frames and a 64 KiB window would cut up and pace with
            # flow-control round trips.
            ("grpc.http2.max_frame_size", HTTP2_FRAME_BYTES),
            ("grpc.http2.lookahead_bytes", HTTP2_WINDOW_BYTES),
            # GetBlocks' messages are read on the calling thread instead of being handed over
            # from gRPC's channel thread one by one (~1.5x the bandwidth: bench/).
            (grpc.experimental.ChannelOptions.SingleThreadedUnaryStream, 1)]
        self.credentials: Optional[grpc.ChannelCredentials] = None
        if tls is not None:
            self.credentials = _channel_credentials(self.target, tls)
            if tls.server_name:
                self.options.append(("grpc.ssl_target_name_override", tls.server_name))

    def unreachable(self, connect_timeout: float) -> KvCacheError:
        hint = (" (over TLS: is the daemon's certificate trusted and named as the target, and "
                "is the client certificate one it accepts?)" if self.tls is not None else "")
        return KvCacheError(grpc.StatusCode.UNAVAILABLE,
                            f"cannot connect to the kvcache daemon at {self.target} within "
                            f"{connect_timeout:g}s{hint}")


def retry_budget(retry: RetryPolicy, call: UnaryCall, error: grpc.RpcError,
                 deadline: float) -> Optional[float]:
    """Seconds left for a second try of `call` after `error` (RetryPolicy), None for none."""
    if not (retry.enabled and call.idempotent and error.code() == grpc.StatusCode.UNAVAILABLE):
        return None
    remaining = deadline - time.monotonic()
    return remaining if remaining > 0 else None


def retry_failure(first: grpc.RpcError, second: grpc.RpcError) -> grpc.RpcError:
    """What a retried call raises: the first UNAVAILABLE when the retry only ran out of time
    waiting for the daemon, else what the retry got."""
    return first if second.code() == grpc.StatusCode.DEADLINE_EXCEEDED else second


class ClientBase:
    """The channel, stubs and settings of a client; `channels` is grpc (Client) or grpc.aio
    (aio.Client), whose channels take the same arguments and make the same stubs."""

    def __init__(self, channels: Any, target: Optional[str], tls: Optional[TlsOptions],
                 bearer_token: Optional[str], allow_plaintext_token: bool,
                 connect_timeout: float, rpc_timeout: float, wait_for_ready: bool,
                 max_message_bytes: int, retry: RetryPolicy) -> None:
        settings = ChannelSettings(target, tls, bearer_token, allow_plaintext_token,
                                   connect_timeout, rpc_timeout, max_message_bytes)
        self._settings = settings
        self.target = settings.target
        self.connect_timeout = connect_timeout
        self.rpc_timeout = rpc_timeout
        self.max_message_bytes = max_message_bytes
        self._retry = retry
        self._wait_for_ready = wait_for_ready
        self._closed = False
        self._metadata = settings.metadata
        if settings.credentials is not None:
            self._channel = channels.secure_channel(self.target, settings.credentials,
                                                    settings.options)
        else:
            self._channel = channels.insecure_channel(self.target, settings.options)
        self.stub = kvcache_pb2_grpc.KvCacheStub(self._channel)
        # The data RPCs move raw bytes (block_stream.py): PutBlocks takes serialized requests as
        # they are, GetBlocks' replies are split, not parsed.
        self._put_blocks = self._channel.stream_unary(
            PUT_BLOCKS_METHOD, request_serializer=bytes,
            response_deserializer=kvcache_pb2.PutBlocksResponse.FromString)
        self._get_blocks = self._channel.unary_stream(
            GET_BLOCKS_METHOD, request_serializer=kvcache_pb2.GetBlocksRequest.SerializeToString,
            response_deserializer=split_get_message)
        self._health_check = self._channel.unary_unary(
            _calls.HEALTH_CHECK_METHOD, request_serializer=_calls.health_check_request,
            response_deserializer=bytes)

    def _start(self, name: str, method: Callable[..., Any], request: Any,
               timeout: Optional[float], wait_for_ready: Optional[bool] = None) -> Any:
        """method(request) with the client's credentials; CANCELLED once the client is closed
        (gRPC raises ValueError, grpc.aio UsageError, for a call on a closed channel)."""
        try:
            if not self._closed:
                return method(request, timeout=timeout, metadata=self._metadata,
                              wait_for_ready=(self._wait_for_ready if wait_for_ready is None
                                              else wait_for_ready))
        except (ValueError, grpc.aio.UsageError):
            if not self._closed:
                raise
        raise KvCacheError(grpc.StatusCode.CANCELLED, f"{name}: the client is closed")

    def _call_arguments(self, call: UnaryCall, request: Any, timeout: Optional[float]
                        ) -> Tuple[Callable[..., Any], Any, float, float]:
        """The stub method, request (`call`'s unless a stamped one is given), timeout (the
        client's unless given) and deadline (time.monotonic) of one call."""
        timeout = self.rpc_timeout if timeout is None else timeout
        method = (getattr(self, call.client_method) if call.client_method
                  else getattr(self.stub, call.name))
        return (method, call.request if request is None else request, timeout,
                time.monotonic() + timeout)


class Client(ClientBase):
    """A channel to one daemon. Close it (or use it as a context manager) when done."""

    def __init__(self, target: Optional[str] = None, *, tls: Optional[TlsOptions] = None,
                 bearer_token: Optional[str] = None, allow_plaintext_token: bool = False,
                 connect_timeout: float = 5.0,
                 rpc_timeout: float = 5.0, wait_for_ready: bool = False,
                 max_message_bytes: int = 16 << 20,
                 retry: RetryPolicy = RetryPolicy()) -> None:
        """Connects to `target` ("unix:///path/kv.sock" or "host:port"; default: the daemon's
        default socket) and waits up to `connect_timeout` seconds for the channel to be ready.

        rpc_timeout: the deadline of every call in seconds, keep-alives included (block streams
        get 1 s more per 64 MiB they move).
        retry: idempotent calls (reads, keep-alives, commit, close, rendezvous) that fail
        UNAVAILABLE are sent again once the daemon is back, within rpc_timeout, so a daemon
        restart is a slower call rather than an error (RetryPolicy). Calls that change state
        and are not idempotent (open_session, open_sequence, extend, release, fork) and the
        block streams fail UNAVAILABLE at once.
        wait_for_ready: every call made while the daemon is unreachable waits (up to
        rpc_timeout) for it to come back instead of failing UNAVAILABLE at once.

        bearer_token: sent with every call. Over plaintext TCP (no `tls`) anyone on the path
        can read it, so it goes only to a loopback host (127.0.0.0/8, ::1, localhost) unless
        allow_plaintext_token is True; Unix sockets and TLS are unaffected.

        Raises KvCacheError: INVALID_ARGUMENT for TLS with a unix:// target, unreadable TLS files,
        a certificate without its key (or the reverse), a bearer token that is not visible ASCII
        or that would go over plaintext TCP to a host other than loopback, non-positive
        timeouts; UNAVAILABLE when the daemon is not ready in time (not there, or a failed TLS
        handshake).
        """
        super().__init__(grpc, target, tls, bearer_token, allow_plaintext_token,
                         connect_timeout, rpc_timeout, wait_for_ready, max_message_bytes, retry)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise self._settings.unreachable(connect_timeout) from None

    def close(self) -> None:
        """Closes the channel; calls in flight and later calls fail CANCELLED. Sessions are not
        closed first: close them (or leave their `with` blocks) before."""
        self._closed = True
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # --- plumbing shared with Session -----------------------------------------------------------

    def _invoke(self, call: UnaryCall, request: Any = None, timeout: Optional[float] = None
                ) -> Any:
        """The reply to `call` (its request, or `request` when given: a stamped one), with the
        client's deadline (or `timeout`), retried per the RetryPolicy. grpc.RpcError is left to
        the caller (Session needs its trailers)."""
        method, request, timeout, deadline = self._call_arguments(call, request, timeout)
        try:
            return self._start(call.name, method, request, timeout)
        except grpc.RpcError as error:
            remaining = retry_budget(self._retry, call, error, deadline)
            if remaining is None:
                raise
            first = error
        try:
            return self._start(call.name, method, request, remaining, wait_for_ready=True)
        except grpc.RpcError as error:
            raise retry_failure(first, error) from None

    def _future(self, call: UnaryCall, request: Any, timeout: float) -> grpc.Future:
        """`call` started asynchronously (so it can be cancelled); not retried."""
        return self._start(call.name, getattr(self.stub, call.name).future, request, timeout)

    def _put_blocks_stream(self, messages: Iterable[bytes], timeout: float
                           ) -> kvcache_pb2.PutBlocksResponse:
        return self._start("PutBlocks", self._put_blocks, messages, timeout)

    def _get_blocks_stream(self, request: kvcache_pb2.GetBlocksRequest, timeout: float) -> Any:
        """The call: an iterator of GetMessage that can be cancelled."""
        return self._start("GetBlocks", self._get_blocks, request, timeout)

    def _unary(self, call: UnaryCall[T]) -> T:
        try:
            return call.parse(self._invoke(call))
        except grpc.RpcError as error:
            raise KvCacheError.from_rpc_error(call.name, error) from None

    # --- read-only calls: idempotent, need no session -------------------------------------------

    def ping(self) -> int:
        """The daemon's epoch (it changes with every daemon start)."""
        return self._unary(_calls.ping())

    def health(self, service: str = "") -> str:
        """grpc.health.v1 Check on this channel: "SERVING", "NOT_SERVING" (the daemon is
        draining), or "SERVICE_UNKNOWN" for a service it does not serve. "" is the whole
        daemon, "kvcache.v1.KvCache" its API (what kubelet's probes ask). KvCacheError when the
        daemon cannot be reached."""
        try:
            return self._unary(_calls.health(service))
        except KvCacheError as error:
            if error.code == grpc.StatusCode.NOT_FOUND:  # the health service's answer for it
                return "SERVICE_UNKNOWN"
            raise

    def list_pools(self) -> List[PoolInfo]:
        """Every pool of the daemon, with its layout (and mapping, for worker and admin
        callers)."""
        return self._unary(_calls.list_pools())

    def describe_pool(self, pool: str) -> PoolDescription:
        """The pool, its block counts and the daemon's epoch. NOT_FOUND for an unknown pool. The
        mapping is filled only for worker and admin callers."""
        return self._unary(_calls.describe_pool(pool))

    def lookup(self, pool: str, tokens: Sequence[int], *, cache_salt: bytes = b"",
               extra_keys: Optional[hashing.ExtraKeys] = None, tenant: str = "",
               manifest: Optional[CompatibilityManifest] = None,
               restore_parts: Sequence[str] = ()) -> LookupResult:
        """Longest cached prefix of `tokens`, acquiring nothing (for routers). `tokens`: a list
        of ints or a 1-D numpy integer array (checked without a Python loop). `tenant`: empty
        for the caller's own (another: PERMISSION_DENIED unless an admin). `manifest`: the one
        the looked-up blocks' sessions are bound to (None: sessions without one).
        `restore_parts`: as Session.open_sequence's."""
        return self._unary(_calls.lookup(pool, tokens, cache_salt, extra_keys, tenant, manifest,
                                         restore_parts))

    def stats(self, pool: str = "", *, tenant: str = "") -> Stats:
        """Every pool's statistics when `pool` is empty; NOT_FOUND for an unknown pool."""
        return self._unary(_calls.stats(pool, tenant))

    def list_sessions(self, tenant: str = "") -> List[ListedSession]:
        """The caller's tenant's open sessions (an admin's: every tenant's, or `tenant`'s)."""
        return self._unary(_calls.list_sessions(tenant))

    def watch_events(self, pool: str = "", *, tenant: str = "",
                     start: ResumePoint = ResumePoint(), resume: bool = True,
                     reconnect_timeout: float = 30.0) -> Iterator[EventBatch]:
        """The daemon's KV events (WatchEvents) as batches, from `start` (default: everything the
        daemon holds, as a snapshot if it no longer holds the beginning) and then live, for as
        long as the caller iterates. Each batch's `resume_point` is where to start again later.

        resume: when the stream breaks (the daemon restarted or is draining), wait up to
        `reconnect_timeout` seconds for a daemon on the same target and go on from the last
        resume point; a restarted daemon answers with a snapshot (AllBlocksCleared, then its
        blocks, `snapshot_end` on the last batch). Without it, or when no daemon comes back in
        time, the iterator raises KvCacheError (UNAVAILABLE). NOT_FOUND for an unknown pool,
        PERMISSION_DENIED for another tenant (non-admin), RESOURCE_EXHAUSTED at the daemon's
        watcher limit. Stop iterating (or close the generator) to end the watch."""
        cursor = WatchCursor(start, pool, tenant)
        while True:
            stream = self._start("WatchEvents", self.stub.WatchEvents, cursor.request(), None)
            with cursor.reading(stream, resume):
                for response in stream:
                    yield cursor.advance(response)
            if not resume:
                return
            time.sleep(RESUME_PAUSE)
            try:
                grpc.channel_ready_future(self._channel).result(timeout=reconnect_timeout)
            except grpc.FutureTimeoutError:
                raise cursor.gone(reconnect_timeout) from None

    # --- sessions -------------------------------------------------------------------------------

    def open_session(self, client_name: str = "python", *, ttl: float = 0.0,
                     on_epoch_change: Optional[Callable[[int, int], None]] = None,
                     on_session_lost: Optional[Callable[[KvCacheError], None]] = None,
                     manifest: Optional[CompatibilityManifest] = None) -> "Session":
        """Opens a session (a lease) of the caller's tenant and starts keeping it alive every
        ttl/3 in a background thread. `ttl` in seconds; 0 asks for the daemon's default, which
        clamps it to its limits (Session.ttl is what was granted). Not idempotent: each call
        makes a new session (never retried). RESOURCE_EXHAUSTED at the daemon's session limit.

        on_epoch_change(old_epoch, new_epoch) runs once when the session finds the daemon
        restarted (new_epoch 0 when only an error said so); on_session_lost(error) once when the
        lease is found ended without close(). They run on the thread that noticed (a caller's or
        the keep-alive thread) and must not call close() on this session.

        manifest binds the session to the engine's CompatibilityManifest: its blocks are shared
        only with sessions of an equal manifest (INVALID_ARGUMENT naming a bad field; each call
        on a pool whose layout it contradicts is FAILED_PRECONDITION). None: as before manifests.
        """
        from .session import Session  # session.py imports this module
        response = self._unary(_calls.open_session(client_name, ttl, manifest))
        return Session(self, response, on_epoch_change, on_session_lost)
