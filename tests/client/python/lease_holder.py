"""A client process for test_client_interop's lease test: opens a session (TTL 300 ms, kept alive
every 100 ms) and a sequence, prints "ready SESSION_ID", then waits for a line on stdin. The test
stops this process long enough for the lease to end, continues it and writes "check": the
process then waits (bounded) for its keep-alive to find the lease lost, tries a session call,
and prints what it saw as key=value fields.

Usage: lease_holder.py TARGET
"""

import sys
import threading

from daemon import BOUND, tokens

from kvcache_client import Client, KvCacheError

lost_events = []
lost = threading.Event()


def on_lost(error: KvCacheError) -> None:
    lost_events.append(error.code)
    lost.set()


def main() -> int:
    client = Client(sys.argv[1], connect_timeout=BOUND, rpc_timeout=BOUND)
    session = client.open_session("lease-holder", ttl=0.3, on_session_lost=on_lost)
    session.open_sequence("default", tokens(7000, 20))
    print("ready", session.id, flush=True)
    sys.stdin.readline()
    lost_by_keepalive = lost.wait(BOUND)
    try:
        session.open_sequence("default", tokens(7000, 20))
        code = "OK"
    except KvCacheError as error:
        code = error.code.name
    print(f"lost_by_keepalive={lost_by_keepalive} callbacks={len(lost_events)} code={code} "
          f"lost={session.lost} epoch_changed={session.epoch_changed}", flush=True)
    session.__exit__(None, None, None)
    client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
