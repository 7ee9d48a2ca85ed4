"""Every unary call of the API as data: its RPC, its request, how to read its reply, whether it
may be retried. The blocking client (client.py, session.py) and the asyncio one (aio.py) build
their calls here and differ only in how they wait for the reply.

Idempotent calls (reads, KeepAlive, CloseSession, CommitSequence, rendezvous) are retried across
a daemon restart (RetryPolicy); the others (OpenSession, OpenSequence, ExtendSequence,
ReleaseSequence, ForkSequence) are not, since a second copy would do the work twice.

Session calls' requests lack the session id and epoch: the session stamps them.
"""

from dataclasses import dataclass
from typing import Any, Callable, Generic, List, Optional, Sequence, TypeVar

from . import hashing
from ._proto import kvcache_pb2
from .errors import invalid_argument, make_request, token_ids
from .values import (Commit, Extension, Fork, ListedSession, LookupResult, PoolDescription,
                     PoolInfo, Sequence as SequenceTable, Stats, block_counts_from_proto,
                     fill_extra_keys, pool_info_from_proto, pool_stats_from_proto,
                     tier_tokens_from_proto)

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


def _reply(response: Any) -> Any:
    return response


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
        lambda response: PoolDescription(pool=pool_info_from_proto(response.pool),
                                         counts=block_counts_from_proto(response.counts),
                                         epoch=response.epoch),
        True)


def lookup(pool: str, tokens: Sequence[int], cache_salt: bytes,
           extra_keys: Optional[hashing.ExtraKeys], tenant: str) -> UnaryCall[LookupResult]:
    request = make_request("lookup", kvcache_pb2.LookupRequest, pool=pool, tenant=tenant,
                           tokens=token_ids("lookup", tokens), cache_salt=cache_salt)
    fill_extra_keys(extra_keys, request.extra_keys)
    return UnaryCall("Lookup", request,
                     lambda response: LookupResult(
                         num_cached_tokens=response.num_cached_tokens,
                         num_cached_blocks=response.num_cached_blocks,
                         cached_tokens_by_tier=tier_tokens_from_proto(
                             response.cached_tokens_by_tier)),
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


def open_session(client_name: str, ttl: float) -> UnaryCall[Any]:
    if ttl < 0:
        raise invalid_argument(f"open_session: ttl {ttl} is negative")
    return UnaryCall("OpenSession", make_request(
        "open_session", kvcache_pb2.OpenSessionRequest, client_name=client_name,
        ttl_ms=int(ttl * 1000)), _reply, False)


# --- session calls (stamped by the session) -------------------------------------------------------

def keep_alive() -> UnaryCall[Any]:
    return UnaryCall("KeepAlive", kvcache_pb2.KeepAliveRequest(), _reply, True)


def close_session() -> UnaryCall[int]:
    return UnaryCall("CloseSession", kvcache_pb2.CloseSessionRequest(),
                     lambda response: response.released_sequences, True)


def open_sequence(pool: str, tokens: Sequence[int], cache_salt: bytes,
                  extra_keys: Optional[hashing.ExtraKeys],
                  max_load_ms: int) -> UnaryCall[SequenceTable]:
    request = make_request("open_sequence", kvcache_pb2.OpenSequenceRequest, pool=pool,
                           tokens=token_ids("open_sequence", tokens), cache_salt=cache_salt,
                           max_load_ms=max_load_ms)
    fill_extra_keys(extra_keys, request.extra_keys)
    return UnaryCall("OpenSequence", request,
                     lambda response: SequenceTable(
                         sequence_id=response.sequence_id, block_ids=list(response.block_ids),
                         num_cached_tokens=response.num_cached_tokens,
                         cached_tokens_by_tier=tier_tokens_from_proto(
                             response.cached_tokens_by_tier)),
                     False)


def extend(sequence_id: int, tokens: Sequence[int]) -> UnaryCall[Extension]:
    return UnaryCall("ExtendSequence", make_request(
        "extend", kvcache_pb2.ExtendSequenceRequest, sequence_id=sequence_id,
        tokens=token_ids("extend", tokens)),
        lambda response: Extension(new_block_ids=list(response.new_block_ids),
                                   num_tokens=response.num_tokens),
        False)


def commit(sequence_id: int, num_written_tokens: int) -> UnaryCall[Commit]:
    return UnaryCall("CommitSequence", make_request(
        "commit", kvcache_pb2.CommitSequenceRequest, sequence_id=sequence_id,
        num_written_tokens=num_written_tokens),
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
