"""SGLang HiCache storage backend on the kvcache daemon's key-addressed pages.

SGLang loads it with `--hicache-storage-backend dynamic` and an extra config naming this module
and class (docs/engines.md, "Use with SGLang"):

    --hicache-storage-backend-extra-config '{"backend_name": "kvcache",
        "module_path": "kvcache_client.sglang", "class_name": "KvCacheStorage",
        "interface_v1": 1, "kvcache_pool": "sglang"}'

`interface_v1` makes SGLang call the zero-copy batch_get_v1/batch_set_v1 with host indices into
the host KV pool it registered; without it SGLang uses the deprecated batch_get/batch_set of
whole flat pages, which this backend also serves. Written against SGLang's
python/sglang/srt/mem_cache/hicache_storage.py, storage/backend_factory.py and
managers/cache_controller.py at commit 001067fffe33427bee0ed2f007fb7551a1d76b44 (the Mooncake
store's key scheme read at 00fe477f32b3878f64d44cc36895e1de4a113afe).

How SGLang's calls map onto pages (proto/kvcache/v1/kvcache.proto, DESIGN §13):
- a SGLang page (page_size tokens) is one kvcache page; its key is SGLang's page hash (64 hex
  digits, stored as its 32 bytes); the pool's "kv" part holds K then V, each
  [token][layer][head][head_dim], whatever the host layout (page_first, layer_first,
  page_first_direct, page_head), so engines of different layouts share pages;
- the other host pools SGLang registers for hybrid models (mamba, swa, indexer, ...) are pool
  parts of the same names, their hit policies (all pages or trailing pages) declared by the
  pool; the daemon computes the one endpoint every requested part can restore;
- tensor-parallel ranks are apart by the session's compatibility manifest (its geometry), so
  rank r only ever finds rank r's pages; an MLA model (every rank holds the same bytes) leaves
  the tensor-parallel geometry out, so its pages are stored once and every rank finds them.

Settings come from the extra config, else the environment: kvcache_target / KVCACHE_TARGET
(default: the daemon's default socket), kvcache_token_file / KVCACHE_TOKEN_FILE (a bearer token),
kvcache_pool / KVCACHE_POOL (default "default"), kvcache_model_config_digest (hex; default:
derived from the model's config.json and the KV geometry).

SGLang's storage threads (prefetch, prefetch I/O, backup) call it concurrently and never expect
an exception: a daemon that is down or restarting makes every call a miss (False, 0), logged at
most every few seconds, and the next call after it is back opens a new session.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import xxhash

from ._calls import RetryPolicy
from .client import Client
from .values import CompatibilityManifest, PagePart, ParallelGeometry, PoolInfo

logger = logging.getLogger(__name__)

KV_PART = "kv"
# SGLang's page keys: sha256 over the page's tokens chained to the previous page's key
# (sglang.srt.mem_cache.utils.get_hash_str), as 64 hex digits.
KEY_HASH_ALGORITHM = "sglang-sha256"
_RETRY_SECONDS = 2.0  # after a failure, calls are misses for this long before reconnecting
_LOG_SECONDS = 10.0
_MAX_STAGED_PAGES = 8192  # extra-pool parts waiting for their KV part (batch_set_v2 then v1)
_DTYPES = {"torch.bfloat16": "bf16", "torch.float16": "fp16", "torch.float32": "fp32",
           "torch.float8_e4m3fn": "fp8_e4m3"}

try:  # SGLang's factory wants a subclass of its HiCacheStorage; without SGLang, duck typing.
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorage as _Base
    from sglang.srt.mem_cache.hicache_storage import PoolTransferResult as _TransferResult
except ImportError:  # pragma: no cover - depends on the environment
    _Base = object

    @dataclasses.dataclass
    class _TransferResult:  # type: ignore[no-redef]
        """SGLang's PoolTransferResult, field for field."""
        kv_hit_pages: int
        extra_pool_hit_pages: Dict[str, int]


def page_key(sglang_key: str) -> bytes:
    """The daemon key of a SGLang page key: its 32 bytes when it is 64 hex digits (SGLang's
    sha256), else its UTF-8 up to 64 bytes, else its sha256 (a key is 1 to 64 bytes)."""
    if len(sglang_key) == 64:
        try:
            return bytes.fromhex(sglang_key)
        except ValueError:
            pass
    encoded = sglang_key.encode()
    return encoded if 0 < len(encoded) <= 64 else hashlib.sha256(encoded).digest()


