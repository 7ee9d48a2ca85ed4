from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from typing import ClassVar as _ClassVar, Iterable as _Iterable, Mapping as _Mapping, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor
DTYPE_BFLOAT16: DType
DTYPE_FLOAT16: DType
DTYPE_FLOAT32: DType
DTYPE_FP8_E4M3: DType
DTYPE_UNSPECIFIED: DType
HASH_ALGORITHM_SHA256: HashAlgorithm
HASH_ALGORITHM_UNSPECIFIED: HashAlgorithm
HASH_ALGORITHM_XXH3_128: HashAlgorithm

class AcquirePagesRequest(_message.Message):
    __slots__ = ["epoch", "keys", "max_load_ms", "parts", "pool", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    max_load_ms: int
    parts: _containers.RepeatedScalarFieldContainer[str]
    pool: str
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pool: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., parts: _Optional[_Iterable[str]] = ..., max_load_ms: _Optional[int] = ...) -> None: ...

class AcquirePagesResponse(_message.Message):
    __slots__ = ["block_ids", "epoch", "page_checksums", "pages_by_tier", "part_masks", "sequence_id"]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PAGES_BY_TIER_FIELD_NUMBER: _ClassVar[int]
    PAGE_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    PART_MASKS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    epoch: int
    page_checksums: _containers.RepeatedScalarFieldContainer[int]
    pages_by_tier: TierPages
    part_masks: _containers.RepeatedScalarFieldContainer[int]
    sequence_id: int
    def __init__(self, epoch: _Optional[int] = ..., sequence_id: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ..., page_checksums: _Optional[_Iterable[int]] = ..., part_masks: _Optional[_Iterable[int]] = ..., pages_by_tier: _Optional[_Union[TierPages, _Mapping]] = ...) -> None: ...

class AllBlocksCleared(_message.Message):
    __slots__ = ["pool"]
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class AwaitRendezvousRequest(_message.Message):
    __slots__ = ["epoch", "key", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    key: str
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., key: _Optional[str] = ...) -> None: ...

