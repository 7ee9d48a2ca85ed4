#!/usr/bin/python3
"""Python client across a daemon restart: how long a caller polling lookup() is without an
answer, and how many errors reach it.

For each outage length (default 0.2, 1 and 3 seconds) it starts kvcache-manager (from
KVCACHE_BIN_DIR, default build/bin), SIGKILLs it, starts a new one on the same socket that long
after (from another thread), and meanwhile calls Client.lookup every 50 ms. It prints the time
from the new daemon's start to the caller's first answer from it, and the errors the caller saw.
RETRY=0 in the environment turns the client's retries off (RetryPolicy(enabled=False)).

Usage: bench/python_restart_bench.py [OUTAGE_SECONDS...]
"""

import os
import signal
import sys
import threading
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
os.environ.setdefault("KVCACHE_BIN_DIR", os.path.join(ROOT, "build", "bin"))
sys.path.insert(0, os.path.join(ROOT, "tests", "client", "python"))

from daemon import BOUND, Daemon  # noqa: E402  (the tests' launcher)

from kvcache_client import KvCacheError, RetryPolicy  # noqa: E402

POLL_SECONDS = 0.05


def one_restart(outage: float, retry: RetryPolicy) -> None:
    daemon = Daemon()
    restarted = {}

    def restart() -> None:
        time.sleep(outage)
        restarted["at"] = time.monotonic()
        restarted["daemon"] = Daemon(directory=daemon.directory, listen=daemon.target)

    client = daemon.client(rpc_timeout=BOUND, retry=retry)
    prompt = list(range(32))
    client.lookup("default", prompt)
    daemon.process.send_signal(signal.SIGKILL)
    daemon.process.wait(BOUND)
    thread = threading.Thread(target=restart)
    thread.start()
    errors = 0
    try:
        while True:
            try:
                client.lookup("default", prompt)
                if "daemon" in restarted and client.ping() == restarted["daemon"].epoch:
                    break
            except KvCacheError:
                errors += 1
            time.sleep(POLL_SECONDS)
        print(f"  down {outage:g} s: first answer {time.monotonic() - restarted['at']:.2f} s "
              f"after the new daemon started; {errors} errors reached the caller")
    finally:
        thread.join(BOUND)
        client.close()
        if "daemon" in restarted:
            restarted["daemon"].cleanup()
        daemon.cleanup()


def main() -> int:
    outages = [float(arg) for arg in sys.argv[1:]] or [0.2, 1.0, 3.0]
    retry = RetryPolicy(enabled=os.environ.get("RETRY", "1") != "0")
    print(f"lookup every {POLL_SECONDS * 1000:g} ms across a SIGKILL and restart, retries "
          f"{'on' if retry.enabled else 'off'}")
    for outage in outages:
        one_restart(outage, retry)
    return 0


if __name__ == "__main__":
    sys.exit(main())
