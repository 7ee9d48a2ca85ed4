"""Every unary call of the API as data: its RPC, its request, how to read its reply, whether it
may be retried. The blocking client (client.py, session.py) and the asyncio one (aio.py) build
their calls here and differ only in how they wait for the reply.

Idempotent calls (reads, KeepAlive, CloseSession, CommitSequence, rendezvous, ExistsPages,
PutPages, GetPages, PinPages) are retried across a daemon restart (RetryPolicy); the others
(OpenSession, OpenSequence, ExtendSequence, ReleaseSequence, ForkSequence, ReservePages,
CommitPages, AcquirePages) are not, since a second copy would do the work twice (or, for
CommitPages, find its reservation gone and answer NOT_FOUND for pages that were published).

Session calls' requests lack the session id and epoch: the session stamps them.
"""

from dataclasses import dataclass
from typing import Any, Callable, Generic, List, Optional, Sequence, Tuple, TypeVar

from . import _pages, hashing
from ._proto import kvcache_pb2
from .block_stream import _read_varint, _varint
from .errors import invalid_argument, make_request, token_ids
from .values import (AcquiredPages, Commit, CompatibilityManifest, Extension, Fork, GotPages,
                     ListedSession, LookupResult, ManifestInUse, PageHits, PageReservation,
                     PagesPut, PoolDescription, PoolInfo, Sequence as SequenceTable, Stats,
                     block_counts_from_proto, fill_extra_keys, pool_info_from_proto,
                     pool_stats_from_proto, tier_tokens_from_proto)

T = TypeVar("T")


@dataclass(frozen=True)
class RetryPolicy:
    """How idempotent calls ride out a daemon restart: a call that fails UNAVAILABLE (the
    daemon is down or not yet listening again) is sent again, waiting for the channel to
    reconnect, within what is left of its deadline (the client's rpc_timeout). Non-idempotent
    calls fail at once. `enabled=False` turns retries off."""
    enabled: bool = True


@dataclass(frozen=True)
class UnaryCall(Generic[T]):
    name: str  # the RPC, e.g. "Lookup": the stub's method and the errors' prefix
    request: Any
    parse: Callable[[Any], T]  # the reply (a kvcache_pb2 message) as what the method returns
    idempotent: bool
    # A method of another service: the client's attribute holding it (else the stub's `name`).
    client_method: str = ""


def _reply(response: Any) -> Any:
    return response


# grpc.health.v1, which the daemon serves on its own channel: kvcache_client carries no stubs of
# it (grpcio-health-checking is not a dependency), so its two one-field messages are framed here.
HEALTH_CHECK_METHOD = "/grpc.health.v1.Health/Check"
_HEALTH_STATUSES = {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}


def health_check_request(service: str) -> bytes:
    """A serialized HealthCheckRequest{service}."""
    name = service.encode()
    return b"\x0a" + _varint(len(name)) + name if name else b""


def health_status(reply: bytes) -> str:
    """A serialized HealthCheckResponse's status, by name; fields it does not know skipped."""
    view, status, offset = memoryview(reply), 0, 0
    while offset < len(view):
        key, offset = _read_varint(view, offset)
        if key & 7 != 0:  # only varints in this message
            raise ValueError("HealthCheckResponse: unexpected wire type")
        value, offset = _read_varint(view, offset)
        if key >> 3 == 1:
            status = value
    return _HEALTH_STATUSES.get(status, "UNKNOWN")


def health(service: str) -> UnaryCall[str]:
    return UnaryCall("Health.Check", service, health_status, True, "_health_check")


def ping() -> UnaryCall[int]:
    return UnaryCall("Ping", kvcache_pb2.PingRequest(), lambda response: response.epoch, True)


def list_pools() -> UnaryCall[List[PoolInfo]]:
    return UnaryCall("ListPools", kvcache_pb2.ListPoolsRequest(),
                     lambda response: [pool_info_from_proto(pool) for pool in response.pools],
                     True)


def describe_pool(pool: str) -> UnaryCall[PoolDescription]:
    return UnaryCall(
        "DescribePool",
        make_request("describe_pool", kvcache_pb2.DescribePoolRequest, pool=pool),
        lambda response: PoolDescription(
            pool=pool_info_from_proto(response.pool),
            counts=block_counts_from_proto(response.counts), epoch=response.epoch,
            manifests=[ManifestInUse(digest=use.digest, tenant=use.tenant,
                                     manifest=CompatibilityManifest.from_proto(use.manifest),
                                     sessions=use.sessions) for use in response.manifests]),
        True)