class AwaitRendezvousResponse(_message.Message):
    __slots__ = ["epoch", "value"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    value: bytes
    def __init__(self, epoch: _Optional[int] = ..., value: _Optional[bytes] = ...) -> None: ...

class BlockCounts(_message.Message):
    __slots__ = ["evictable", "free", "referenced"]
    EVICTABLE_FIELD_NUMBER: _ClassVar[int]
    FREE_FIELD_NUMBER: _ClassVar[int]
    REFERENCED_FIELD_NUMBER: _ClassVar[int]
    evictable: int
    free: int
    referenced: int
    def __init__(self, free: _Optional[int] = ..., evictable: _Optional[int] = ..., referenced: _Optional[int] = ...) -> None: ...

class BlockHash(_message.Message):
    __slots__ = ["hi", "lo"]
    HI_FIELD_NUMBER: _ClassVar[int]
    LO_FIELD_NUMBER: _ClassVar[int]
    hi: int
    lo: int
    def __init__(self, hi: _Optional[int] = ..., lo: _Optional[int] = ...) -> None: ...

class BlocksRemoved(_message.Message):
    __slots__ = ["hashes", "medium", "page_keys", "pool", "tenant"]
    HASHES_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    PAGE_KEYS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    hashes: _containers.RepeatedCompositeFieldContainer[BlockHash]
    medium: str
    page_keys: _containers.RepeatedScalarFieldContainer[bytes]
    pool: str
    tenant: str
    def __init__(self, pool: _Optional[str] = ..., tenant: _Optional[str] = ..., medium: _Optional[str] = ..., hashes: _Optional[_Iterable[_Union[BlockHash, _Mapping]]] = ..., page_keys: _Optional[_Iterable[bytes]] = ...) -> None: ...

class BlocksStored(_message.Message):
    __slots__ = ["block_size", "blocks", "manifest_digest", "medium", "parent_hash", "pool", "tenant"]
    BLOCKS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MEDIUM_FIELD_NUMBER: _ClassVar[int]
    PARENT_HASH_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    block_size: int
    blocks: _containers.RepeatedCompositeFieldContainer[StoredBlock]
    manifest_digest: str
    medium: str
    parent_hash: BlockHash
    pool: str
    tenant: str
    def __init__(self, pool: _Optional[str] = ..., tenant: _Optional[str] = ..., medium: _Optional[str] = ..., block_size: _Optional[int] = ..., parent_hash: _Optional[_Union[BlockHash, _Mapping]] = ..., blocks: _Optional[_Iterable[_Union[StoredBlock, _Mapping]]] = ..., manifest_digest: _Optional[str] = ...) -> None: ...

class CloseSessionRequest(_message.Message):
    __slots__ = ["epoch", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class CloseSessionResponse(_message.Message):
    __slots__ = ["epoch", "released_sequences"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    RELEASED_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    released_sequences: int
    def __init__(self, epoch: _Optional[int] = ..., released_sequences: _Optional[int] = ...) -> None: ...

class CommitPagesRequest(_message.Message):
    __slots__ = ["epoch", "page_checksums", "sequence_id", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PAGE_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    page_checksums: _containers.RepeatedScalarFieldContainer[int]
    sequence_id: int
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., sequence_id: _Optional[int] = ..., page_checksums: _Optional[_Iterable[int]] = ...) -> None: ...

class CommitPagesResponse(_message.Message):
    __slots__ = ["epoch", "num_duplicates", "num_published"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    NUM_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_duplicates: int
    num_published: int
    def __init__(self, epoch: _Optional[int] = ..., num_published: _Optional[int] = ..., num_duplicates: _Optional[int] = ...) -> None: ...

class CommitSequenceRequest(_message.Message):
    __slots__ = ["epoch", "num_written_tokens", "part_masks", "sequence_id", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_WRITTEN_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PART_MASKS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_written_tokens: int
    part_masks: _containers.RepeatedScalarFieldContainer[int]
    sequence_id: int
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., sequence_id: _Optional[int] = ..., num_written_tokens: _Optional[int] = ..., part_masks: _Optional[_Iterable[int]] = ...) -> None: ...

class CommitSequenceResponse(_message.Message):
    __slots__ = ["epoch", "num_committed_blocks", "num_published_blocks"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_COMMITTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_PUBLISHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_committed_blocks: int
    num_published_blocks: int
    def __init__(self, epoch: _Optional[int] = ..., num_committed_blocks: _Optional[int] = ..., num_published_blocks: _Optional[int] = ...) -> None: ...

class CompatibilityManifest(_message.Message):
    __slots__ = ["key_hash_algorithm", "kv_codec", "kv_dtype", "model_config_digest", "model_id", "page_tokens", "parallel", "parts"]
    KEY_HASH_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    KV_CODEC_FIELD_NUMBER: _ClassVar[int]
    KV_DTYPE_FIELD_NUMBER: _ClassVar[int]
    MODEL_CONFIG_DIGEST_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PARALLEL_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    key_hash_algorithm: str
    kv_codec: str
    kv_dtype: str
    model_config_digest: bytes
    model_id: str
    page_tokens: int
    parallel: ParallelGeometry
    parts: _containers.RepeatedCompositeFieldContainer[PagePart]
    def __init__(self, model_id: _Optional[str] = ..., model_config_digest: _Optional[bytes] = ..., kv_dtype: _Optional[str] = ..., kv_codec: _Optional[str] = ..., page_tokens: _Optional[int] = ..., parts: _Optional[_Iterable[_Union[PagePart, _Mapping]]] = ..., parallel: _Optional[_Union[ParallelGeometry, _Mapping]] = ..., key_hash_algorithm: _Optional[str] = ...) -> None: ...

class DescribePoolRequest(_message.Message):
    __slots__ = ["pool"]
    POOL_FIELD_NUMBER: _ClassVar[int]
    pool: str
    def __init__(self, pool: _Optional[str] = ...) -> None: ...

class DescribePoolResponse(_message.Message):
    __slots__ = ["counts", "epoch", "manifests", "pool"]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    MANIFESTS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    counts: BlockCounts
    epoch: int
    manifests: _containers.RepeatedCompositeFieldContainer[ManifestInUse]
    pool: PoolInfo
    def __init__(self, epoch: _Optional[int] = ..., pool: _Optional[_Union[PoolInfo, _Mapping]] = ..., counts: _Optional[_Union[BlockCounts, _Mapping]] = ..., manifests: _Optional[_Iterable[_Union[ManifestInUse, _Mapping]]] = ...) -> None: ...

class ExistsPagesRequest(_message.Message):
    __slots__ = ["epoch", "keys", "parts", "pool", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    parts: _containers.RepeatedScalarFieldContainer[str]
    pool: str
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pool: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., parts: _Optional[_Iterable[str]] = ...) -> None: ...

class ExistsPagesResponse(_message.Message):
    __slots__ = ["epoch", "num_pages", "pages_by_tier"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGES_BY_TIER_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_pages: int
    pages_by_tier: TierPages
    def __init__(self, epoch: _Optional[int] = ..., num_pages: _Optional[int] = ..., pages_by_tier: _Optional[_Union[TierPages, _Mapping]] = ...) -> None: ...

class ExtendSequenceRequest(_message.Message):
    __slots__ = ["epoch", "sequence_id", "session_id", "tokens"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    sequence_id: int
    session_id: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., sequence_id: _Optional[int] = ..., tokens: _Optional[_Iterable[int]] = ...) -> None: ...

class ExtendSequenceResponse(_message.Message):
    __slots__ = ["epoch", "new_block_ids", "num_tokens"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEW_BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    NUM_TOKENS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    new_block_ids: _containers.RepeatedScalarFieldContainer[int]
    num_tokens: int
    def __init__(self, epoch: _Optional[int] = ..., new_block_ids: _Optional[_Iterable[int]] = ..., num_tokens: _Optional[int] = ...) -> None: ...

class ExtraKeys(_message.Message):
    __slots__ = ["lora_id", "multimodal_items"]
    LORA_ID_FIELD_NUMBER: _ClassVar[int]
    MULTIMODAL_ITEMS_FIELD_NUMBER: _ClassVar[int]
    lora_id: str
    multimodal_items: _containers.RepeatedCompositeFieldContainer[MultimodalItem]
    def __init__(self, lora_id: _Optional[str] = ..., multimodal_items: _Optional[_Iterable[_Union[MultimodalItem, _Mapping]]] = ...) -> None: ...

class ForkSequenceRequest(_message.Message):
    __slots__ = ["epoch", "sequence_id", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    sequence_id: int
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., sequence_id: _Optional[int] = ...) -> None: ...

class ForkSequenceResponse(_message.Message):
    __slots__ = ["block_ids", "copied_from_block", "epoch", "sequence_id"]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    COPIED_FROM_BLOCK_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    copied_from_block: int
    epoch: int
    sequence_id: int
    def __init__(self, epoch: _Optional[int] = ..., sequence_id: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ..., copied_from_block: _Optional[int] = ...) -> None: ...

class GetBlocksHeader(_message.Message):
    __slots__ = ["block_bytes", "block_checksums", "num_blocks", "num_cached_tokens", "part_masks"]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PART_MASKS_FIELD_NUMBER: _ClassVar[int]
    block_bytes: int
    block_checksums: _containers.RepeatedScalarFieldContainer[int]
    num_blocks: int
    num_cached_tokens: int
    part_masks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, num_blocks: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., block_bytes: _Optional[int] = ..., block_checksums: _Optional[_Iterable[int]] = ..., part_masks: _Optional[_Iterable[int]] = ...) -> None: ...

class GetBlocksRequest(_message.Message):
    __slots__ = ["cache_salt", "epoch", "extra_keys", "max_chunk_bytes", "pool", "restore_parts", "session_id", "tokens"]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXTRA_KEYS_FIELD_NUMBER: _ClassVar[int]
    MAX_CHUNK_BYTES_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    RESTORE_PARTS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    cache_salt: bytes
    epoch: int
    extra_keys: ExtraKeys
    max_chunk_bytes: int
    pool: str
    restore_parts: _containers.RepeatedScalarFieldContainer[str]
    session_id: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pool: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., cache_salt: _Optional[bytes] = ..., extra_keys: _Optional[_Union[ExtraKeys, _Mapping]] = ..., max_chunk_bytes: _Optional[int] = ..., restore_parts: _Optional[_Iterable[str]] = ...) -> None: ...

class GetBlocksResponse(_message.Message):
    __slots__ = ["data", "epoch", "header"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    epoch: int
    header: GetBlocksHeader
    def __init__(self, epoch: _Optional[int] = ..., header: _Optional[_Union[GetBlocksHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class GetPagesRequest(_message.Message):
    __slots__ = ["epoch", "keys", "max_load_ms", "parts", "pool", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    max_load_ms: int
    parts: _containers.RepeatedScalarFieldContainer[str]
    pool: str
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pool: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., parts: _Optional[_Iterable[str]] = ..., max_load_ms: _Optional[int] = ...) -> None: ...

class GetPagesResponse(_message.Message):
    __slots__ = ["epoch", "page_checksums", "pages", "pages_by_tier", "part_masks"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PAGES_BY_TIER_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    PART_MASKS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    page_checksums: _containers.RepeatedScalarFieldContainer[int]
    pages: _containers.RepeatedScalarFieldContainer[bytes]
    pages_by_tier: TierPages
    part_masks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, epoch: _Optional[int] = ..., pages: _Optional[_Iterable[bytes]] = ..., page_checksums: _Optional[_Iterable[int]] = ..., part_masks: _Optional[_Iterable[int]] = ..., pages_by_tier: _Optional[_Union[TierPages, _Mapping]] = ...) -> None: ...

class GetStatsRequest(_message.Message):
    __slots__ = ["pool", "tenant"]
    POOL_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    pool: str
    tenant: str
    def __init__(self, pool: _Optional[str] = ..., tenant: _Optional[str] = ...) -> None: ...

class GetStatsResponse(_message.Message):
    __slots__ = ["epoch", "open_sessions", "pools"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    OPEN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    open_sessions: int
    pools: _containers.RepeatedCompositeFieldContainer[PoolStats]
    def __init__(self, epoch: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[PoolStats, _Mapping]]] = ..., open_sessions: _Optional[int] = ...) -> None: ...

class KeepAliveRequest(_message.Message):
    __slots__ = ["epoch", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ...) -> None: ...

class KeepAliveResponse(_message.Message):
    __slots__ = ["epoch"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class KvEvent(_message.Message):
    __slots__ = ["all_blocks_cleared", "blocks_removed", "blocks_stored", "sequence", "time_unix_micros"]
    ALL_BLOCKS_CLEARED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_REMOVED_FIELD_NUMBER: _ClassVar[int]
    BLOCKS_STORED_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TIME_UNIX_MICROS_FIELD_NUMBER: _ClassVar[int]
    all_blocks_cleared: AllBlocksCleared
    blocks_removed: BlocksRemoved
    blocks_stored: BlocksStored
    sequence: int
    time_unix_micros: int
    def __init__(self, sequence: _Optional[int] = ..., time_unix_micros: _Optional[int] = ..., blocks_stored: _Optional[_Union[BlocksStored, _Mapping]] = ..., blocks_removed: _Optional[_Union[BlocksRemoved, _Mapping]] = ..., all_blocks_cleared: _Optional[_Union[AllBlocksCleared, _Mapping]] = ...) -> None: ...

class ListPoolsRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class ListPoolsResponse(_message.Message):
    __slots__ = ["epoch", "pools"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    POOLS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    pools: _containers.RepeatedCompositeFieldContainer[PoolInfo]
    def __init__(self, epoch: _Optional[int] = ..., pools: _Optional[_Iterable[_Union[PoolInfo, _Mapping]]] = ...) -> None: ...

class ListSessionsRequest(_message.Message):
    __slots__ = ["tenant"]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    tenant: str
    def __init__(self, tenant: _Optional[str] = ...) -> None: ...

class ListSessionsResponse(_message.Message):
    __slots__ = ["epoch", "sessions"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    sessions: _containers.RepeatedCompositeFieldContainer[SessionInfo]
    def __init__(self, epoch: _Optional[int] = ..., sessions: _Optional[_Iterable[_Union[SessionInfo, _Mapping]]] = ...) -> None: ...

class LookupRequest(_message.Message):
    __slots__ = ["cache_salt", "extra_keys", "manifest", "pool", "restore_parts", "tenant", "tokens"]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    EXTRA_KEYS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    RESTORE_PARTS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    cache_salt: bytes
    extra_keys: ExtraKeys
    manifest: CompatibilityManifest
    pool: str
    restore_parts: _containers.RepeatedScalarFieldContainer[str]
    tenant: str
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, pool: _Optional[str] = ..., tenant: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., cache_salt: _Optional[bytes] = ..., extra_keys: _Optional[_Union[ExtraKeys, _Mapping]] = ..., manifest: _Optional[_Union[CompatibilityManifest, _Mapping]] = ..., restore_parts: _Optional[_Iterable[str]] = ...) -> None: ...

class LookupResponse(_message.Message):
    __slots__ = ["cached_tokens_by_tier", "epoch", "num_cached_blocks", "num_cached_tokens", "part_masks"]
    CACHED_TOKENS_BY_TIER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PART_MASKS_FIELD_NUMBER: _ClassVar[int]
    cached_tokens_by_tier: TierTokens
    epoch: int
    num_cached_blocks: int
    num_cached_tokens: int
    part_masks: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, epoch: _Optional[int] = ..., num_cached_tokens: _Optional[int] = ..., num_cached_blocks: _Optional[int] = ..., cached_tokens_by_tier: _Optional[_Union[TierTokens, _Mapping]] = ..., part_masks: _Optional[_Iterable[int]] = ...) -> None: ...

class ManifestInUse(_message.Message):
    __slots__ = ["digest", "manifest", "sessions", "tenant"]
    DIGEST_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    SESSIONS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    digest: str
    manifest: CompatibilityManifest
    sessions: int
    tenant: str
    def __init__(self, digest: _Optional[str] = ..., tenant: _Optional[str] = ..., manifest: _Optional[_Union[CompatibilityManifest, _Mapping]] = ..., sessions: _Optional[int] = ...) -> None: ...

class MultimodalItem(_message.Message):
    __slots__ = ["content_hash", "length", "offset"]
    CONTENT_HASH_FIELD_NUMBER: _ClassVar[int]
    LENGTH_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    content_hash: bytes
    length: int
    offset: int
    def __init__(self, content_hash: _Optional[bytes] = ..., offset: _Optional[int] = ..., length: _Optional[int] = ...) -> None: ...

class OpenSequenceRequest(_message.Message):
    __slots__ = ["cache_salt", "epoch", "extra_keys", "max_load_ms", "pool", "restore_parts", "session_id", "tokens"]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXTRA_KEYS_FIELD_NUMBER: _ClassVar[int]
    MAX_LOAD_MS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    RESTORE_PARTS_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    cache_salt: bytes
    epoch: int
    extra_keys: ExtraKeys
    max_load_ms: int
    pool: str
    restore_parts: _containers.RepeatedScalarFieldContainer[str]
    session_id: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pool: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., cache_salt: _Optional[bytes] = ..., extra_keys: _Optional[_Union[ExtraKeys, _Mapping]] = ..., max_load_ms: _Optional[int] = ..., restore_parts: _Optional[_Iterable[str]] = ...) -> None: ...

class OpenSequenceResponse(_message.Message):
    __slots__ = ["block_ids", "cached_tokens_by_tier", "epoch", "num_cached_tokens", "part_masks", "sequence_id"]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    CACHED_TOKENS_BY_TIER_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_CACHED_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PART_MASKS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    cached_tokens_by_tier: TierTokens
    epoch: int
    num_cached_tokens: int
    part_masks: _containers.RepeatedScalarFieldContainer[int]
    sequence_id: int
    def __init__(self, epoch: _Optional[int] = ..., sequence_id: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ..., num_cached_tokens: _Optional[int] = ..., cached_tokens_by_tier: _Optional[_Union[TierTokens, _Mapping]] = ..., part_masks: _Optional[_Iterable[int]] = ...) -> None: ...

class OpenSessionRequest(_message.Message):
    __slots__ = ["client_name", "manifest", "tenant", "ttl_ms"]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    manifest: CompatibilityManifest
    tenant: str
    ttl_ms: int
    def __init__(self, tenant: _Optional[str] = ..., client_name: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., manifest: _Optional[_Union[CompatibilityManifest, _Mapping]] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ["epoch", "session_id", "ttl_ms"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    session_id: int
    ttl_ms: int
    def __init__(self, epoch: _Optional[int] = ..., session_id: _Optional[int] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class PagePart(_message.Message):
    __slots__ = ["bytes", "name"]
    BYTES_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    name: str
    def __init__(self, name: _Optional[str] = ..., bytes: _Optional[int] = ...) -> None: ...

class PagePartInfo(_message.Message):
    __slots__ = ["bytes", "hit_policy", "name", "offset", "trailing_pages"]
    class HitPolicy(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    BYTES_FIELD_NUMBER: _ClassVar[int]
    HIT_POLICY_ALL_PAGES: PagePartInfo.HitPolicy
    HIT_POLICY_FIELD_NUMBER: _ClassVar[int]
    HIT_POLICY_TRAILING_PAGES: PagePartInfo.HitPolicy
    HIT_POLICY_UNSPECIFIED: PagePartInfo.HitPolicy
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    TRAILING_PAGES_FIELD_NUMBER: _ClassVar[int]
    bytes: int
    hit_policy: PagePartInfo.HitPolicy
    name: str
    offset: int
    trailing_pages: int
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., bytes: _Optional[int] = ..., hit_policy: _Optional[_Union[PagePartInfo.HitPolicy, str]] = ..., trailing_pages: _Optional[int] = ...) -> None: ...

class ParallelGeometry(_message.Message):
    __slots__ = ["cp_rank", "cp_size", "pp_rank", "pp_size", "tp_rank", "tp_size"]
    CP_RANK_FIELD_NUMBER: _ClassVar[int]
    CP_SIZE_FIELD_NUMBER: _ClassVar[int]
    PP_RANK_FIELD_NUMBER: _ClassVar[int]
    PP_SIZE_FIELD_NUMBER: _ClassVar[int]
    TP_RANK_FIELD_NUMBER: _ClassVar[int]
    TP_SIZE_FIELD_NUMBER: _ClassVar[int]
    cp_rank: int
    cp_size: int
    pp_rank: int
    pp_size: int
    tp_rank: int
    tp_size: int
    def __init__(self, tp_size: _Optional[int] = ..., tp_rank: _Optional[int] = ..., pp_size: _Optional[int] = ..., pp_rank: _Optional[int] = ..., cp_size: _Optional[int] = ..., cp_rank: _Optional[int] = ...) -> None: ...

class PinPagesRequest(_message.Message):
    __slots__ = ["epoch", "keys", "pool", "priority", "session_id", "ttl_ms"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PRIORITY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    pool: str
    priority: int
    session_id: int
    ttl_ms: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pool: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., ttl_ms: _Optional[int] = ..., priority: _Optional[int] = ...) -> None: ...

class PinPagesResponse(_message.Message):
    __slots__ = ["epoch", "num_pages"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_PAGES_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_pages: int
    def __init__(self, epoch: _Optional[int] = ..., num_pages: _Optional[int] = ...) -> None: ...

class PingRequest(_message.Message):
    __slots__ = []
    def __init__(self) -> None: ...

class PingResponse(_message.Message):
    __slots__ = ["epoch", "server_revision", "server_version"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SERVER_REVISION_FIELD_NUMBER: _ClassVar[int]
    SERVER_VERSION_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    server_revision: str
    server_version: str
    def __init__(self, epoch: _Optional[int] = ..., server_version: _Optional[str] = ..., server_revision: _Optional[str] = ...) -> None: ...

class PoolInfo(_message.Message):
    __slots__ = ["hash_algorithm", "layout", "mapping", "memory_kind", "model_id", "name", "num_blocks", "parts"]
    HASH_ALGORITHM_FIELD_NUMBER: _ClassVar[int]
    LAYOUT_FIELD_NUMBER: _ClassVar[int]
    MAPPING_FIELD_NUMBER: _ClassVar[int]
    MEMORY_KIND_FIELD_NUMBER: _ClassVar[int]
    MODEL_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    PARTS_FIELD_NUMBER: _ClassVar[int]
    hash_algorithm: HashAlgorithm
    layout: PoolLayout
    mapping: PoolMapping
    memory_kind: str
    model_id: str
    name: str
    num_blocks: int
    parts: _containers.RepeatedCompositeFieldContainer[PagePartInfo]
    def __init__(self, name: _Optional[str] = ..., model_id: _Optional[str] = ..., layout: _Optional[_Union[PoolLayout, _Mapping]] = ..., num_blocks: _Optional[int] = ..., hash_algorithm: _Optional[_Union[HashAlgorithm, str]] = ..., memory_kind: _Optional[str] = ..., mapping: _Optional[_Union[PoolMapping, _Mapping]] = ..., parts: _Optional[_Iterable[_Union[PagePartInfo, _Mapping]]] = ...) -> None: ...

class PoolLayout(_message.Message):
    __slots__ = ["block_bytes", "block_size", "dtype", "fingerprint", "head_dim", "num_kv_heads", "num_layers"]
    BLOCK_BYTES_FIELD_NUMBER: _ClassVar[int]
    BLOCK_SIZE_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    HEAD_DIM_FIELD_NUMBER: _ClassVar[int]
    NUM_KV_HEADS_FIELD_NUMBER: _ClassVar[int]
    NUM_LAYERS_FIELD_NUMBER: _ClassVar[int]
    block_bytes: int
    block_size: int
    dtype: DType
    fingerprint: int
    head_dim: int
    num_kv_heads: int
    num_layers: int
    def __init__(self, num_layers: _Optional[int] = ..., num_kv_heads: _Optional[int] = ..., head_dim: _Optional[int] = ..., block_size: _Optional[int] = ..., dtype: _Optional[_Union[DType, str]] = ..., block_bytes: _Optional[int] = ..., fingerprint: _Optional[int] = ...) -> None: ...

class PoolMapping(_message.Message):
    __slots__ = ["cuda_device", "cuda_ipc_handle", "kind", "shm_name", "size_bytes"]
    class Kind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
        __slots__ = []
    CUDA_DEVICE_FIELD_NUMBER: _ClassVar[int]
    CUDA_IPC_HANDLE_FIELD_NUMBER: _ClassVar[int]
    KIND_CUDA_IPC: PoolMapping.Kind
    KIND_FIELD_NUMBER: _ClassVar[int]
    KIND_SHM: PoolMapping.Kind
    KIND_UNSPECIFIED: PoolMapping.Kind
    SHM_NAME_FIELD_NUMBER: _ClassVar[int]
    SIZE_BYTES_FIELD_NUMBER: _ClassVar[int]
    cuda_device: int
    cuda_ipc_handle: bytes
    kind: PoolMapping.Kind
    shm_name: str
    size_bytes: int
    def __init__(self, kind: _Optional[_Union[PoolMapping.Kind, str]] = ..., shm_name: _Optional[str] = ..., size_bytes: _Optional[int] = ..., cuda_ipc_handle: _Optional[bytes] = ..., cuda_device: _Optional[int] = ...) -> None: ...

class PoolStats(_message.Message):
    __slots__ = ["counts", "duplicate_blocks", "evictions", "hit_blocks", "hit_tokens", "miss_blocks", "open_sequences", "pool", "prompt_tokens", "published_blocks", "resurrected_blocks", "tenant", "tiers"]
    COUNTS_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EVICTIONS_FIELD_NUMBER: _ClassVar[int]
    HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    HIT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    MISS_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    OPEN_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    RESURRECTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TIERS_FIELD_NUMBER: _ClassVar[int]
    counts: BlockCounts
    duplicate_blocks: int
    evictions: int
    hit_blocks: int
    hit_tokens: int
    miss_blocks: int
    open_sequences: int
    pool: str
    prompt_tokens: int
    published_blocks: int
    resurrected_blocks: int
    tenant: str
    tiers: _containers.RepeatedCompositeFieldContainer[TierStats]
    def __init__(self, pool: _Optional[str] = ..., counts: _Optional[_Union[BlockCounts, _Mapping]] = ..., prompt_tokens: _Optional[int] = ..., hit_tokens: _Optional[int] = ..., hit_blocks: _Optional[int] = ..., resurrected_blocks: _Optional[int] = ..., miss_blocks: _Optional[int] = ..., evictions: _Optional[int] = ..., published_blocks: _Optional[int] = ..., duplicate_blocks: _Optional[int] = ..., open_sequences: _Optional[int] = ..., tenant: _Optional[str] = ..., tiers: _Optional[_Iterable[_Union[TierStats, _Mapping]]] = ...) -> None: ...

class PublishRendezvousRequest(_message.Message):
    __slots__ = ["epoch", "key", "session_id", "value"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    key: str
    session_id: int
    value: bytes
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., key: _Optional[str] = ..., value: _Optional[bytes] = ...) -> None: ...

class PublishRendezvousResponse(_message.Message):
    __slots__ = ["epoch"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class PutBlocksHeader(_message.Message):
    __slots__ = ["block_checksums", "cache_salt", "epoch", "extra_keys", "first_block", "part_masks", "pool", "session_id", "tokens"]
    BLOCK_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    CACHE_SALT_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EXTRA_KEYS_FIELD_NUMBER: _ClassVar[int]
    FIRST_BLOCK_FIELD_NUMBER: _ClassVar[int]
    PART_MASKS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    block_checksums: _containers.RepeatedScalarFieldContainer[int]
    cache_salt: bytes
    epoch: int
    extra_keys: ExtraKeys
    first_block: int
    part_masks: _containers.RepeatedScalarFieldContainer[int]
    pool: str
    session_id: int
    tokens: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pool: _Optional[str] = ..., tokens: _Optional[_Iterable[int]] = ..., cache_salt: _Optional[bytes] = ..., extra_keys: _Optional[_Union[ExtraKeys, _Mapping]] = ..., block_checksums: _Optional[_Iterable[int]] = ..., first_block: _Optional[int] = ..., part_masks: _Optional[_Iterable[int]] = ...) -> None: ...

class PutBlocksRequest(_message.Message):
    __slots__ = ["data", "header"]
    DATA_FIELD_NUMBER: _ClassVar[int]
    HEADER_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    header: PutBlocksHeader
    def __init__(self, header: _Optional[_Union[PutBlocksHeader, _Mapping]] = ..., data: _Optional[bytes] = ...) -> None: ...

class PutBlocksResponse(_message.Message):
    __slots__ = ["epoch", "num_already_cached", "num_blocks", "num_stored"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_ALREADY_CACHED_FIELD_NUMBER: _ClassVar[int]
    NUM_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    NUM_STORED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_already_cached: int
    num_blocks: int
    num_stored: int
    def __init__(self, epoch: _Optional[int] = ..., num_blocks: _Optional[int] = ..., num_already_cached: _Optional[int] = ..., num_stored: _Optional[int] = ...) -> None: ...

class PutPagesRequest(_message.Message):
    __slots__ = ["epoch", "keys", "page_checksums", "pages", "part_masks", "pool", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PAGES_FIELD_NUMBER: _ClassVar[int]
    PAGE_CHECKSUMS_FIELD_NUMBER: _ClassVar[int]
    PART_MASKS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    page_checksums: _containers.RepeatedScalarFieldContainer[int]
    pages: _containers.RepeatedScalarFieldContainer[bytes]
    part_masks: _containers.RepeatedScalarFieldContainer[int]
    pool: str
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pool: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., part_masks: _Optional[_Iterable[int]] = ..., pages: _Optional[_Iterable[bytes]] = ..., page_checksums: _Optional[_Iterable[int]] = ...) -> None: ...

class PutPagesResponse(_message.Message):
    __slots__ = ["epoch", "num_duplicates", "num_published"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    NUM_DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    NUM_PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    num_duplicates: int
    num_published: int
    def __init__(self, epoch: _Optional[int] = ..., num_published: _Optional[int] = ..., num_duplicates: _Optional[int] = ...) -> None: ...

class ReleaseSequenceRequest(_message.Message):
    __slots__ = ["epoch", "sequence_id", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    sequence_id: int
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., sequence_id: _Optional[int] = ...) -> None: ...

class ReleaseSequenceResponse(_message.Message):
    __slots__ = ["epoch"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    def __init__(self, epoch: _Optional[int] = ...) -> None: ...

class ReservePagesRequest(_message.Message):
    __slots__ = ["epoch", "keys", "part_masks", "pool", "session_id"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    PART_MASKS_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    keys: _containers.RepeatedScalarFieldContainer[bytes]
    part_masks: _containers.RepeatedScalarFieldContainer[int]
    pool: str
    session_id: int
    def __init__(self, session_id: _Optional[int] = ..., epoch: _Optional[int] = ..., pool: _Optional[str] = ..., keys: _Optional[_Iterable[bytes]] = ..., part_masks: _Optional[_Iterable[int]] = ...) -> None: ...

class ReservePagesResponse(_message.Message):
    __slots__ = ["block_ids", "epoch", "sequence_id"]
    BLOCK_IDS_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_ID_FIELD_NUMBER: _ClassVar[int]
    block_ids: _containers.RepeatedScalarFieldContainer[int]
    epoch: int
    sequence_id: int
    def __init__(self, epoch: _Optional[int] = ..., sequence_id: _Optional[int] = ..., block_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SessionInfo(_message.Message):
    __slots__ = ["client_name", "expires_in_ms", "open_sequences", "principal", "session_id", "tenant", "ttl_ms"]
    CLIENT_NAME_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_IN_MS_FIELD_NUMBER: _ClassVar[int]
    OPEN_SEQUENCES_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    client_name: str
    expires_in_ms: int
    open_sequences: int
    principal: str
    session_id: int
    tenant: str
    ttl_ms: int
    def __init__(self, session_id: _Optional[int] = ..., tenant: _Optional[str] = ..., principal: _Optional[str] = ..., client_name: _Optional[str] = ..., ttl_ms: _Optional[int] = ..., expires_in_ms: _Optional[int] = ..., open_sequences: _Optional[int] = ...) -> None: ...

class StoredBlock(_message.Message):
    __slots__ = ["extras_digest", "hash", "page_key", "token_ids"]
    EXTRAS_DIGEST_FIELD_NUMBER: _ClassVar[int]
    HASH_FIELD_NUMBER: _ClassVar[int]
    PAGE_KEY_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    extras_digest: int
    hash: BlockHash
    page_key: bytes
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, hash: _Optional[_Union[BlockHash, _Mapping]] = ..., token_ids: _Optional[_Iterable[int]] = ..., extras_digest: _Optional[int] = ..., page_key: _Optional[bytes] = ...) -> None: ...

class TierPages(_message.Message):
    __slots__ = ["cluster", "disk", "host", "pool"]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    cluster: int
    disk: int
    host: int
    pool: int
    def __init__(self, pool: _Optional[int] = ..., host: _Optional[int] = ..., disk: _Optional[int] = ..., cluster: _Optional[int] = ...) -> None: ...

class TierStats(_message.Message):
    __slots__ = ["bytes_used", "capacity_bytes", "deadline_blocks", "evicted_blocks", "evicted_from_above", "hit_blocks", "load_failures", "lost_from_above", "node_failures", "open_failures", "poorer_kept_back", "records", "redirects", "request_waits", "restore_skipped", "restored_records", "skipped_commands", "store_failures", "stored_blocks", "superseded", "tier", "verify_failures"]
    BYTES_USED_FIELD_NUMBER: _ClassVar[int]
    CAPACITY_BYTES_FIELD_NUMBER: _ClassVar[int]
    DEADLINE_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    EVICTED_FROM_ABOVE_FIELD_NUMBER: _ClassVar[int]
    HIT_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    LOAD_FAILURES_FIELD_NUMBER: _ClassVar[int]
    LOST_FROM_ABOVE_FIELD_NUMBER: _ClassVar[int]
    NODE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    OPEN_FAILURES_FIELD_NUMBER: _ClassVar[int]
    POORER_KEPT_BACK_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    REDIRECTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_WAITS_FIELD_NUMBER: _ClassVar[int]
    RESTORED_RECORDS_FIELD_NUMBER: _ClassVar[int]
    RESTORE_SKIPPED_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_COMMANDS_FIELD_NUMBER: _ClassVar[int]
    STORED_BLOCKS_FIELD_NUMBER: _ClassVar[int]
    STORE_FAILURES_FIELD_NUMBER: _ClassVar[int]
    SUPERSEDED_FIELD_NUMBER: _ClassVar[int]
    TIER_FIELD_NUMBER: _ClassVar[int]
    VERIFY_FAILURES_FIELD_NUMBER: _ClassVar[int]
    bytes_used: int
    capacity_bytes: int
    deadline_blocks: int
    evicted_blocks: int
    evicted_from_above: int
    hit_blocks: int
    load_failures: int
    lost_from_above: int
    node_failures: int
    open_failures: int
    poorer_kept_back: int
    records: int
    redirects: int
    request_waits: int
    restore_skipped: int
    restored_records: int
    skipped_commands: int
    store_failures: int
    stored_blocks: int
    superseded: int
    tier: str
    verify_failures: int
    def __init__(self, tier: _Optional[str] = ..., hit_blocks: _Optional[int] = ..., stored_blocks: _Optional[int] = ..., evicted_blocks: _Optional[int] = ..., bytes_used: _Optional[int] = ..., capacity_bytes: _Optional[int] = ..., verify_failures: _Optional[int] = ..., load_failures: _Optional[int] = ..., deadline_blocks: _Optional[int] = ..., evicted_from_above: _Optional[int] = ..., records: _Optional[int] = ..., request_waits: _Optional[int] = ..., store_failures: _Optional[int] = ..., restored_records: _Optional[int] = ..., restore_skipped: _Optional[int] = ..., node_failures: _Optional[int] = ..., skipped_commands: _Optional[int] = ..., redirects: _Optional[int] = ..., lost_from_above: _Optional[int] = ..., open_failures: _Optional[int] = ..., superseded: _Optional[int] = ..., poorer_kept_back: _Optional[int] = ...) -> None: ...

class TierTokens(_message.Message):
    __slots__ = ["cluster", "disk", "host", "pool"]
    CLUSTER_FIELD_NUMBER: _ClassVar[int]
    DISK_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    cluster: int
    disk: int
    host: int
    pool: int
    def __init__(self, pool: _Optional[int] = ..., host: _Optional[int] = ..., cluster: _Optional[int] = ..., disk: _Optional[int] = ...) -> None: ...

class WatchEventsRequest(_message.Message):
    __slots__ = ["epoch", "pool", "start_sequence", "tenant"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    POOL_FIELD_NUMBER: _ClassVar[int]
    START_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    TENANT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    pool: str
    start_sequence: int
    tenant: str
    def __init__(self, start_sequence: _Optional[int] = ..., epoch: _Optional[int] = ..., tenant: _Optional[str] = ..., pool: _Optional[str] = ...) -> None: ...

class WatchEventsResponse(_message.Message):
    __slots__ = ["epoch", "events", "head_sequence", "next_sequence", "snapshot", "snapshot_end"]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    HEAD_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQUENCE_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_END_FIELD_NUMBER: _ClassVar[int]
    SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    events: _containers.RepeatedCompositeFieldContainer[KvEvent]
    head_sequence: int
    next_sequence: int
    snapshot: bool
    snapshot_end: bool
    def __init__(self, epoch: _Optional[int] = ..., events: _Optional[_Iterable[_Union[KvEvent, _Mapping]]] = ..., next_sequence: _Optional[int] = ..., snapshot: bool = ..., head_sequence: _Optional[int] = ..., snapshot_end: bool = ...) -> None: ...

class DType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []

class HashAlgorithm(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = []
