"""Every call of the Python client against a real kvcache-manager, and every error code it can
raise, each asserted exactly: the daemon's (passed on unchanged) and the client's own. Identity:
bearer tokens over the Unix socket and over TLS (a CA made here with openssl).
"""

import dataclasses
import hashlib
import os
import re
import signal
import subprocess
import tempfile
import threading
import unittest
import urllib.request
from unittest import mock

import numpy

from daemon import BOUND, POOL_BLOCKS, Daemon, error_code, tokens, wait_until

import grpc
from kvcache_client import Client, DType, KvCacheError, MappingKind, TlsOptions
from kvcache_client import PoolInfo, PoolLayout, PoolMapping, TierTokens
from kvcache_client import CompatibilityManifest, PagePart, ParallelGeometry
from kvcache_client import block_stream, hashing
from kvcache_client import ResumePoint, page_keys_of
from kvcache_client.mapped_pool import MappedPool
from kvcache_client._proto import kvcache_pb2

Code = grpc.StatusCode
BLOCK_SIZE = 16


class CallsTest(unittest.TestCase):
    """One daemon with no identity file: every caller is tenant `default`, role worker."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.client = cls.daemon.client()
        cls.layout = cls.client.describe_pool("default").pool.layout

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.cleanup()

    def session(self, name="calls"):
        session = self.client.open_session(name)
        self.addCleanup(session.__exit__, None, None, None)
        return session

    def test_read_only_calls(self):
        self.assertEqual(self.client.ping(), self.daemon.epoch)
        [pool] = self.client.list_pools()
        self.assertEqual((pool.name, pool.num_blocks, pool.memory_kind, pool.hash_algorithm),
                         ("default", POOL_BLOCKS, "host", "xxh3_128"))
        self.assertEqual(pool.layout.dtype, DType.FLOAT16)
        self.assertEqual(pool.mapping.kind, MappingKind.SHM)
        # The layout's fingerprint is the one the hash reference computes.
        self.assertEqual(pool.layout.fingerprint, hashing.layout_fingerprint(
            pool.layout.num_layers, pool.layout.num_kv_heads, pool.layout.head_dim,
            pool.layout.block_size, "fp16"))
        described = self.client.describe_pool("default")
        self.assertEqual(described.epoch, self.daemon.epoch)
        counts = described.counts
        self.assertEqual(counts.free + counts.evictable + counts.referenced, POOL_BLOCKS)
        self.assertEqual(self.client.lookup("default", tokens(50000, 64)).num_cached_tokens, 0)
        self.assertEqual([stats.pool for stats in self.client.stats().pools], ["default"])
        self.assertEqual(self.client.stats("default").pools[0].tenant, "default")
        # grpc.health.v1 on the same channel, framed by the client itself.
        self.assertEqual(self.client.health(), "SERVING")
        self.assertEqual(self.client.health("kvcache.v1.KvCache"), "SERVING")
        self.assertEqual(self.client.health("no.such.Service"), "SERVICE_UNKNOWN")

    def test_health_is_not_serving_while_the_daemon_drains(self):
        daemon = Daemon("--drain_period=10s")
        self.addCleanup(daemon.cleanup)
        with daemon.client() as client:
            self.assertEqual(client.health("kvcache.v1.KvCache"), "SERVING")
            daemon.process.send_signal(signal.SIGTERM)
            wait_until(lambda: client.health("kvcache.v1.KvCache") == "NOT_SERVING",
                       "health to say NOT_SERVING while the daemon drains")

    def test_sequence_calls_lookup_and_stats(self):
        session = self.session("sequences")
        self.assertIn(session.id, [info.session_id for info in self.client.list_sessions()])
        prompt = tokens(100, 2 * BLOCK_SIZE + 8)
        sequence = session.open_sequence("default", prompt)
        self.assertEqual((len(sequence.block_ids), sequence.num_cached_tokens), (3, 0))
        extension = session.extend(sequence.sequence_id, tokens(900, BLOCK_SIZE))
        self.assertEqual((len(extension.new_block_ids), extension.num_tokens),
                         (1, len(prompt) + BLOCK_SIZE))
        commit = session.commit(sequence.sequence_id, len(prompt))
        self.assertEqual((commit.num_committed_blocks, commit.num_published_blocks), (2, 2))
        self.assertEqual(session.commit(sequence.sequence_id, len(prompt)).num_published_blocks, 0)
        fork = session.fork(sequence.sequence_id)
        self.assertEqual(fork.block_ids[:3], sequence.block_ids[:3])
        self.assertEqual(fork.copied_from_block, extension.new_block_ids[0])
        self.assertNotEqual(fork.block_ids[3], extension.new_block_ids[0])
        lookup = self.client.lookup("default", prompt)
        self.assertEqual((lookup.num_cached_blocks, lookup.num_cached_tokens), (2, 32))
        self.assertEqual(lookup.cached_tokens_by_tier, TierTokens(pool=32))
        # Salts and extra keys are part of the hash: no hit under another.
        self.assertEqual(self.client.lookup("default", prompt, cache_salt=b"s").num_cached_blocks,
                         0)
        extra = hashing.ExtraKeys(b"lora-1", [hashing.MultimodalItem(b"img", 0, 4)])
        self.assertEqual(self.client.lookup("default", prompt, extra_keys=extra).num_cached_blocks,
                         0)
        hit = session.open_sequence("default", prompt, max_load_ms=50)
        self.assertEqual(hit.num_cached_tokens, 32)
        self.assertEqual(hit.cached_tokens_by_tier, TierTokens(pool=32))
        stats = self.client.stats("default").pools[0]
        self.assertGreaterEqual(stats.hit_tokens, 32)
        self.assertGreaterEqual(stats.open_sequences, 3)
        for sequence_id in (sequence.sequence_id, fork.sequence_id, hit.sequence_id):
            session.release(sequence_id)
        self.assertEqual(session.close(), 0)

    def manifest(self, **changes):
        """Rank 0 of a 2-way tensor-parallel engine on the default pool's layout."""
        fields = dict(model_id="m", model_config_digest=b"rope=8", kv_dtype="fp16",
                      page_tokens=self.layout.block_size,
                      parts=(PagePart("kv", self.layout.block_bytes),),
                      parallel=ParallelGeometry(tp_size=2, tp_rank=0))
        fields.update(changes)
        return CompatibilityManifest(**fields)

    def test_sessions_of_other_manifests_never_hit(self):
        rank_zero = self.manifest()
        rank_one = self.manifest(parallel=ParallelGeometry(tp_size=2, tp_rank=1))
        writer = self.client.open_session("rank0", manifest=rank_zero)
        self.addCleanup(writer.__exit__, None, None, None)
        prompt = tokens(7000, 2 * BLOCK_SIZE + 1)
        sequence = writer.open_sequence("default", prompt)
        writer.commit(sequence.sequence_id, 2 * BLOCK_SIZE)
        writer.release(sequence.sequence_id)
        self.assertEqual(self.client.lookup("default", prompt, manifest=rank_zero)
                         .num_cached_tokens, 32)
        self.assertEqual(self.client.lookup("default", prompt, manifest=rank_one)
                         .num_cached_tokens, 0)
        self.assertEqual(self.client.lookup("default", prompt).num_cached_tokens, 0)
        other = self.client.open_session("rank1", manifest=rank_one)
        self.addCleanup(other.__exit__, None, None, None)
        miss = other.open_sequence("default", prompt)
        self.assertEqual(miss.num_cached_tokens, 0)
        other.release(miss.sequence_id)
        again = self.client.open_session("rank0-again", manifest=rank_zero)
        self.addCleanup(again.__exit__, None, None, None)
        hit = again.open_sequence("default", prompt)
        self.assertEqual(hit.num_cached_tokens, 32)
        again.release(hit.sequence_id)

        uses = {use.manifest.parallel.tp_rank: use
                for use in self.client.describe_pool("default").manifests}
        self.assertEqual(sorted(uses), [0, 1])
        self.assertEqual((uses[0].sessions, uses[1].sessions), (2, 1))
        self.assertEqual(uses[0].manifest, rank_zero)
        self.assertEqual(uses[0].tenant, "default")
        # The Python reference computes the blocks' hashes the daemon announces (root v2).
        pool = self.client.describe_pool("default").pool
        root = hashing.root_hash("xxh3_128", pool.model_id.encode(), pool.layout.fingerprint,
                                 b"default", b"",
                                 manifest_digest=hashing.manifest_digest("xxh3_128", rank_zero))
        expected = hashing.chain_hashes("xxh3_128", root, prompt, BLOCK_SIZE)
        stored = set()
        watch = self.client.watch_events("default", resume=False)
        for batch in watch:
            for event in batch.events:
                if event.WhichOneof("kind") == "blocks_stored":
                    stored.update(block.hash.hi.to_bytes(8, "big") + block.hash.lo.to_bytes(8, "big")
                                  for block in event.blocks_stored.blocks)
            if batch.next_sequence >= batch.head_sequence and (batch.snapshot_end
                                                                or not batch.snapshot):
                break
        watch.close()
        self.assertEqual(len(expected), 2)
        self.assertLessEqual(set(expected), stored)
        # The Python reference computes the digest the daemon shows.
        self.assertEqual(uses[0].digest, hashing.manifest_digest("xxh3_128", rank_zero).hex())
        self.assertEqual(uses[1].digest, hashing.manifest_digest("xxh3_128", rank_one).hex())

    def test_page_events_carry_the_engine_key_and_metrics_count_pages(self):
        """A page's KV events name it by the engine's key and manifest digest (docs/design.md,
        "Page events"), live and in the snapshot a watcher resuming from afar gets; and
        kvcache_pages_total counts its namespace's pages, in an exposition promtool accepts."""
        daemon = Daemon("--metrics_listen=127.0.0.1:0")
        self.addCleanup(daemon.cleanup)
        client = daemon.client()
        self.addCleanup(client.close)
        engine = self.manifest(model_config_digest=b"pages")
        session = client.open_session("pages", manifest=engine)
        self.addCleanup(session.__exit__, None, None, None)
        keys = [b"engine-key-\x00\x01", bytes(range(32))]
        pages = [bytes([i]) * self.layout.block_bytes for i in range(len(keys))]
        checksums = block_stream.block_checksums(memoryview(b"".join(pages)),
                                                 self.layout.block_bytes)

        def put():
            return client.stub.PutPages(kvcache_pb2.PutPagesRequest(
                session_id=session.id, epoch=session.epoch, pool="default", keys=keys,
                pages=pages, page_checksums=checksums))
        self.assertEqual(put().num_published, 2)
        self.assertEqual(put().num_duplicates, 2)
        got = client.stub.GetPages(kvcache_pb2.GetPagesRequest(
            session_id=session.id, epoch=session.epoch, pool="default",
            keys=keys + [b"absent"]))
        self.assertEqual(list(got.pages), pages)
        exists = client.stub.ExistsPages(kvcache_pb2.ExistsPagesRequest(
            session_id=session.id, epoch=session.epoch, pool="default", keys=keys))
        self.assertEqual(exists.num_pages, 2)
        digest = hashing.manifest_digest("xxh3_128", engine).hex()

        def page_events(start):
            found = {}
            for batch in client.watch_events("default", start=start, resume=False):
                for event in batch.events:
                    for key, block in zip(page_keys_of(event), event.blocks_stored.blocks):
                        found[key] = (event.blocks_stored, block)
                if batch.next_sequence >= batch.head_sequence and (batch.snapshot_end
                                                                    or not batch.snapshot):
                    return found

        live = page_events(ResumePoint())
        # A start ahead of the daemon gets a snapshot.
        snapshot = page_events(ResumePoint(sequence=1 << 60, epoch=daemon.epoch))
        for found in (live, snapshot):
            self.assertEqual(sorted(found), sorted(keys))
            for stored, block in found.values():
                self.assertEqual(stored.manifest_digest, digest)
                self.assertFalse(stored.HasField("parent_hash"))
                self.assertEqual(list(block.token_ids), [])

        with open(daemon.log_path) as log:
            address = re.search(r"metrics on http://(\S+)/metrics", log.read()).group(1)
        exposition = urllib.request.urlopen(f"http://{address}/metrics", timeout=BOUND).read()
        series = {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
                  for line in exposition.decode().splitlines()
                  if line.startswith("kvcache_pages_total{")}
        labels = f'pool="default",tenant="default",manifest="{digest[:16]}"'
        self.assertEqual({op: series.get(f'kvcache_pages_total{{{labels},op="{op}"}}')
                          for op in ("exists", "hit", "miss", "published", "duplicate")},
                         {"exists": 2, "hit": 2, "miss": 1, "published": 2, "duplicate": 2})
        checked = subprocess.run(["promtool", "check", "metrics"], input=exposition,
                                 capture_output=True)
        self.assertEqual(checked.returncode, 0, checked.stdout + checked.stderr)

    def test_bad_manifests(self):
        self.assertEqual(error_code(self.client.open_session, "bad", manifest=self.manifest(
            model_id="")), Code.INVALID_ARGUMENT)
        self.assertEqual(error_code(self.client.open_session, "bad", manifest=self.manifest(
            parallel=ParallelGeometry(tp_size=2, tp_rank=2))), Code.INVALID_ARGUMENT)
        self.assertEqual(error_code(self.client.open_session, "bad", manifest=self.manifest(
            model_config_digest=b"x" * 65)), Code.INVALID_ARGUMENT)
        misfit = self.client.open_session("misfit", manifest=self.manifest(kv_dtype="bf16"))
        self.addCleanup(misfit.__exit__, None, None, None)
        self.assertEqual(error_code(misfit.open_sequence, "default", tokens(1, 40)),
                         Code.FAILED_PRECONDITION)
        self.assertEqual(error_code(self.client.lookup, "default", tokens(1, 40),
                                    manifest=self.manifest(page_tokens=32)),
                         Code.FAILED_PRECONDITION)

    def test_close_reports_released_sequences(self):
        session = self.client.open_session("closing", ttl=2.0)
        self.assertEqual(session.ttl, 2.0)
        session.open_sequence("default", tokens(300, 20))
        session.open_sequence("default", tokens(400, 20))
        self.assertEqual(session.close(), 2)
        self.assertNotIn(session.id, [info.session_id for info in self.client.list_sessions()])
        self.assertEqual(error_code(session.open_sequence, "default", [1]),
                         Code.FAILED_PRECONDITION)  # locally: closed
        self.assertFalse(session.lost)

    def test_block_bytes_round_trip_from_every_buffer_kind(self):
        session = self.session("bytes")
        block_bytes = self.layout.block_bytes
        rng = numpy.random.default_rng(16)
        kinds = {"bytes": lambda a: a.tobytes(), "bytearray": lambda a: bytearray(a.tobytes()),
                 "memoryview": lambda a: memoryview(a.tobytes()),
                 "numpy fp16": lambda a: a.view(numpy.float16).reshape(2, -1)}
        for index, (kind, convert) in enumerate(kinds.items()):
            with self.subTest(kind):
                prompt = tokens(10000 * (index + 1), 2 * BLOCK_SIZE)
                data = rng.integers(0, 256, 2 * block_bytes, dtype=numpy.uint8)
                put = session.put_blocks("default", prompt, convert(data))
                self.assertEqual((put.num_blocks, put.num_stored), (2, 2))
                again = session.put_blocks("default", prompt, convert(data))
                self.assertEqual((again.num_already_cached, again.num_stored), (2, 0))
                into = numpy.zeros(2 * block_bytes // 4, dtype=numpy.float32)  # any writable
                info = session.get_blocks_into("default", prompt, into, max_chunk_bytes=3000)
                self.assertEqual((info.num_blocks, info.block_bytes), (2, block_bytes))
                self.assertEqual(into.tobytes(), data.tobytes())
                info, got = session.get_blocks("default", prompt)
                self.assertEqual(bytes(got), data.tobytes())
        # first_block: the receiver holds the prefix already.
        prompt = tokens(10000, 3 * BLOCK_SIZE)
        put = session.put_blocks("default", prompt, bytes(block_bytes), first_block=2)
        self.assertEqual((put.num_blocks, put.num_already_cached, put.num_stored), (3, 2, 1))
        # Nothing cached: a get of nothing.
        info, got = session.get_blocks("default", tokens(90000, 40))
        self.assertEqual((info.num_blocks, len(got)), (0, 0))

    def test_mapping_views(self):
        session = self.session("mapping")
        with session.map_pool("default") as pool:
            self.assertEqual((pool.num_blocks, pool.block_bytes), (POOL_BLOCKS,
                                                                   self.layout.block_bytes))
            keys = pool.keys(3, 1)
            self.assertEqual((keys.shape, keys.dtype), ((16, 2, 64), numpy.float16))
            keys[:] = 0.5
            values = pool.values(3, 1)
            values[:] = -2.0
            raw = pool.block(3)
            kv_bytes = keys.nbytes
            layer_start = 2 * kv_bytes  # layer 1's K follows layer 0's K and V
            self.assertTrue((raw[layer_start:layer_start + kv_bytes].view(numpy.float16)
                             == 0.5).all())
            self.assertTrue((pool.kv(3)[1, 1] == -2.0).all())
            self.assertEqual(error_code(pool.block, POOL_BLOCKS), Code.OUT_OF_RANGE)
            self.assertEqual(error_code(pool.keys, 0, self.layout.num_layers), Code.OUT_OF_RANGE)
        self.assertTrue(pool.closed)
        self.assertEqual(error_code(pool.block, 0), Code.FAILED_PRECONDITION)

    def test_rendezvous(self):
        first, second = self.session("first"), self.session("second")
        first.publish_rendezvous("nccl-id", b"\x01\x02")
        self.assertEqual(second.await_rendezvous("nccl-id", 5.0), b"\x01\x02")
        self.assertEqual(error_code(second.publish_rendezvous, "nccl-id", b"x"),
                         Code.ALREADY_EXISTS)
        self.assertEqual(error_code(second.await_rendezvous, "never", 0.2),
                         Code.DEADLINE_EXCEEDED)
        self.assertEqual(error_code(second.await_rendezvous, "never", 0), Code.INVALID_ARGUMENT)

    def test_a_call_parked_when_its_client_closes_is_cancelled(self):
        client = self.daemon.client()
        session = client.open_session("parked")
        codes = []
        parked = threading.Thread(
            target=lambda: codes.append(error_code(session.await_rendezvous, "never", 60)))
        parked.start()
        wait_until(lambda: any(info.session_id == session.id and info.client_name == "parked"
                               for info in self.client.list_sessions()), "the parked session")
        session.__exit__(None, None, None)
        client.close()
        parked.join(BOUND)
        self.assertEqual(codes, [Code.CANCELLED])
        self.assertEqual(error_code(client.ping), Code.CANCELLED)  # a closed client

    def test_daemon_error_codes(self):
        session = self.session("errors")
        self.assertEqual(error_code(session.open_sequence, "default", []), Code.INVALID_ARGUMENT)
        self.assertEqual(error_code(session.open_sequence, "default", [1], cache_salt=b"s" * 300),
                         Code.INVALID_ARGUMENT)
        sequence = session.open_sequence("default", tokens(600, 20))
        self.assertEqual(error_code(session.commit, sequence.sequence_id, 21),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(error_code(self.client.describe_pool, "nope"), Code.NOT_FOUND)
        self.assertEqual(error_code(self.client.lookup, "nope", [1]), Code.NOT_FOUND)
        self.assertEqual(error_code(session.open_sequence, "nope", [1]), Code.NOT_FOUND)
        self.assertEqual(error_code(session.release, 12345), Code.NOT_FOUND)
        self.assertEqual(error_code(session.open_sequence, "default",
                                    tokens(0, (POOL_BLOCKS + 1) * BLOCK_SIZE)),
                         Code.RESOURCE_EXHAUSTED)
        # A put skipping blocks the daemon does not hold: the daemon's FAILED_PRECONDITION, which
        # is not a restart (its trailers carry the session's epoch).
        self.assertEqual(error_code(session.put_blocks, "default", tokens(700, 32),
                                    bytes(self.layout.block_bytes), first_block=1),
                         Code.FAILED_PRECONDITION)
        self.assertFalse(session.epoch_changed)
        # Checksums that do not match the bytes: the daemon's DATA_LOSS, nothing stored.
        with mock.patch("kvcache_client._session_core.block_checksums", lambda view, size: [1, 2]):
            self.assertEqual(error_code(session.put_blocks, "default", tokens(800, 32),
                                        bytes(2 * self.layout.block_bytes)), Code.DATA_LOSS)
        self.assertEqual(self.client.lookup("default", tokens(800, 32)).num_cached_blocks, 0)
        self.assertEqual(error_code(self.client.open_session, "x", ttl=-1),
                         Code.INVALID_ARGUMENT)

    def test_ended_lease_is_aborted(self):
        lost = []
        session = self.client.open_session("ended", on_session_lost=lost.append)
        # Another party ends the lease (as the daemon does when it expires).
        self.client.stub.CloseSession(kvcache_pb2.CloseSessionRequest(session_id=session.id,
                                                                      epoch=session.epoch))
        self.assertEqual(error_code(session.open_sequence, "default", [1, 2]), Code.ABORTED)
        self.assertTrue(session.lost)
        self.assertFalse(session.epoch_changed)
        self.assertEqual([error.code for error in lost], [Code.ABORTED])
        session.__exit__(None, None, None)

    def test_client_error_codes(self):
        session = self.session("local")
        block_bytes = self.layout.block_bytes
        prompt = tokens(20000, 2 * BLOCK_SIZE)
        self.assertEqual(error_code(session.put_blocks, "default", prompt, bytes(block_bytes)),
                         Code.INVALID_ARGUMENT)  # one block's bytes for two
        self.assertEqual(error_code(session.put_blocks, "default", prompt, "text"),
                         Code.INVALID_ARGUMENT)  # not a buffer
        self.assertEqual(error_code(session.put_blocks, "default", prompt,
                                    numpy.zeros((2, block_bytes), numpy.uint8)[:, ::2]),
                         Code.INVALID_ARGUMENT)  # not contiguous
        self.assertEqual(error_code(session.put_blocks, "default", prompt, b"", first_block=3),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(error_code(session.open_sequence, "default", [1, -1]),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(error_code(session.open_sequence, "default", [1 << 32]),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(error_code(self.client.lookup, "default", "abc"), Code.INVALID_ARGUMENT)
        with self.assertRaises(KvCacheError) as raised:  # a str salt: named, not quoted
            session.open_sequence("default", [1], cache_salt="private-salt")
        self.assertEqual(raised.exception.code, Code.INVALID_ARGUMENT)
        self.assertIn("cache_salt (str)", raised.exception.message)
        self.assertNotIn("private-salt", raised.exception.message)
        self.assertEqual(error_code(session.release, -1), Code.INVALID_ARGUMENT)
        self.assertEqual(error_code(self.client.describe_pool, 7), Code.INVALID_ARGUMENT)
        bad_item = hashing.ExtraKeys(b"", [hashing.MultimodalItem("not-bytes", 0, 1)])
        self.assertEqual(error_code(self.client.lookup, "default", [1], extra_keys=bad_item),
                         Code.INVALID_ARGUMENT)
        session.put_blocks("default", prompt, bytes(2 * block_bytes))
        self.assertEqual(error_code(session.get_blocks_into, "default", prompt,
                                    bytearray(block_bytes)), Code.OUT_OF_RANGE)
        self.assertEqual(error_code(session.get_blocks_into, "default", prompt,
                                    bytes(2 * block_bytes)), Code.INVALID_ARGUMENT)  # read-only
        self.assertEqual(error_code(Client, "unix:///nonexistent/kv.sock", connect_timeout=0.2),
                         Code.UNAVAILABLE)
        self.assertEqual(error_code(Client, self.daemon.target, bearer_token="has space"),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(error_code(Client, self.daemon.target, tls=TlsOptions()),
                         Code.INVALID_ARGUMENT)  # TLS on a Unix socket
        self.assertEqual(error_code(Client, "localhost:1", tls=TlsOptions(ca_file="/nonexistent")),
                         Code.INVALID_ARGUMENT)
        self.assertEqual(error_code(Client, "localhost:1", tls=TlsOptions(cert_file="c.pem")),
                         Code.INVALID_ARGUMENT)  # a certificate without its key
        self.assertEqual(error_code(Client, self.daemon.target, rpc_timeout=0),
                         Code.INVALID_ARGUMENT)


class BlockVerifierTest(unittest.TestCase):
    """The received bytes' checks, which a correct daemon never fails."""

    def test_a_block_that_fails_its_checksum_is_data_loss(self):
        data = bytes(range(256)) * 8
        sums = block_stream.block_checksums(memoryview(data), 1024)
        out = bytearray(len(data))

        def sink(offset, piece):
            out[offset:offset + len(piece)] = piece

        verifier = block_stream.BlockVerifier(1024, sums, sink)
        for start in range(0, len(data), 300):  # pieces straddling blocks
            verifier.feed(memoryview(data)[start:start + 300])
        self.assertEqual((verifier.received_bytes, bytes(out)), (len(data), data))
        bad = block_stream.BlockVerifier(1024, [sums[0], sums[1] ^ 1], sink)
        bad.feed(memoryview(data)[:1024])
        with self.assertRaises(KvCacheError) as raised:
            bad.feed(memoryview(data)[1024:])
        self.assertEqual(raised.exception.code, Code.DATA_LOSS)
        self.assertIn("block 1", raised.exception.message)

    def test_raw_framing_matches_protobuf(self):
        chunk = bytes(range(200)) * 700
        self.assertEqual(block_stream.put_data_message(memoryview(chunk)),
                         kvcache_pb2.PutBlocksRequest(data=chunk).SerializeToString())
        message = block_stream.split_get_message(
            kvcache_pb2.GetBlocksResponse(epoch=(1 << 64) - 3, data=chunk).SerializeToString())
        self.assertEqual((message.epoch, bytes(message.data), message.header),
                         ((1 << 64) - 3, chunk, None))
        header = kvcache_pb2.GetBlocksHeader(num_blocks=2, block_checksums=[5, 6])
        message = block_stream.split_get_message(
            kvcache_pb2.GetBlocksResponse(epoch=9, header=header).SerializeToString())
        self.assertEqual((message.epoch, message.header, message.data), (9, header, None))


class MappedPoolErrorsTest(unittest.TestCase):
    """What MappedPool refuses to map, from descriptions a daemon would not give for this pool."""

    def pool(self, kind, shm_name="/kvpy-test-absent", size_bytes=4 * 32768, block_bytes=32768):
        layout = dataclasses.replace(_LAYOUT, block_bytes=block_bytes)
        return PoolInfo(name="p", model_id="m", layout=layout, num_blocks=4,
                        hash_algorithm="xxh3_128", memory_kind="host",
                        mapping=PoolMapping(kind=kind, shm_name=shm_name, size_bytes=size_bytes,
                                            cuda_ipc_handle=b"", cuda_device=-1))

    def test_refusals(self):
        self.assertEqual(error_code(MappedPool, self.pool(MappingKind.CUDA_IPC), 1),
                         Code.FAILED_PRECONDITION)  # device memory: not from Python
        self.assertEqual(error_code(MappedPool, self.pool(MappingKind.NONE), 1),
                         Code.FAILED_PRECONDITION)
        self.assertEqual(error_code(MappedPool, self.pool(MappingKind.SHM), 1), Code.NOT_FOUND)
        self.assertEqual(error_code(MappedPool, self.pool(MappingKind.SHM, block_bytes=100), 1),
                         Code.INVALID_ARGUMENT)  # block_bytes is not the layout's
        self.assertEqual(error_code(MappedPool, self.pool(MappingKind.SHM, shm_name="/a/b"), 1),
                         Code.INVALID_ARGUMENT)
        name = f"/kvpy-test-{os.getpid()}"
        with open("/dev/shm" + name, "wb") as file:  # an object of another size
            file.write(bytes(32768))
        self.addCleanup(os.unlink, "/dev/shm" + name)
        self.assertEqual(error_code(MappedPool, self.pool(MappingKind.SHM, shm_name=name), 1),
                         Code.FAILED_PRECONDITION)


_LAYOUT = PoolLayout(num_layers=4, num_kv_heads=2, head_dim=64, block_size=16,
                     dtype=DType.FLOAT16, block_bytes=32768, fingerprint=0)


def _token_line(name: str, token: str, tenant: str, role: str) -> str:
    return f"token {name} sha256:{hashlib.sha256(token.encode()).hexdigest()} {tenant} {role}\n"


WORKER_TOKEN = "worker-token-0123456789"
READER_TOKEN = "reader-token-0123456789"


class IdentityTest(unittest.TestCase):
    """A daemon with an identity file (no line for this uid: a caller needs a token), on its Unix
    socket and on TLS over TCP."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.TemporaryDirectory(prefix="kvpy-tls-")
        path = lambda name: os.path.join(cls.dir.name, name)  # noqa: E731
        with open(path("identities"), "w") as file:
            file.write(_token_line("py-worker", WORKER_TOKEN, "team-a", "worker"))
            file.write(_token_line("py-reader", READER_TOKEN, "team-a", "reader"))
        for name in ("daemon", "stranger"):
            subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                            "ec_paramgen_curve:prime256v1", "-nodes", "-days", "1",
                            "-subj", "/CN=localhost", "-addext",
                            "subjectAltName=DNS:localhost,IP:127.0.0.1",
                            "-keyout", path(f"{name}.key"), "-out", path(f"{name}.pem")],
                           check=True, capture_output=True)
        cls.cert = path("daemon.pem")
        cls.other_ca = path("stranger.pem")
        cls.unix = Daemon("--identities", path("identities"))
        cls.tcp = Daemon("--identities", path("identities"), "--tls_cert", cls.cert,
                         "--tls_key", path("daemon.key"), listen="127.0.0.1:0")

    @classmethod
    def tearDownClass(cls):
        cls.unix.cleanup()
        cls.tcp.cleanup()
        cls.dir.cleanup()

    def test_tokens_on_the_unix_socket(self):
        with self.unix.client() as anonymous:
            self.assertEqual(error_code(anonymous.ping), Code.UNAUTHENTICATED)
        with self.unix.client(bearer_token="not-a-known-token") as unknown:
            self.assertEqual(error_code(unknown.list_pools), Code.UNAUTHENTICATED)
        with self.unix.client(bearer_token=READER_TOKEN) as reader:
            self.assertEqual(reader.lookup("default", [1] * 32).num_cached_blocks, 0)
            self.assertEqual(error_code(reader.open_session, "reader"), Code.PERMISSION_DENIED)
        with self.unix.client(bearer_token=WORKER_TOKEN) as worker:
            self.assertEqual(error_code(worker.lookup, "default", [1], tenant="team-b"),
                             Code.PERMISSION_DENIED)
            with worker.open_session("worker") as session:
                sequence = session.open_sequence("default", tokens(1, 20))
                self.assertEqual(len(sequence.block_ids), 2)
                principals = {info.principal for info in worker.list_sessions()}
                self.assertEqual(principals, {"token:py-worker"})

    def test_tls_with_a_token(self):
        host_port = self.tcp.address
        tls = TlsOptions(ca_file=self.cert, server_name="localhost")
        with Client(host_port, tls=tls, bearer_token=WORKER_TOKEN) as client:
            with client.open_session("tls") as session:
                prompt = tokens(30, 2 * BLOCK_SIZE)
                data = bytes(range(256)) * (2 * client.describe_pool("default").pool.layout
                                            .block_bytes // 256)
                self.assertEqual(session.put_blocks("default", prompt, data).num_stored, 2)
                self.assertEqual(bytes(session.get_blocks("default", prompt)[1]), data)
        with Client(host_port, tls=tls) as anonymous:  # TLS without a client certificate
            self.assertEqual(error_code(anonymous.ping), Code.UNAUTHENTICATED)
        # A daemon whose certificate the client's CA did not sign: the handshake fails.
        self.assertEqual(error_code(Client, host_port, connect_timeout=1,
                                    tls=TlsOptions(ca_file=self.other_ca)), Code.UNAVAILABLE)


class PlaintextTokenTest(unittest.TestCase):
    """Regression (issue 29, item 6): the token went over plaintext TCP to any host. No daemon:
    the refusal comes before the channel; the other cases get as far as connecting."""

    TOKEN = "kvc-secret-token-1234"

    def test_refuses_a_token_over_plaintext_tcp_to_a_non_loopback_host(self):
        for target in ("192.0.2.1:5000", "dns:///kvcache.example:5000", "[2001:db8::1]:5000"):
            with self.assertRaises(KvCacheError) as raised:
                Client(target, bearer_token=self.TOKEN, connect_timeout=0.1)
            self.assertEqual(raised.exception.code, Code.INVALID_ARGUMENT)
            self.assertIn(target, raised.exception.message)
            self.assertIn("allow_plaintext_token", raised.exception.message)
            self.assertNotIn(self.TOKEN, str(raised.exception))

    def test_loopback_an_explicit_allowance_or_no_token_may_connect(self):
        cases = [("127.0.0.1:1", {"bearer_token": self.TOKEN}),
                 ("localhost:1", {"bearer_token": self.TOKEN}),
                 ("[::1]:1", {"bearer_token": self.TOKEN}),
                 ("192.0.2.1:5000", {"bearer_token": self.TOKEN, "allow_plaintext_token": True}),
                 ("192.0.2.1:5000", {})]
        for target, kwargs in cases:
            self.assertEqual(error_code(Client, target, connect_timeout=0.1, **kwargs),
                             Code.UNAVAILABLE, (target, kwargs))

    def test_loopback_targets(self):
        from kvcache_client.client import is_loopback_target
        for target in ("127.0.0.1:5000", "127.8.9.10:5000", "localhost:5000", "LOCALHOST",
                       "[::1]:5000", "::1", "dns:///localhost:5000", "dns:localhost:5000",
                       "dns://8.8.8.8/127.0.0.1:5000", "ipv4:127.0.0.1:5000",
                       "ipv6:[::1]:5000", "[::ffff:127.0.0.1]:5000"):
            self.assertTrue(is_loopback_target(target), target)
        for target in ("192.0.2.1:5000", "10.0.0.1:5000", "128.0.0.1:5000", "example.com:5000",
                       "localhost.example.com:5000", "dns:///kvcache.local:5000",
                       "[2001:db8::1]:5000", "ipv4:192.0.2.1:5000", "unix:///tmp/kv.sock",
                       "unix-abstract:kvcache", ""):
            self.assertFalse(is_loopback_target(target), target)


if __name__ == "__main__":
    unittest.main()
