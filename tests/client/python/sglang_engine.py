"""What SGLang's HiCache does around a storage backend, for the conformance driver and the bench.

Written from SGLang's source at commit 001067fffe33427bee0ed2f007fb7551a1d76b44:
- python/sglang/srt/mem_cache/hicache_storage.py: HiCacheStorageConfig, PoolTransfer,
  PoolHitPolicy, STORAGE_BATCH_SIZE (128);
- python/sglang/srt/mem_cache/storage/backend_factory.py: `dynamic` imports extra_config's
  module_path, takes class_name and constructs it as cls(storage_config, kwargs);
- python/sglang/srt/managers/cache_controller.py: attach_storage_backend (create, then
  register_mem_pool_host; interface_v1 selects the zero-copy page functions),
  _storage_hit_query (batch_exists per 128 keys, stopping at the first short batch),
  _page_transfer (batch_get_v1 per 128 keys with host_indices[i*page_size:(i+n)*page_size],
  counting the leading successes), _page_backup (batch_set_v1 per 128 keys, all(...)), each on
  its own thread (prefetch, prefetch I/O, backup);
- python/sglang/srt/mem_cache/pool_host/mha.py (read at 0047d999): the host KV buffer's shape
  per layout; hybrid_cache_controller._page_backup: batch_set_v2 of the other pools first, then
  the KV through batch_set_v1.
No SGLang is installed: these classes build the same tensors and make the same calls.
"""

import dataclasses
import hashlib
import importlib
import threading
from typing import Any, Dict, List, Optional

import torch

STORAGE_BATCH_SIZE = 128


@dataclasses.dataclass
class HiCacheStorageConfig:
    """SGLang's, field for field (hicache_storage.py)."""
    tp_rank: int
    tp_size: int
    pp_rank: int
    pp_size: int
    attn_cp_rank: int
    attn_cp_size: int
    is_mla_model: bool
    enable_storage_metrics: bool
    is_page_first_layout: bool
    model_name: Optional[str]
    dp_rank: int = 0
    dp_size: int = 1
    tp_lcm_size: Optional[int] = None
    should_split_heads: bool = False
    extra_config: Optional[dict] = None


@dataclasses.dataclass
class PoolTransfer:
    """SGLang's PoolTransfer (name is a PoolName, a str enum: its value here)."""
    name: str
    host_indices: Optional[torch.Tensor] = None
    device_indices: Optional[torch.Tensor] = None
    keys: Optional[List[str]] = None
    hit_policy: str = "all_pages"
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[str] = None


class MHAHostPool:
    """MHATokenToKVPoolHost's buffer: kv_buffer of init_kv_buffer's dims per layout."""

    def __init__(self, layout: str, pages: int, page_size: int = 16, layers: int = 2,
                 heads: int = 2, head_dim: int = 64, dtype: torch.dtype = torch.bfloat16) -> None:
        self.layout, self.page_size, self.dtype = layout, page_size, dtype
        self.size, self.page_num = pages * page_size, pages
        self.layer_num, self.head_num, self.head_dim = layers, heads, head_dim
        dims = {"layer_first": (2, layers, self.size, heads, head_dim),
                "page_first": (2, self.size, layers, heads, head_dim),
                "page_first_direct": (2, pages, layers, page_size, heads, head_dim),
                "page_head": (2, pages, heads, page_size, layers, head_dim)}[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def page(self, token_index: int) -> torch.Tensor:
        """The page at token_index as K then V, [token][layer][head][dim]: what the engine's
        device pool gave it, whatever the layout (the driver's reference)."""
        size, page = self.page_size, token_index // self.page_size
        buffer = self.kv_buffer
        if self.layout == "page_first":
            view = buffer[:, token_index:token_index + size]
        elif self.layout == "layer_first":
            view = buffer[:, :, token_index:token_index + size].transpose(1, 2)
        elif self.layout == "page_first_direct":
            view = buffer[:, page].transpose(1, 2)
        else:
            view = buffer[:, page].permute(0, 2, 3, 1, 4)
        return view

    def fill(self, token_index: int, seed: int) -> None:
        """Gives the page at token_index the bytes of `seed` (as a forward pass would)."""
        self.page(token_index).copy_(pattern(seed, self.page(token_index).shape, self.dtype))


class MLAHostPool:
    """MLATokenToKVPoolHost's buffer: one latent per token, [layer][token][1][dim] layer-first,
    [token][layer][1][dim] page-first."""

    def __init__(self, layout: str, pages: int, page_size: int = 16, layers: int = 2,
                 dim: int = 256, dtype: torch.dtype = torch.bfloat16) -> None:
        self.layout, self.page_size, self.dtype = layout, page_size, dtype
        self.size, self.layer_num = pages * page_size, layers
        dims = {"layer_first": (layers, self.size, 1, dim),
                "page_first": (self.size, layers, 1, dim)}[layout]
        self.kv_buffer = torch.zeros(dims, dtype=dtype)

    def page(self, token_index: int) -> torch.Tensor:
        size = self.page_size
        if self.layout == "page_first":
            return self.kv_buffer[token_index:token_index + size]
        return self.kv_buffer[:, token_index:token_index + size].transpose(0, 1)

    def fill(self, token_index: int, seed: int) -> None:
        self.page(token_index).copy_(pattern(seed, self.page(token_index).shape, self.dtype))


class StateHostPool:
    """A Mamba-like side pool: one state of `state_bytes` per slot, page_size 1, reached through
    the flat-page calls every SGLang host pool has."""

    page_size = 1

    def __init__(self, slots: int, state_bytes: int = 4096) -> None:
        self.buffer = torch.zeros((slots, state_bytes), dtype=torch.uint8)

    def get_data_page(self, index: int, flat: bool = True) -> torch.Tensor:
        return self.buffer[index].flatten() if flat else self.buffer[index]

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self.buffer.shape[1], dtype=torch.uint8)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        self.buffer[index].copy_(data_page)


