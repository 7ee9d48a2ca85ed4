"""Conformance driver for kvcache_client.vllm: the tier called exactly as vLLM calls it, against
real kvcache-manager processes, checking bytes.

Written from vllm-project/vllm at 041410b9b13a5e762e6bfce4a0ce39574def5919 (no engine can be
installed here):
- vllm/v1/kv_offload/tiering/factory.py (SecondaryTierFactory.get_tier_class and
  create_secondary_tier): the tier class is getattr(import_module(module_path), type), built
  with offloading_spec=, primary_kv_view=, tier_type= and the rest of its config as keywords.
- vllm/v1/kv_offload/cpu/shared_offload_region.py (create_kv_memoryview): the primary view is
  memoryview(int8 tensor (num_blocks, row_stride).numpy()); row b is block b.
- vllm/distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py
  (_maximal_prefix_lookup) and vllm/v1/kv_offload/tiering/manager.py (TieringOffloadingManager),
  on the scheduler thread: lookup(key, req_context) key by key in prefix order until one is a
  miss (False); None means "retry": it counts as a hit for the rest of the step, so that every
  key is asked, and the request's lookup is done again next step. A hit allocates a
  primary slot and the slots of one request and step go to one submit_load(JobMetadata(job_id,
  keys, block_ids=int64 array, is_promotion=True, req_context)) at the step's end (take_events);
  complete_store cascades each stored batch with submit_store(JobMetadata(..., is_promotion=
  False)); get_finished() is polled at most once per step, every job reported once;
  touch(keys, req_context), request_finished(req_context), shutdown().
- vllm/v1/kv_offload/base.py: OffloadKey = block hash + 4-byte big-endian group index
  (make_offload_key); ReqContext(req_id, kv_transfer_params).
The GPU side is a stand-in: per layer a FlashAttention-layout KV tensor (2, num_blocks,
block_size, kv_heads, head_dim) of bfloat16 on the CPU, canonicalised as vLLM does into one
(num_blocks, page_bytes) int8 tensor per K and V, copied into and out of the primary rows at
each canonical tensor's offset (what CPUOffloadingWorker does on the GPU worker).

Checked: bytes back bit-identical from the pool, after eviction to the host tier, after a
daemon restart (disk tier) and on another node's daemon (a shared Redis Cluster); two engine
processes sharing one prefix; a killed engine holding nothing; a daemon that is down giving
misses and failed jobs, never an exception in vLLM's loop.

Run as a script with an engine role (`--engine ...`), it is a second engine process.
"""

import argparse
import dataclasses
import hashlib
import importlib
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
import unittest
from typing import Any, Dict, List, Optional, Sequence, Tuple

import grpc
import numpy
import torch

from daemon import BOUND, Daemon, RedisCluster, wait_until

from kvcache_client import Client
from kvcache_client._proto import kvcache_pb2, kvcache_pb2_grpc

LAYERS, KV_HEADS, HEAD_DIM, BLOCK_TOKENS = 2, 2, 64, 16
DTYPE = torch.bfloat16
# Per block: K and V of each layer, (block_size, kv_heads, head_dim) bf16 each.
CANONICAL_PAGE = BLOCK_TOKENS * KV_HEADS * HEAD_DIM * 2
ROW_BYTES = LAYERS * 2 * CANONICAL_PAGE  # = the pool's block_bytes (see pool_spec)
MODULE_PATH = "kvcache_client.vllm"
TIER_TYPE = "KvCacheTier"
SESSION_TTL = 2.0  # seconds: how soon a killed engine's pages are released
HIT = (True,)  # what lookup returns for a hit: True, or vLLM's LookupResult.HIT when installed
RETRY = (None,)  # "ask again next step": None, or vLLM's LookupResult.RETRY
STEP = 0.002  # seconds: one engine step


def pool_spec(blocks: int, *extra: str) -> str:
    return ":".join([f"default:model=vllm-driver:layers={LAYERS}:kv_heads={KV_HEADS}",
                     f"head_dim={HEAD_DIM}:block_size={BLOCK_TOKENS}:dtype=bf16",
                     f"blocks={blocks}", *extra])


# ---- vLLM's values, as the commit above defines them ----

@dataclasses.dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Optional[Dict[str, Any]] = None


@dataclasses.dataclass
class JobMetadata:
    job_id: int
    keys: Sequence[bytes]
    block_ids: numpy.ndarray
    is_promotion: bool
    req_context: ReqContext


