"""The checks and replies of the keyed-page calls (ExistsPages ... PinPages) that need no I/O and
no numpy: a batch's keys, part masks and page buffers, each page's XXH3-64, and the daemon's
replies read into values.

The daemon checks the same inputs (INVALID_ARGUMENT); checking them here first saves a round
trip, and for write_pages it means a bad source is found before any block is reserved. The
limits are the daemon's (kMaxPageKeyBytes, its batch bound).

Thread safety: pure functions.
"""

from typing import Any, List, Optional, Sequence

import grpc

from ._proto import kvcache_pb2
from .errors import KvCacheError, invalid_argument
from .hashing import xxhash  # checked there for XXH3
from .values import AcquiredPages, GotPages, PageHits, PageReservation, PagesPut, TierPages

MAX_PAGE_KEY_BYTES = 64
MAX_PAGES_PER_CALL = 4096
DUPLICATE_BLOCK = (1 << 32) - 1  # ReservePagesResponse.block_ids: present already
_MAX_MASK = (1 << 32) - 1


def page_keys(call: str, keys: Sequence[bytes]) -> List[bytes]:
    """`keys` as the request's bytes: 1 to MAX_PAGES_PER_CALL keys, each 1 to
    MAX_PAGE_KEY_BYTES bytes (bytes, bytearray or memoryview). INVALID_ARGUMENT naming the first
    bad one otherwise. A str is refused rather than encoded: the engine's keys are bytes, and an
    implicit encoding would name another page."""
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise invalid_argument(f"{call}: keys must be a sequence of keys, not one "
                               f"{type(keys).__name__}")
    try:
        listed = list(keys)
    except TypeError:
        raise invalid_argument(f"{call}: keys must be a sequence of bytes, not "
                               f"{type(keys).__name__}") from None
    if not listed:
        raise invalid_argument(f"{call}: no keys (a batch names 1 to {MAX_PAGES_PER_CALL})")
    if len(listed) > MAX_PAGES_PER_CALL:
        raise invalid_argument(f"{call}: {len(listed)} keys; a batch names at most "
                               f"{MAX_PAGES_PER_CALL}")
    for index, key in enumerate(listed):
        if not isinstance(key, bytes):
            if not isinstance(key, (bytearray, memoryview)):
                raise invalid_argument(f"{call}: key {index} is a {type(key).__name__}; keys "
                                       "are bytes")
            key = listed[index] = bytes(key)
        if not 1 <= len(key) <= MAX_PAGE_KEY_BYTES:
            raise invalid_argument(f"{call}: key {index} has {len(key)} bytes; a key has 1 to "
                                   f"{MAX_PAGE_KEY_BYTES}")
    return listed


def part_names(call: str, parts: Sequence[str]) -> List[str]:
    """The parts a read asks for, by name (empty: every part); the daemon knows the pool's."""
    if isinstance(parts, str):
        raise invalid_argument(f"{call}: parts must be a sequence of names, not the str "
                               f"'{parts}'")
    names = list(parts)
    for index, name in enumerate(names):
        if not isinstance(name, str):
            raise invalid_argument(f"{call}: part {index} is a {type(name).__name__}; parts "
                                   "are named by str")
    return names


def part_masks(call: str, masks: Optional[Sequence[int]], num_keys: int) -> List[int]:
    """One mask per key, each non-zero and a uint32; None: empty (every page has every part).
    Whether a mask stays within the pool's parts is the daemon's to say (it knows them)."""
    if masks is None:
        return []
    listed = list(masks)
    if len(listed) != num_keys:
        raise invalid_argument(f"{call}: {len(listed)} part_masks for {num_keys} keys; give one "
                               "per key, or none")
    for index, mask in enumerate(listed):
        if isinstance(mask, bool) or not isinstance(mask, int) and not hasattr(mask, "__index__"):
            raise invalid_argument(f"{call}: part_masks[{index}] is a {type(mask).__name__}, "
                                   "not an int")
        if not 0 < int(mask) <= _MAX_MASK:
            raise invalid_argument(f"{call}: part_masks[{index}] is {int(mask)}; a page carries "
                                   "at least one part (bit i: the pool's part i)")
        listed[index] = int(mask)
    return listed


def block_part_masks(call: str, masks: Optional[Sequence[int]]) -> List[int]:
    """A token call's masks (commit, put_blocks): one per full block from block 0, each checked
    as part_masks checks it; None: empty (every part). The daemon knows the block size and
    checks the count."""
    listed = None if masks is None else list(masks)
    return part_masks(call, listed, len(listed or []))