def pattern(seed: int, shape: Any, dtype: torch.dtype) -> torch.Tensor:
    """Bytes unique to `seed` (random bits, any dtype: compared as bytes, never as numbers)."""
    generator = torch.Generator().manual_seed(seed)
    numel = 1
    for size in shape:
        numel *= int(size)
    nbytes = numel * torch.tensor([], dtype=dtype).element_size()
    raw = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).view(tuple(shape))


def page_bytes(tensor: torch.Tensor) -> bytes:
    return tensor.contiguous().view(-1).view(torch.uint8).numpy().tobytes()


def get_hash_str(token_ids: List[int], prior_hash: Optional[str], page_size: int) -> List[str]:
    """SGLang's page keys (mem_cache/utils.get_hash_str): sha256 of each page's tokens chained
    to the previous page's key, as hex."""
    keys = []
    for start in range(0, len(token_ids) - page_size + 1, page_size):
        hasher = hashlib.sha256()
        if prior_hash:
            hasher.update(bytes.fromhex(prior_hash))
        for token in token_ids[start:start + page_size]:
            hasher.update(token.to_bytes(4, byteorder="little", signed=False))
        prior_hash = hasher.hexdigest()
        keys.append(prior_hash)
    return keys


def storage_config(extra: Dict[str, Any], *, tp_rank: int = 0, tp_size: int = 1,
                   mla: bool = False, layout: str = "page_first",
                   model: str = "Qwen/Qwen3-0.6B") -> HiCacheStorageConfig:
    """As HiCacheController._generate_storage_config builds it (no DP attention, PP 1)."""
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=False,
        is_page_first_layout=layout == "page_first", model_name=model, extra_config=extra)


def create_backend(config: HiCacheStorageConfig, host_pool: Any) -> Any:
    """StorageBackendFactory._create_dynamic_backend, then attach_storage_backend's
    register_mem_pool_host."""
    extra = config.extra_config or {}
    for field in ("backend_name", "module_path", "class_name"):
        assert field in extra, field
    backend_class = getattr(importlib.import_module(extra["module_path"]), extra["class_name"])
    backend = backend_class(config, {})
    backend.register_mem_pool_host(host_pool)
    assert bool(extra.get("interface_v1", 0)), "the zero-copy page functions need interface_v1"
    return backend


class Controller:
    """The storage half of HiCacheController with interface_v1: the same batching, the same
    result handling, on the same three threads."""

    def __init__(self, backend: Any, page_size: int) -> None:
        self.backend, self.page_size = backend, page_size

    def storage_hit_query(self, keys: List[str]) -> int:
        """_storage_hit_query: leading pages found, in batches of 128."""
        hits = 0
        for start in range(0, len(keys), STORAGE_BATCH_SIZE):
            batch = keys[start:start + STORAGE_BATCH_SIZE]
            found = self.backend.batch_exists(batch, None)
            hits += found
            if found < len(batch):
                break
        return hits

    def page_transfer(self, keys: List[str], host_indices: torch.Tensor) -> int:
        """_page_transfer with _page_get_zero_copy: leading pages loaded."""
        completed = 0
        for start in range(0, len(keys), STORAGE_BATCH_SIZE):
            batch = keys[start:start + STORAGE_BATCH_SIZE]
            indices = host_indices[start * self.page_size:(start + len(batch)) * self.page_size]
            results = self.backend.batch_get_v1(batch, indices, None)
            inc = 0
            for i in range(len(batch)):
                if not results[i]:
                    break
                inc += 1
            completed += inc
            if inc != len(batch):
                break
        return completed

    def page_backup(self, keys: List[str], host_indices: torch.Tensor) -> int:
        """_page_backup with _page_set_zero_copy: pages stored before the first failed batch."""
        stored = 0
        for start in range(0, len(keys), STORAGE_BATCH_SIZE):
            batch = keys[start:start + STORAGE_BATCH_SIZE]
            indices = host_indices[start * self.page_size:(start + len(batch)) * self.page_size]
            if not all(self.backend.batch_set_v1(batch, indices, None)):
                break
            stored += len(batch)
        return stored

    def on_thread(self, name: str, *args: Any) -> Any:
        """Runs one of the calls above on a thread of its own, as the controller does."""
        result: List[Any] = []
        thread = threading.Thread(target=lambda: result.append(getattr(self, name)(*args)),
                                  name=f"sglang-{name}")
        thread.start()
        thread.join(timeout=120)
        assert result, f"{name} raised or hung on its thread"
        return result[0]


def host_indices(pages: List[int], page_size: int) -> torch.Tensor:
    """The host pool's token indices of `pages` (what mem_pool_host.alloc hands out)."""
    return torch.tensor([page * page_size + t for page in pages for t in range(page_size)],
                        dtype=torch.int64)


def tokens_for(round_number: int, pages: int, page_size: int) -> List[int]:
    """Tokens of `pages` pages no other round has (new keys every round)."""
    first = round_number * pages * page_size * 7 + 1
    return list(range(first, first + pages * page_size))