def make_offload_key(block_hash: bytes, group_idx: int) -> bytes:
    return block_hash + group_idx.to_bytes(4, "big", signed=False)


def block_keys(first_token: int, num_blocks: int, parent: bytes = b"") -> List[bytes]:
    """vLLM-style keys of a prompt's full blocks: a SHA-256 chain over each block's tokens (the
    hash function is the engine's business; the tier sees opaque bytes), group 0."""
    keys = []
    for block in range(num_blocks):
        tokens = range(first_token + block * BLOCK_TOKENS, first_token + (block + 1) * BLOCK_TOKENS)
        parent = hashlib.sha256(parent + b"".join(t.to_bytes(4, "little") for t in tokens)
                                ).digest()
        keys.append(make_offload_key(parent, 0))
    return keys


def offloading_spec(model: str = "meta-llama/Llama-3.1-8B-Instruct") -> Any:
    """The attributes of vLLM's OffloadingSpec the tier reads (vllm_config and the block
    sizes), with values of a real engine's config."""
    hf = {"architectures": ["LlamaForCausalLM"], "num_hidden_layers": LAYERS,
          "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "rope_theta": 500000.0}
    config = types.SimpleNamespace(
        model_config=types.SimpleNamespace(model=model, revision=None, dtype=DTYPE,
                                           max_model_len=8192, hf_text_config=hf),
        cache_config=types.SimpleNamespace(block_size=BLOCK_TOKENS, cache_dtype="auto"),
        parallel_config=types.SimpleNamespace(tensor_parallel_size=1, pipeline_parallel_size=1,
                                              decode_context_parallel_size=1,
                                              prefill_context_parallel_size=1))
    return types.SimpleNamespace(vllm_config=config, gpu_block_size=(BLOCK_TOKENS,),
                                 block_size_factor=1, extra_config={})


def page_pattern(key: bytes) -> torch.Tensor:
    """The KV a block with this key holds in every test engine: (LAYERS, 2, block, heads, dim)
    bf16 from a generator seeded by the key, so another process can recompute it."""
    generator = torch.Generator().manual_seed(int.from_bytes(key[:8], "little") & (2**63 - 1))
    return torch.randn((LAYERS, 2, BLOCK_TOKENS, KV_HEADS, HEAD_DIM),
                       generator=generator).to(DTYPE)


class Engine:
    """One vLLM instance as the tier sees it: GPU KV tensors (CPU stand-ins), the primary host
    region and its free slots, and the scheduler's calls to the tier."""

    def __init__(self, target: str, gpu_blocks: int = 256, primary_blocks: int = 256,
                 **tier_config: Any) -> None:
        # The model runner's KV caches: per layer (2, num_blocks, block_size, heads, dim).
        self.kv_caches = [torch.zeros((2, gpu_blocks, BLOCK_TOKENS, KV_HEADS, HEAD_DIM),
                                      dtype=DTYPE) for _ in range(LAYERS)]
        # Canonical tensors (CanonicalKVCaches): K and V of each layer, (num_blocks, page) int8.
        self.canonical = [kv[i].view(torch.int8).reshape(gpu_blocks, CANONICAL_PAGE)
                          for kv in self.kv_caches for i in range(2)]
        # SharedOffloadRegion: (num_blocks, row_stride) int8; create_kv_memoryview's view.
        self.region = torch.zeros((primary_blocks, ROW_BYTES), dtype=torch.int8)
        view = memoryview(self.region.view(primary_blocks, ROW_BYTES).numpy())
        self.free_slots = list(range(primary_blocks))
        self.next_job = 0
        self.next_request = 0
        self.lookup_steps = 0  # steps the last lookup took
        self.tier = create_secondary_tier(
            {"type": TIER_TYPE, "module_path": MODULE_PATH, "target": target,
             "session_ttl_s": SESSION_TTL, **tier_config}, view, offloading_spec())

    # -- GPU worker stand-in (CPUOffloadingWorker's copies) --

    def fill_gpu(self, keys: Sequence[bytes], gpu_blocks: Sequence[int]) -> None:
        for key, block in zip(keys, gpu_blocks):
            pattern = page_pattern(key)
            for layer, kv in enumerate(self.kv_caches):
                kv[:, block] = pattern[layer]

    def gpu_to_primary(self, gpu_blocks: Sequence[int], slots: Sequence[int]) -> None:
        for block, slot in zip(gpu_blocks, slots):
            self.region[slot] = torch.cat([tensor[block] for tensor in self.canonical])

    def primary_to_gpu(self, slots: Sequence[int], gpu_blocks: Sequence[int]) -> None:
        for slot, block in zip(slots, gpu_blocks):
            offset = 0
            for tensor in self.canonical:
                tensor[block] = self.region[slot, offset:offset + CANONICAL_PAGE]
                offset += CANONICAL_PAGE

    def gpu_block(self, block: int) -> torch.Tensor:
        return torch.stack([kv[:, block] for kv in self.kv_caches])

    # -- The scheduler's side (TieringOffloadingManager) --

    def _job(self, keys: Sequence[bytes], slots: Sequence[int], promotion: bool,
             request: str) -> JobMetadata:
        job = JobMetadata(self.next_job, list(keys), numpy.array(slots, dtype=numpy.int64),
                          promotion, ReqContext(request))
        self.next_job += 1
        return job

    def wait_jobs(self, job_ids: Sequence[int]) -> Dict[int, bool]:
        """Engine steps until every job is reported: get_finished once per step."""
        pending, results = set(job_ids), {}
        deadline = time.monotonic() + BOUND
        while pending:
            for result in self.tier.get_finished():
                assert result.job_id not in results, f"job {result.job_id} reported twice"
                results[result.job_id] = result.success
                pending.discard(result.job_id)
            if time.monotonic() > deadline:
                raise AssertionError(f"jobs {sorted(pending)} never finished")
            time.sleep(0.002)  # one engine step
        return results

    def store(self, keys: Sequence[bytes], gpu_blocks: Sequence[int],
              request: str = "req-store") -> bool:
        """The GPU blocks offloaded (GPU -> primary), then cascaded to the tier (complete_store's
        submit_store); the primary slots are held until the job is reported, then freed."""
        slots = [self.free_slots.pop() for _ in keys]
        self.gpu_to_primary(gpu_blocks, slots)
        job = self._job(keys, slots, False, request)
        self.tier.submit_store(job)
        success = self.wait_jobs([job.job_id])[job.job_id]
        self.free_slots.extend(slots)
        return success

    def new_request(self) -> str:
        self.next_request += 1
        return f"req-{self.next_request}"

    def lookup(self, keys: Sequence[bytes], request: Optional[str] = None) -> int:
        """Leading keys the tier has, as the scheduler finds them: each step asks key by key
        until a miss, an answer to come counting as a hit; steps until no answer is to come.
        A lookup of its own (no `request`) is a request that then finishes."""
        context = ReqContext(request or self.new_request())
        deadline = time.monotonic() + BOUND
        self.lookup_steps = 0
        while True:
            self.lookup_steps += 1
            hits, deferred = 0, False
            for key in keys:
                result = self.tier.lookup(key, context)
                if result in RETRY:
                    deferred = True
                elif result not in HIT:
                    break
                hits += 1
            if not deferred:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"lookups still deferred after {self.lookup_steps} steps")
            time.sleep(STEP)
        if request is None:
            self.tier.request_finished(context)
        return hits

    def load(self, keys: Sequence[bytes], gpu_blocks: Sequence[int]) -> int:
        """As a request's prefix is restored: lookups, a primary slot per hit (promotion), one
        submit_load at the step's end, get_finished, then primary -> GPU; the request then
        finishes. Returns the blocks restored (0 when the job failed: vLLM drops the slots
        then)."""
        request = self.new_request()
        hits = self.lookup(keys, request)
        success = False
        if hits > 0:
            slots = [self.free_slots.pop() for _ in range(hits)]
            job = self._job(keys[:hits], slots, True, request)
            self.tier.submit_load(job)
            success = self.wait_jobs([job.job_id])[job.job_id]
            if success:
                self.primary_to_gpu(slots, gpu_blocks[:hits])
            self.free_slots.extend(slots)
        self.tier.request_finished(ReqContext(request))
        return hits if success else 0

    def shutdown(self) -> None:
        self.tier.shutdown()