def page_views(call: str, pages: Any, num_keys: int, block_bytes: int) -> List[memoryview]:
    """`pages` as one view per key, each exactly block_bytes: a sequence of per-page buffers,
    or one buffer of num_keys * block_bytes. INVALID_ARGUMENT naming the page of the wrong
    size, or what is not a buffer."""
    from ._session_core import as_bytes_view as as_view  # it imports this module
    try:
        whole: Optional[memoryview] = memoryview(pages)
    except TypeError:
        whole = None
    if whole is not None:
        view = as_view(call, pages, False)
        if len(view) != num_keys * block_bytes:
            raise invalid_argument(f"{call}: one buffer of {len(view)} bytes for {num_keys} "
                                   f"pages of {block_bytes} bytes: want "
                                   f"{num_keys * block_bytes}")
        return [view[start:start + block_bytes]
                for start in range(0, len(view), block_bytes)]
    listed = list(pages)
    if len(listed) != num_keys:
        raise invalid_argument(f"{call}: {len(listed)} pages for {num_keys} keys")
    views = []
    for index, page in enumerate(listed):
        view = as_view(f"{call}: page {index}", page, False)
        if len(view) != block_bytes:
            raise invalid_argument(f"{call}: page {index} has {len(view)} bytes; a page has "
                                   f"the pool's block_bytes, {block_bytes}")
        views.append(view)
    return views


def page_checksum(page: Any) -> int:
    """XXH3-64 (seed 0) of one whole page, as the daemon computes it (common/block_checksum.h)."""
    return int(xxhash.xxh3_64_intdigest(page))


def checksum_mismatch(call: str, index: int, got: int, expected: int) -> KvCacheError:
    return KvCacheError(grpc.StatusCode.DATA_LOSS,
                        f"{call}: page {index} failed its checksum: XXH3-64 {got:016x}, the "
                        f"daemon's {expected:016x}")


def _inconsistent(call: str, what: str) -> KvCacheError:
    return KvCacheError(grpc.StatusCode.INTERNAL, f"{call}: inconsistent reply from the daemon: "
                        f"{what}")


def page_hits(response: kvcache_pb2.ExistsPagesResponse) -> PageHits:
    return PageHits(num_pages=response.num_pages,
                    by_tier=TierPages.from_proto(response.pages_by_tier))


def pages_put(response: Any) -> PagesPut:
    """CommitPagesResponse and PutPagesResponse alike."""
    return PagesPut(num_published=response.num_published,
                    num_duplicates=response.num_duplicates)


def reservation(pool: str, num_keys: int,
                response: kvcache_pb2.ReservePagesResponse) -> PageReservation:
    if len(response.block_ids) != num_keys:
        raise _inconsistent("ReservePages", f"{len(response.block_ids)} block ids for "
                            f"{num_keys} keys")
    return PageReservation(
        pool=pool, sequence_id=response.sequence_id,
        block_ids=tuple(None if block == DUPLICATE_BLOCK else block
                        for block in response.block_ids))


def _hit_lists(call: str, num_keys: int, *lists: Sequence[Any]) -> int:
    """The hit's page count; INTERNAL unless every per-page list has it, at most num_keys."""
    count = len(lists[0])
    if count > num_keys or any(len(other) != count for other in lists):
        raise _inconsistent(call, f"per-page lists of {[len(other) for other in lists]} entries "
                            f"for {num_keys} keys")
    return count


def acquired(pool: str, num_keys: int,
             response: kvcache_pb2.AcquirePagesResponse) -> AcquiredPages:
    _hit_lists("AcquirePages", num_keys, response.block_ids, response.page_checksums,
               response.part_masks)
    return AcquiredPages(pool=pool, sequence_id=response.sequence_id,
                         block_ids=tuple(response.block_ids),
                         checksums=tuple(response.page_checksums),
                         part_masks=tuple(response.part_masks),
                         by_tier=TierPages.from_proto(response.pages_by_tier))


def got_pages(num_keys: int, response: kvcache_pb2.GetPagesResponse) -> GotPages:
    """The pages, each verified against the daemon's checksum (DATA_LOSS naming the first that
    differs): bytes that crossed the network are checked before the caller sees them."""
    _hit_lists("GetPages", num_keys, response.pages, response.page_checksums,
               response.part_masks)
    pages = list(response.pages)
    for index, (page, expected) in enumerate(zip(pages, response.page_checksums)):
        got = page_checksum(page)
        if got != expected:
            raise checksum_mismatch("GetPages", index, got, expected)
    return GotPages(pages=pages, part_masks=tuple(response.part_masks),
                    by_tier=TierPages.from_proto(response.pages_by_tier))


MAX_PIN_SECONDS = 86400  # PinPagesRequest.ttl_ms: at most a day


def ttl_ms(call: str, ttl: float) -> int:
    if not 0 <= ttl <= MAX_PIN_SECONDS:
        raise invalid_argument(f"{call}: ttl {ttl} is not within 0 to {MAX_PIN_SECONDS} seconds "
                               "(a day)")
    return int(ttl * 1000)
