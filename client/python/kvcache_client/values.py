"""The plain values kvcache_client calls return, one per proto reply (proto/kvcache/v1/).

Frozen dataclasses, so results can be shared between threads. Requests take
hashing.ExtraKeys for extra keys: the object that computes a block's hash names it to the daemon.
"""

import enum
from dataclasses import dataclass, field
from typing import Any, List, Optional, Sequence as SequenceOf, Tuple, Type, TypeVar

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
class PagePartInfo:
    """One named byte range of a pool's pages (kvcache.v1.PagePartInfo), and when a hit needs it:
    policy "all" on every page of the hit (full attention), "trailing" on its last
    `trailing_pages` pages only (sliding window, recurrent state)."""
    name: str
    offset: int  # from the start of the page (block)
    bytes: int
    policy: str  # "all" or "trailing"
    trailing_pages: int  # policy "trailing" only


@dataclass(frozen=True)
class PoolInfo:
    name: str
    model_id: str
    layout: PoolLayout
    num_blocks: int
    hash_algorithm: str  # "xxh3_128" or "sha256", as hashing.py names them
    memory_kind: str  # "host" or "cuda"
    mapping: PoolMapping
    # The named parts of every page, in page order (a pool declared without parts has one, "kv",
    # the whole block). Last, with a default, so that values made before pages still build.
    parts: Tuple[PagePartInfo, ...] = ()

    def part_mask(self, names: SequenceOf[str] = ()) -> int:
        """The part mask of `names` (bit i is parts[i]), as ReservePages and PutPages take it;
        empty: every part. INVALID_ARGUMENT naming a name the pool does not have, found here
        rather than by the daemon a round trip later."""
        if isinstance(names, str):
            raise invalid_argument(f"pool '{self.name}': part names must be a sequence of "
                                   f"names, not the str '{names}'")
        if not names:
            return (1 << len(self.parts)) - 1
        index = {part.name: bit for bit, part in enumerate(self.parts)}
        mask = 0
        for name in names:
            if name not in index:
                raise invalid_argument(f"pool '{self.name}' has no part '{name}' (its parts: "
                                       f"{', '.join(index) or 'none'})")
            mask |= 1 << index[name]
        return mask


@dataclass(frozen=True)
class BlockCounts:
    """free + evictable + referenced == the pool's blocks (for a tenant: referenced is its own)."""
    free: int
    evictable: int  # ref 0, still hashed and findable
    referenced: int  # ref > 0


@dataclass(frozen=True)
class PagePart:
    """A named byte range of a page, in page order (kvcache.v1.PagePart)."""
    name: str
    bytes: int


@dataclass(frozen=True)
class ParallelGeometry:
    """The engine process's place in its parallel groups; a size of 0 means 1."""
    tp_size: int = 1
    tp_rank: int = 0
    pp_size: int = 1
    pp_rank: int = 0
    cp_size: int = 1
    cp_rank: int = 0


@dataclass(frozen=True)
class CompatibilityManifest:
    """What an engine process declares about the KV it stores (kvcache.v1.CompatibilityManifest,
    whose comments give each field's rule). A session opened with one never shares a block with
    a session of another manifest, in any tier, across restarts."""
    model_id: str
    model_config_digest: bytes  # the engine's digest of whatever in its config changes the KV
    kv_dtype: str  # "fp16", "bf16", "fp32" or "fp8_e4m3": the pool's dtype
    page_tokens: int  # the pool's block_size
    parts: Tuple[PagePart, ...]  # their bytes sum to the pool's block_bytes
    parallel: ParallelGeometry = ParallelGeometry()
    kv_codec: str = ""  # "" for raw KV
    key_hash_algorithm: str = ""

    def to_proto(self) -> kvcache_pb2.CompatibilityManifest:
        return kvcache_pb2.CompatibilityManifest(
            model_id=self.model_id, model_config_digest=bytes(self.model_config_digest),
            kv_dtype=self.kv_dtype, kv_codec=self.kv_codec, page_tokens=self.page_tokens,
            parts=[kvcache_pb2.PagePart(name=part.name, bytes=part.bytes) for part in self.parts],
            parallel=kvcache_pb2.ParallelGeometry(
                tp_size=self.parallel.tp_size, tp_rank=self.parallel.tp_rank,
                pp_size=self.parallel.pp_size, pp_rank=self.parallel.pp_rank,
                cp_size=self.parallel.cp_size, cp_rank=self.parallel.cp_rank),
            key_hash_algorithm=self.key_hash_algorithm)

    @staticmethod
    def from_proto(proto: kvcache_pb2.CompatibilityManifest) -> "CompatibilityManifest":
        parallel = proto.parallel
        return CompatibilityManifest(
            model_id=proto.model_id, model_config_digest=bytes(proto.model_config_digest),
            kv_dtype=proto.kv_dtype, page_tokens=proto.page_tokens,
            parts=tuple(PagePart(name=part.name, bytes=part.bytes) for part in proto.parts),
            parallel=ParallelGeometry(tp_size=parallel.tp_size, tp_rank=parallel.tp_rank,
                                      pp_size=parallel.pp_size, pp_rank=parallel.pp_rank,
                                      cp_size=parallel.cp_size, cp_rank=parallel.cp_rank),
            kv_codec=proto.kv_codec, key_hash_algorithm=proto.key_hash_algorithm)


