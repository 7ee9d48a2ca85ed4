"""The integration tests' deterministic KV (tests/integration/kv_pattern.h) in numpy, so Python
writes and checks the same bytes kvcache-test-client does.

Every element is splitmix64 over (token, position, layer, K/V, head, dim); an element holds its
low element_bytes bytes, little-endian.
"""

import numpy
import xxhash

from kvcache_client import PoolLayout

_U64 = numpy.uint64


def block_values(layout: PoolLayout, tokens, block: int) -> numpy.ndarray:
    """The pattern of full block `block` of `tokens`: uint64 [layer][kv][slot][head][dim]."""
    slots = numpy.arange(layout.block_size, dtype=_U64)
    positions = slots + _U64(block * layout.block_size)
    token_ids = numpy.asarray(tokens[block * layout.block_size:(block + 1) * layout.block_size],
                              dtype=_U64)
    layer = numpy.arange(layout.num_layers, dtype=_U64)[:, None, None, None, None]
    kv = numpy.arange(2, dtype=_U64)[None, :, None, None, None]
    head = numpy.arange(layout.num_kv_heads, dtype=_U64)[None, None, None, :, None]
    dim = numpy.arange(layout.head_dim, dtype=_U64)[None, None, None, None, :]
    packed = ((token_ids << _U64(32)) | positions)[None, None, :, None, None]
    coords = (layer << _U64(48)) | (kv << _U64(40)) | (head << _U64(20)) | dim
    x = packed ^ (coords * _U64(0x9E3779B97F4A7C15))
    x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def low_bytes(values: numpy.ndarray, element_bytes: int) -> numpy.ndarray:
    """Each value's low `element_bytes` bytes, little-endian: uint8 [..., element_bytes]."""
    return values.astype("<u8").view(numpy.uint8).reshape(values.shape + (8,))[..., :element_bytes]


def block_bytes(layout: PoolLayout, tokens, block: int) -> bytes:
    return low_bytes(block_values(layout, tokens, block), layout.dtype.element_bytes).tobytes()


def prefix_bytes(layout: PoolLayout, tokens, num_blocks: int) -> bytes:
    return b"".join(block_bytes(layout, tokens, block) for block in range(num_blocks))


def digest(data) -> str:
    """What kvcache-test-client prints for bytes: XXH3-64 in hex."""
    return f"{xxhash.xxh3_64_intdigest(data):016x}"