def create_secondary_tier(tier_config: Dict[str, Any], primary_kv_view: memoryview,
                          spec: Any) -> Any:
    """SecondaryTierFactory.create_secondary_tier for a type that is not registered."""
    config = dict(tier_config)
    tier_type = config.pop("type")
    module = importlib.import_module(config.pop("module_path"))
    tier_cls = getattr(module, tier_type)
    return tier_cls(offloading_spec=spec, primary_kv_view=primary_kv_view,
                    tier_type=tier_type, **config)


def check_session(client: Client, tier: Any) -> Any:
    """A session with the tier's manifest, to ask the daemon where pages are."""
    return client.open_session("driver-check", manifest=tier.manifest)


def disk_records(target: str) -> int:
    """Records the pool's disk tier holds, durable (GetStats' tier rows)."""
    with grpc.insecure_channel(target) as channel:
        stats = kvcache_pb2_grpc.KvCacheStub(channel).GetStats(
            kvcache_pb2.GetStatsRequest(pool="default"), timeout=BOUND)
    return sum(tier.records for pool in stats.pools for tier in pool.tiers if tier.tier == "disk")


class VllmTierTest(unittest.TestCase):
    def start_daemon(self, blocks: int = 512, *extra: str, flags: Sequence[str] = (),
                     directory: Optional[str] = None) -> Daemon:
        daemon = Daemon(*flags, pool=pool_spec(blocks, *extra), directory=directory)
        self.addCleanup(daemon.cleanup)
        return daemon

    def engine(self, target: str, **tier_config: Any) -> Engine:
        engine = Engine(target, **tier_config)
        self.addCleanup(engine.shutdown)
        return engine

    def assert_restored(self, engine: Engine, keys: Sequence[bytes],
                        gpu_blocks: Sequence[int]) -> None:
        for key, block in zip(keys, gpu_blocks):
            got = engine.gpu_block(block).view(torch.int16)
            self.assertTrue(torch.equal(got, page_pattern(key).view(torch.int16)),
                            f"block of key {key.hex()[:16]} differs")

    def test_pages_come_back_bit_identical_into_a_fresh_engine(self):
        daemon = self.start_daemon()
        writer = self.engine(daemon.target)
        keys = block_keys(0, 128)
        writer.fill_gpu(keys, range(128))
        self.assertTrue(writer.store(keys, range(128)))
        writer.tier.touch(keys[:4], ReqContext("req-store"))
        reader = self.engine(daemon.target)  # fresh KV tensors and primary region
        self.assertTrue(reader.tier.wait_connected(BOUND))
        self.assertEqual(reader.load(keys, range(100, 228)), 128)
        self.assert_restored(reader, keys, range(100, 228))
        # A prefix that diverges after 64 blocks hits its first 64 only.
        other = keys[:64] + block_keys(10**6, 8, parent=keys[63][:32])
        self.assertEqual(reader.lookup(other), 64)

    def count_exists_calls(self, engine: Engine) -> List[int]:
        """Counts the ExistsPages calls of the engine's tier session (each still goes to the
        daemon): [calls, keys]."""
        self.assertTrue(engine.tier.wait_connected(BOUND))
        session = engine.tier._connection.session
        exists_pages, counts = session.exists_pages, [0, 0]

        def counted(pool: str, keys: Sequence[bytes], **kwargs: Any) -> Any:
            counts[0] += 1
            counts[1] += len(keys)
            return exists_pages(pool, keys, **kwargs)
        session.exists_pages = counted
        return counts

    def test_lookups_never_block_the_scheduler(self):
        """A key first asked is answered "retry" at once and the scheduler goes on; the prefix's
        keys go to the daemon together, and the next steps find the answers: the stored prefix's
        hits, a miss where a page is missing (not past it), one answer for two requests sharing
        the keys, nothing kept once both requests have finished. (No first-key wait here: see
        the next case.)"""
        daemon = self.start_daemon()
        engine = self.engine(daemon.target, first_lookup_wait_s=0)
        keys = block_keys(60000, 96)
        stored = keys[:40] + keys[48:]  # 8 pages missing after the first 40
        engine.fill_gpu(stored, range(len(stored)))
        self.assertTrue(engine.store(stored, range(len(stored))))
        calls = self.count_exists_calls(engine)
        context = ReqContext("first")
        self.assertEqual([engine.tier.lookup(key, context) in RETRY for key in keys],
                         [True] * 96)  # no answer yet for any, and no call waited for one
        self.assertEqual(engine.lookup(keys, "first"), 40)
        # The keys asked in one step went out in a few calls, never one per key.
        self.assertLessEqual(calls[0], 8, calls)
        self.assertEqual(calls[1], 96, calls)
        # A second request asking for the same keys gets the answers kept, with no call.
        self.assertEqual(engine.lookup(keys, "second"), 40)
        self.assertEqual(engine.lookup_steps, 1)
        self.assertEqual(calls[1], 96, calls)
        engine.tier.request_finished(ReqContext("first"))
        self.assertGreater(engine.tier._lookups.known(), 0)  # "second" still holds them
        engine.tier.request_finished(ReqContext("second"))
        self.assertEqual(engine.tier._lookups.known(), 0)
        # Asked again by a new request, the keys are asked of the daemon again.
        self.assertEqual(engine.lookup(keys[:40]), 40)
        self.assertEqual(calls[1], 96 + 40, calls)
        self.assertEqual(engine.tier._lookups.known(), 0)

    def test_an_uncached_prompt_is_a_miss_in_the_step_it_arrives_in(self):
        """A request's first key waits for its answer (here without a bound, to make the steps
        exact): a prompt nothing is cached for is a miss at once, in one step and one call, as
        with blocking lookups; a cached one is a hit on its first key and retries the rest."""
        daemon = self.start_daemon()
        engine = self.engine(daemon.target, first_lookup_wait_s=BOUND)
        calls = self.count_exists_calls(engine)
        self.assertEqual(engine.lookup(block_keys(90000, 64)), 0)
        self.assertEqual(engine.lookup_steps, 1)
        self.assertEqual(calls, [1, 1])
        keys = block_keys(91000, 64)
        engine.fill_gpu(keys, range(64))
        self.assertTrue(engine.store(keys, range(64)))
        context = ReqContext("warm")
        self.assertIn(engine.tier.lookup(keys[0], context), HIT)
        self.assertIn(engine.tier.lookup(keys[1], context), RETRY)  # only the first key waits
        self.assertEqual(engine.lookup(keys, "warm"), 64)
        engine.tier.request_finished(context)
        self.assertEqual(engine.tier._lookups.known(), 0)

    def test_a_failed_load_turns_its_hits_into_misses(self):
        """Pages gone between the lookup and the load: the load fails, and the request's next
        lookups answer a miss without asking the daemon (else the scheduler would promote them
        and fail again, vllm#49176)."""
        daemon = self.start_daemon(64)
        engine = self.engine(daemon.target)
        keys = block_keys(70000, 16)
        engine.fill_gpu(keys, range(16))
        self.assertTrue(engine.store(keys, range(16)))
        calls = self.count_exists_calls(engine)
        self.assertEqual(engine.lookup(keys, "req"), 16)
        for batch in range(1, 5):  # 64 later pages push the 16 out of the 64-block pool
            later = block_keys(70000 + 1000 * batch, 16)
            engine.fill_gpu(later, range(16, 32))
            self.assertTrue(engine.store(later, range(16, 32)))
        job = engine._job(keys, [engine.free_slots.pop() for _ in keys], True, "req")
        engine.tier.submit_load(job)
        self.assertEqual(engine.wait_jobs([job.job_id]), {job.job_id: False})
        engine.free_slots.extend(job.block_ids.tolist())
        asked = calls[1]
        self.assertEqual(engine.lookup(keys, "req"), 0)
        self.assertEqual(calls[1], asked)
        engine.tier.request_finished(ReqContext("req"))
        self.assertEqual(engine.lookup(keys), 0)  # a new request asks, and they are gone
        self.assertGreater(calls[1], asked)

    def test_blocking_lookups_answer_on_the_scheduler_thread(self):
        daemon = self.start_daemon()
        engine = self.engine(daemon.target, async_lookup=False)
        keys = block_keys(80000, 24)
        engine.fill_gpu(keys[:16], range(16))
        self.assertTrue(engine.store(keys[:16], range(16)))
        self.assertTrue(engine.tier.wait_connected(BOUND))
        self.assertEqual(engine.lookup(keys), 16)
        self.assertEqual(engine.lookup_steps, 1)

    def test_pages_evicted_to_the_host_tier_come_back(self):
        daemon = self.start_daemon(64, "host_tier=64MiB")
        engine = self.engine(daemon.target)
        batches = [block_keys(1000 * batch, 48) for batch in range(3)]  # 144 pages, 64 blocks
        for keys in batches:
            engine.fill_gpu(keys, range(48))
            self.assertTrue(engine.store(keys, range(48)))
        with daemon.client() as client, check_session(client, engine.tier) as session:
            where = session.exists_pages("default", batches[0])
        self.assertEqual(where.num_pages, 48)
        self.assertGreater(where.by_tier.host, 0, where)
        self.assertEqual(engine.load(batches[0], range(100, 148)), 48)
        self.assert_restored(engine, batches[0], range(100, 148))

    def test_pages_on_disk_survive_a_daemon_restart(self):
        directory = tempfile.mkdtemp(prefix="kvvllm-")
        extra = ("host_tier=" + str(16 * ROW_BYTES), "disk_tier=" + directory + "/p.tier:64MiB")
        daemon = self.start_daemon(16, *extra, directory=directory)
        engine = self.engine(daemon.target)
        keys = block_keys(5000, 128)
        engine.fill_gpu(keys, range(128))
        # In batches of 16 (half the disk tier's queue), each let down to disk before the next: a
        # burst past the queue is dropped by design (back-pressure), and which pages it drops is
        # timing's. Pool and host tier hold the newest 32; every older page must reach the disk.
        for end in range(16, 129, 16):
            self.assertTrue(engine.store(keys[end - 16:end], range(end - 16, end)))
            wait_until(lambda: disk_records(daemon.target) >= end - 32, "the disk tier's writes")
        daemon.stop()
        restarted = Daemon(pool=pool_spec(16, *extra), directory=directory,
                           listen=daemon.target)
        self.addCleanup(restarted.cleanup)
        # The tier finds its session gone (another epoch) and makes a new one.
        wait_until(lambda: engine.lookup(keys[:1]) == 1, "a lookup after the restart")
        restored = engine.load(keys, range(128, 256))
        # Pool and host tier (32 pages) are memory: at least the rest was on disk.
        self.assertGreaterEqual(restored, 128 - 32)
        self.assert_restored(engine, keys[:restored], range(128, 128 + restored))

    def test_pages_another_node_passed_down_are_hits_here(self):
        """Two nodes' daemons share a Redis Cluster (their cluster tier): blocks one engine
        stored, pushed out of its daemon's pool (the mover sends them to the cluster on their
        way out), are hits for an engine on the other node, loaded bit-identical."""
        cluster = RedisCluster()
        self.addCleanup(cluster.stop)
        first = self.start_daemon(32, flags=("--cluster_tier", cluster.target))
        second = self.start_daemon(32, flags=("--cluster_tier", cluster.target))
        writer = self.engine(first.target)
        keys = block_keys(40000, 16)
        writer.fill_gpu(keys, range(16))
        self.assertTrue(writer.store(keys, range(16)))
        # Later blocks push the 16 out of the 32-block pool, through the cluster.
        for batch in range(1, 5):
            later = block_keys(40000 + 1000 * batch, 16)
            writer.fill_gpu(later, range(16, 32))
            self.assertTrue(writer.store(later, range(16, 32)))
        reader = self.engine(second.target)
        self.assertTrue(reader.tier.wait_connected(BOUND))
        wait_until(lambda: reader.lookup(keys) == 16, "the cluster to hold the 16 blocks")
        self.assertEqual(reader.load(keys, range(100, 116)), 16)
        self.assert_restored(reader, keys, range(100, 116))

    def test_two_engine_processes_share_one_prefix(self):
        daemon = self.start_daemon()
        first = self.engine(daemon.target)
        prefix = block_keys(20000, 64)
        first.fill_gpu(prefix, range(64))
        self.assertTrue(first.store(prefix, range(64)))
        own = block_keys(30000, 32, parent=prefix[-1][:32])
        # The second engine restores the prefix, checks its bytes, stores its own 32 blocks.
        done = run_engine(daemon.target, "share", prefix, own)
        self.assertEqual(done.returncode, 0, done.stdout + done.stderr)
        self.assertIn("restored 64 stored 32", done.stdout)
        self.assertEqual(first.load(prefix + own, range(100, 196)), 96)
        self.assert_restored(first, prefix + own, range(100, 196))

    def test_a_killed_engine_leaves_nothing_held(self):
        daemon = self.start_daemon()
        engine = subprocess.Popen([sys.executable, __file__, "--engine", "loop", daemon.target],
                                  stdout=subprocess.PIPE, text=True)
        line = engine.stdout.readline()  # it has stored and loaded at least once
        self.assertTrue(line.startswith("looping"), line)
        engine.send_signal(signal.SIGKILL)
        engine.wait(BOUND)
        engine.stdout.close()
        with daemon.client() as client:
            def released() -> bool:
                stats = client.stats("default")
                return stats.open_sessions == 0 and stats.pools[0].counts.referenced == 0
            wait_until(released, "the killed engine's session and pages to be released")

    def test_a_daemon_that_is_down_gives_misses_and_failed_jobs(self):
        directory = tempfile.mkdtemp(prefix="kvvllm-")
        target = "unix://" + os.path.join(directory, "kv.sock")
        engine = self.engine(target, retry_after_s=0.2)
        keys = block_keys(40000, 8)
        engine.fill_gpu(keys, range(8))
        start = time.monotonic()
        self.assertEqual(engine.lookup(keys), 0)  # nothing there, and nothing raised
        self.assertLess(time.monotonic() - start, 1.0)
        self.assertFalse(engine.store(keys, range(8)))
        job = engine._job(keys, [0] * 8, True, "req-down")
        engine.tier.submit_load(job)
        self.assertEqual(engine.wait_jobs([job.job_id]), {job.job_id: False})
        # The daemon comes up: the tier connects by itself.
        daemon = self.start_daemon(directory=directory)
        self.assertTrue(engine.tier.wait_connected(BOUND))
        self.assertTrue(engine.store(keys, range(8)))
        # Killed under the tier: misses and failed jobs again, never an exception.
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(BOUND)
        self.assertEqual(engine.lookup(keys), 0)
        self.assertEqual(engine.load(keys, range(8, 16)), 0)
        self.assertFalse(engine.store(keys, range(8)))

    def test_a_pool_of_another_page_size_disables_the_tier(self):
        daemon = Daemon()  # the default layout: 32 KiB blocks, not this engine's rows
        self.addCleanup(daemon.cleanup)
        engine = self.engine(daemon.target)
        self.assertEqual(engine.lookup(block_keys(0, 1)), 0)  # the first call starts the tier
        wait_until(lambda: engine.tier.disabled is not None, "the tier to see the mismatch")
        self.assertIn("block_bytes", engine.tier.disabled)
        self.assertFalse(engine.store(block_keys(0, 1), [0]))


