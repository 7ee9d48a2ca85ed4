"""write_pages and read_pages_into on the same node: their sources and destinations checked
against the pool before any block is reserved or pinned, and each page's bytes copied once
between them and the mapped pool (numpy slice assignment, or torch's copy_ for tensors, a
device tensor included: no intermediate bytes object).

A source or destination is a whole page (a buffer of block_bytes), or a dict {part name: a
buffer of that part's bytes}. torch tensors are taken as they are (contiguous, any dtype, CPU or
device); anything else through the buffer protocol (bytes, bytearray, memoryview, numpy).

Imported by the sessions on first use: it needs numpy, as the mapping does.

Thread safety: a plan belongs to one call.
"""

import sys
from typing import Any, Dict, List, Optional, Sequence, Union

import numpy
import xxhash

from . import _pages
from ._session_core import as_bytes_view
from .errors import invalid_argument
from .mapped_pool import MappedPool
from .values import AcquiredPages, PageReservation, PoolInfo

Bytes = Any  # a flat uint8 numpy array or a flat uint8 torch tensor
Page = Union[Bytes, Dict[str, Bytes]]


def _flat_bytes(call: str, buffer: Any, writable: bool) -> Bytes:
    """`buffer` as a flat uint8 array over its memory (never a copy): a torch tensor as a
    uint8 tensor, anything else as a numpy array through the buffer protocol."""
    torch = sys.modules.get("torch")  # only a tensor needs it, and a tensor brought it in
    if torch is not None and isinstance(buffer, torch.Tensor):
        if not buffer.is_contiguous():
            raise invalid_argument(f"{call}: the tensor must be contiguous")
        return buffer.reshape(-1).view(torch.uint8)
    return numpy.frombuffer(as_bytes_view(call, buffer, writable), dtype=numpy.uint8)


def _copy(destination: Bytes, source: Bytes) -> None:
    """One copy, destination and source of equal size: numpy's own between arrays, torch's
    copy_ (device to host or back) when either is a tensor."""
    if isinstance(destination, numpy.ndarray) and isinstance(source, numpy.ndarray):
        destination[...] = source
        return
    torch = sys.modules["torch"]
    if isinstance(destination, numpy.ndarray):
        destination = torch.from_numpy(destination)
    if isinstance(source, numpy.ndarray):
        source = torch.from_numpy(source)
    destination.copy_(source)


def _sized(call: str, buffer: Any, size: int, writable: bool, what: str) -> Bytes:
    flat = _flat_bytes(call, buffer, writable)
    if flat.shape[0] != size:
        raise invalid_argument(f"{call}: {what} has {flat.shape[0]} bytes, want {size}")
    return flat


def _pages_of(call: str, buffers: Sequence[Any], num_keys: int, what: str) -> List[Any]:
    if isinstance(buffers, dict) or not hasattr(buffers, "__len__"):
        raise invalid_argument(f"{call}: {what} must be a sequence, one per key")
    listed = list(buffers)
    if len(listed) != num_keys:
        raise invalid_argument(f"{call}: {len(listed)} {what} for {num_keys} keys")
    return listed


def _by_part(call: str, pool: PoolInfo, index: int, parts: Dict[str, Any],
             writable: bool, what: str) -> Dict[str, Bytes]:
    sizes = {part.name: part.bytes for part in pool.parts}
    flat = {}
    for name, buffer in parts.items():
        if name not in sizes:
            pool.part_mask([name])  # INVALID_ARGUMENT naming it and the pool's parts
        flat[name] = _sized(call, buffer, sizes[name], writable,
                            f"{what} {index} part '{name}'")
    return flat


