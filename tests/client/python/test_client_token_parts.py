"""Token calls with parts, from Python (kvcache.proto OpenSequence, CommitSequence, Lookup, and
the data streams PutBlocks and GetBlocks).

Against a kvcache-manager (KVCACHE_BIN_DIR) with a pool of two parts, "kv" (12 KiB, every block of
a hit) and "state" (4 KiB, the last block of a hit): a commit names each block's parts, and
open_sequence and lookup restore the parts asked for, answering each cached block's mask; a
richer commit supersedes a poorer copy; put_blocks publishes each block's mask and get_blocks
ends where the hit rule ends, telling the masks; the daemon's codes for bad input, with nothing
held; the same through the asyncio client. Without a daemon binary the tests fail.
"""

import asyncio
import unittest

import grpc

from daemon import BOUND, Daemon, error_code, error_message as message_of, wait_until

from kvcache_client import aio

Code = grpc.StatusCode
POOL = "hybrid"
BLOCK = 16  # tokens per block
POOL_SPEC = (f"{POOL}:layers=2:kv_heads=2:head_dim=64:block_size={BLOCK}:blocks=32:"
             "parts=kv/12K+state/4K/trailing1")
KV, STATE, BOTH = 1, 2, 3  # part masks


def prompt(blocks: int, first: int) -> list:
    """`blocks` full blocks and one token more, so an open may hit every block."""
    return list(range(first, first + blocks * BLOCK + 1))


