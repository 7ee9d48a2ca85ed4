"""Python client of the kvcache daemon (proto/kvcache/v1/kvcache.proto).

- Client (client.py): a connection; read-only calls (ping, list_pools, describe_pool, lookup,
  stats, list_sessions) and open_session.
- Session (session.py): a lease kept alive in the background; sequences, rendezvous, block bytes
  (put_blocks, get_blocks_into), map_pool, and pages named by the engine's own keys
  (exists_pages, write_pages, read_pages_into, put_pages, get_pages, ...).
- MappedPool (mapped_pool.py, needs numpy): a host pool's shared memory with numpy views.
- aio (aio.py): the same Client and Session for asyncio, on grpc.aio.
- events (events.py): watch_events() batches and resume points.
- KvCacheError (errors.py): every failure, with its gRPC code.
- tuning (tuning.py): process-wide settings for processes that stream many blocks.
- hashing (hashing.py): the block hash chain (docs/hash_spec.md), needing only xxhash.

Runtime: grpcio, protobuf and xxhash (Debian: python3-grpcio, python3-protobuf, python3-xxhash),
numpy (python3-numpy) for MappedPool. The gRPC stubs are generated from the proto
(generate_stubs.py) into _proto/.
"""

__version__ = "0.1.0"  # the project's (CMakeLists.txt, pyproject.toml)

from ._calls import RetryPolicy
from .client import Client, TlsOptions, default_target
from .errors import KvCacheError
from .events import EventBatch, ResumePoint, page_keys_of
from .session import Session
from .values import (AcquiredPages, BlockCounts, Commit, CompatibilityManifest, DType, Extension,
                     Fork, GetInfo, GotPages, ListedSession, LookupResult, ManifestInUse,
                     MappingKind, OpenedSequence, PageHits, PagePart, PagePartInfo,
                     PageReservation, PagesPut, ParallelGeometry, PoolDescription, PoolInfo,
                     PoolLayout, PoolMapping, PoolStats, PutResult, Sequence, Stats, TierPages,
                     TierTokens)

__all__ = ["AcquiredPages", "BlockCounts", "Client", "Commit", "CompatibilityManifest", "DType",
           "EventBatch", "Extension", "Fork", "GetInfo", "GotPages", "KvCacheError",
           "ListedSession", "LookupResult", "ManifestInUse", "MappingKind", "OpenedSequence",
           "PageHits", "PagePart", "PagePartInfo", "PageReservation", "PagesPut",
           "ParallelGeometry", "PoolDescription", "PoolInfo", "PoolLayout", "PoolMapping",
           "PoolStats", "PutResult", "ResumePoint", "RetryPolicy", "Session", "Stats", "TierPages",
           "TierTokens", "TlsOptions", "default_target", "page_keys_of"]