def lookup(pool: str, tokens: Sequence[int], cache_salt: bytes,
           extra_keys: Optional[hashing.ExtraKeys], tenant: str,
           manifest: Optional[CompatibilityManifest] = None,
           restore_parts: Sequence[str] = ()) -> UnaryCall[LookupResult]:
    request = make_request("lookup", kvcache_pb2.LookupRequest, pool=pool, tenant=tenant,
                           tokens=token_ids("lookup", tokens), cache_salt=cache_salt,
                           restore_parts=_pages.part_names("lookup", restore_parts))
    fill_extra_keys(extra_keys, request.extra_keys)
    if manifest is not None:
        request.manifest.CopyFrom(manifest.to_proto())
    return UnaryCall("Lookup", request,
                     lambda response: LookupResult(
                         num_cached_tokens=response.num_cached_tokens,
                         num_cached_blocks=response.num_cached_blocks,
                         cached_tokens_by_tier=tier_tokens_from_proto(
                             response.cached_tokens_by_tier),
                         part_masks=list(response.part_masks)),
                     True)


def stats(pool: str, tenant: str) -> UnaryCall[Stats]:
    return UnaryCall(
        "GetStats", make_request("stats", kvcache_pb2.GetStatsRequest, pool=pool, tenant=tenant),
        lambda response: Stats(pools=[pool_stats_from_proto(stats) for stats in response.pools],
                               open_sessions=response.open_sessions),
        True)


def list_sessions(tenant: str) -> UnaryCall[List[ListedSession]]:
    return UnaryCall(
        "ListSessions",
        make_request("list_sessions", kvcache_pb2.ListSessionsRequest, tenant=tenant),
        lambda response: [ListedSession(session_id=info.session_id, tenant=info.tenant,
                                        principal=info.principal, client_name=info.client_name,
                                        ttl=info.ttl_ms / 1000,
                                        expires_in=info.expires_in_ms / 1000,
                                        open_sequences=info.open_sequences)
                          for info in response.sessions],
        True)


def open_session(client_name: str, ttl: float,
                 manifest: Optional[CompatibilityManifest] = None) -> UnaryCall[Any]:
    if ttl < 0:
        raise invalid_argument(f"open_session: ttl {ttl} is negative")
    request = make_request("open_session", kvcache_pb2.OpenSessionRequest,
                           client_name=client_name, ttl_ms=int(ttl * 1000))
    if manifest is not None:
        request.manifest.CopyFrom(manifest.to_proto())
    return UnaryCall("OpenSession", request, _reply, False)


# --- session calls (stamped by the session) -------------------------------------------------------

def keep_alive() -> UnaryCall[Any]:
    return UnaryCall("KeepAlive", kvcache_pb2.KeepAliveRequest(), _reply, True)


def close_session() -> UnaryCall[int]:
    return UnaryCall("CloseSession", kvcache_pb2.CloseSessionRequest(),
                     lambda response: response.released_sequences, True)


def open_sequence(pool: str, tokens: Sequence[int], cache_salt: bytes,
                  extra_keys: Optional[hashing.ExtraKeys], max_load_ms: int,
                  restore_parts: Sequence[str] = ()) -> UnaryCall[SequenceTable]:
    request = make_request("open_sequence", kvcache_pb2.OpenSequenceRequest, pool=pool,
                           tokens=token_ids("open_sequence", tokens), cache_salt=cache_salt,
                           max_load_ms=max_load_ms,
                           restore_parts=_pages.part_names("open_sequence", restore_parts))
    fill_extra_keys(extra_keys, request.extra_keys)
    return UnaryCall("OpenSequence", request,
                     lambda response: SequenceTable(
                         sequence_id=response.sequence_id, block_ids=list(response.block_ids),
                         num_cached_tokens=response.num_cached_tokens,
                         cached_tokens_by_tier=tier_tokens_from_proto(
                             response.cached_tokens_by_tier),
                         part_masks=list(response.part_masks)),
                     False)


def extend(sequence_id: int, tokens: Sequence[int]) -> UnaryCall[Extension]:
    return UnaryCall("ExtendSequence", make_request(
        "extend", kvcache_pb2.ExtendSequenceRequest, sequence_id=sequence_id,
        tokens=token_ids("extend", tokens)),
        lambda response: Extension(new_block_ids=list(response.new_block_ids),
                                   num_tokens=response.num_tokens),
        False)


def commit(sequence_id: int, num_written_tokens: int,
           part_masks: Optional[Sequence[int]] = None) -> UnaryCall[Commit]:
    return UnaryCall("CommitSequence", make_request(
        "commit", kvcache_pb2.CommitSequenceRequest, sequence_id=sequence_id,
        num_written_tokens=num_written_tokens,
        part_masks=_pages.block_part_masks("commit", part_masks)),
        lambda response: Commit(num_committed_blocks=response.num_committed_blocks,
                                num_published_blocks=response.num_published_blocks),
        True)


def release(sequence_id: int) -> UnaryCall[None]:
    return UnaryCall("ReleaseSequence", make_request(
        "release", kvcache_pb2.ReleaseSequenceRequest, sequence_id=sequence_id),
        lambda response: None, False)


def fork(sequence_id: int) -> UnaryCall[Fork]:
    return UnaryCall("ForkSequence", make_request(
        "fork", kvcache_pb2.ForkSequenceRequest, sequence_id=sequence_id),
        lambda response: Fork(sequence_id=response.sequence_id,
                              block_ids=list(response.block_ids),
                              copied_from_block=(response.copied_from_block
                                                 if response.HasField("copied_from_block")
                                                 else None)),
        False)


def publish_rendezvous(key: str, value: bytes) -> UnaryCall[None]:
    return UnaryCall("PublishRendezvous", make_request(
        "publish_rendezvous", kvcache_pb2.PublishRendezvousRequest, key=key, value=value),
        lambda response: None, True)


def await_rendezvous(key: str, timeout: float) -> UnaryCall[bytes]:
    if timeout <= 0:
        raise invalid_argument(f"await_rendezvous: timeout {timeout} is not positive")
    return UnaryCall("AwaitRendezvous", make_request(
        "await_rendezvous", kvcache_pb2.AwaitRendezvousRequest, key=key),
        lambda response: bytes(response.value), True)


# --- pages named by the engine's keys (checked and read by _pages.py) ----------------------------

def exists_pages(pool: str, keys: Sequence[bytes], parts: Sequence[str]) -> UnaryCall[PageHits]:
    call = "exists_pages"
    return UnaryCall("ExistsPages", make_request(
        call, kvcache_pb2.ExistsPagesRequest, pool=pool, keys=_pages.page_keys(call, keys),
        parts=_pages.part_names(call, parts)), _pages.page_hits, True)


def reserve_pages(pool: str, keys: Sequence[bytes],
                  part_masks: Optional[Sequence[int]]) -> UnaryCall[PageReservation]:
    call = "reserve_pages"
    keys = _pages.page_keys(call, keys)
    request = make_request(call, kvcache_pb2.ReservePagesRequest, pool=pool, keys=keys,
                           part_masks=_pages.part_masks(call, part_masks, len(keys)))
    return UnaryCall("ReservePages", request,
                     lambda response: _pages.reservation(pool, len(keys), response), False)


def commit_pages(sequence_id: int, page_checksums: Sequence[int] = ()) -> UnaryCall[PagesPut]:
    return UnaryCall("CommitPages", make_request(
        "commit_pages", kvcache_pb2.CommitPagesRequest, sequence_id=sequence_id,
        page_checksums=list(page_checksums)), _pages.pages_put, False)


def _read_pages_request(call: str, message_type: Any, pool: str, keys: Sequence[bytes],
                        parts: Sequence[str], max_load_ms: int) -> Tuple[int, Any]:
    """AcquirePages' and GetPages' request, which ask the same; and its number of keys."""
    listed = _pages.page_keys(call, keys)
    return len(listed), make_request(call, message_type, pool=pool, keys=listed,
                                     parts=_pages.part_names(call, parts),
                                     max_load_ms=max_load_ms)


def acquire_pages(pool: str, keys: Sequence[bytes], parts: Sequence[str],
                  max_load_ms: int) -> UnaryCall[AcquiredPages]:
    num_keys, request = _read_pages_request("acquire_pages", kvcache_pb2.AcquirePagesRequest,
                                            pool, keys, parts, max_load_ms)
    return UnaryCall("AcquirePages", request,
                     lambda response: _pages.acquired(pool, num_keys, response), False)


def put_pages(pool: str, keys: List[bytes], pages: List[memoryview],
              part_masks: List[int]) -> UnaryCall[PagesPut]:
    """REQUIRES: keys, pages and part_masks checked (_pages; the pages need the pool's
    block_bytes). Each page's bytes are copied once into the request (protobuf takes bytes)."""
    page_bytes = [bytes(page) for page in pages]
    return UnaryCall("PutPages", make_request(
        "put_pages", kvcache_pb2.PutPagesRequest, pool=pool, keys=keys, part_masks=part_masks,
        pages=page_bytes, page_checksums=[_pages.page_checksum(page) for page in page_bytes]),
        _pages.pages_put, True)


def get_pages(pool: str, keys: Sequence[bytes], parts: Sequence[str],
              max_load_ms: int) -> UnaryCall[GotPages]:
    num_keys, request = _read_pages_request("get_pages", kvcache_pb2.GetPagesRequest, pool,
                                            keys, parts, max_load_ms)
    return UnaryCall("GetPages", request,
                     lambda response: _pages.got_pages(num_keys, response), True)


def pin_pages(pool: str, keys: Sequence[bytes], ttl: float, priority: int = 0) -> UnaryCall[int]:
    call = "pin_pages"
    return UnaryCall("PinPages", make_request(
        call, kvcache_pb2.PinPagesRequest, pool=pool, keys=_pages.page_keys(call, keys),
        ttl_ms=_pages.ttl_ms(call, ttl), priority=priority),
        lambda response: response.num_pages, True)
