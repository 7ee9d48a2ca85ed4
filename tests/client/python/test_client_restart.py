"""A daemon killed and restarted on the same socket under a Python client (blocking and asyncio):
idempotent calls ride it out without the caller seeing UNAVAILABLE (the retry policy), calls
that are not idempotent fail instead of being sent twice, and watch_events() resumes: with a
snapshot (marked snapshot_end) from the new daemon, and without one from a resume point the
same daemon still holds.
"""

import asyncio
import signal
import threading
import time
import unittest

import grpc

from daemon import BOUND, Daemon, error_code, tokens

from kvcache_client import KvCacheError, ResumePoint, RetryPolicy, aio

Code = grpc.StatusCode
DOWN_SECONDS = 0.5  # how long the daemon stays dead: calls made meanwhile find no listener


class Restarter:
    """SIGKILLs the daemon now (as the OOM killer would) and starts another on the same socket
    DOWN_SECONDS later, from a thread, so the caller's call is in flight meanwhile."""

    def __init__(self, daemon: Daemon) -> None:
        self._daemon = daemon
        self.restarted = None
        daemon.process.send_signal(signal.SIGKILL)
        daemon.process.wait(BOUND)
        self._thread = threading.Thread(target=self._restart)
        self._thread.start()

    def _restart(self) -> None:
        time.sleep(DOWN_SECONDS)
        self.restarted = Daemon(directory=self._daemon.directory, listen=self._daemon.target)

    def join(self) -> Daemon:
        self._thread.join(BOUND)
        assert self.restarted is not None, "the daemon did not restart"
        return self.restarted


