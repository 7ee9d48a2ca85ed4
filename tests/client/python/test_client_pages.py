"""Pages named by the engine's own keys, from Python (kvcache.proto ExistsPages ... PinPages).

PagesLocalTest needs no daemon: the client's own checks (keys, part masks, page sizes, the
parts of a source or destination), the replies read into values (a duplicate's block id, a
page that fails its checksum, an inconsistent reply), and the copies between buffers, numpy
arrays and torch tensors and a mapped pool, over a shared-memory object made here.

PagesDaemonTest and PagesAioTest run against a kvcache-manager (KVCACHE_BIN_DIR) with a pool
of two parts, "kv" (12 KiB, every page of a hit) and "state" (4 KiB, the last page of a hit):
byte-for-byte round trips through put/get and write/read_into, duplicates, exists counts, the
hit rule as Python sees it, the daemon's codes for bad input, and numpy and torch views of the
pages. Without a daemon binary they fail; only the torch checks skip, when torch is missing.
"""

import asyncio
import os
import unittest
from unittest import mock

import grpc
import numpy

from daemon import BOUND, Daemon, error_code, error_message as message_of

from kvcache_client import (AcquiredPages, CompatibilityManifest, DType, KvCacheError,
                            MappingKind, PagePart, PagePartInfo, PageReservation, PoolInfo,
                            PoolLayout, PoolMapping, TierPages, aio)
from kvcache_client import _calls, _page_copy, _pages
from kvcache_client._proto import kvcache_pb2
from kvcache_client.mapped_pool import MappedPool
from kvcache_client.values import pool_info_from_proto

try:
    import torch
except ImportError:
    torch = None

Code = grpc.StatusCode
POOL = "hy"
BLOCK_BYTES = 16384
KV_BYTES, STATE_BYTES = 12 << 10, 4 << 10
NUM_BLOCKS = 64
POOL_SPEC = (f"{POOL}:layers=2:kv_heads=2:head_dim=64:block_size=16:blocks={NUM_BLOCKS}:"
             "parts=kv/12K+state/4K/trailing1")
KV, STATE, BOTH = 1, 2, 3  # part masks
PARTS = (PagePartInfo("kv", 0, KV_BYTES, "all", 0),
         PagePartInfo("state", KV_BYTES, STATE_BYTES, "trailing", 1))
# Pages live in the namespace of a tenant and a manifest: an engine's page sessions declare one.
MANIFEST = CompatibilityManifest(model_id="m", model_config_digest=b"hybrid", kv_dtype="fp16",
                                 page_tokens=16, parts=(PagePart("kv", KV_BYTES),
                                                        PagePart("state", STATE_BYTES)))
NO_TORCH = "torch is not installed (Debian: python3-torch): the torch views are not checked"


def keys(prefix: str, count: int) -> list:
    """Engine keys: each names its page (and, as an engine's chain would, its prefix)."""
    return [f"{prefix}/{index}".encode() for index in range(count)]


def page_bytes(seed: int, count: int = 1) -> bytes:
    return numpy.random.default_rng(seed).integers(0, 256, count * BLOCK_BYTES,
                                                   dtype=numpy.uint8).tobytes()


def code_of(call, *args, **kwargs) -> grpc.StatusCode:
    return error_code(call, *args, **kwargs)


def pool_info(shm_name: str = "", num_blocks: int = NUM_BLOCKS) -> PoolInfo:
    return PoolInfo(
        name=POOL, model_id="m",
        layout=PoolLayout(num_layers=2, num_kv_heads=2, head_dim=64, block_size=16,
                          dtype=DType.FLOAT16, block_bytes=BLOCK_BYTES, fingerprint=1),
        num_blocks=num_blocks, hash_algorithm="xxh3_128", memory_kind="host",
        mapping=PoolMapping(kind=MappingKind.SHM, shm_name=shm_name,
                            size_bytes=num_blocks * BLOCK_BYTES, cuda_ipc_handle=b"",
                            cuda_device=0),
        parts=PARTS)


