"""kvcache_client.aio against a real kvcache-manager: the blocking client's calls as coroutines,
with the same results and error codes, a keep-alive task that holds a short lease, block bytes
both ways, the pool mapping, and a closed client's CANCELLED. The blocking client runs beside it
on the same daemon as the reference.
"""

import asyncio
import unittest

import grpc
import numpy

from daemon import BOUND, Daemon, error_code, tokens

from kvcache_client import CompatibilityManifest, KvCacheError, PagePart, ParallelGeometry, aio

Code = grpc.StatusCode


async def code_of(awaitable) -> grpc.StatusCode:
    try:
        await awaitable
    except KvCacheError as error:
        return error.code
    raise AssertionError("no KvCacheError")


class AioTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon()
        cls.sync_client = cls.daemon.client()

    @classmethod
    def tearDownClass(cls):
        cls.sync_client.close()
        cls.daemon.cleanup()

    def run_async(self, scenario):
        async def with_client():
            async with aio.Client(self.daemon.target, connect_timeout=BOUND,
                                  rpc_timeout=BOUND) as client:
                await scenario(client)
        asyncio.run(with_client())

    def test_read_only_calls_answer_as_the_blocking_client(self):
        async def scenario(client):
            self.assertEqual(await client.ping(), self.daemon.epoch)
            self.assertEqual(await client.list_pools(), self.sync_client.list_pools())
            described = await client.describe_pool("default")
            self.assertEqual(described.pool, self.sync_client.describe_pool("default").pool)
            self.assertEqual(await client.lookup("default", tokens(0, 40)),
                             self.sync_client.lookup("default", tokens(0, 40)))
            self.assertEqual((await client.stats()).pools[0].pool, "default")
            self.assertEqual(await client.health(), "SERVING")
            self.assertEqual(await client.health("no.such.Service"), "SERVICE_UNKNOWN")
            self.assertEqual(await code_of(client.describe_pool("nope")), Code.NOT_FOUND)
            self.assertEqual(await code_of(client.lookup("default", [-1])),
                             Code.INVALID_ARGUMENT)
        self.run_async(scenario)

    def test_a_manifest_binds_the_session(self):
        async def scenario(client):
            layout = (await client.describe_pool("default")).pool.layout
            manifest = CompatibilityManifest(
                model_id="m", model_config_digest=b"aio", kv_dtype="fp16",
                page_tokens=layout.block_size, parts=(PagePart("kv", layout.block_bytes),),
                parallel=ParallelGeometry(tp_size=4, tp_rank=3))
            prompt = tokens(8000, 40)
            async with await client.open_session("aio-manifest", manifest=manifest) as session:
                sequence = await session.open_sequence("default", prompt)
                await session.commit(sequence.sequence_id, 32)
                await session.release(sequence.sequence_id)
                uses = (await client.describe_pool("default")).manifests
                self.assertEqual([(use.manifest, use.sessions) for use in uses],
                                 [(manifest, 1)])
            self.assertEqual((await client.lookup("default", prompt, manifest=manifest))
                             .num_cached_tokens, 32)
            self.assertEqual((await client.lookup("default", prompt)).num_cached_tokens, 0)
            self.assertEqual(await code_of(client.open_session(
                "bad", manifest=CompatibilityManifest(
                    model_id="", model_config_digest=b"x", kv_dtype="fp16", page_tokens=16,
                    parts=(PagePart("kv", 1),)))), Code.INVALID_ARGUMENT)
        self.run_async(scenario)

    def test_sequences_and_block_bytes(self):
        async def scenario(client):
            layout = (await client.describe_pool("default")).pool.layout
            prompt = tokens(2000, 40)
            async with await client.open_session("aio-seq") as session:
                sequence = await session.open_sequence("default", prompt)
                self.assertEqual(len(sequence.block_ids), 3)
                extension = await session.extend(sequence.sequence_id, tokens(3000, 10))
                self.assertEqual(extension.num_tokens, 50)
                commit = await session.commit(sequence.sequence_id, 40)
                self.assertEqual(commit.num_published_blocks, 2)
                child = await session.fork(sequence.sequence_id)
                self.assertEqual(child.block_ids[:2], sequence.block_ids[:2])
                await session.release(child.sequence_id)
                await session.release(sequence.sequence_id)
                self.assertEqual(await code_of(session.release(sequence.sequence_id)),
                                 Code.NOT_FOUND)
                # Found by the blocking client too: one daemon, one index.
                self.assertEqual(self.sync_client.lookup("default", prompt).num_cached_tokens, 32)

                data = numpy.arange(2 * layout.block_bytes, dtype=numpy.uint8)
                put = await session.put_blocks("default", tokens(4000, 32), data)
                self.assertEqual(put.num_stored, 2)
                into = numpy.zeros_like(data)
                info = await session.get_blocks_into("default", tokens(4000, 40), into)
                self.assertEqual(info.num_blocks, 2)
                self.assertTrue((into == data).all())
                got_info, got = await session.get_blocks("default", tokens(4000, 32))
                self.assertEqual(bytes(got), data.tobytes())
                self.assertEqual(await code_of(session.get_blocks_into(
                    "default", tokens(4000, 32), bytearray(10))), Code.OUT_OF_RANGE)
                self.assertEqual(await code_of(session.put_blocks(
                    "default", tokens(4000, 32), b"short")), Code.INVALID_ARGUMENT)

                await session.publish_rendezvous("aio-key", b"value")
                self.assertEqual(await session.await_rendezvous("aio-key", BOUND), b"value")
                mapped = await session.map_pool("default")
                self.assertEqual(mapped.block(sequence.block_ids[0]).nbytes, layout.block_bytes)
                mapped.close()
            self.assertEqual(await code_of(session.open_sequence("default", prompt)),
                             Code.FAILED_PRECONDITION)  # closed by the `async with`
        self.run_async(scenario)

    def test_keep_alive_task_holds_a_short_lease(self):
        async def scenario(client):
            session = await client.open_session("aio-lease", ttl=0.3)
            ttl = session.ttl
            await asyncio.sleep(ttl * 4)  # several leases long: only the keep-alives hold it
            self.assertFalse(session.lost)
            sessions = await client.list_sessions()
            self.assertIn(session.id, [info.session_id for info in sessions])
            self.assertEqual(await session.close(), 0)
            self.assertNotIn(session.id,
                             [info.session_id for info in await client.list_sessions()])
        self.run_async(scenario)

    def test_a_closed_client_cancels(self):
        async def scenario():
            client = await aio.Client(self.daemon.target, connect_timeout=BOUND).connect()
            await client.close()
            self.assertEqual(await code_of(client.ping()), Code.CANCELLED)
        asyncio.run(scenario())

    def test_no_daemon_is_unavailable(self):
        async def scenario():
            client = aio.Client("unix:///nonexistent/kv.sock", connect_timeout=0.2)
            self.assertEqual(await code_of(client.connect()), Code.UNAVAILABLE)
            await client.close()
        asyncio.run(scenario())
        self.assertEqual(error_code(aio.Client, "unix:///x.sock", rpc_timeout=0),
                         Code.INVALID_ARGUMENT)


if __name__ == "__main__":
    unittest.main()