class PageWrite:
    """write_pages' sources, checked: `keys`, `part_masks` for ReservePages (empty when every
    page is whole and none were given), then copy_into the reserved blocks."""

    def __init__(self, pool: PoolInfo, keys: List[bytes], sources: Sequence[Any],
                 part_masks: Optional[Sequence[int]]) -> None:
        call = "write_pages"
        self.keys = keys
        masks = _pages.part_masks(call, part_masks, len(keys))
        every = pool.part_mask()
        self._sources: List[Page] = []
        derived = []
        for index, source in enumerate(_pages_of(call, sources, len(keys), "sources")):
            if isinstance(source, dict):
                if not source:
                    raise invalid_argument(f"{call}: source {index} names no part")
                parts = _by_part(call, pool, index, source, False, "source")
                mask = pool.part_mask(list(parts))
                if masks and masks[index] != mask:
                    raise invalid_argument(
                        f"{call}: source {index} holds parts {sorted(parts)} (mask {mask}), "
                        f"part_masks[{index}] is {masks[index]}: give the bytes of exactly the "
                        "parts the page carries")
                self._sources.append(parts)
                derived.append(mask)
            else:
                self._sources.append(_sized(call, source, pool.layout.block_bytes, False,
                                            f"source {index}"))
                derived.append(every)
        for index, mask in enumerate(masks):
            if mask & ~every:
                raise invalid_argument(f"{call}: part_masks[{index}] is {mask}; pool "
                                       f"'{pool.name}' has {len(pool.parts)} parts")
        has_parts = any(isinstance(source, dict) for source in self._sources)
        self.part_masks = masks or (derived if has_parts else [])

    def copy_into(self, mapped: MappedPool, reservation: PageReservation) -> List[int]:
        """Each non-duplicate page's source into its reserved block; returns each written
        page's XXH3-64, taken right after its copy while its bytes are in cache, for the commit
        (the daemon then need not read every page back)."""
        checksums = []
        for block, source in zip(reservation.block_ids, self._sources):
            if block is None:
                continue
            if isinstance(source, dict):
                for name, part in source.items():
                    _copy(mapped.part(block, name), part)
            else:
                _copy(mapped.page(block), source)
            checksums.append(xxhash.xxh3_64_intdigest(mapped.page(block).data))
        return checksums


class PageRead:
    """read_pages_into's destinations, checked: a buffer takes the whole page (parts empty) or
    the asked parts one after another in the order asked; a dict {part: buffer} takes exactly
    the asked parts (every part when none are asked)."""

    def __init__(self, pool: PoolInfo, num_keys: int, destinations: Sequence[Any],
                 parts: Sequence[str]) -> None:
        call = "read_pages_into"
        names = _pages.part_names(call, parts)
        pool.part_mask(names)  # INVALID_ARGUMENT for a name the pool lacks, before a pin
        self._parts = {part.name: (bit, part) for bit, part in enumerate(pool.parts)}
        self._names = names  # empty: the whole page
        asked = set(names or self._parts)
        whole = sum(self._parts[name][1].bytes for name in names) or pool.layout.block_bytes
        self._destinations: List[Page] = []
        for index, destination in enumerate(
                _pages_of(call, destinations, num_keys, "destinations")):
            if isinstance(destination, dict):
                if set(destination) != asked:
                    raise invalid_argument(
                        f"{call}: destination {index} names parts {sorted(destination)}; the "
                        f"read asks for {sorted(asked)}")
                self._destinations.append(_by_part(call, pool, index, destination, True,
                                                   "destination"))
            else:
                self._destinations.append(_sized(call, destination, whole, True,
                                                 f"destination {index}"))

    def copy_out(self, mapped: MappedPool, pages: AcquiredPages, verify: bool) -> None:
        """Each acquired page's parts into its destination, after its checksum (over the page
        in the pool) when `verify`. A part the page does not hold (a trailing part of an inner
        page) leaves its destination untouched."""
        for index, (block, checksum, mask) in enumerate(
                zip(pages.block_ids, pages.checksums, pages.part_masks)):
            page = mapped.page(block)
            if verify:
                got = _pages.page_checksum(page)
                if got != checksum:
                    raise _pages.checksum_mismatch("read_pages_into", index, got, checksum)
            destination = self._destinations[index]
            if isinstance(destination, dict):
                for name, flat in destination.items():
                    if mask >> self._parts[name][0] & 1:
                        _copy(flat, mapped.part(block, name))
            elif not self._names:
                _copy(destination, page)
            else:
                offset = 0
                for name in self._names:
                    bit, part = self._parts[name]
                    if mask >> bit & 1:
                        _copy(destination[offset:offset + part.bytes], mapped.part(block, name))
                    offset += part.bytes