def _setting(extra: Dict[str, Any], name: str, default: str) -> str:
    value = extra.get(name)
    if value is None:
        value = os.environ.get(name.upper(), default)
    return str(value)


def _is_mla(host_pool: Any) -> bool:
    return not hasattr(host_pool, "head_num") or type(host_pool).__name__.startswith("MLA")


class KvPageCopier:
    """Copies SGLang host-pool KV pages to and from a page's "kv" part, one torch copy per page
    with no intermediate buffer. The stored order is canonical, K then V (MLA: the latent once),
    each [token][layer][head][head_dim], so every host layout reads what any other wrote."""

    def __init__(self, host_pool: Any) -> None:
        self.pool = host_pool
        self.layout = str(getattr(host_pool, "layout", "layer_first"))
        self.page_size = int(host_pool.page_size)
        self.dtype = host_pool.dtype
        self.mla = _is_mla(host_pool)
        buffer = host_pool.kv_buffer
        if self.mla:
            # [layer][token][1][dim] layer-first, [token][layer][1][dim] page-first,
            # [page][layer][page_size][1][dim] page-first-direct.
            self.shape: Tuple[int, ...] = (self.page_size, int(host_pool.layer_num),
                                           *buffer.shape[-2:])
        else:
            self.shape = (2, self.page_size, int(host_pool.layer_num), int(host_pool.head_num),
                          int(host_pool.head_dim))
        self.page_bytes = _element_size(self.dtype)
        for size in self.shape:
            self.page_bytes *= int(size)
        if self.layout not in ("layer_first", "page_first", "page_first_direct", "page_head"):
            raise ValueError(f"kvcache: SGLang host layout '{self.layout}' is not supported")

    def host_page(self, token_index: int) -> Any:
        """The host pool's page starting at `token_index`, as a view in the canonical shape."""
        buffer, size, page = self.pool.kv_buffer, self.page_size, token_index // self.page_size
        if self.mla:
            if self.layout == "page_first":
                return buffer[token_index:token_index + size]
            if self.layout == "layer_first":
                return buffer[:, token_index:token_index + size].transpose(0, 1)
            return buffer[page].transpose(0, 1)  # page_first_direct
        if self.layout == "page_first":
            return buffer[:, token_index:token_index + size]
        if self.layout == "layer_first":
            return buffer[:, :, token_index:token_index + size].transpose(1, 2)
        if self.layout == "page_first_direct":
            return buffer[:, page].transpose(1, 2)
        return buffer[:, page].permute(0, 2, 3, 1, 4)  # page_head: [2][head][token][layer][dim]

    def stored(self, part: Any) -> Any:
        """A page's "kv" part (a uint8 tensor) viewed in the canonical shape."""
        return part.view(self.dtype).view(self.shape)


class KvCacheStorage(_Base):  # type: ignore[misc,valid-type]
    """SGLang HiCacheStorage on a kvcache daemon (module docstring). Constructed by SGLang's
    StorageBackendFactory as cls(storage_config, kwargs); register_mem_pool_host follows."""

    def __init__(self, storage_config: Any, kwargs: Optional[Dict[str, Any]] = None,
                 *, client_factory: Optional[Callable[[], Client]] = None) -> None:
        self.config = storage_config
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.extra = extra
        self.pool_name = _setting(extra, "kvcache_pool", "default")
        self.target = _setting(extra, "kvcache_target", "") or None
        token_file = _setting(extra, "kvcache_token_file", "")
        token = open(token_file).read().strip() if token_file else None
        # No retries: a call to a daemon that is down fails at once (a miss) instead of
        # holding SGLang's storage thread for the client's whole deadline.
        self._client_factory = client_factory or (lambda: Client(
            self.target, bearer_token=token, allow_plaintext_token=bool(token),
            retry=RetryPolicy(enabled=False)))
        self.mla = bool(getattr(storage_config, "is_mla_model", False))
        self.tp_rank = int(getattr(storage_config, "tp_rank", 0))
        self.mem_pool_host: Any = None
        self.registered_pools: Dict[str, Any] = {}
        self.copier: Optional[KvPageCopier] = None
        self._lock = threading.Lock()
        self._reopen_lock = threading.Lock()  # one thread opens the next session, not each
        self._client: Optional[Client] = None
        self._session: Any = None
        self._mapped: Any = None
        self._pool: Optional[PoolInfo] = None
        self._down_until = 0.0
        self._logged_at = 0.0
        self._staged: Dict[bytes, Dict[str, Any]] = {}  # key -> part -> flat page (v2 first)
        self.client = self._client_factory()  # fails the engine's start when unreachable

    # --- registration (SGLang calls these once, before its storage threads start) ------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
        self.registered_pools[KV_PART] = mem_pool_host
        self.copier = KvPageCopier(mem_pool_host)
        self._open()

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        name = str(getattr(host_pool_name, "value", host_pool_name))
        self.registered_pools[name] = host_pool
        if self._pool is not None and name != KV_PART:
            self._part(name)  # a pool without that part fails the engine's start, not a request

    # --- the session, opened again after a daemon restart ------------------------------------

    def manifest(self, pool: PoolInfo) -> CompatibilityManifest:
        """The manifest this engine process stores under: model, config digest, dtype, page
        size, the pool's parts, and the process's parallel place (MLA: no tensor parallel)."""
        assert self.copier is not None
        config = self.config
        parallel = ParallelGeometry(
            tp_size=1 if self.mla else int(getattr(config, "tp_size", 1)),
            tp_rank=0 if self.mla else self.tp_rank,
            pp_size=int(getattr(config, "pp_size", 1)), pp_rank=int(getattr(config, "pp_rank", 0)),
            cp_size=int(getattr(config, "attn_cp_size", 1)),
            cp_rank=int(getattr(config, "attn_cp_rank", 0)))
        return CompatibilityManifest(
            model_id=str(getattr(config, "model_name", None) or "sglang-model"),
            model_config_digest=self._model_config_digest(),
            kv_dtype=_DTYPES.get(str(self.copier.dtype), str(self.copier.dtype)),
            page_tokens=self.copier.page_size,
            parts=tuple(PagePart(part.name, part.bytes) for part in pool.parts),
            parallel=parallel, key_hash_algorithm=KEY_HASH_ALGORITHM)

    def _model_config_digest(self) -> bytes:
        """Configured (kvcache_model_config_digest, hex), else sha256 of what changes the KV:
        the model's config.json when the model name is a local path, SGLang's server arguments
        that change it (revision, context length, KV dtype), the host pool's KV geometry."""
        configured = self.extra.get("kvcache_model_config_digest")
        if configured:
            return bytes.fromhex(str(configured))
        assert self.copier is not None
        facts: Dict[str, Any] = {"mla": self.copier.mla, "page": list(self.copier.shape),
                                 "dtype": str(self.copier.dtype)}
        model = str(getattr(self.config, "model_name", None) or "")
        config_path = os.path.join(model, "config.json")
        if model and os.path.isfile(config_path):
            with open(config_path, "rb") as config_file:
                facts["config.json"] = hashlib.sha256(config_file.read()).hexdigest()
        try:  # the running server's arguments, when SGLang is there
            from sglang.srt.server_args import get_global_server_args
            args = get_global_server_args()
            for name in ("revision", "context_length", "kv_cache_dtype", "quantization",
                         "json_model_override_args"):
                facts[name] = str(getattr(args, name, None))
        except Exception:  # noqa: BLE001 - older SGLang, or none
            pass
        return hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).digest()

    def _open(self) -> None:
        """Describes the pool, checks its "kv" part holds a SGLang page, opens the session
        under this process's manifest and maps the pool."""
        assert self.copier is not None
        pool = self.client.describe_pool(self.pool_name).pool
        parts = {part.name: part for part in pool.parts}
        kv = parts.get(KV_PART)
        if kv is None or kv.bytes != self.copier.page_bytes:
            raise ValueError(
                f"kvcache pool '{self.pool_name}': its part '{KV_PART}' must hold one SGLang page "
                f"of {self.copier.page_bytes} bytes ({self.copier.shape} of "
                f"{self.copier.dtype}); it has {kv.bytes if kv else 'no such part'}")
        session = self.client.open_session(f"sglang-tp{self.tp_rank}",
                                           manifest=self.manifest(pool))
        try:
            mapped = session.map_pool(self.pool_name)
        except BaseException:
            _close_quietly(session)
            raise
        with self._lock:
            self._pool, self._session, self._mapped = pool, session, mapped

    def _current(self) -> Optional[Tuple[Any, Any]]:
        """(session, mapped pool) while the session is usable; a session whose lease ended or
        whose daemon restarted (the session says so) is dropped and closed here."""
        with self._lock:
            session, mapped = self._session, self._mapped
            if session is not None and not (session.lost or session.epoch_changed):
                return session, mapped
            self._session, self._mapped = None, None
        _close_quietly(mapped, session)
        return None

    def _live(self) -> Optional[Tuple[Any, Any]]:
        """(session, mapped pool), opening a new session when there is none (a restarted
        daemon, a lost lease), or after a failure once _RETRY_SECONDS passed; None while the
        daemon stays unreachable."""
        live = self._current()
        if live is not None:
            return live
        with self._reopen_lock:
            live = self._current()  # another storage thread may have opened it meanwhile
            if live is not None or time.monotonic() < self._down_until:
                return live
            try:
                self._open()
            except Exception as error:  # noqa: BLE001 - a miss, never an exception in the engine
                self._failed("reopen", error)
                return None
            return self._current()

    def _failed(self, what: str, error: BaseException) -> None:
        """Records a failed call: misses until _RETRY_SECONDS pass, then a new session."""
        with self._lock:
            old, self._session = self._session, None
            old_mapped, self._mapped = self._mapped, None
            self._down_until = time.monotonic() + _RETRY_SECONDS
            now = time.monotonic()
            log = now - self._logged_at >= _LOG_SECONDS
            if log:
                self._logged_at = now
        if log:
            logger.warning("kvcache %s failed, treated as misses: %s", what, error)
        _close_quietly(old_mapped, old)

    def _part(self, name: str) -> Any:
        assert self._pool is not None
        for part in self._pool.parts:
            if part.name == name:
                return part
        raise ValueError(f"kvcache pool '{self.pool_name}' has no part '{name}' for SGLang's "
                         f"'{name}' host pool (its parts: "
                         f"{', '.join(p.name for p in self._pool.parts)})")

    # --- zero-copy v1: host indices into the registered KV host pool --------------------------

    def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
        """Leading pages whose KV the daemon can restore (any tier)."""
        live = self._live()
        if live is None or not keys:
            return 0
        try:
            return int(live[0].exists_pages(self.pool_name, [page_key(k) for k in keys],
                                            parts=(KV_PART,)).num_pages)
        except Exception as error:  # noqa: BLE001
            self._failed("exists", error)
            return 0

    def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None
                     ) -> List[bool]:
        """Stores the pages at host_indices (page_size indices per key) under keys."""
        if self.mla and self.tp_rank != 0:
            return [True] * len(keys)  # rank 0 stores the bytes every rank holds
        assert self.copier is not None
        copier, size = self.copier, self.copier.page_size
        starts = [int(host_indices[i * size]) for i in range(len(keys))]
        return self._write(keys, {KV_PART: lambda i, part: copier.stored(part).copy_(
            copier.host_page(starts[i]))})

    def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None
                     ) -> List[bool]:
        """Loads the leading pages the daemon has into host_indices; True for each loaded."""
        assert self.copier is not None
        copier, size = self.copier, self.copier.page_size
        starts = [int(host_indices[i * size]) for i in range(len(keys))]
        return self._read(keys, KV_PART, lambda i, part: copier.host_page(starts[i]).copy_(
            copier.stored(part)))

    def _write(self, keys: Sequence[str], writers: Dict[str, Callable[[int, Any], Any]]
               ) -> List[bool]:
        """Reserves a page per key with the parts of `writers` (and parts staged by
        batch_set_v2 for those keys), has each writer copy into its part, commits."""
        live = self._live()
        if live is None or not keys:
            return [False] * len(keys)
        session, mapped = live
        page_keys = [page_key(k) for k in keys]
        with self._lock:
            staged = [self._staged.pop(key, {}) for key in page_keys]
        assert self._pool is not None
        masks = [self._pool.part_mask(list(writers) + list(extra)) for extra in staged]
        reservation = None
        try:
            reservation = session.reserve_pages(self.pool_name, page_keys, part_masks=masks)
            checksums = []
            for i, block in enumerate(reservation.block_ids):
                if block is None:
                    continue  # present already with these parts
                for name, write in writers.items():
                    write(i, mapped.part_tensor(block, name))
                for name, flat in staged[i].items():
                    mapped.part_tensor(block, name).copy_(flat)
                # Taken while the page is in cache: the daemon need not read it back.
                checksums.append(xxhash.xxh3_64_intdigest(mapped.page(block).data))
            session.commit_pages(reservation, checksums)
            return [True] * len(keys)
        except Exception as error:  # noqa: BLE001
            self._abandon(session, reservation)
            self._failed("set", error)
            return [False] * len(keys)

    def _read(self, keys: Sequence[str], part: str, read: Callable[[int, Any], Any]
              ) -> List[bool]:
        """Acquires the leading pages whose `part` the hit rule gives, has `read` copy each out,
        releases them."""
        live = self._live()
        if live is None or not keys:
            return [False] * len(keys)
        session, mapped = live
        acquired = None
        try:
            acquired = session.acquire_pages(self.pool_name, [page_key(k) for k in keys],
                                             parts=(part,))
            bit = self._pool.part_mask([part]) if self._pool is not None else 1
            found = [False] * len(keys)
            for i, (block, mask) in enumerate(zip(acquired.block_ids, acquired.part_masks)):
                if mask & bit:
                    read(i, mapped.part_tensor(block, part))
                    found[i] = True
            session.release(acquired.sequence_id)
            return found
        except Exception as error:  # noqa: BLE001
            self._abandon(session, acquired)
            self._failed("get", error)
            return [False] * len(keys)

    @staticmethod
    def _abandon(session: Any, held: Any) -> None:
        if held is None:
            return
        try:
            session.release(held.sequence_id)
        except Exception:  # noqa: BLE001 - the session's end releases it anyway
            pass

    # --- multi-pool v2: PoolTransfer per host pool, each a part of the same pages ------------

    def batch_exists_v2(self, keys: List[str], pool_transfers: Optional[List[Any]] = None,
                        extra_info: Any = None) -> Any:
        """The daemon's one endpoint every requested part can restore (its hit rule), for the
        KV and each transfer's pool; every pool's count is that endpoint."""
        names = [KV_PART] + [str(getattr(t.name, "value", t.name)) for t in pool_transfers or []]
        live = self._live()
        hits = 0
        if live is not None and keys:
            try:
                hits = int(live[0].exists_pages(self.pool_name, [page_key(k) for k in keys],
                                                parts=tuple(dict.fromkeys(names))).num_pages)
            except Exception as error:  # noqa: BLE001
                self._failed("exists", error)
        return _TransferResult(hits, {name: hits for name in names} if hits else {})

    def batch_set_v2(self, transfers: List[Any], extra_info: Any = None
                     ) -> Dict[str, List[bool]]:
        """With the KV among the transfers, one reservation writes every part of each page.
        Without it (SGLang's hybrid backup writes the other pools first, then the KV with
        batch_set_v1), their parts wait here, copied, and join the KV's pages."""
        by_name = {str(getattr(t.name, "value", t.name)): t for t in transfers}
        if KV_PART not in by_name:
            staged: Dict[str, List[bool]] = {}
            with self._lock:
                for name, transfer in by_name.items():
                    pages = self._flat_pages(name, transfer)
                    for key, flat in zip(transfer.keys or [], pages):
                        if len(self._staged) >= _MAX_STAGED_PAGES:
                            self._staged.pop(next(iter(self._staged)))
                        self._staged.setdefault(page_key(key), {})[name] = flat
                    staged[name] = [True] * len(pages)
            return staged
        kv = by_name[KV_PART]
        order = list(kv.keys or [])
        with self._lock:
            for name, transfer in by_name.items():
                if name == KV_PART:
                    continue
                for key, flat in zip(transfer.keys or [], self._flat_pages(name, transfer)):
                    self._staged.setdefault(page_key(key), {})[name] = flat
        done = dict(zip(order, self.batch_set_v1(order, kv.host_indices)))
        return {name: [done.get(key, False) for key in t.keys or []]
                for name, t in by_name.items()}

    def batch_get_v2(self, transfers: List[Any], extra_info: Any = None
                     ) -> Dict[str, List[bool]]:
        """Each transfer's part into its host pool (the KV by the zero-copy path, the others
        through their host pool's flat pages)."""
        results: Dict[str, List[bool]] = {}
        for transfer in transfers:
            name = str(getattr(transfer.name, "value", transfer.name))
            keys = list(transfer.keys or [])
            if name == KV_PART:
                results[name] = self.batch_get_v1(keys, transfer.host_indices)
                continue
            host_pool = self.registered_pools.get(name)
            if host_pool is None:
                results[name] = [False] * len(keys)
                continue
            size = int(getattr(host_pool, "page_size", 1) or 1)
            indices = transfer.host_indices

            def load(i: int, part: Any, pool: Any = host_pool, size: int = size,
                     indices: Any = indices) -> None:
                page = pool.get_dummy_flat_data_page()
                flat = page.view(-1).view(_uint8(page))
                flat.copy_(part[:flat.numel()])
                pool.set_from_flat_data_page(int(indices[i * size]), page)

            results[name] = self._read(keys, name, load)
        return results

    def _flat_pages(self, name: str, transfer: Any) -> List[Any]:
        """Copies of the transfer's pages from its host pool, as flat uint8 tensors."""
        host_pool = self.registered_pools[name]
        size = int(getattr(host_pool, "page_size", 1) or 1)
        part_bytes = self._part(name).bytes
        pages = []
        for i in range(len(transfer.keys or [])):
            flat = host_pool.get_data_page(int(transfer.host_indices[i * size]), flat=True)
            flat = flat.contiguous().view(-1).view(_uint8(flat)).clone()
            if flat.numel() != part_bytes:
                raise ValueError(f"kvcache pool '{self.pool_name}': part '{name}' has "
                                 f"{part_bytes} bytes, SGLang's '{name}' page {flat.numel()}")
            pages.append(flat)
        return pages

    # --- the deprecated whole-page calls (SGLang without interface_v1) ------------------------

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        got = self.batch_get([key], [target_location])
        return got[0] if isinstance(got, list) else None

    def batch_get(self, keys: List[str], target_locations: Any = None,
                  target_sizes: Any = None) -> List[Any]:
        """Fills SGLang's flat dummy pages (target_locations) with the leading pages found."""
        targets = list(target_locations or [])

        def load(i: int, part: Any) -> None:
            targets[i].view(-1).view(_uint8(part)).copy_(part)

        found = self._read(keys, KV_PART, load)
        return [targets[i] if hit else None for i, hit in enumerate(found)]

    def set(self, key: str, value: Any = None, target_location: Any = None,
            target_sizes: Any = None) -> bool:
        return self.batch_set([key], [value])

    def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None,
                  target_sizes: Any = None) -> bool:
        """Stores SGLang's flat pages (get_data_page of its host pool: its own layout's bytes,
        so only engines of one host layout share what this path wrote)."""
        pages = list(values or [])
        if self.mla and self.tp_rank != 0:
            return True
        return all(self._write(keys, {KV_PART: lambda i, part: part.copy_(
            pages[i].contiguous().view(-1).view(_uint8(pages[i])))}))

    def clear(self) -> None:
        """Nothing: the daemon's pages are shared with other engines; its eviction frees them."""

    def get_stats(self) -> None:
        return None

    def close(self) -> None:
        """Ends the session (its reservations and pins with it) and the connection."""
        with self._lock:
            session, mapped, self._session, self._mapped = self._session, self._mapped, None, None
            self._down_until = float("inf")
        _close_quietly(mapped, session, self.client)


def _close_quietly(*closables: Any) -> None:
    """Closes each of `closables` (None skipped); a daemon that is gone makes no error."""
    for closable in closables:
        try:
            if closable is not None:
                closable.close()
        except Exception:  # noqa: BLE001 - the daemon may be gone
            pass


def _element_size(dtype: Any) -> int:
    """Bytes per element (torch before 2.1 has no dtype.itemsize)."""
    import torch
    return int(torch.empty(0, dtype=dtype).element_size())


def _uint8(tensor: Any) -> Any:
    import torch  # SGLang's processes have it; the module imports without it
    del tensor
    return torch.uint8
