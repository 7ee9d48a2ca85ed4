"""Quick start: a prefix hit, and block bytes in and out of the daemon (README "Using the Python client")."""
import sys

from kvcache_client import Client, KvCacheError

target = sys.argv[1] if len(sys.argv) > 1 else None  # None: the daemon's default socket
with Client(target) as client:
    pool = client.describe_pool("default").pool
    prompt = list(range(1000, 1040))  # 2 full blocks of 16 tokens, and 8 more
    with client.open_session("quickstart") as session:  # kept alive in the background
        sequence = session.open_sequence("default", prompt)
        # ... a worker writes the prompt's KV into sequence.block_ids, then publishes it:
        session.commit(sequence.sequence_id, len(prompt))
        session.release(sequence.sequence_id)
        print("cached tokens:", client.lookup("default", prompt).num_cached_tokens)

        # Another node's worker moves KV bytes instead: put, then get into a buffer of its own
        # (any writable buffer: a bytearray, a numpy array, a torch tensor's numpy view).
        kv = b"\x01" * (2 * pool.layout.block_bytes)
        other = list(range(5000, 5032))
        session.put_blocks("default", other, kv)
        into = bytearray(len(kv))
        info = session.get_blocks_into("default", other, into)
        print("got blocks:", info.num_blocks, "identical:", into == kv)
        try:
            session.open_sequence("missing-pool", prompt)
        except KvCacheError as error:
            print("error code:", error.code.name)