class PagesLocalTest(unittest.TestCase):
    """No daemon: what the client decides by itself."""

    def setUp(self):
        self.pool = pool_info()

    def test_pool_info_reads_the_parts(self):
        proto = kvcache_pb2.PoolInfo(name=POOL, num_blocks=4, parts=[
            kvcache_pb2.PagePartInfo(name="kv", offset=0, bytes=KV_BYTES,
                                     hit_policy=kvcache_pb2.PagePartInfo.HIT_POLICY_ALL_PAGES),
            kvcache_pb2.PagePartInfo(
                name="state", offset=KV_BYTES, bytes=STATE_BYTES, trailing_pages=1,
                hit_policy=kvcache_pb2.PagePartInfo.HIT_POLICY_TRAILING_PAGES)])
        self.assertEqual(pool_info_from_proto(proto).parts, PARTS)
        # Values made before pages still build, with no parts.
        self.assertEqual(PoolInfo(POOL, "m", self.pool.layout, 1, "xxh3_128", "host",
                                  self.pool.mapping).parts, ())

    def test_part_mask(self):
        self.assertEqual(self.pool.part_mask(), BOTH)
        self.assertEqual(self.pool.part_mask(["kv"]), KV)
        self.assertEqual(self.pool.part_mask(("state",)), STATE)
        self.assertEqual(self.pool.part_mask(["state", "kv"]), BOTH)
        self.assertEqual(code_of(self.pool.part_mask, ["kv", "indexer"]), Code.INVALID_ARGUMENT)
        self.assertIn("'indexer'", message_of(self.pool.part_mask, ["indexer"]))
        self.assertEqual(code_of(self.pool.part_mask, "kv"), Code.INVALID_ARGUMENT)

    def test_keys_are_checked_before_any_call(self):
        for build in (lambda k: _calls.exists_pages(POOL, k, ()),
                      lambda k: _calls.reserve_pages(POOL, k, None),
                      lambda k: _calls.acquire_pages(POOL, k, (), 0),
                      lambda k: _calls.get_pages(POOL, k, (), 0),
                      lambda k: _calls.pin_pages(POOL, k, 1.0)):
            self.assertIn("no keys", message_of(build, []))
            self.assertIn("key 1 has 65 bytes", message_of(build, [b"a", b"x" * 65]))
            self.assertIn("key 0 has 0 bytes", message_of(build, [b""]))
            self.assertIn("4097 keys", message_of(build, keys("k", 4097)))
            self.assertIn("key 0 is a str", message_of(build, ["text"]))
            self.assertIn("not one bytes", message_of(build, b"one-key"))
        request = _calls.exists_pages(POOL, [b"a", bytearray(b"b"), memoryview(b"c" * 64)],
                                      ["kv"]).request
        self.assertEqual(list(request.keys), [b"a", b"b", b"c" * 64])
        self.assertEqual(list(request.parts), ["kv"])
        self.assertEqual(len(_calls.exists_pages(POOL, keys("k", 4096), ()).request.keys), 4096)

    def test_masks_ttl_and_load_bounds_are_checked(self):
        self.assertIn("1 part_masks for 2 keys",
                      message_of(_calls.reserve_pages, POOL, keys("k", 2), [BOTH]))
        self.assertIn("part_masks[1] is 0",
                      message_of(_calls.reserve_pages, POOL, keys("k", 2), [KV, 0]))
        self.assertEqual(code_of(_calls.reserve_pages, POOL, keys("k", 1), [1 << 32]),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(code_of(_calls.reserve_pages, POOL, keys("k", 1), ["1"]),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(list(_calls.reserve_pages(POOL, keys("k", 2), [KV, numpy.uint32(3)])
                              .request.part_masks), [KV, BOTH])
        self.assertEqual(list(_calls.reserve_pages(POOL, keys("k", 2), None).request.part_masks),
                         [])
        self.assertIn("ttl -1", message_of(_calls.pin_pages, POOL, keys("k", 1), -1))
        self.assertIn("ttl 86401", message_of(_calls.pin_pages, POOL, keys("k", 1), 86401))
        self.assertEqual(_calls.pin_pages(POOL, keys("k", 1), 2.5).request.ttl_ms, 2500)
        self.assertEqual(code_of(_calls.acquire_pages, POOL, keys("k", 1), (), -1),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(code_of(_calls.get_pages, POOL, keys("k", 1), "kv", 0),
                         Code.INVALID_ARGUMENT)

    def test_page_buffers_are_checked(self):
        views = _pages.page_views("put_pages", page_bytes(1, 3), 3, BLOCK_BYTES)
        self.assertEqual([len(view) for view in views], [BLOCK_BYTES] * 3)
        two = numpy.zeros((2, BLOCK_BYTES), numpy.uint8)
        self.assertEqual(len(_pages.page_views("put_pages", two, 2, BLOCK_BYTES)), 2)
        self.assertEqual(len(_pages.page_views("put_pages", [bytearray(BLOCK_BYTES)] * 2, 2,
                                               BLOCK_BYTES)), 2)
        self.assertIn("want 49152", message_of(_pages.page_views, "put_pages", page_bytes(1, 2),
                                               3, BLOCK_BYTES))
        self.assertIn("page 1 has 16383 bytes", message_of(
            _pages.page_views, "put_pages", [bytes(BLOCK_BYTES), bytes(BLOCK_BYTES - 1)], 2,
            BLOCK_BYTES))
        self.assertIn("1 pages for 2 keys", message_of(
            _pages.page_views, "put_pages", [bytes(BLOCK_BYTES)], 2, BLOCK_BYTES))
        self.assertEqual(code_of(_pages.page_views, "put_pages", [42], 1, BLOCK_BYTES),
                         Code.INVALID_ARGUMENT)
        # The request carries each page's XXH3-64 (seed 0), as the daemon checks it.
        data = page_bytes(2, 2)
        request = _calls.put_pages(POOL, keys("k", 2), _pages.page_views(
            "put_pages", data, 2, BLOCK_BYTES), []).request
        self.assertEqual(list(request.pages), [data[:BLOCK_BYTES], data[BLOCK_BYTES:]])
        self.assertEqual(list(request.page_checksums),
                         [_pages.xxhash.xxh3_64_intdigest(data[:BLOCK_BYTES], seed=0),
                          _pages.xxhash.xxh3_64_intdigest(data[BLOCK_BYTES:], seed=0)])

    def test_replies_are_read_into_values(self):
        call = _calls.reserve_pages(POOL, keys("k", 3), None)
        reservation = call.parse(kvcache_pb2.ReservePagesResponse(
            sequence_id=7, block_ids=[5, 4294967295, 9]))
        self.assertEqual(reservation, PageReservation(POOL, 7, (5, None, 9)))
        self.assertEqual(code_of(call.parse, kvcache_pb2.ReservePagesResponse(block_ids=[1])),
                         Code.INTERNAL)
        call = _calls.acquire_pages(POOL, keys("k", 3), (), 0)
        acquired = call.parse(kvcache_pb2.AcquirePagesResponse(
            sequence_id=8, block_ids=[1, 2], page_checksums=[10, 11], part_masks=[KV, BOTH],
            pages_by_tier=kvcache_pb2.TierPages(pool=1, host=1)))
        self.assertEqual(acquired, AcquiredPages(POOL, 8, (1, 2), (10, 11), (KV, BOTH),
                                                 TierPages(pool=1, host=1, disk=0, cluster=0)))
        self.assertEqual(code_of(call.parse, kvcache_pb2.AcquirePagesResponse(
            block_ids=[1], page_checksums=[], part_masks=[1])), Code.INTERNAL)
        self.assertEqual(code_of(call.parse, kvcache_pb2.AcquirePagesResponse(
            block_ids=[1] * 4, page_checksums=[0] * 4, part_masks=[1] * 4)), Code.INTERNAL)
        hits = _calls.exists_pages(POOL, keys("k", 3), ()).parse(
            kvcache_pb2.ExistsPagesResponse(num_pages=2, pages_by_tier=kvcache_pb2.TierPages(
                disk=2)))
        self.assertEqual((hits.num_pages, hits.by_tier), (2, TierPages(disk=2)))

    def test_got_pages_are_verified(self):
        data = page_bytes(3, 2)
        pages = [data[:BLOCK_BYTES], data[BLOCK_BYTES:]]
        sums = [_pages.page_checksum(page) for page in pages]
        call = _calls.get_pages(POOL, keys("k", 2), (), 0)
        got = call.parse(kvcache_pb2.GetPagesResponse(pages=pages, page_checksums=sums,
                                                      part_masks=[BOTH, KV]))
        self.assertEqual((got.pages, got.part_masks), (pages, (BOTH, KV)))
        bad = kvcache_pb2.GetPagesResponse(pages=pages, page_checksums=[sums[0], sums[1] ^ 1],
                                           part_masks=[BOTH, BOTH])
        self.assertEqual(code_of(call.parse, bad), Code.DATA_LOSS)
        self.assertIn("page 1 failed its checksum", message_of(call.parse, bad))

    def test_write_sources_are_checked(self):
        whole, kv, state = bytes(BLOCK_BYTES), bytes(KV_BYTES), bytes(STATE_BYTES)

        def plan(sources, masks=None):
            return _page_copy.PageWrite(self.pool, keys("k", len(sources)), sources, masks)

        self.assertEqual(plan([whole, whole]).part_masks, [])
        self.assertEqual(plan([whole, whole], [KV, BOTH]).part_masks, [KV, BOTH])
        self.assertEqual(plan([{"kv": kv}, {"kv": kv, "state": state}, whole]).part_masks,
                         [KV, BOTH, BOTH])
        self.assertIn("source 1 has 16383 bytes", message_of(plan, [whole, whole[1:]]))
        self.assertIn("source 0 part 'state' has 12288 bytes", message_of(plan, [{"state": kv}]))
        self.assertIn("no part 'indexer'", message_of(plan, [{"indexer": kv}]))
        self.assertIn("names no part", message_of(plan, [{}]))
        self.assertIn("part_masks[0] is 3", message_of(plan, [{"kv": kv}], [BOTH]))
        self.assertIn("part_masks[0] is 4", message_of(plan, [whole], [4]))
        self.assertIn("1 sources for 2 keys", message_of(
            _page_copy.PageWrite, self.pool, keys("k", 2), [whole], None))
        self.assertEqual(code_of(plan, [bytearray(BLOCK_BYTES)[::2]]), Code.INVALID_ARGUMENT)

    def test_read_destinations_are_checked(self):
        def plan(destinations, parts=()):
            return _page_copy.PageRead(self.pool, len(destinations), destinations, parts)

        plan([bytearray(BLOCK_BYTES)])
        plan([bytearray(STATE_BYTES)], ["state"])
        plan([bytearray(BLOCK_BYTES)], ["state", "kv"])
        plan([{"kv": bytearray(KV_BYTES), "state": bytearray(STATE_BYTES)}])
        plan([{"state": numpy.zeros(STATE_BYTES // 2, numpy.float16)}], ["state"])
        self.assertIn("read-only", message_of(plan, [bytes(BLOCK_BYTES)]))
        self.assertIn("destination 0 has 16384 bytes, want 4096",
                      message_of(plan, [bytearray(BLOCK_BYTES)], ["state"]))
        self.assertIn("asks for ['kv', 'state']",
                      message_of(plan, [{"kv": bytearray(KV_BYTES)}]))
        self.assertIn("no part 'indexer'",
                      message_of(plan, [bytearray(BLOCK_BYTES)], ["indexer"]))


class FakeShmPool:
    """A pool's shared-memory object made here, mapped as the daemon's would be."""

    def __init__(self, test: unittest.TestCase, num_blocks: int = 4) -> None:
        self.shm_name = f"/kvpy-pages-{os.getpid()}-{id(self)}"
        path = "/dev/shm" + self.shm_name
        with open(path, "wb") as file:
            file.truncate(num_blocks * BLOCK_BYTES)
        test.addCleanup(os.unlink, path)
        self.info = pool_info(self.shm_name, num_blocks)
        self.mapped = MappedPool(self.info, epoch=1)
        test.addCleanup(self.mapped.close)


class MappedPagesLocalTest(unittest.TestCase):
    """MappedPool's page views and the one-copy moves, over a shm object made here."""

    def setUp(self):
        self.pool = FakeShmPool(self)
        self.mapped = self.pool.mapped

    def test_page_and_part_views(self):
        page = self.mapped.page(2)
        self.assertEqual((page.dtype, page.shape, page.flags.writeable),
                         (numpy.uint8, (BLOCK_BYTES,), True))
        kv, state = self.mapped.part(2, "kv"), self.mapped.part(2, "state")
        self.assertEqual((kv.shape, state.shape), ((KV_BYTES,), (STATE_BYTES,)))
        state[:] = 7
        self.assertTrue((page[KV_BYTES:] == 7).all() and not page[:KV_BYTES].any())
        self.assertTrue((self.mapped.block(2) == page).all())
        self.assertEqual(code_of(self.mapped.page, 4), Code.OUT_OF_RANGE)
        self.assertEqual(code_of(self.mapped.part, -1, "kv"), Code.OUT_OF_RANGE)
        self.assertEqual(code_of(self.mapped.part, 0, "indexer"), Code.INVALID_ARGUMENT)

    def test_torch_views_share_the_memory(self):
        if torch is None:
            self.skipTest(NO_TORCH)
        tensor = self.mapped.page_tensor(1)
        self.assertEqual((tensor.dtype, tuple(tensor.shape)), (torch.uint8, (BLOCK_BYTES,)))
        tensor[:KV_BYTES] = 3
        self.assertTrue((self.mapped.part(1, "kv") == 3).all())
        state = self.mapped.part_tensor(1, "state")
        state.fill_(9)
        self.assertTrue((self.mapped.page(1)[KV_BYTES:] == 9).all())
        self.assertEqual(code_of(self.mapped.part_tensor, 9, "kv"), Code.OUT_OF_RANGE)

    def test_torch_missing_is_failed_precondition(self):
        with mock.patch.dict("sys.modules", {"torch": None}):
            self.assertEqual(code_of(self.mapped.page_tensor, 0), Code.FAILED_PRECONDITION)
            self.assertIn("torch is not installed", message_of(self.mapped.part_tensor, 0, "kv"))

    def test_write_then_read_copies_each_page_once(self):
        data = page_bytes(4, 2)
        kv = numpy.frombuffer(page_bytes(5), numpy.uint8)[:KV_BYTES]
        sources = [data[:BLOCK_BYTES], {"kv": kv}, bytearray(data[BLOCK_BYTES:])]
        write = _page_copy.PageWrite(self.pool.info, keys("k", 3), sources, None)
        write.copy_into(self.mapped, PageReservation(POOL, 1, (3, 0, None)))
        self.assertEqual(self.mapped.page(3).tobytes(), data[:BLOCK_BYTES])
        self.assertEqual(self.mapped.part(0, "kv").tobytes(), kv.tobytes())
        sums = (_pages.page_checksum(self.mapped.page(3)),
                _pages.page_checksum(self.mapped.page(0)))
        pages = AcquiredPages(POOL, 2, (3, 0), sums, (BOTH, KV), TierPages())
        whole = [bytearray(BLOCK_BYTES), numpy.zeros(BLOCK_BYTES, numpy.uint8), None]
        _page_copy.PageRead(self.pool.info, 3, whole[:2] + [bytearray(BLOCK_BYTES)],
                            ()).copy_out(self.mapped, pages, True)
        self.assertEqual(bytes(whole[0]), data[:BLOCK_BYTES])
        self.assertEqual(whole[1][:KV_BYTES].tobytes(), kv.tobytes())
        # By part: a part the page lacks (page 1's state) leaves its destination untouched.
        by_part = [{"state": bytearray(STATE_BYTES)},
                   {"state": bytearray(b"\xee" * STATE_BYTES)}]
        _page_copy.PageRead(self.pool.info, 2, by_part, ["state"]).copy_out(
            self.mapped, pages, True)
        self.assertEqual(bytes(by_part[0]["state"]), data[KV_BYTES:BLOCK_BYTES])
        self.assertEqual(bytes(by_part[1]["state"]), b"\xee" * STATE_BYTES)
        packed = [bytearray(BLOCK_BYTES), bytearray(BLOCK_BYTES)]
        _page_copy.PageRead(self.pool.info, 2, packed, ["state", "kv"]).copy_out(
            self.mapped, pages, True)
        self.assertEqual(bytes(packed[0]), data[KV_BYTES:BLOCK_BYTES] + data[:KV_BYTES])
        self.assertEqual(bytes(packed[1]), bytes(STATE_BYTES) + kv.tobytes())
        # A page whose bytes changed after its checksum: DATA_LOSS naming it, when verifying.
        self.mapped.page(0)[5] ^= 1
        read = _page_copy.PageRead(self.pool.info, 2, [bytearray(BLOCK_BYTES)] * 2, ())
        self.assertIn("page 1 failed its checksum",
                      message_of(read.copy_out, self.mapped, pages, True))
        read.copy_out(self.mapped, pages, False)

    def test_torch_sources_and_destinations(self):
        if torch is None:
            self.skipTest(NO_TORCH)
        source = torch.arange(BLOCK_BYTES // 2, dtype=torch.int16)  # any dtype, as its bytes
        write = _page_copy.PageWrite(self.pool.info, keys("k", 1), [source], None)
        write.copy_into(self.mapped, PageReservation(POOL, 1, (2,)))
        self.assertEqual(self.mapped.page(2).tobytes(), source.numpy().tobytes())
        destination = torch.zeros(STATE_BYTES // 4, dtype=torch.float32)
        pages = AcquiredPages(POOL, 2, (2,), (_pages.page_checksum(self.mapped.page(2)),),
                              (BOTH,), TierPages())
        _page_copy.PageRead(self.pool.info, 1, [{"state": destination}], ["state"]).copy_out(
            self.mapped, pages, True)
        self.assertEqual(destination.numpy().tobytes(),
                         source.numpy().tobytes()[KV_BYTES:])
        self.assertIn("contiguous", message_of(
            _page_copy.PageWrite, self.pool.info, keys("k", 1),
            [torch.zeros(2, BLOCK_BYTES, dtype=torch.uint8)[:, 0]], None))


class PagesDaemonTest(unittest.TestCase):
    """One daemon with the two-part pool; each test names its own keys."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(pool=POOL_SPEC)
        cls.client = cls.daemon.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.cleanup()

    def session(self, name="pages", manifest=MANIFEST):
        session = self.client.open_session(name, manifest=manifest)
        self.addCleanup(session.__exit__, None, None, None)
        return session

    def open_sequences(self) -> int:
        return self.client.stats(POOL).pools[0].open_sequences

    def test_pool_describes_its_parts(self):
        pool = self.client.describe_pool(POOL).pool
        self.assertEqual(pool.layout.block_bytes, BLOCK_BYTES)
        self.assertEqual(pool.parts, PARTS)
        self.assertEqual((pool.part_mask(), pool.part_mask(["state"])), (BOTH, STATE))
        [default] = [info for info in self.client.list_pools() if info.name == POOL]
        self.assertEqual(default.parts, PARTS)

    def test_put_get_round_trip_and_duplicates(self):
        session = self.session()
        names = keys("put", 4)
        data = page_bytes(10, 4)
        put = session.put_pages(POOL, names, data)
        self.assertEqual((put.num_published, put.num_duplicates), (4, 0))
        again = session.put_pages(POOL, names[:2] + keys("put-more", 1),
                                  [data[:BLOCK_BYTES], data[BLOCK_BYTES:2 * BLOCK_BYTES],
                                   page_bytes(11)])
        self.assertEqual((again.num_published, again.num_duplicates), (1, 2))
        got = session.get_pages(POOL, names + keys("put-absent", 1))
        self.assertEqual(b"".join(got.pages), data)
        self.assertEqual((got.part_masks, got.by_tier), ((BOTH,) * 4, TierPages(pool=4)))
        hits = session.exists_pages(POOL, names + keys("put-absent", 1))
        self.assertEqual((hits.num_pages, hits.by_tier), (4, TierPages(pool=4)))
        self.assertEqual(session.exists_pages(POOL, keys("put-absent", 2)).num_pages, 0)
        self.assertEqual(session.get_pages(POOL, keys("put-absent", 1)).pages, [])

    def test_write_read_into_round_trip(self):
        session = self.session()
        names = keys("write", 3)
        data = page_bytes(20, 3)
        sources = [data[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES] for i in range(3)]
        written = session.write_pages(POOL, names, sources)
        self.assertEqual((written.num_published, written.num_duplicates), (3, 0))
        self.assertEqual(session.write_pages(POOL, names, sources).num_duplicates, 3)
        destinations = [bytearray(BLOCK_BYTES) for _ in range(4)]
        read = session.read_pages_into(POOL, names + keys("write-absent", 1), destinations)
        self.assertEqual(len(read.block_ids), 3)
        self.assertEqual(b"".join(destinations[:3]), data)
        self.assertEqual(bytes(destinations[3]), bytes(BLOCK_BYTES))
        self.assertEqual(read.part_masks, (BOTH,) * 3)
        self.assertEqual(self.open_sequences(), 0)  # read_pages_into released its pin
        # Across nodes and on the node, the same pages.
        self.assertEqual(b"".join(session.get_pages(POOL, names).pages), data)
        # By part, into numpy arrays of any dtype.
        kv = [numpy.zeros(KV_BYTES // 2, numpy.float16) for _ in range(3)]
        session.read_pages_into(POOL, names, [{"kv": array} for array in kv], parts=["kv"])
        self.assertEqual(kv[2].tobytes(), data[2 * BLOCK_BYTES:2 * BLOCK_BYTES + KV_BYTES])

    def test_reserve_commit_and_duplicates(self):
        session = self.session()
        names = keys("reserve", 3)
        session.put_pages(POOL, names[1:2], page_bytes(30))
        reservation = session.reserve_pages(POOL, names)
        self.assertIsNone(reservation.block_ids[1])
        self.assertTrue(all(isinstance(block, int) for block in reservation.block_ids[::2]))
        mapped = session.map_pool(POOL)
        self.addCleanup(mapped.close)
        mapped.page(reservation.block_ids[0])[:] = 1
        mapped.page(reservation.block_ids[2])[:] = 2
        committed = session.commit_pages(reservation)
        self.assertEqual((committed.num_published, committed.num_duplicates), (2, 1))
        got = session.get_pages(POOL, names)
        self.assertEqual([page[:1] for page in got.pages], [b"\x01", page_bytes(30)[:1], b"\x02"])
        # An abandoned reservation publishes nothing.
        abandoned = session.reserve_pages(POOL, keys("reserve-abandoned", 2))
        session.release(abandoned.sequence_id)
        self.assertEqual(session.exists_pages(POOL, keys("reserve-abandoned", 2)).num_pages, 0)

    def test_hit_rule_seen_from_python(self):
        session = self.session()
        # Pages 0 and 1 lack the state part (inner pages of a hit need only kv); page 2 has it.
        inner = keys("rule-inner", 3)
        kv = bytes(KV_BYTES)
        session.write_pages(POOL, inner, [{"kv": kv}, {"kv": kv},
                                          {"kv": kv, "state": bytes(STATE_BYTES)}])
        self.assertEqual(session.exists_pages(POOL, inner).num_pages, 3)
        # A last page without its state ends the hit before it: page 3 lacks it.
        ended = keys("rule-end", 4)
        session.put_pages(POOL, ended, page_bytes(40, 4), part_masks=[BOTH, BOTH, BOTH, KV])
        self.assertEqual(session.exists_pages(POOL, ended).num_pages, 3)
        self.assertEqual(session.exists_pages(POOL, ended, parts=["kv"]).num_pages, 4)
        acquired = session.acquire_pages(POOL, ended, parts=["kv"])
        try:
            self.assertEqual(acquired.part_masks, (BOTH, BOTH, BOTH, KV))
            self.assertEqual(len(acquired.block_ids), 4)
        finally:
            session.release(acquired.sequence_id)
        self.assertEqual(len(session.get_pages(POOL, ended).pages), 3)

    def test_a_page_gains_its_missing_part(self):
        """ReservePages: a key present already is a duplicate only "with at least these parts";
        so a page stored without its state takes the state later, and the hit grows."""
        session = self.session()
        names = keys("gain", 2)
        session.put_pages(POOL, names, page_bytes(42, 2), part_masks=[BOTH, KV])
        self.assertEqual(session.exists_pages(POOL, names).num_pages, 1)
        reservation = session.reserve_pages(POOL, names)
        self.assertIsNone(reservation.block_ids[0])
        self.assertIsNotNone(reservation.block_ids[1])  # present, but without the state
        session.release(reservation.sequence_id)
        put = session.put_pages(POOL, names[1:], page_bytes(43))
        self.assertEqual((put.num_published, put.num_duplicates), (1, 0))
        self.assertEqual(session.exists_pages(POOL, names).num_pages, 2)
        self.assertEqual(session.get_pages(POOL, names).pages[1], page_bytes(43))

    def test_pages_need_a_manifest(self):
        session = self.session("no-manifest", manifest=None)
        self.assertEqual(code_of(session.exists_pages, POOL, keys("manifest", 1)),
                         Code.FAILED_PRECONDITION)
        self.assertFalse(session.epoch_changed)  # the daemon's answer, not a restart

    def test_pin_pages(self):
        session = self.session()
        names = keys("pin", 2)
        session.put_pages(POOL, names, page_bytes(50, 2))
        self.assertEqual(session.pin_pages(POOL, names + keys("pin-absent", 1), ttl=5), 2)
        self.assertEqual(session.pin_pages(POOL, names, ttl=0), 2)
        self.assertEqual(session.pin_pages(POOL, keys("pin-absent", 1), ttl=1), 0)
        self.assertEqual(session.pin_pages(POOL, names, ttl=5, priority=7), 2)
        self.assertIn("pin priority 8; at most 7",
                      message_of(session.pin_pages, POOL, names, ttl=5, priority=8))
        self.assertEqual(code_of(session.pin_pages, POOL, names, ttl=5, priority=-1),
                         Code.INVALID_ARGUMENT)  # the client's: out of a uint32's range

    def test_bad_input_codes(self):
        session = self.session()
        # The session describes and maps the pool once; after that a bad batch costs no call.
        session.write_pages(POOL, keys("bad-prime", 1), [bytes(BLOCK_BYTES)])
        session.read_pages_into(POOL, keys("bad-prime", 1), [bytearray(BLOCK_BYTES)])
        local = [(session.exists_pages, (POOL, [])), (session.exists_pages, (POOL, [b"x" * 65])),
                 (session.exists_pages, (POOL, keys("bad", 4097))),
                 (session.put_pages, (POOL, keys("bad", 2), page_bytes(1))),
                 (session.put_pages, (POOL, keys("bad", 1), [page_bytes(1)[1:]])),
                 (session.reserve_pages, (POOL, keys("bad", 2)), {"part_masks": [KV]}),
                 (session.write_pages, (POOL, keys("bad", 1), [{"kv": bytes(1)}])),
                 (session.read_pages_into, (POOL, keys("bad", 1), [bytes(BLOCK_BYTES)]))]
        for call, args, *kwargs in local:
            with mock.patch.object(self.client, "_invoke") as invoke:
                self.assertEqual(code_of(call, *args, **(kwargs[0] if kwargs else {})),
                                 Code.INVALID_ARGUMENT, (call.__name__, args))
                invoke.assert_not_called()  # the client's own check: no round trip
        # The daemon's.
        self.assertEqual(code_of(session.exists_pages, POOL, keys("bad", 1), parts=["indexer"]),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(code_of(session.reserve_pages, POOL, keys("bad", 1), part_masks=[4]),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(code_of(session.exists_pages, "nope", keys("bad", 1)), Code.NOT_FOUND)
        self.assertEqual(code_of(session.commit_pages, PageReservation(POOL, 987654, ())),
                         Code.NOT_FOUND)
        # A page whose checksum does not match: the daemon publishes nothing.
        with mock.patch.object(_pages, "page_checksum", lambda page: 12345):
            self.assertEqual(code_of(session.put_pages, POOL, keys("bad-sum", 2),
                                     page_bytes(60, 2)), Code.DATA_LOSS)
        self.assertEqual(session.exists_pages(POOL, keys("bad-sum", 2)).num_pages, 0)

    def test_write_pages_releases_on_failure(self):
        session = self.session()
        names = keys("fail", 2)
        with mock.patch.object(_page_copy, "_copy", side_effect=RuntimeError("copy failed")):
            with self.assertRaisesRegex(RuntimeError, "copy failed"):
                session.write_pages(POOL, names, [page_bytes(70)] * 2)
        self.assertEqual(self.open_sequences(), 0)
        self.assertEqual(session.exists_pages(POOL, names).num_pages, 0)
        session.put_pages(POOL, names, page_bytes(71, 2))
        destinations = [bytearray(BLOCK_BYTES)] * 2
        with mock.patch.object(_pages, "page_checksum", lambda page: 1):
            self.assertEqual(code_of(session.read_pages_into, POOL, names, destinations),
                             Code.DATA_LOSS)
        self.assertEqual(self.open_sequences(), 0)

    def test_numpy_and_torch_views_of_pages(self):
        session = self.session()
        names = keys("views", 1)
        reservation = session.reserve_pages(POOL, names)
        [block] = reservation.block_ids
        mapped = session.map_pool(POOL)
        self.addCleanup(mapped.close)
        mapped.part(block, "kv")[:] = 4
        mapped.part(block, "state")[:] = 5
        session.commit_pages(reservation)
        [page] = session.get_pages(POOL, names).pages
        self.assertEqual(page, b"\x04" * KV_BYTES + b"\x05" * STATE_BYTES)
        if torch is None:
            self.skipTest(NO_TORCH)
        acquired = session.acquire_pages(POOL, names)
        try:
            tensor = mapped.part_tensor(acquired.block_ids[0], "state")
            self.assertEqual((tensor.dtype, int(tensor.sum())), (torch.uint8, 5 * STATE_BYTES))
            self.assertEqual(mapped.page_tensor(acquired.block_ids[0]).numel(), BLOCK_BYTES)
        finally:
            session.release(acquired.sequence_id)
        source = torch.full((BLOCK_BYTES // 2,), 3, dtype=torch.int16)
        session.write_pages(POOL, keys("views-torch", 1), [source])
        destination = torch.zeros(BLOCK_BYTES, dtype=torch.uint8)
        session.read_pages_into(POOL, keys("views-torch", 1), [destination])
        self.assertEqual(destination.numpy().tobytes(), source.numpy().tobytes())


class PagesAioTest(unittest.TestCase):
    """The same calls as coroutines, against the same kind of daemon."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(pool=POOL_SPEC)

    @classmethod
    def tearDownClass(cls):
        cls.daemon.cleanup()

    def run_async(self, scenario):
        async def with_session():
            async with aio.Client(self.daemon.target, connect_timeout=BOUND,
                                  rpc_timeout=BOUND) as client:
                async with await client.open_session("aio-pages",
                                                     manifest=MANIFEST) as session:
                    await scenario(session)
        asyncio.run(with_session())

    def test_round_trips(self):
        async def scenario(session):
            names = keys("aio", 3)
            data = page_bytes(80, 3)
            put = await session.put_pages(POOL, names[:2], data[:2 * BLOCK_BYTES])
            self.assertEqual((put.num_published, put.num_duplicates), (2, 0))
            written = await session.write_pages(POOL, names, [
                data[:BLOCK_BYTES], data[BLOCK_BYTES:2 * BLOCK_BYTES],
                {"kv": data[2 * BLOCK_BYTES:2 * BLOCK_BYTES + KV_BYTES],
                 "state": data[2 * BLOCK_BYTES + KV_BYTES:]}])
            self.assertEqual((written.num_published, written.num_duplicates), (1, 2))
            self.assertEqual((await session.exists_pages(POOL, names)).num_pages, 3)
            self.assertEqual(b"".join((await session.get_pages(POOL, names)).pages), data)
            destinations = [bytearray(BLOCK_BYTES) for _ in names]
            read = await session.read_pages_into(POOL, names, destinations)
            self.assertEqual((len(read.block_ids), b"".join(destinations)), (3, data))
            acquired = await session.acquire_pages(POOL, names, parts=["kv"])
            self.assertEqual(len(acquired.block_ids), 3)
            await session.release(acquired.sequence_id)
            reservation = await session.reserve_pages(POOL, keys("aio-reserve", 1))
            self.assertEqual((await session.commit_pages(reservation)).num_published, 1)
            self.assertEqual(await session.pin_pages(POOL, names, ttl=1), 3)
            try:
                await session.exists_pages(POOL, [])
            except KvCacheError as error:
                self.assertEqual(error.code, Code.INVALID_ARGUMENT)
            else:
                raise AssertionError("no KvCacheError for an empty batch")
        self.run_async(scenario)


if __name__ == "__main__":
    unittest.main()
