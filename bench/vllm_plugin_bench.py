#!/usr/bin/python3
"""kvcache_client.vllm: a batch of 128 pages stored and loaded through the tier, against memcpy
of the same bytes in the same process, and what the tier costs in Python per page.

Starts kvcache-manager (from KVCACHE_BIN_DIR, default build/bin) with a pool whose blocks are the
pages, builds the tier as vLLM's factory does over a primary region (a numpy array standing in
for vLLM's shared CPU tier), and per round: submit_store of 128 rows then get_finished until it
is reported (what vLLM's cascade waits for), the 128 lookups, submit_load of the 128 pages into
other rows then get_finished; the bytes loaded must equal those stored. memcpy is numpy.copyto of
the same 128 rows. The lookups run as vLLM's scheduler runs them (test_vllm_plugin's
Engine.lookup: steps until no answer is to come, polled every 0.2 ms here) with the tier's
non-blocking lookups, and then key by key on a second tier made with async_lookup=False, whose
lookups each wait for the daemon: the figure to compare is the scheduler's time in the tier's
lookup calls per key (what holds up every other request's step), with how long the non-blocking
answers took to come; then the same for a prompt nothing is cached for (its first key's answer
is waited for, so it should take one step and one round trip, as blocking does). Prints, per page size, the medians over the rounds: milliseconds per
batch, the ratios tier / memcpy, the lookup figures, and this process's CPU microseconds per
page (tier, client, gRPC threads: the Python cost; small pages show it best).

Usage: bench/vllm_plugin_bench.py [ROUNDS]
Any failed job or call raises, and the bench exits 1.
"""

import os
import statistics
import sys
import time
from typing import Any, Dict, List, Tuple

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.environ.setdefault("KVCACHE_BIN_DIR", os.path.join(ROOT, "build", "bin"))
sys.path.insert(0, os.path.join(ROOT, "tests", "client", "python"))

import numpy  # noqa: E402

from daemon import Daemon  # noqa: E402  (the tests' launcher)
from test_vllm_plugin import (JobMetadata, ReqContext, block_keys,  # noqa: E402
                              create_secondary_tier, offloading_spec)

PAGES = 128
# (layers, kv_heads, head_dim) of 16-token bf16 pages: 16 KiB, 256 KiB, 1 MiB.
SHAPES = ((2, 2, 64), (32, 2, 64), (32, 8, 64))


def wait_job(tier: Any, job_id: int) -> None:
    while True:
        for result in tier.get_finished():
            if result.job_id != job_id or not result.success:
                raise RuntimeError(f"job {result.job_id} reported success={result.success}")
            return
        time.sleep(0.0002)  # an engine step is milliseconds; poll finer than that


def timed_lookups(tier: Any, keys: List[bytes], request: str,
                  hits: int) -> Tuple[float, float, int]:
    """The scheduler's lookups of `keys` until every answer is in, each step key by key until a
    miss (vLLM's prefix lookup): (seconds inside the tier's lookup calls, seconds until
    answered, steps). Raises unless `hits` leading keys are hits."""
    context = ReqContext(request)
    inside, start, steps = 0.0, time.perf_counter(), 0
    while True:
        steps += 1
        entered = time.perf_counter()
        results = []
        for key in keys:
            results.append(tier.lookup(key, context))
            if results[-1] is False:
                break
        inside += time.perf_counter() - entered
        if None not in results:
            break
        time.sleep(0.0002)
    answered = time.perf_counter() - start
    tier.request_finished(context)
    if results.count(True) != hits:
        raise RuntimeError(f"{results.count(True)} hits of {hits}")
    return inside, answered, steps


