"""The plain values kvcache_client calls return, one per proto reply (proto/kvcache/v1/).

Frozen dataclasses, so results can be shared between threads. Requests take
hashing.ExtraKeys for extra keys: the object that computes a block's hash names it to the daemon.
"""

import enum
from dataclasses import dataclass
from typing import List, Optional

from . import hashing
from ._proto import kvcache_pb2
from .errors import invalid_argument


class DType(enum.IntEnum):
    """Element type of a pool (kvcache.v1.DType)."""
    FLOAT16 = kvcache_pb2.DTYPE_FLOAT16
    BFLOAT16 = kvcache_pb2.DTYPE_BFLOAT16
    FLOAT32 = kvcache_pb2.DTYPE_FLOAT32
    FP8_E4M3 = kvcache_pb2.DTYPE_FP8_E4M3

    @property
    def element_bytes(self) -> int:
        return {DType.FLOAT16: 2, DType.BFLOAT16: 2, DType.FLOAT32: 4, DType.FP8_E4M3: 1}[self]


class MappingKind(enum.IntEnum):
    """How a process on the daemon's node maps a pool (kvcache.v1.PoolMapping.Kind)."""
    NONE = kvcache_pb2.PoolMapping.KIND_UNSPECIFIED  # move bytes with put_blocks / get_blocks
    SHM = kvcache_pb2.PoolMapping.KIND_SHM
    CUDA_IPC = kvcache_pb2.PoolMapping.KIND_CUDA_IPC


@dataclass(frozen=True)
class PoolLayout:
    """Block-major: one block is [layer][K,V][token][kv_head][head_dim] elements, contiguous."""
    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int  # tokens per block
    dtype: DType
    block_bytes: int  # as the daemon computed it
    fingerprint: int  # root of every hash chain in the pool (hashing.layout_fingerprint)


@dataclass(frozen=True)
class PoolMapping:
    kind: MappingKind
    shm_name: str
    size_bytes: int
    cuda_ipc_handle: bytes
    cuda_device: int


@dataclass(frozen=True)
class PoolInfo:
    name: str
    model_id: str
    layout: PoolLayout
    num_blocks: int
    hash_algorithm: str  # "xxh3_128" or "sha256", as hashing.py names them
    memory_kind: str  # "host" or "cuda"
    mapping: PoolMapping


@dataclass(frozen=True)
class BlockCounts:
    """free + evictable + referenced == the pool's blocks (for a tenant: referenced is its own)."""
    free: int
    evictable: int  # ref 0, still hashed and findable
    referenced: int  # ref > 0


@dataclass(frozen=True)
class PoolDescription:
    pool: PoolInfo
    counts: BlockCounts
    epoch: int  # the mapping belongs to this daemon start only


@dataclass(frozen=True)
class TierTokens:
    """Where cached tokens were found (v1.TierTokens), summing to num_cached_tokens: the pool
    itself, or a lower tier they were loaded from (a lookup: found in, not loaded)."""
    pool: int = 0
    host: int = 0
    disk: int = 0
    cluster: int = 0


def tier_tokens_from_proto(proto: kvcache_pb2.TierTokens) -> TierTokens:
    return TierTokens(pool=proto.pool, host=proto.host, disk=proto.disk, cluster=proto.cluster)


@dataclass(frozen=True)
class Sequence:
    """An open sequence: its block table, one block id per block_size tokens."""
    sequence_id: int
    block_ids: List[int]
    num_cached_tokens: int  # leading tokens whose KV is already in the pool
    cached_tokens_by_tier: TierTokens = TierTokens()


@dataclass(frozen=True)
class Extension:
    new_block_ids: List[int]  # appended to the block table
    num_tokens: int  # sequence length after the call


@dataclass(frozen=True)
class Commit:
    num_committed_blocks: int  # full blocks of the sequence now committed
    num_published_blocks: int  # of those, how many this call added to the prefix index


@dataclass(frozen=True)
class Fork:
    sequence_id: int
    block_ids: List[int]
    copied_from_block: Optional[int]  # source of the copied partial last block, if any


@dataclass(frozen=True)
class LookupResult:
    num_cached_tokens: int  # num_cached_blocks * block_size; not capped
    num_cached_blocks: int
    cached_tokens_by_tier: TierTokens = TierTokens()