class TokenPartsTest(unittest.TestCase):
    """One daemon with the two-part pool; each test its own prompts."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon(pool=POOL_SPEC)
        cls.client = cls.daemon.client()

    @classmethod
    def tearDownClass(cls):
        cls.client.close()
        cls.daemon.cleanup()

    def setUp(self):
        self.session = self.client.open_session("token-parts")
        self.addCleanup(self.session.__exit__, None, None, None)

    def store(self, tokens: list, masks) -> None:
        table = self.session.open_sequence(POOL, tokens)
        full = len(tokens) // BLOCK * BLOCK
        self.session.commit(table.sequence_id, full, part_masks=masks)
        self.session.release(table.sequence_id)

    @staticmethod
    def block_bytes(blocks: int, first: int) -> bytes:
        """`blocks` blocks of 16 KiB, each filled with its own byte."""
        return b"".join(bytes([first + i]) * (16 << 10) for i in range(blocks))

    def referenced(self) -> int:
        return self.client.describe_pool(POOL).counts.referenced

    def test_the_hit_ends_where_every_asked_part_restores(self):
        tokens = prompt(6, 100)
        self.store(tokens, [KV, KV, KV, BOTH, KV, KV])
        both = self.client.lookup(POOL, tokens, restore_parts=["kv", "state"])
        self.assertEqual((both.num_cached_tokens, both.part_masks),
                         (4 * BLOCK, [KV, KV, KV, BOTH]))
        self.assertEqual(self.client.lookup(POOL, tokens, restore_parts=["kv"]).num_cached_tokens,
                         6 * BLOCK)
        table = self.session.open_sequence(POOL, tokens, restore_parts=["kv", "state"])
        self.assertEqual((table.num_cached_tokens, table.part_masks),
                         (4 * BLOCK, [KV, KV, KV, BOTH]))
        self.assertEqual(len(table.block_ids), 7)
        self.session.release(table.sequence_id)
        default = self.session.open_sequence(POOL, tokens)  # every part
        self.assertEqual(default.num_cached_tokens, 4 * BLOCK)
        self.session.release(default.sequence_id)
        self.assertEqual(self.referenced(), 0)

    def test_a_richer_commit_supersedes_the_poorer_copy(self):
        tokens = prompt(3, 1000)
        self.store(tokens, [KV, KV, KV])
        self.assertEqual(self.client.lookup(POOL, tokens).num_cached_tokens, 0)
        table = self.session.open_sequence(POOL, tokens, restore_parts=["kv", "state"])
        self.assertEqual(table.num_cached_tokens, 0)
        committed = self.session.commit(table.sequence_id, 3 * BLOCK, part_masks=[KV, KV, BOTH])
        self.assertEqual(committed.num_published_blocks, 1)
        self.session.release(table.sequence_id)
        found = self.client.lookup(POOL, tokens)
        self.assertEqual((found.num_cached_tokens, found.part_masks), (3 * BLOCK, [KV, KV, BOTH]))

    def test_bad_parts_are_invalid_argument_and_hold_nothing(self):
        tokens = prompt(2, 2000)
        self.assertEqual(error_code(self.session.open_sequence, POOL, tokens,
                                    restore_parts=["kv", "ssm"]), Code.INVALID_ARGUMENT)
        self.assertIn("unknown part 'ssm'; the pool has kv, state",
                      message_of(self.client.lookup, POOL, tokens, restore_parts=["ssm"]))
        table = self.session.open_sequence(POOL, tokens)
        self.assertIn("block 1 has part mask 0x4 but the pool has 2 part(s)",
                      message_of(self.session.commit, table.sequence_id, 2 * BLOCK,
                                 part_masks=[KV, 4]))
        self.assertIn("block 0 has part mask 0x2 without part 'kv'",
                      message_of(self.session.commit, table.sequence_id, 2 * BLOCK,
                                 part_masks=[STATE, KV]))
        self.assertIn("1 part masks for a commit of 32 tokens",
                      message_of(self.session.commit, table.sequence_id, 2 * BLOCK,
                                 part_masks=[KV]))
        self.assertEqual(error_code(self.session.commit, table.sequence_id, 2 * BLOCK,
                                    part_masks=[0, KV]), Code.INVALID_ARGUMENT)  # the client's
        self.assertEqual(error_code(self.session.open_sequence, POOL, tokens,
                                    restore_parts="kv"), Code.INVALID_ARGUMENT)  # a str
        self.session.release(table.sequence_id)
        self.assertEqual(self.client.lookup(POOL, tokens, restore_parts=["kv"]).num_cached_tokens,
                         0)
        self.assertEqual(self.referenced(), 0)

    def test_put_blocks_masks_come_back_from_get_blocks_and_open_sequence(self):
        tokens = prompt(4, 4000)
        data = self.block_bytes(4, 1)
        put = self.session.put_blocks(POOL, tokens, data, part_masks=[KV, KV, BOTH, KV])
        self.assertEqual(put.num_stored, 4)
        info, got = self.session.get_blocks(POOL, tokens)  # every part: ends at the state
        self.assertEqual((info.num_blocks, info.part_masks), (3, [KV, KV, BOTH]))
        self.assertEqual(bytes(got), data[:3 * (16 << 10)])
        info, got = self.session.get_blocks(POOL, tokens, restore_parts=["kv"])
        self.assertEqual((info.num_blocks, info.part_masks), (4, [KV, KV, BOTH, KV]))
        self.assertEqual(bytes(got), data)
        destination = bytearray(len(data))
        info = self.session.get_blocks_into(POOL, tokens, destination,
                                            restore_parts=["kv", "state"])
        self.assertEqual(info.part_masks, [KV, KV, BOTH])
        # A stream's reactor releases its blocks after the client saw the stream end.
        wait_until(lambda: self.referenced() == 0, "the get streams to release their blocks")
        table = self.session.open_sequence(POOL, tokens, restore_parts=["kv", "state"])
        self.assertEqual((table.num_cached_tokens, table.part_masks), (3 * BLOCK, [KV, KV, BOTH]))
        self.session.release(table.sequence_id)
        # A put that skips the blocks the daemon holds (up to where every part restores) still
        # masks from block 0.
        longer = prompt(5, 4000)
        put = self.session.put_blocks(POOL, longer, data[3 * (16 << 10):] + self.block_bytes(1, 9),
                                      first_block=3, part_masks=[KV, KV, BOTH, KV, BOTH])
        self.assertEqual(put.num_already_cached, 3)
        info, _ = self.session.get_blocks(POOL, longer)
        self.assertEqual(info.part_masks, [KV, KV, BOTH, KV, BOTH])
        wait_until(lambda: self.referenced() == 0, "the streams to release their blocks")

    def test_bad_put_masks_or_get_parts_are_invalid_argument_and_hold_nothing(self):
        tokens = prompt(2, 5000)
        data = self.block_bytes(2, 1)
        self.assertIn("block 1 has part mask 0x4 but the pool has 2 part(s)",
                      message_of(self.session.put_blocks, POOL, tokens, data,
                                 part_masks=[KV, 4]))
        self.assertIn("block 0 has part mask 0x2 without part 'kv'",
                      message_of(self.session.put_blocks, POOL, tokens, data,
                                 part_masks=[STATE, KV]))
        self.assertIn("1 part masks for 2 full blocks",
                      message_of(self.session.put_blocks, POOL, tokens, data, part_masks=[KV]))
        self.assertEqual(error_code(self.session.put_blocks, POOL, tokens, data,
                                    part_masks=[0, KV]), Code.INVALID_ARGUMENT)  # the client's
        self.assertIn("unknown part 'ssm'",
                      message_of(self.session.get_blocks, POOL, tokens,
                                 restore_parts=["kv", "ssm"]))
        self.assertEqual(error_code(self.session.get_blocks, POOL, tokens, restore_parts="kv"),
                         Code.INVALID_ARGUMENT)  # a str
        self.assertEqual(self.client.lookup(POOL, tokens, restore_parts=["kv"]).num_cached_tokens,
                         0)
        # A stream releases what it held just after its caller has the status.
        wait_until(lambda: self.referenced() == 0, "the failed streams to release their blocks")

    def test_the_asyncio_client_takes_the_same_arguments(self):
        tokens = prompt(3, 3000)

        async def scenario():
            async with aio.Client(self.daemon.target, connect_timeout=BOUND,
                                  rpc_timeout=BOUND) as client:
                async with await client.open_session("aio-token-parts") as session:
                    table = await session.open_sequence(POOL, tokens, restore_parts=["kv"])
                    await session.commit(table.sequence_id, 3 * BLOCK,
                                         part_masks=[KV, BOTH, KV])
                    await session.release(table.sequence_id)
                    found = await client.lookup(POOL, tokens, restore_parts=["kv", "state"])
                    self.assertEqual((found.num_cached_tokens, found.part_masks),
                                     (2 * BLOCK, [KV, BOTH]))
                    again = await session.open_sequence(POOL, tokens,
                                                        restore_parts=["kv", "state"])
                    self.assertEqual(again.part_masks, [KV, BOTH])
                    await session.release(again.sequence_id)
                    streamed = prompt(3, 3500)
                    data = self.block_bytes(3, 7)
                    await session.put_blocks(POOL, streamed, data, part_masks=[KV, BOTH, KV])
                    info, got = await session.get_blocks(POOL, streamed)
                    self.assertEqual((info.part_masks, bytes(got)),
                                     ([KV, BOTH], data[:2 * len(data) // 3]))
                    destination = bytearray(len(data))
                    info = await session.get_blocks_into(POOL, streamed, destination,
                                                         restore_parts=["kv"])
                    self.assertEqual((info.part_masks, bytes(destination)),
                                     ([KV, BOTH, KV], data))
        asyncio.run(scenario())


if __name__ == "__main__":
    unittest.main()
