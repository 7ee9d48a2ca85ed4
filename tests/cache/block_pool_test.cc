// BlockPool bookkeeping: states, LRU order, the verified index, and invariants.
#include "cache/block_pool.h"

#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

constexpr uint32_t kBlockSize = 2;

BlockIdentity Identity(uint64_t hash, uint64_t parent = 0, BlockId parent_block = kNoBlock) {
  return BlockIdentity{.hash = {hash, hash},
                       .parent_hash = {parent, parent},
                       .parent_block = parent_block,
                       .extras_digest = 7};
}

class BlockPoolTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_OK(pool_.CheckInvariants()); }
  BlockPool pool_{4, kBlockSize};
  const std::vector<uint32_t> tokens_{10, 11};
};

TEST_F(BlockPoolTest, HandsOutFreeBlocksThenEvictsLeastRecentlyReleased) {
  const BlockId a = pool_.AllocateFresh();
  const BlockId b = pool_.AllocateFresh();
  ASSERT_TRUE(pool_.Publish(a, Identity(1), tokens_));
  ASSERT_TRUE(pool_.Publish(b, Identity(2), tokens_));
  pool_.Release(b);
  pool_.Release(a);
  EXPECT_EQ(pool_.num_evictable(), 2);
  pool_.AllocateFresh();
  pool_.AllocateFresh();
  EXPECT_EQ(pool_.counters().evictions, 0);  // the free list goes first
  EXPECT_EQ(pool_.AllocateFresh(), b);       // released before a
  EXPECT_EQ(pool_.Indexed(Identity(2).hash), kNoBlock);
  EXPECT_EQ(pool_.AllocateFresh(), a);
  EXPECT_EQ(pool_.AllocateFresh(), kNoBlock);
  EXPECT_EQ(pool_.counters().evictions, 2);
}

TEST_F(BlockPoolTest, AcquireResurrectsFromTheMiddleOfTheLru) {
  std::vector<BlockId> blocks;
  for (uint64_t i = 1; i <= 3; ++i) {
    blocks.push_back(pool_.AllocateFresh());
    ASSERT_TRUE(pool_.Publish(blocks.back(), Identity(i), tokens_));
  }
  for (BlockId block : blocks) pool_.Release(block);
  pool_.Acquire(blocks[1], /*prefix_hit=*/true);
  EXPECT_EQ(pool_.num_evictable(), 2);
  EXPECT_EQ(pool_.RefCount(blocks[1]), 1);
  EXPECT_EQ(pool_.counters().resurrections, 1);
  EXPECT_OK(pool_.CheckInvariants());
  pool_.AllocateFresh();  // the last free block
  EXPECT_EQ(pool_.AllocateFresh(), blocks[0]);
  EXPECT_EQ(pool_.AllocateFresh(), blocks[2]);
  pool_.Release(blocks[1]);
}

TEST_F(BlockPoolTest, UnpublishedBlockGoesStraightToTheFreeList) {
  const BlockId block = pool_.AllocateFresh();
  pool_.Release(block);
  EXPECT_EQ(pool_.num_free(), 4);
  EXPECT_EQ(pool_.num_evictable(), 0);
}

TEST_F(BlockPoolTest, SharedBlockStaysReferencedUntilTheLastRelease) {
  const BlockId block = pool_.AllocateFresh();
  ASSERT_TRUE(pool_.Publish(block, Identity(1), tokens_));
  pool_.Acquire(block, /*prefix_hit=*/true);
  pool_.Release(block);
  EXPECT_EQ(pool_.num_referenced(), 1);
  pool_.Release(block);
  EXPECT_EQ(pool_.num_evictable(), 1);
}

TEST_F(BlockPoolTest, DuplicateHashKeepsTheFirstBlock) {
  const BlockId first = pool_.AllocateFresh();
  const BlockId second = pool_.AllocateFresh();
  EXPECT_TRUE(pool_.Publish(first, Identity(1), tokens_));
  EXPECT_FALSE(pool_.Publish(second, Identity(1), tokens_));
  EXPECT_TRUE(pool_.Publish(first, Identity(1), tokens_));  // republishing is a no-op
  EXPECT_EQ(pool_.Indexed(Identity(1).hash), first);
  EXPECT_FALSE(pool_.IsPublished(second));
  EXPECT_EQ(pool_.counters().duplicates, 1);
  EXPECT_EQ(pool_.counters().published, 1);
}