@dataclass(frozen=True)
class PoolStats:
    pool: str
    tenant: str  # empty: the whole pool (an admin's view)
    counts: BlockCounts
    prompt_tokens: int  # tokens asked for by open_sequence
    hit_tokens: int  # of those, served from the cache
    hit_blocks: int
    resurrected_blocks: int  # of open_sequence's hit blocks, those soft-freed (evictable)
    miss_blocks: int  # freshly allocated blocks
    evictions: int
    published_blocks: int
    duplicate_blocks: int
    open_sequences: int


@dataclass(frozen=True)
class Stats:
    pools: List[PoolStats]
    open_sessions: int


@dataclass(frozen=True)
class ListedSession:
    session_id: int  # 0: another identity's session, hidden from a non-admin
    tenant: str
    principal: str  # "uid:1000", "token:NAME", "cert:NAME"
    client_name: str
    ttl: float  # seconds
    expires_in: float  # seconds until the lease ends unless kept alive
    open_sequences: int


@dataclass(frozen=True)
class PutResult:
    num_blocks: int  # full blocks in the put prefix
    num_already_cached: int  # of those, kept from the cache (their bytes were dropped)
    num_stored: int  # of those, written and published by this put


@dataclass(frozen=True)
class GetInfo:
    num_blocks: int  # cached full blocks matched, from the front
    num_cached_tokens: int  # num_blocks * block_size
    block_bytes: int


_HASH_ALGORITHMS = {kvcache_pb2.HASH_ALGORITHM_XXH3_128: "xxh3_128",
                    kvcache_pb2.HASH_ALGORITHM_SHA256: "sha256"}


def pool_info_from_proto(proto: kvcache_pb2.PoolInfo) -> PoolInfo:
    layout = proto.layout
    mapping = proto.mapping
    return PoolInfo(
        name=proto.name, model_id=proto.model_id,
        layout=PoolLayout(num_layers=layout.num_layers, num_kv_heads=layout.num_kv_heads,
                          head_dim=layout.head_dim, block_size=layout.block_size,
                          dtype=DType(layout.dtype) if layout.dtype else DType.FLOAT16,
                          block_bytes=layout.block_bytes, fingerprint=layout.fingerprint),
        num_blocks=proto.num_blocks,
        hash_algorithm=_HASH_ALGORITHMS.get(proto.hash_algorithm, "unspecified"),
        memory_kind=proto.memory_kind,
        mapping=PoolMapping(kind=MappingKind(mapping.kind), shm_name=mapping.shm_name,
                            size_bytes=mapping.size_bytes,
                            cuda_ipc_handle=bytes(mapping.cuda_ipc_handle),
                            cuda_device=mapping.cuda_device))


def block_counts_from_proto(proto: kvcache_pb2.BlockCounts) -> BlockCounts:
    return BlockCounts(free=proto.free, evictable=proto.evictable, referenced=proto.referenced)


def pool_stats_from_proto(proto: kvcache_pb2.PoolStats) -> PoolStats:
    return PoolStats(pool=proto.pool, tenant=proto.tenant,
                     counts=block_counts_from_proto(proto.counts),
                     prompt_tokens=proto.prompt_tokens, hit_tokens=proto.hit_tokens,
                     hit_blocks=proto.hit_blocks, resurrected_blocks=proto.resurrected_blocks,
                     miss_blocks=proto.miss_blocks, evictions=proto.evictions,
                     published_blocks=proto.published_blocks,
                     duplicate_blocks=proto.duplicate_blocks,
                     open_sequences=proto.open_sequences)


def fill_extra_keys(extra_keys: Optional[hashing.ExtraKeys], proto: kvcache_pb2.ExtraKeys) -> None:
    """Requests take hashing.ExtraKeys, the same object that computes the blocks' hashes."""
    if extra_keys is None:
        return
    try:
        proto.lora_id = extra_keys.lora_id.decode()
    except UnicodeDecodeError:
        raise invalid_argument("extra_keys.lora_id must be UTF-8 (it is a proto string)") from None
    for index, item in enumerate(extra_keys.multimodal_items):
        try:
            proto.multimodal_items.add(content_hash=item.content_hash, offset=item.offset,
                                       length=item.length)
        except (TypeError, ValueError):
            raise invalid_argument(f"extra_keys.multimodal_items[{index}]: content_hash must be "
                                   "bytes, offset and length uint32") from None
