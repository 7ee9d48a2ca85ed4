#!/usr/bin/python3
"""Python client vs C++ client: GetBlocks into a reused buffer, on the same daemon, in one run.

Starts kvcache-manager (from KVCACHE_BIN_DIR, default build/bin) with a pool of 1 MiB blocks,
puts 8 of them (8 MiB per get) from Python, then alternates rounds of Python's
Session.get_blocks_into and the C++ KvCacheClient::GetBlocksInto (kvcache-test-client time-get,
timed inside that process, connection excluded) over the same Unix socket, and prints each
client's bandwidth and the median of the per-round ratios Python / C++, and the CPU time each
client spends per GB moved (this process's, and the C++ client process's from start to exit):
on a machine busy with other work the bandwidths swing, what a byte costs the client much less.

Usage: bench/python_client_bench.py [SECONDS_PER_ROUND [ROUNDS]]
"""

import os
import resource
import statistics
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.environ.setdefault("KVCACHE_BIN_DIR", os.path.join(ROOT, "build", "bin"))
sys.path.insert(0, os.path.join(ROOT, "tests", "client", "python"))

import numpy  # noqa: E402

from daemon import Daemon, run_test_client, tokens  # noqa: E402  (the tests' launcher)

BLOCKS = 8
BLOCK_SIZE = 16
# 16 layers * K,V * 16 tokens * 8 heads * 128 dims * fp16 = 1 MiB per block.
POOL = "default:layers=16:kv_heads=8:head_dim=128:block_size=16:dtype=fp16:blocks=16"


def children_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def python_round(session, prompt, destination, seconds: float):
    """GB/s of get_blocks_into over about `seconds`, and CPU seconds per GB."""
    moved = 0
    start, cpu_start = time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        moved += session.get_blocks_into("default", prompt, destination).num_blocks
    gigabytes = moved * destination.nbytes / BLOCKS / 1e9
    return (gigabytes / (time.perf_counter() - start),
            (time.process_time() - cpu_start) / gigabytes)


def cpp_round(target: str, prompt, iterations: int):
    """GB/s of the C++ client's GetBlocksInto, `iterations` gets, and CPU seconds per GB."""
    cpu_start = children_cpu_seconds()
    result = run_test_client(target, "time-get", prompt[0], len(prompt), str(iterations))
    gigabytes = int(result["bytes"]) * iterations / 1e9
    return (gigabytes / float(result["seconds"]),
            (children_cpu_seconds() - cpu_start) / gigabytes)


def main() -> int:
    seconds = float(sys.argv[1]) if len(sys.argv) > 1 else 1.0
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    daemon = Daemon(pool=POOL)
    try:
        with daemon.client() as client, client.open_session("bench") as session:
            layout = client.describe_pool("default").pool.layout
            prompt = tokens(1, BLOCKS * BLOCK_SIZE + 1)
            data = numpy.random.default_rng(0).integers(0, 256, BLOCKS * layout.block_bytes,
                                                        dtype=numpy.uint8)
            session.put_blocks("default", prompt, data)
            destination = numpy.empty_like(data)
            session.get_blocks_into("default", prompt, destination)
            assert destination.tobytes() == data.tobytes()
            python_rates, cpp_rates, python_cpu, cpp_cpu = [], [], [], []
            iterations = 10
            for _ in range(rounds):
                rate, cpu = python_round(session, prompt, destination, seconds)
                python_rates.append(rate)
                python_cpu.append(cpu)
                rate, cpu = cpp_round(daemon.target, prompt, iterations)
                cpp_rates.append(rate)
                cpp_cpu.append(cpu)
                # Size the next C++ round to about `seconds` too.
                iterations = max(1, int(seconds * cpp_rates[-1] * 1e9 / data.nbytes))
    finally:
        daemon.cleanup()
    ratios = [p / c for p, c in zip(python_rates, cpp_rates)]
    print(f"get_blocks_into, {BLOCKS} x {layout.block_bytes >> 20} MiB blocks per get, "
          f"unix socket, {rounds} rounds of ~{seconds:g}s each")
    print(f"  python  {statistics.median(python_rates):6.2f} GB/s (median)")
    print(f"  c++     {statistics.median(cpp_rates):6.2f} GB/s (median)")
    print(f"  ratio python / c++: {statistics.median(ratios):.2f} "
          f"(median of per-round ratios; rounds: {', '.join(f'{r:.2f}' for r in ratios)})")
    cpu_ratios = [c / p for p, c in zip(python_cpu, cpp_cpu)]
    print(f"  client CPU per GB: python {statistics.median(python_cpu):.2f} s, "
          f"c++ {statistics.median(cpp_cpu):.2f} s; c++ / python: "
          f"{statistics.median(cpu_ratios):.2f} (median of per-round ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