def run_engine(target: str, role: str, *key_lists: Sequence[bytes]) -> Any:
    arguments = [",".join(key.hex() for key in keys) for keys in key_lists]
    return subprocess.run([sys.executable, __file__, "--engine", role, target, *arguments],
                          capture_output=True, text=True, timeout=2 * BOUND)


def engine_main(role: str, target: str, key_lists: List[str]) -> None:
    """A second engine process: "share" restores a prefix and stores its own blocks after it;
    "loop" stores and loads until killed."""
    engine = Engine(target)
    assert engine.tier.wait_connected(BOUND), "no daemon"
    if role == "share":
        prefix, own = ([bytes.fromhex(key) for key in keys.split(",")] for keys in key_lists)
        restored = engine.load(prefix, range(len(prefix)))
        for key, block in zip(prefix[:restored], range(restored)):
            assert torch.equal(engine.gpu_block(block).view(torch.int16),
                               page_pattern(key).view(torch.int16)), key.hex()
        engine.fill_gpu(own, range(100, 100 + len(own)))
        stored = engine.store(own, range(100, 100 + len(own)))
        print(f"restored {restored} stored {len(own) if stored else 0}", flush=True)
        engine.shutdown()
        return
    keys = block_keys(50000, 128)
    engine.fill_gpu(keys, range(128))
    announced = False
    while True:  # jobs in flight when the signal comes: reservations and acquisitions held
        assert engine.store(keys, range(128))
        for start in range(0, 128, 32):
            job = engine._job(keys[start:start + 32], list(range(start, start + 32)), True, "r")
            engine.tier.submit_load(job)
        if not announced:
            print("looping", flush=True)
            announced = True
        engine.wait_jobs(list(range(engine.next_job - 4, engine.next_job)))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--engine":
        parser = argparse.ArgumentParser()
        parser.add_argument("--engine", required=True)
        parser.add_argument("target")
        parser.add_argument("keys", nargs="*")
        options = parser.parse_args()
        engine_main(options.engine, options.target, options.keys)
    else:
        unittest.main()
