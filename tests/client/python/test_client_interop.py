"""The Python client against real kvcache-manager processes, with the C++ client on the other side:
block bytes put by one read back by the other (bytes identical, by pattern and XXH3 digest),
a numpy write through the pool mapping read by the C++ client, a lease lost while the client
process is stopped, and the epoch change of a daemon restart.
"""

import os
import signal
import subprocess
import sys
import unittest

import numpy

from daemon import BOUND, Daemon, error_code, run_test_client, tokens, wait_until
from kv_pattern import block_values, digest, low_bytes, prefix_bytes

import grpc
from kvcache_client import KvCacheError

BLOCKS = 5  # full blocks per prompt
BLOCK_SIZE = 16  # the daemon's default layout


class InteropTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon()
        self.addCleanup(self.daemon.cleanup)
        self.client = self.daemon.client()
        self.addCleanup(self.client.close)
        self.layout = self.client.describe_pool("default").pool.layout

    def test_python_put_is_read_by_cpp(self):
        prompt = tokens(1000, BLOCKS * BLOCK_SIZE + 3)  # a partial last block is not put
        data = prefix_bytes(self.layout, prompt, BLOCKS)
        with self.client.open_session("put") as session:
            # A numpy array, sent in chunks that straddle blocks.
            put = session.put_blocks("default", prompt, numpy.frombuffer(data, numpy.uint8),
                                     chunk_bytes=10000)
        self.assertEqual((put.num_blocks, put.num_already_cached, put.num_stored),
                         (BLOCKS, 0, BLOCKS))
        got = run_test_client(self.daemon.target, "get-kv", 1000, len(prompt))
        self.assertEqual(got["got_blocks"], str(BLOCKS))
        self.assertEqual(got["mismatched_blocks"], "0")
        self.assertEqual(got["digest"], digest(data))

    def test_cpp_put_is_read_by_python(self):
        prompt = tokens(2000, BLOCKS * BLOCK_SIZE)
        put = run_test_client(self.daemon.target, "put-kv", 2000, len(prompt))
        self.assertEqual(put["stored"], str(BLOCKS))
        destination = numpy.zeros(BLOCKS + 2, dtype=numpy.dtype((numpy.uint8,
                                                                 self.layout.block_bytes)))
        with self.client.open_session("get") as session:
            info = session.get_blocks_into("default", prompt, destination, max_chunk_bytes=7000)
        self.assertEqual((info.num_blocks, info.num_cached_tokens), (BLOCKS, BLOCKS * BLOCK_SIZE))
        received = destination.tobytes()[:BLOCKS * self.layout.block_bytes]
        self.assertEqual(digest(received), put["digest"])
        self.assertEqual(received, prefix_bytes(self.layout, prompt, BLOCKS))
        self.assertFalse(destination.tobytes()[len(received):].strip(b"\0"))  # nothing past

    def test_numpy_write_through_the_mapping_is_read_by_cpp(self):
        prompt = tokens(3000, BLOCKS * BLOCK_SIZE + 1)
        with self.client.open_session("writer") as session:
            pool = session.map_pool("default")
            self.assertEqual(pool.epoch, session.epoch)
            sequence = session.open_sequence("default", prompt)
            self.assertEqual(sequence.num_cached_tokens, 0)
            for block in range(BLOCKS):
                values = low_bytes(block_values(self.layout, prompt, block), 2)
                # fp16 elements written as their bits, one layer's K and V at a time.
                bits = values.view("<u2")[..., 0]
                block_id = sequence.block_ids[block]
                for layer in range(self.layout.num_layers):
                    pool.keys(block_id, layer).view(numpy.uint16)[:] = bits[layer, 0]
                    pool.values(block_id, layer).view(numpy.uint16)[:] = bits[layer, 1]
            committed = session.commit(sequence.sequence_id, len(prompt))
            self.assertEqual(committed.num_published_blocks, BLOCKS)
            written = b"".join(pool.block(block).tobytes() for block in sequence.block_ids[:BLOCKS])
            session.release(sequence.sequence_id)
        read = run_test_client(self.daemon.target, "read-kv", 3000, len(prompt))
        self.assertEqual(read["cached"], str(BLOCKS * BLOCK_SIZE))
        self.assertEqual(read["mismatched_blocks"], "0")
        self.assertEqual(read["digest"], digest(written))

    def test_cpp_write_through_the_mapping_is_read_by_python(self):
        prompt = tokens(4000, BLOCKS * BLOCK_SIZE + 1)
        write = run_test_client(self.daemon.target, "write-kv", 4000, len(prompt))
        self.assertEqual(write["written"], str(len(prompt)))
        with self.client.open_session("reader") as session, session.map_pool("default") as pool:
            sequence = session.open_sequence("default", prompt)
            self.assertEqual(sequence.num_cached_tokens, BLOCKS * BLOCK_SIZE)
            for block in range(BLOCKS):
                self.assertEqual(pool.block(sequence.block_ids[block]).tobytes(),
                                 prefix_bytes(self.layout, prompt, block + 1)[
                                     block * self.layout.block_bytes:])

    def test_lease_lost_while_the_client_process_is_stopped(self):
        # The client runs in its own process; SIGSTOP freezes it, keep-alive thread included, so
        # its lease expires on the (running) daemon. After SIGCONT the keep-alive finds the lease
        # ended, and the next session call is ABORTED.
        holder = subprocess.Popen(
            [sys.executable, os.path.join(os.path.dirname(__file__), "lease_holder.py"),
             self.daemon.target], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=dict(os.environ, PYTHONPATH=os.path.dirname(__file__)))
        self.addCleanup(holder.kill)
        ready = holder.stdout.readline().split()
        self.assertEqual(ready[0], "ready", ready)
        session_id = int(ready[1])
        ids = lambda: [info.session_id for info in self.client.list_sessions()]  # noqa: E731
        self.assertIn(session_id, ids())
        holder.send_signal(signal.SIGSTOP)
        try:
            wait_until(lambda: session_id not in ids(), "the daemon to end the stopped lease")
        finally:
            holder.send_signal(signal.SIGCONT)
        out, _ = holder.communicate("check\n", timeout=BOUND)
        report = dict(field.split("=", 1) for field in out.split())
        self.assertEqual(report, {"lost_by_keepalive": "True", "callbacks": "1",
                                  "code": "ABORTED", "lost": "True", "epoch_changed": "False"})
        self.assertEqual(holder.returncode, 0)

    def test_epoch_change_after_a_daemon_restart(self):
        changes = []
        client = self.daemon.client(wait_for_ready=True)
        self.addCleanup(client.close)
        session = client.open_session("restart", on_epoch_change=lambda *e: changes.append(e))
        pool = session.map_pool("default")
        view = pool.keys(0, 0)
        sequence = session.open_sequence("default", tokens(5000, 40))
        old_epoch = session.epoch
        self.assertEqual(old_epoch, self.daemon.epoch)

        self.daemon.stop()
        restarted = Daemon(directory=self.daemon.directory)  # the same socket path
        self.addCleanup(restarted.stop)
        self.assertNotEqual(restarted.epoch, old_epoch)

        def reconnected():
            # The channel may first answer UNAVAILABLE from the old connection; clients retry.
            try:
                return client.ping() == restarted.epoch
            except KvCacheError as error:
                self.assertEqual(error.code, grpc.StatusCode.UNAVAILABLE)
                return False

        wait_until(reconnected, "the client to reach the restarted daemon")

        self.assertEqual(error_code(session.extend, sequence.sequence_id, [1]),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertTrue(session.epoch_changed)
        self.assertEqual(changes, [(old_epoch, restarted.epoch)])
        # The mapping of the old daemon's pool is closed; views handed out stay Python objects.
        self.assertTrue(pool.closed)
        self.assertEqual(error_code(pool.keys, 0, 0), grpc.StatusCode.FAILED_PRECONDITION)
        view[0, 0, 0] = 1.0
        self.assertEqual(error_code(session.open_sequence, "default", [1, 2]),
                         grpc.StatusCode.FAILED_PRECONDITION)
        self.assertEqual(changes, [(old_epoch, restarted.epoch)])  # once
        session.__exit__(None, None, None)  # no CloseSession for a fenced session

        with client.open_session("again") as fresh:
            self.assertEqual(fresh.epoch, restarted.epoch)
            with fresh.map_pool("default") as mapped:
                self.assertEqual(mapped.epoch, restarted.epoch)
                self.assertFalse(mapped.closed)
            self.assertEqual(fresh.open_sequence("default", tokens(5000, 40)).num_cached_tokens, 0)


if __name__ == "__main__":
    unittest.main()
