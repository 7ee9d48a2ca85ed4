"""A HiCache-style batch of 128 pages set and got through kvcache_client.sglang, against a memcpy
of the same bytes in the same process, and the plug-in's own Python cost per page.

Usage: KVCACHE_BIN_DIR=build/bin /usr/bin/python3 bench/sglang_plugin_bench.py [--pages 128]
Starts its own daemon (a host pool of 256 blocks of the page's size), an engine host pool in
SGLang's page_first layout (tests/client/python/sglang_engine.py: SGLang's shapes, bf16), and
prints per batch: set and get through the plug-in, a torch copy of the same bytes, their
ratios, and the per-page time that is neither a copy nor a daemon call (the plug-in's Python).
"""

import argparse
import os
import statistics
import sys
import time
from typing import Callable, List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "client", "python"))
import daemon as helpers  # noqa: E402
import sglang_engine as engine  # noqa: E402
import torch  # noqa: E402

PAGE = 16
LAYERS, HEADS, HEAD_DIM = 8, 8, 128  # a 512 KiB page (bf16), K then V


def best(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def check(condition: bool, what: str) -> None:
    """Exits 1 naming `what` unless `condition` (docs/benchmarks.md: a bench's first error)."""
    if not condition:
        sys.exit(f"sglang_plugin_bench: {what}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pages", type=int, default=engine.STORAGE_BATCH_SIZE)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    pages = args.pages
    page_bytes = 2 * PAGE * LAYERS * HEADS * HEAD_DIM * 2
    spec = (f"sg:layers={LAYERS}:kv_heads={HEADS}:head_dim={HEAD_DIM}:block_size={PAGE}:"
            f"dtype=bf16:blocks={2 * pages + 16}")
    daemon = helpers.Daemon(pool=spec)
    try:
        pool = engine.MHAHostPool("page_first", pages=pages, layers=LAYERS, heads=HEADS,
                                  head_dim=HEAD_DIM)
        pool.kv_buffer.copy_(engine.pattern(1, pool.kv_buffer.shape, pool.dtype))
        extra = {"backend_name": "kvcache", "module_path": "kvcache_client.sglang",
                 "class_name": "KvCacheStorage", "interface_v1": 1, "kvcache_pool": "sg",
                 "kvcache_target": daemon.target}
        backend = engine.create_backend(engine.storage_config(extra), pool)
        indices = engine.host_indices(list(range(pages)), PAGE)
        rounds: List[int] = [0]

        def keys() -> List[str]:
            return engine.get_hash_str(engine.tokens_for(rounds[0], pages, PAGE), None, PAGE)

        def set_batch() -> None:
            rounds[0] += 1
            check(all(backend.batch_set_v1(keys(), indices)), "a failed batch_set_v1")

        set_time = best(set_batch, args.repeats)
        stored = keys()
        source = pool.kv_buffer.clone()
        pool.kv_buffer.zero_()  # the first get must bring every byte back (exit 1 otherwise)
        get_time = best(lambda: check(all(backend.batch_get_v1(stored, indices)),
                                      "a short batch_get_v1"), args.repeats)
        check(torch.equal(pool.kv_buffer.view(torch.uint8), source.view(torch.uint8)),
              "batch_get_v1 brought other bytes back")
        exists_time = best(lambda: check(backend.batch_exists(stored) == pages,
                                         "batch_exists short"), args.repeats)
        target = torch.empty_like(source)
        copy_time = best(lambda: target.copy_(source), args.repeats)
        session = backend._live()[0]
        page_keys = [bytes.fromhex(k) for k in stored]
        acquire_time = best(lambda: session.release(session.acquire_pages(
            "sg", page_keys, parts=("kv",)).sequence_id), args.repeats)
        backend.close()
    finally:
        daemon.cleanup()
    total = pages * page_bytes
    print(f"batch: {pages} pages of {page_bytes // 1024} KiB ({total / 2**20:.0f} MiB), "
          f"page_first bf16, median of {args.repeats}")
    print(f"memcpy (torch copy_) : {copy_time * 1e3:8.2f} ms  {total / copy_time / 1e9:6.2f} GB/s")
    print(f"batch_set_v1         : {set_time * 1e3:8.2f} ms  {total / set_time / 1e9:6.2f} GB/s"
          f"  {set_time / copy_time:5.2f}x memcpy")
    print(f"batch_get_v1         : {get_time * 1e3:8.2f} ms  {total / get_time / 1e9:6.2f} GB/s"
          f"  {get_time / copy_time:5.2f}x memcpy")
    print(f"batch_exists         : {exists_time * 1e3:8.2f} ms")
    own = (get_time - copy_time - acquire_time) / pages
    print(f"get: plug-in Python per page (get - memcpy - acquire/release): {own * 1e6:.1f} us")


if __name__ == "__main__":
    main()
