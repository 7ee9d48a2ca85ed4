"""Block hash chain, spec v1 (docs/hash_spec.md), written from the spec alone.

Lets routers and other Python services compute the same block hashes as the daemon, e.g. to key
their own prefix-aware routing tables. Needs the `xxhash` module (Debian: python3-xxhash) for the
default algorithm; sha256 needs only the standard library.
"""

import hashlib
import struct
from dataclasses import dataclass, field
from typing import List, Sequence

import xxhash

# Any python-xxhash with XXH3 (2.0 and later). Not a version check: Debian's python3-xxhash
# declares version 0.0.0 whatever it ships.
if not hasattr(xxhash, "xxh3_64_intdigest") or not hasattr(xxhash, "xxh3_128"):
    raise ImportError("kvcache_client needs the xxhash module with XXH3 (python-xxhash 2.0 or "
                      f"later); the one at {getattr(xxhash, '__file__', '?')} has none")

DTYPES = {"fp16": 1, "bf16": 2, "fp32": 3, "fp8_e4m3": 4}


@dataclass
class MultimodalItem:
    content_hash: bytes
    offset: int
    length: int


@dataclass
class ExtraKeys:
    lora_id: bytes = b""
    multimodal_items: List[MultimodalItem] = field(default_factory=list)


def _u32(value: int) -> bytes:
    return struct.pack("<I", value)


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def _str(value: bytes) -> bytes:
    return _u32(len(value)) + value


def _hash(algorithm: str, data: bytes) -> bytes:
    if algorithm == "xxh3_128":
        return xxhash.xxh3_128(data, seed=0).digest()  # canonical: big-endian high, then low
    if algorithm == "sha256":
        return hashlib.sha256(data).digest()[:16]
    raise ValueError(f"unknown hash algorithm {algorithm!r}")


def layout_fingerprint(layers: int, kv_heads: int, head_dim: int, block_size: int,
                       dtype: str) -> int:
    data = (b"kvcache.layout.v1" + _u32(layers) + _u32(kv_heads) + _u32(head_dim)
            + _u32(block_size) + _u32(DTYPES[dtype]))
    return xxhash.xxh3_64_intdigest(data, seed=0)


def root_hash(algorithm: str, model_id: bytes, fingerprint: int, tenant: bytes,
              cache_salt: bytes) -> bytes:
    return _hash(algorithm, b"kvcache.root.v1" + _str(model_id) + _u64(fingerprint)
                 + _str(tenant) + _str(cache_salt))


def _block_extras(extras: ExtraKeys, start: int, end: int) -> bytes:
    overlapping = [item for item in extras.multimodal_items
                   if item.offset < end and item.offset + item.length > start]
    return (_str(extras.lora_id) + _u32(len(overlapping))
            + b"".join(_str(item.content_hash) for item in overlapping))


def chain_hashes(algorithm: str, root: bytes, tokens: Sequence[int], block_size: int,
                 extras: ExtraKeys = ExtraKeys()) -> List[bytes]:
    """Hashes of every full block of `tokens`, h_0 first."""
    hashes = []
    parent = root
    for start in range(0, len(tokens) - block_size + 1, block_size):
        block = tokens[start:start + block_size]
        data = (b"kvcache.block.v1" + parent + _u32(block_size)
                + b"".join(_u32(token) for token in block)
                + _block_extras(extras, start, start + block_size))
        parent = _hash(algorithm, data)
        hashes.append(parent)
    return hashes
