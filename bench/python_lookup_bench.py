#!/usr/bin/python3
"""Python client: what a router's lookup of a long prompt costs, client side and in all.

Starts kvcache-manager (from KVCACHE_BIN_DIR, default build/bin) and times, for a prompt of
TOKENS token ids (default 131072) given as a list and as a numpy uint32 array: checking the ids
alone (what the client adds before protobuf copies them), building the request, and a whole
Client.lookup round trip. Prints the best of REPEATS runs of each in milliseconds.

Usage: bench/python_lookup_bench.py [TOKENS [REPEATS]]
"""

import os
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.environ.setdefault("KVCACHE_BIN_DIR", os.path.join(ROOT, "build", "bin"))
sys.path.insert(0, os.path.join(ROOT, "tests", "client", "python"))

import numpy  # noqa: E402

from daemon import Daemon  # noqa: E402  (the tests' launcher)

from kvcache_client import _calls  # noqa: E402
from kvcache_client.errors import token_ids  # noqa: E402


def best_ms(function, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> int:
    num_tokens = int(sys.argv[1]) if len(sys.argv) > 1 else 131072
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    prompts = {"list": list(range(num_tokens)),
               "numpy": numpy.arange(num_tokens, dtype=numpy.uint32)}
    daemon = Daemon(pool=f"default:blocks={num_tokens // 16 + 1}")
    try:
        with daemon.client() as client:
            print(f"lookup of {num_tokens} tokens, best of {repeats}")
            for kind, prompt in prompts.items():
                check = best_ms(lambda: token_ids("lookup", prompt), repeats)
                build = best_ms(lambda: _calls.lookup("default", prompt, b"", None, ""), repeats)
                whole = best_ms(lambda: client.lookup("default", prompt), repeats)
                print(f"  {kind:5}  check {check:8.3f} ms  build request {build:7.2f} ms  "
                      f"lookup {whole:7.2f} ms")
    finally:
        daemon.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