// A hash collision must only ever cost a miss: every stored field is checked.
TEST_F(BlockPoolTest, VerifiedLookupRejectsAnyMismatchBehindAnEqualHash) {
  const BlockId parent = pool_.AllocateFresh();
  const BlockId block = pool_.AllocateFresh();
  ASSERT_TRUE(pool_.Publish(parent, Identity(1), tokens_));
  const BlockIdentity stored = Identity(2, 1, parent);
  ASSERT_TRUE(pool_.Publish(block, stored, tokens_));
  EXPECT_EQ(pool_.FindVerified(stored, tokens_), block);

  EXPECT_EQ(pool_.FindVerified(stored, std::vector<uint32_t>{10, 12}), kNoBlock);
  BlockIdentity other = stored;
  other.parent_hash = {9, 9};
  EXPECT_EQ(pool_.FindVerified(other, tokens_), kNoBlock);
  other = stored;
  other.parent_block = block;
  EXPECT_EQ(pool_.FindVerified(other, tokens_), kNoBlock);
  other = stored;
  other.extras_digest = 8;
  EXPECT_EQ(pool_.FindVerified(other, tokens_), kNoBlock);
  other = stored;
  other.namespace_digest = 1;
  EXPECT_EQ(pool_.FindVerified(other, tokens_), kNoBlock);
  other = stored;
  other.prefix_digest = 1;
  EXPECT_EQ(pool_.FindVerified(other, tokens_), kNoBlock);
  other = stored;
  other.hash = {3, 3};
  EXPECT_EQ(pool_.FindVerified(other, tokens_), kNoBlock);
}

TEST_F(BlockPoolTest, CheckInvariantsCountsEveryState) {
  const BlockId a = pool_.AllocateFresh();
  const BlockId b = pool_.AllocateFresh();
  ASSERT_TRUE(pool_.Publish(b, Identity(5), tokens_));
  pool_.Release(b);
  EXPECT_EQ(pool_.num_free(), 2);
  EXPECT_EQ(pool_.num_evictable(), 1);
  EXPECT_EQ(pool_.num_referenced(), 1);
  EXPECT_OK(pool_.CheckInvariants());
  pool_.Release(a);
}

}  // namespace
}  // namespace kvcache

namespace kvcache {
namespace {

// The offload mover's pin (issue 18): a block copied below keeps its LRU place, is not a hit, and
// its later eviction counts as already offloaded.
class OffloadPinTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (uint64_t i = 1; i <= 3; ++i) {
      blocks_.push_back(pool_.AllocateFresh());
      ASSERT_TRUE(pool_.Publish(blocks_.back(), Identity(i), tokens_));
    }
    for (BlockId block : blocks_) pool_.Release(block);  // LRU: 0, 1, 2
    pool_.AllocateFresh();                               // the last free block
  }
  void TearDown() override { EXPECT_OK(pool_.CheckInvariants()); }

  BlockPool pool_{4, kBlockSize};
  const std::vector<uint32_t> tokens_{10, 11};
  std::vector<BlockId> blocks_;
};

TEST_F(OffloadPinTest, PinnedBlockIsNotEvictedAndReturnsToItsPlace) {
  pool_.PinForOffload(blocks_[1]);
  EXPECT_TRUE(pool_.IsOffloadPinned(blocks_[1]));
  EXPECT_EQ(pool_.num_evictable(), 2);
  EXPECT_EQ(pool_.counters().resurrections, 0);  // a pin is no hit
  EXPECT_OK(pool_.CheckInvariants());
  pool_.UnpinOffloaded(blocks_[1], /*offloaded=*/true);
  EXPECT_TRUE(pool_.IsOffloaded(blocks_[1]));
  EXPECT_FALSE(pool_.IsOffloaded(blocks_[0]));
  // The LRU order is as before: 0, 1, 2.
  EXPECT_EQ(pool_.AllocateFresh(), blocks_[0]);
  EXPECT_EQ(pool_.counters().evicted_offloaded, 0);
  EXPECT_EQ(pool_.AllocateFresh(), blocks_[1]);
  EXPECT_EQ(pool_.counters().evicted_offloaded, 1);
  EXPECT_FALSE(pool_.IsOffloaded(blocks_[1]));  // reused: its new bytes are not below
  EXPECT_EQ(pool_.AllocateFresh(), blocks_[2]);
}

TEST_F(OffloadPinTest, BlockUsedDuringThePinGoesToTheBackWhenReleased) {
  pool_.PinForOffload(blocks_[0]);
  pool_.Acquire(blocks_[0], /*prefix_hit=*/true);  // a hit while the mover copies it
  pool_.Release(blocks_[0]);
  EXPECT_FALSE(pool_.IsEvictable(blocks_[0]));  // still pinned
  pool_.UnpinOffloaded(blocks_[0], /*offloaded=*/true);
  EXPECT_TRUE(pool_.IsEvictable(blocks_[0]));
  EXPECT_EQ(pool_.AllocateFresh(), blocks_[1]);
  EXPECT_EQ(pool_.AllocateFresh(), blocks_[2]);
  EXPECT_EQ(pool_.AllocateFresh(), blocks_[0]);
}

}  // namespace
}  // namespace kvcache