def bench_shape(layers: int, kv_heads: int, head_dim: int, rounds: int) -> Dict[str, float]:
    page = layers * 2 * 16 * kv_heads * head_dim * 2
    pool = (f"default:model=bench:layers={layers}:kv_heads={kv_heads}:head_dim={head_dim}:"
            f"block_size=16:dtype=bf16:blocks={4 * PAGES}")
    daemon = Daemon(pool=pool)
    try:
        region = numpy.random.default_rng(0).integers(0, 256, (2 * PAGES, page), numpy.uint8)
        tier = create_secondary_tier(
            {"type": "KvCacheTier", "module_path": "kvcache_client.vllm",
             "target": daemon.target}, memoryview(region), offloading_spec())
        blocking = create_secondary_tier(
            {"type": "KvCacheTier", "module_path": "kvcache_client.vllm",
             "target": daemon.target, "async_lookup": False}, memoryview(region),
            offloading_spec())
        if not tier.wait_connected(30.0) or not blocking.wait_connected(30.0):
            raise RuntimeError("the tier did not connect")
        rows_out = numpy.arange(PAGES, dtype=numpy.int64)
        rows_in = rows_out + PAGES
        samples: Dict[str, List[float]] = {key: [] for key in (
            "store_ms", "load_ms", "memcpy_ms", "lookup_us", "answered_ms", "steps",
            "blocking_lookup_us", "cold_ms", "cold_steps", "cold_blocking_ms", "store_cpu_us",
            "load_cpu_us")}
        scratch = numpy.empty((PAGES, page), numpy.uint8)
        for round_ in range(rounds + 1):  # round 0 warms up (page faults, mappings)
            keys = block_keys(10**6 * (round_ + 1), PAGES)
            region[rows_in] = 0
            wall, cpu = time.perf_counter(), time.process_time()
            tier.submit_store(JobMetadata(2 * round_, keys, rows_out, False, ReqContext("s")))
            wait_job(tier, 2 * round_)
            store = (time.perf_counter() - wall, time.process_time() - cpu)
            inside, answered, steps = timed_lookups(tier, keys, f"l{round_}", PAGES)
            blocked, _, _ = timed_lookups(blocking, keys, f"b{round_}", PAGES)
            # A prompt nothing is cached for: its first key's answer is waited for.
            cold = block_keys(10**6 * (round_ + 1) + 500000, PAGES)
            _, cold_answered, cold_steps = timed_lookups(tier, cold, f"c{round_}", 0)
            _, cold_blocked, _ = timed_lookups(blocking, cold, f"d{round_}", 0)
            wall, cpu = time.perf_counter(), time.process_time()
            tier.submit_load(JobMetadata(2 * round_ + 1, keys, rows_in, True, ReqContext("l")))
            wait_job(tier, 2 * round_ + 1)
            load = (time.perf_counter() - wall, time.process_time() - cpu)
            if not numpy.array_equal(region[rows_in], region[rows_out]):
                raise RuntimeError("loaded bytes differ from the stored ones")
            wall = time.perf_counter()
            numpy.copyto(scratch, region[rows_out])
            memcpy = time.perf_counter() - wall
            if round_ == 0:
                continue
            samples["store_ms"].append(store[0] * 1e3)
            samples["load_ms"].append(load[0] * 1e3)
            samples["memcpy_ms"].append(memcpy * 1e3)
            samples["lookup_us"].append(inside * 1e6 / PAGES)
            samples["answered_ms"].append(answered * 1e3)
            samples["steps"].append(steps)
            samples["blocking_lookup_us"].append(blocked * 1e6 / PAGES)
            samples["cold_ms"].append(cold_answered * 1e3)
            samples["cold_steps"].append(cold_steps)
            samples["cold_blocking_ms"].append(cold_blocked * 1e3)
            samples["store_cpu_us"].append(store[1] * 1e6 / PAGES)
            samples["load_cpu_us"].append(load[1] * 1e6 / PAGES)
        tier.shutdown()
        blocking.shutdown()
    finally:
        daemon.cleanup()
    result = {key: statistics.median(values) for key, values in samples.items()}
    result["page_kib"] = page / 1024
    return result


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 9
    print(f"{PAGES} pages per batch, median of {rounds} rounds")
    print("lookups of a stored prefix: the scheduler's microseconds per key inside lookup, "
          "non-blocking (answers in ms, steps) and blocking; of an uncached prompt: ms until "
          "answered, non-blocking (steps) and blocking")
    print(f"{'page':>8} {'store ms':>9} {'load ms':>8} {'memcpy ms':>10} {'store/memcpy':>13} "
          f"{'load/memcpy':>12} {'lookup us/key':>14} {'answered':>12} {'blocking':>9} "
          f"{'cold ms':>12} {'blocking':>9} {'cpu us/page st,ld':>18}")
    for shape in SHAPES:
        r = bench_shape(*shape, rounds)
        print(f"{r['page_kib']:>5.0f}KiB {r['store_ms']:>9.2f} {r['load_ms']:>8.2f} "
              f"{r['memcpy_ms']:>10.3f} {r['store_ms'] / r['memcpy_ms']:>13.1f} "
              f"{r['load_ms'] / r['memcpy_ms']:>12.1f} {r['lookup_us']:>14.1f} "
              f"{r['answered_ms']:>6.2f}ms,{r['steps']:>2.0f} {r['blocking_lookup_us']:>9.1f} "
              f"{r['cold_ms']:>9.2f},{r['cold_steps']:>2.0f} {r['cold_blocking_ms']:>9.2f} "
              f"{r['store_cpu_us']:>8.1f},{r['load_cpu_us']:>8.1f}")


if __name__ == "__main__":
    main()