@dataclass(frozen=True)
class ManifestInUse:
    """A manifest open sessions are bound to that fits the pool (kvcache.v1.ManifestInUse)."""
    digest: str  # 32 hex digits, under the pool's hash algorithm
    tenant: str
    manifest: CompatibilityManifest  # as the daemon validated it
    sessions: int


@dataclass(frozen=True)
class PoolDescription:
    pool: PoolInfo
    counts: BlockCounts
    epoch: int  # the mapping belongs to this daemon start only
    # The caller's tenant's manifests in use (an admin's: every tenant's), by tenant then digest.
    manifests: List[ManifestInUse] = field(default_factory=list)


TierCounts = TypeVar("TierCounts", bound="_TierCounts")


@dataclass(frozen=True)
class _TierCounts:
    """A count per tier: the pool itself, host memory, disk, the cluster."""
    pool: int = 0
    host: int = 0
    disk: int = 0
    cluster: int = 0

    @classmethod
    def from_proto(cls: Type[TierCounts], proto: Any) -> TierCounts:
        """From kvcache.v1.TierTokens or TierPages, which have these four fields."""
        return cls(pool=proto.pool, host=proto.host, disk=proto.disk, cluster=proto.cluster)


@dataclass(frozen=True)
class TierTokens(_TierCounts):
    """Where cached tokens were found (v1.TierTokens), summing to num_cached_tokens: the pool
    itself, or a lower tier they were loaded from (a lookup: found in, not loaded)."""


def tier_tokens_from_proto(proto: kvcache_pb2.TierTokens) -> TierTokens:
    return TierTokens.from_proto(proto)


@dataclass(frozen=True)
class OpenedSequence:
    """An open sequence: its block table, one block id per block_size tokens."""
    sequence_id: int
    block_ids: List[int]
    num_cached_tokens: int  # leading tokens whose KV is already in the pool
    cached_tokens_by_tier: TierTokens = TierTokens()
    # One per cached block: the parts it holds (bit i: the pool's part i); empty for a pool
    # declared without parts.
    part_masks: List[int] = field(default_factory=list)


# The name before OpenedSequence, kept for code that imports it; not in the package's __all__,
# where it shadowed typing.Sequence in `from kvcache_client import *`.
Sequence = OpenedSequence


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
    part_masks: List[int] = field(default_factory=list)  # as OpenedSequence's


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
class TierPages(_TierCounts):
    """How many pages each tier gave (kvcache.v1.TierPages), summing to the call's page count:
    the pool itself, or a lower tier they were loaded from (exists: found in, never cluster)."""


@dataclass(frozen=True)
class PageHits:
    """exists_pages: how many leading keys are restorable under the hit rule, and from where."""
    num_pages: int
    by_tier: TierPages


@dataclass(frozen=True)
class PagesPut:
    """commit_pages, put_pages, write_pages: pages this call published, and pages present
    already (their bytes were not needed)."""
    num_published: int
    num_duplicates: int


@dataclass(frozen=True)
class PageReservation:
    """reserve_pages: per key, the block to write its page into, or None for a key present
    already (a duplicate: nothing to write). commit_pages publishes it; release(sequence_id)
    abandons it."""
    pool: str
    sequence_id: int
    block_ids: Tuple[Optional[int], ...]


@dataclass(frozen=True)
class AcquiredPages:
    """acquire_pages, read_pages_into: one entry per page the hit rule gave, from the first key
    on, pinned until release(sequence_id). checksums are each whole page's XXH3-64, part_masks
    the parts each page holds (bit i is PoolInfo.parts[i])."""
    pool: str
    sequence_id: int
    block_ids: Tuple[int, ...]
    checksums: Tuple[int, ...]
    part_masks: Tuple[int, ...]
    by_tier: TierPages


@dataclass(frozen=True)
class GotPages:
    """get_pages: whole pages (block_bytes each; the bytes of parts a page lacks are
    unspecified), one per page the hit rule gave, each verified against its checksum."""
    pages: List[bytes]
    part_masks: Tuple[int, ...]
    by_tier: TierPages


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
    # One per block: the parts it holds, as OpenedSequence's; empty for a pool declared without parts.
    part_masks: List[int] = field(default_factory=list)


_HIT_POLICIES = {kvcache_pb2.PagePartInfo.HIT_POLICY_ALL_PAGES: "all",
                 kvcache_pb2.PagePartInfo.HIT_POLICY_TRAILING_PAGES: "trailing"}

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
                            cuda_device=mapping.cuda_device),
        parts=tuple(PagePartInfo(name=part.name, offset=part.offset, bytes=part.bytes,
                                 policy=_HIT_POLICIES.get(part.hit_policy, "unspecified"),
                                 trailing_pages=part.trailing_pages)
                    for part in proto.parts))


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