class RestartTest(unittest.TestCase):
    def setUp(self):
        self.daemon = Daemon()
        self.addCleanup(self.daemon.cleanup)

    def restart(self) -> Restarter:
        restarter = Restarter(self.daemon)
        self.addCleanup(lambda: restarter.join().stop())
        return restarter

    def test_idempotent_calls_ride_out_a_restart(self):
        client = self.daemon.client()
        self.addCleanup(client.close)
        prompt = tokens(0, 48)
        self.assertEqual(client.lookup("default", prompt).num_cached_tokens, 0)
        restarter = self.restart()
        # Made while nothing listens: retried once the new daemon does, within rpc_timeout.
        self.assertEqual(client.lookup("default", prompt).num_cached_tokens, 0)
        self.assertEqual(client.ping(), restarter.join().epoch)

    def test_without_retries_a_call_meets_the_outage(self):
        client = self.daemon.client(retry=RetryPolicy(enabled=False))
        self.addCleanup(client.close)
        client.ping()
        self.restart()
        self.assertEqual(error_code(client.lookup, "default", [1]), Code.UNAVAILABLE)

    def test_calls_that_are_not_idempotent_are_not_retried(self):
        client = self.daemon.client()
        self.addCleanup(client.close)
        session = client.open_session("before")
        restarter = self.restart()
        # Sent once: it fails while nothing listens rather than opening a second session or
        # sequence later.
        self.assertEqual(error_code(client.open_session, "during"), Code.UNAVAILABLE)
        self.assertEqual(error_code(session.open_sequence, "default", tokens(0, 20)),
                         Code.UNAVAILABLE)
        restarter.join()
        self.assertEqual(client.list_sessions(), [])  # nothing was opened behind the caller
        # An idempotent session call reaches the new daemon, which fences the old epoch.
        self.assertEqual(error_code(session.commit, 1, 0), Code.FAILED_PRECONDITION)
        self.assertTrue(session.epoch_changed)
        session.__exit__(None, None, None)

    def test_watch_resumes_with_a_snapshot_after_a_restart(self):
        client = self.daemon.client()
        self.addCleanup(client.close)
        with client.open_session("writer") as session:
            session.put_blocks("default", tokens(100, 32), bytes(2 * self.block_bytes(client)))
        watch = client.watch_events()
        self.assertEqual(self.kinds(self.until_caught_up(watch)),
                         ["all_blocks_cleared", "blocks_stored"])
        restarter = self.restart()
        restarted = restarter.join()
        # The daemon was killed, not drained: the stream breaks and the watch goes on with the
        # new daemon's snapshot (its pool is empty), its last batch marked.
        snapshot = self.until_caught_up(watch)
        self.assertEqual({batch.epoch for batch in snapshot}, {restarted.epoch})
        self.assertTrue(all(batch.snapshot for batch in snapshot))
        self.assertEqual([batch.snapshot_end for batch in snapshot],
                         [False] * (len(snapshot) - 1) + [True])
        self.assertEqual(self.kinds(snapshot), ["all_blocks_cleared"])
        self.assertEqual(snapshot[-1].resume_point,
                         ResumePoint(snapshot[-1].next_sequence, restarted.epoch))
        # Then live events of the new daemon.
        with restarted.client() as writer, writer.open_session("writer") as session:
            session.put_blocks("default", tokens(500, 16), bytes(self.block_bytes(client)))
        live = next(watch)
        self.assertFalse(live.snapshot)
        self.assertEqual(self.kinds([live]), ["blocks_stored"])
        watch.close()

    def test_watch_from_a_resume_point_misses_and_repeats_nothing(self):
        client = self.daemon.client()
        self.addCleanup(client.close)
        first = client.watch_events()
        resume_point = self.until_caught_up(first)[-1].resume_point
        first.close()
        with client.open_session("writer") as session:
            session.put_blocks("default", tokens(900, 16), bytes(self.block_bytes(client)))
        batches = self.until_caught_up(client.watch_events(start=resume_point))
        self.assertFalse(any(batch.snapshot for batch in batches))
        self.assertEqual(self.kinds(batches), ["blocks_stored"])
        self.assertEqual(batches[0].events[0].sequence, resume_point.sequence)

    def test_watch_without_resume_reports_the_outage(self):
        client = self.daemon.client()
        self.addCleanup(client.close)
        watch = client.watch_events(resume=False)
        self.until_caught_up(watch)
        self.restart()
        with self.assertRaises(KvCacheError) as raised:
            next(watch)
        self.assertEqual(raised.exception.code, Code.UNAVAILABLE)

    # --- asyncio --------------------------------------------------------------------------------

    def test_asyncio_client_rides_out_a_restart_and_resumes_its_watch(self):
        async def scenario():
            async with aio.Client(self.daemon.target, connect_timeout=BOUND,
                                  rpc_timeout=BOUND) as client:
                prompt = tokens(0, 48)
                watch = client.watch_events()
                first = await self.until_caught_up_async(watch)
                self.assertEqual(self.kinds(first), ["all_blocks_cleared"])
                session = await client.open_session("before")
                restarter = self.restart()
                self.assertEqual((await client.lookup("default", prompt)).num_cached_tokens, 0)
                restarted = restarter.join()
                self.assertEqual(await client.ping(), restarted.epoch)
                with self.assertRaises(KvCacheError) as raised:
                    await session.commit(1, 0)
                self.assertEqual(raised.exception.code, Code.FAILED_PRECONDITION)
                self.assertTrue(session.epoch_changed)
                await session.__aexit__(None, None, None)
                snapshot = await self.until_caught_up_async(watch)
                self.assertEqual([batch.snapshot_end for batch in snapshot][-1], True)
                self.assertEqual({batch.epoch for batch in snapshot}, {restarted.epoch})
                await watch.aclose()
        asyncio.run(scenario())

    # --- helpers --------------------------------------------------------------------------------

    @staticmethod
    def block_bytes(client) -> int:
        return client.describe_pool("default").pool.layout.block_bytes

    @staticmethod
    def kinds(batches) -> list:
        return [event.WhichOneof("kind") for batch in batches for event in batch.events]

    @staticmethod
    def caught_up(batch) -> bool:
        in_snapshot = batch.snapshot and not batch.snapshot_end
        return not in_snapshot and batch.next_sequence >= batch.head_sequence

    def until_caught_up(self, watch) -> list:
        """Batches until the watcher has caught up with the daemon (bounded by BOUND)."""
        batches = []
        deadline = time.monotonic() + BOUND
        for batch in watch:
            batches.append(batch)
            if self.caught_up(batch):
                return batches
            self.assertLess(time.monotonic(), deadline, "the watch never caught up")
        raise AssertionError("the watch ended")

    async def until_caught_up_async(self, watch) -> list:
        batches = []
        while True:
            batch = await asyncio.wait_for(watch.__anext__(), BOUND)
            batches.append(batch)
            if self.caught_up(batch):
                return batches


if __name__ == "__main__":
    unittest.main()
