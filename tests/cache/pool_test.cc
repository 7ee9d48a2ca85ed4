// The DESIGN §3 block and prefix contract, rule by rule, on a small pool. Every scenario ends with
// the pool's invariants checked (TearDown).
#include "cache/pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <numeric>

#include "tests/testing/fault_injection_pool_memory.h"
#include "tests/testing/small_pool_options.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr uint32_t kBlockSize = 4;
constexpr uint32_t kNumBlocks = 8;

using ::kvcache::testing::Tokens;

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

PoolOptions TestPoolOptions() { return testing::SmallPoolOptions("test", kNumBlocks, kBlockSize); }

class PoolTest : public ::testing::Test {
 protected:
  void SetUp() override { cache_ = MakeCache(HashAlgorithm::kXxh3_128); }
  void TearDown() override { EXPECT_OK(cache_->CheckInvariants()); }

  static std::unique_ptr<Pool> MakeCache(HashAlgorithm algorithm) {
    PoolOptions options = TestPoolOptions();
    options.hash_algorithm = algorithm;
    auto memory = HostPoolMemory::Create(options.layout.BlockBytes(), options.num_blocks);
    EXPECT_OK(memory);
    auto cache = Pool::Create(options, 0, *std::move(memory));
    EXPECT_OK(cache);
    return *std::move(cache);
  }

  OpenedSequence Open(const std::vector<uint32_t>& tokens, const Session* session = nullptr,
                      absl::string_view salt = "", ExtraKeys extras = {}) {
    auto opened =
        cache_->Open(session ? *session : session_, SequenceSpec{tokens, salt, std::move(extras)});
    EXPECT_OK(opened);
    return opened.ok() ? *opened : OpenedSequence{};
  }

  // Opens, writes (commits) every token and releases: what a finished request leaves behind.
  OpenedSequence Compute(const std::vector<uint32_t>& tokens, absl::string_view salt = "",
                         ExtraKeys extras = {}) {
    OpenedSequence opened = Open(tokens, nullptr, salt, std::move(extras));
    EXPECT_OK(cache_->Commit(session_, opened.sequence_id, tokens.size()));
    EXPECT_OK(cache_->Release(session_, opened.sequence_id));
    return opened;
  }

  uint32_t CachedTokens(const std::vector<uint32_t>& tokens, absl::string_view salt = "",
                        ExtraKeys extras = {}, absl::string_view tenant = "tenant-a") {
    auto result = cache_->Lookup(tenant, SequenceSpec{tokens, salt, std::move(extras)});
    EXPECT_OK(result);
    return result.ok() ? result->num_cached_tokens : 0;
  }

  std::tuple<uint32_t, uint32_t, uint32_t> Counts() const {
    const PoolStatsSnapshot stats = cache_->Stats();
    return {stats.free, stats.evictable, stats.referenced};
  }

  Session session_{1, "uid:1", "tenant-a", "test", absl::Seconds(10)};
  Session other_session_{2, "uid:1", "tenant-a", "other", absl::Seconds(10)};
  std::unique_ptr<Pool> cache_;
};

TEST_F(PoolTest, ColdOpenAllocatesEveryBlockFresh) {
  const OpenedSequence opened = Open(Tokens(100, 10));
  EXPECT_EQ(opened.num_cached_tokens, 0);
  EXPECT_THAT(opened.block_ids, ElementsAre(0, 1, 2));
  EXPECT_EQ(Counts(), std::make_tuple(5u, 0u, 3u));
}

TEST_F(PoolTest, PartialBlockIsNeverCached) {
  Compute(Tokens(100, 10));  // two full blocks and a partial one
  EXPECT_EQ(CachedTokens(Tokens(100, 10)), 8);
  // The partial block went straight back to the free list; the full ones stay findable.
  EXPECT_EQ(Counts(), std::make_tuple(6u, 2u, 0u));
}

TEST_F(PoolTest, HitStopsAtFirstMissingBlock) {
  Compute(Tokens(100, 13));
  // Same first block, different second, same third: only the first block may hit.
  std::vector<uint32_t> prompt = Tokens(100, 13);
  prompt[5] = 999;
  const OpenedSequence opened = Open(prompt);
  EXPECT_EQ(opened.num_cached_tokens, 4);
  EXPECT_EQ(CachedTokens(prompt), 4);
}

TEST_F(PoolTest, FullyCachedPromptStillComputesItsLastToken) {
  const OpenedSequence first = Compute(Tokens(100, 8));
  const OpenedSequence second = Open(Tokens(100, 8));
  EXPECT_EQ(second.num_cached_tokens, 4);
  ASSERT_EQ(second.block_ids.size(), 2);
  EXPECT_EQ(second.block_ids[0], first.block_ids[0]);
  EXPECT_NE(second.block_ids[1], first.block_ids[1]);
  // A router's lookup is not capped.
  EXPECT_EQ(CachedTokens(Tokens(100, 8)), 8);
}

TEST_F(PoolTest, ReleasedBlocksAreResurrectedByALaterHit) {
  const OpenedSequence first = Compute(Tokens(100, 13));
  EXPECT_EQ(Counts(), std::make_tuple(5u, 3u, 0u));
  const OpenedSequence second = Open(Tokens(100, 13));
  EXPECT_EQ(second.num_cached_tokens, 12);
  EXPECT_THAT(absl::MakeSpan(second.block_ids).subspan(0, 3),
              ElementsAreArray(absl::MakeSpan(first.block_ids).subspan(0, 3)));
  EXPECT_EQ(Counts(), std::make_tuple(4u, 0u, 4u));
  EXPECT_EQ(cache_->Stats().pool.resurrections, 3);
  EXPECT_EQ(cache_->Stats().hit_tokens, 12);
}

// Regression (issue 29, item 9): a GetBlocks read (or a put) of soft-freed blocks counted them as
// resurrected though not as hit, so resurrections, documented as hits on evictable blocks,
// outgrew the hits. Only a compute open's hits count, in both figures.
TEST_F(PoolTest, ReadsAndPutsOfSoftFreedBlocksAreNeitherHitsNorResurrections) {
  Compute(Tokens(100, 13));  // 3 full blocks, soft-freed
  for (const OpenMode mode : {OpenMode::kPinCached, OpenMode::kPut}) {
    auto pinned = cache_->Open(session_, SequenceSpec{Tokens(100, 12)}, mode);
    ASSERT_OK(pinned);
    EXPECT_EQ(pinned->num_cached_tokens, 12);
    EXPECT_OK(cache_->Release(session_, pinned->sequence_id));
  }
  for (const PoolStatsSnapshot& stats : {cache_->Stats(), cache_->Stats("tenant-a")}) {
    EXPECT_EQ(stats.hit_blocks, 0);
    EXPECT_EQ(stats.pool.resurrections, 0);
  }
  Open(Tokens(100, 13));  // a compute open: 3 hits, all on soft-freed blocks
  for (const PoolStatsSnapshot& stats : {cache_->Stats(), cache_->Stats("tenant-a")}) {
    EXPECT_EQ(stats.hit_blocks, 3);
    EXPECT_EQ(stats.pool.resurrections, 3);
  }
}

TEST_F(PoolTest, EvictionIsTailFirstWithinASequence) {
  Compute(Tokens(100, 13));  // blocks 0..2 evictable, released tail first
  const OpenedSequence filler = Open(Tokens(500, 4 * 6));  // 5 free + 1 eviction
  EXPECT_EQ(filler.num_cached_tokens, 0);
  EXPECT_EQ(cache_->Stats().pool.evictions, 1);
  EXPECT_EQ(cache_->Stats().pool.evicted_offloaded, 0);  // no tier below: nothing went down
  EXPECT_EQ(CachedTokens(Tokens(100, 13)), 8);           // the tail block went first
  ASSERT_OK(cache_->Extend(session_, filler.sequence_id, Tokens(900, 1)).status());
  EXPECT_EQ(CachedTokens(Tokens(100, 13)), 4);
}

TEST_F(PoolTest, EvictionTakesLeastRecentlyReleasedFirst) {
  Compute(Tokens(100, 5));  // block A, released first
  Compute(Tokens(200, 5));  // block B, released second
  EXPECT_EQ(Counts(), std::make_tuple(6u, 2u, 0u));
  Open(Tokens(500, 4 * 7));  // 6 free + 1 eviction
  EXPECT_EQ(CachedTokens(Tokens(100, 5)), 0);
  EXPECT_EQ(CachedTokens(Tokens(200, 5)), 4);
}

TEST_F(PoolTest, ResurrectionMovesABlockToTheBackOfTheEvictionOrder) {
  Compute(Tokens(100, 5));  // A
  Compute(Tokens(200, 5));  // B
  Compute(Tokens(100, 5));  // A again: resurrected, released after B
  Open(Tokens(500, 4 * 7));
  EXPECT_EQ(CachedTokens(Tokens(100, 5)), 4);
  EXPECT_EQ(CachedTokens(Tokens(200, 5)), 0);
}

TEST_F(PoolTest, EvictedHashNoLongerHitsAndItsBlockIsReused) {
  const OpenedSequence first = Compute(Tokens(100, 5));
  const OpenedSequence filler = Open(Tokens(500, 4 * 8));
  EXPECT_THAT(filler.block_ids, ::testing::Contains(first.block_ids[0]));
  EXPECT_EQ(CachedTokens(Tokens(100, 5)), 0);
  ASSERT_OK(cache_->Release(session_, filler.sequence_id));
  EXPECT_EQ(Open(Tokens(100, 5)).num_cached_tokens, 0);
}

TEST_F(PoolTest, DifferentSaltsTenantsAndExtraKeysNeverShare) {
  Compute(Tokens(100, 9), "salt-1", ExtraKeys{.lora_id = "lora-a"});
  EXPECT_EQ(CachedTokens(Tokens(100, 9), "salt-1", ExtraKeys{.lora_id = "lora-a"}), 8);
  EXPECT_EQ(CachedTokens(Tokens(100, 9), "salt-2", ExtraKeys{.lora_id = "lora-a"}), 0);
  EXPECT_EQ(CachedTokens(Tokens(100, 9), "", ExtraKeys{.lora_id = "lora-a"}), 0);
  EXPECT_EQ(CachedTokens(Tokens(100, 9), "salt-1", ExtraKeys{.lora_id = "lora-b"}), 0);
  EXPECT_EQ(CachedTokens(Tokens(100, 9), "salt-1", ExtraKeys{}), 0);
  EXPECT_EQ(CachedTokens(Tokens(100, 9), "salt-1", ExtraKeys{.lora_id = "lora-a"}, "tenant-b"), 0);
}

TEST_F(PoolTest, MultimodalHashesKeyOnlyTheBlocksTheyCover) {
  auto image = [](std::string hash) {
    return ExtraKeys{.multimodal_items = {MultimodalItem{std::move(hash), 4, 4}}};
  };
  Compute(Tokens(100, 13), "", image("cat"));
  // Block 0 does not overlap the image; blocks 1 and 2 do (block 2 through its parent).
  EXPECT_EQ(CachedTokens(Tokens(100, 13), "", image("cat")), 12);
  EXPECT_EQ(CachedTokens(Tokens(100, 13), "", image("dog")), 4);
  EXPECT_EQ(CachedTokens(Tokens(100, 13), "", ExtraKeys{}), 4);
}

TEST_F(PoolTest, Sha256ChainsBehaveTheSame) {
  cache_ = MakeCache(HashAlgorithm::kSha256);
  const OpenedSequence first = Compute(Tokens(100, 9));
  const OpenedSequence second = Open(Tokens(100, 9));
  EXPECT_EQ(second.num_cached_tokens, 8);
  EXPECT_EQ(second.block_ids[1], first.block_ids[1]);
}

TEST_F(PoolTest, ExhaustionIsAnErrorThatChangesNothing) {
  Compute(Tokens(100, 5));                               // one evictable block
  const OpenedSequence held = Open(Tokens(200, 4 * 5));  // 5 referenced, 2 free
  const auto before = Counts();
  const auto stats_before = cache_->Stats();
  auto failed = cache_->Open(session_, SequenceSpec{Tokens(300, 4 * 4)});
  EXPECT_THAT(failed, StatusIs(absl::StatusCode::kResourceExhausted,
                               AllOf(HasSubstr("needs 4 new blocks"), HasSubstr("2 are free"),
                                     HasSubstr("1 evictable"))));
  EXPECT_EQ(Counts(), before);
  EXPECT_EQ(cache_->Stats().prompt_tokens, stats_before.prompt_tokens);
  EXPECT_EQ(CachedTokens(Tokens(100, 5)), 4);  // nothing was evicted for the failed request
  EXPECT_EQ(cache_->Stats().open_sequences, 1);
  EXPECT_THAT(cache_->Extend(session_, held.sequence_id, Tokens(0, 4 * 4)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(Counts(), before);
}

TEST_F(PoolTest, PromptLargerThanThePoolIsExhaustion) {
  EXPECT_THAT(cache_->Open(session_, SequenceSpec{Tokens(0, 4 * 9)}),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("the pool has 8")));
}

// Regression (issue 17): a read-only open of a prompt longer than the pool was refused as
// RESOURCE_EXHAUSTED ("needs 9 blocks; the pool has 8") although its prefix was cached.
TEST_F(PoolTest, PinningTheCachedPrefixOfAPromptLargerThanThePoolReturnsThePrefix) {
  Compute(Tokens(100, 12));
  for (const size_t length : {size_t{4 * 9 + 2}, size_t{1} << 20}) {
    SCOPED_TRACE(length);
    auto pinned = cache_->Open(session_, SequenceSpec{Tokens(100, length)}, OpenMode::kPinCached);
    ASSERT_OK(pinned);
    EXPECT_EQ(pinned->num_cached_tokens, 12);
    EXPECT_EQ(pinned->block_ids.size(), 3);
    EXPECT_OK(cache_->Release(session_, pinned->sequence_id));
  }
  // Allocating still checks the size.
  EXPECT_THAT(cache_->Open(session_, SequenceSpec{Tokens(100, 4 * 9)}, OpenMode::kPut),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("the pool has 8")));
}

// Issue 17: ForkSequence copies the partial block outside the pool lock. If the session ends
// during the copy, the sweep releases the child; its destination block must stay pinned until the
// copy lands, or another sequence could be handed it mid-copy.
TEST(PoolForkTest, ASessionEndingDuringTheForkCopyCannotHandOutItsDestination) {
  const PoolOptions options = TestPoolOptions();
  ASSERT_EQ(options.num_blocks, 8);
  auto host = HostPoolMemory::Create(options.layout.BlockBytes(), options.num_blocks);
  ASSERT_OK(host);
  auto memory = std::make_unique<::kvcache::testing::FaultInjectionPoolMemory>(*std::move(host));
  ::kvcache::testing::FaultInjectionPoolMemory* hooked = memory.get();
  auto pool = Pool::Create(options, 0, std::move(memory));
  ASSERT_OK(pool);
  Session ending{1, "uid:1", "tenant-a", "ending", absl::Seconds(10)};
  Session other{2, "uid:1", "tenant-a", "other", absl::Seconds(10)};
  // The parent: one full block and a partial one; the other session holds all but one of the
  // rest, so the fork's destination is the last free block.
  auto parent = (*pool)->Open(ending, SequenceSpec{Tokens(0, kBlockSize + 2)});
  ASSERT_OK(parent);
  auto filler = (*pool)->Open(other, SequenceSpec{Tokens(500, 5 * kBlockSize)});
  ASSERT_OK(filler);

  bool hook_ran = false;
  hooked->BeforeCopy([&](uint32_t, uint32_t destination) {
    hook_ran = true;
    // What CacheManager does when a lease ends: mark the session, then release its sequences.
    ending.closed.store(true);
    EXPECT_EQ((*pool)->ReleaseSession(ending.id), 2);  // the parent and the child
    auto taken = (*pool)->Open(other, SequenceSpec{Tokens(900, 2 * kBlockSize)});
    if (taken.ok()) {
      EXPECT_THAT(taken->block_ids, ::testing::Not(::testing::Contains(destination)));
    }
  });
  EXPECT_THAT((*pool)->Fork(ending, parent->sequence_id),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("ended during the fork")));
  EXPECT_TRUE(hook_ran);
  EXPECT_OK((*pool)->CheckInvariants());
  EXPECT_OK((*pool)->Release(other, filler->sequence_id));
  (*pool)->ReleaseSession(other.id);
  EXPECT_EQ((*pool)->Stats().referenced, 0);
  EXPECT_EQ((*pool)->Stats().free, 8);
  EXPECT_OK((*pool)->CheckInvariants());
}

TEST_F(PoolTest, OnlyCommittedBlocksArePublished) {
  const OpenedSequence opened = Open(Tokens(100, 12));
  EXPECT_EQ(CachedTokens(Tokens(100, 12)), 0);
  auto commit = cache_->Commit(session_, opened.sequence_id, 7);
  ASSERT_OK(commit);
  EXPECT_EQ(commit->num_committed_blocks, 1);
  EXPECT_EQ(commit->num_published_blocks, 1);
  EXPECT_EQ(CachedTokens(Tokens(100, 12)), 4);
  // Committing less than before changes nothing.
  commit = cache_->Commit(session_, opened.sequence_id, 3);
  ASSERT_OK(commit);
  EXPECT_EQ(commit->num_committed_blocks, 1);
  EXPECT_EQ(commit->num_published_blocks, 0);
  EXPECT_THAT(cache_->Commit(session_, opened.sequence_id, 13),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("has 12")));
  ASSERT_OK(cache_->Release(session_, opened.sequence_id));
  // Unwritten blocks went to the free list, not the evictable LRU.
  EXPECT_EQ(Counts(), std::make_tuple(7u, 1u, 0u));
}

TEST_F(PoolTest, DuplicateHashKeepsTheFirstBlock) {
  const OpenedSequence a = Open(Tokens(100, 9));
  const OpenedSequence b = Open(Tokens(100, 9));  // computed concurrently: no hit
  EXPECT_EQ(b.num_cached_tokens, 0);
  EXPECT_EQ(cache_->Commit(session_, a.sequence_id, 9)->num_published_blocks, 2);
  EXPECT_EQ(cache_->Commit(session_, b.sequence_id, 9)->num_published_blocks, 0);
  EXPECT_EQ(cache_->Stats().pool.duplicates, 2);
  ASSERT_OK(cache_->Release(session_, b.sequence_id));
  ASSERT_OK(cache_->Release(session_, a.sequence_id));
  EXPECT_EQ(Counts(), std::make_tuple(6u, 2u, 0u));  // b's private blocks were freed
  const OpenedSequence c = Open(Tokens(100, 9));
  EXPECT_EQ(c.num_cached_tokens, 8);
  EXPECT_EQ(c.block_ids[0], a.block_ids[0]);
  EXPECT_EQ(c.block_ids[1], a.block_ids[1]);
}

TEST_F(PoolTest, DuplicateParentStillLetsItsChildBePublished) {
  const OpenedSequence a = Open(Tokens(100, 9));
  const OpenedSequence b = Open(Tokens(100, 9));
  ASSERT_OK(cache_->Commit(session_, a.sequence_id, 4).status());  // a publishes block 0 only
  ASSERT_OK(cache_->Commit(session_, b.sequence_id, 9).status());  // b: dup block 0, new block 1
  ASSERT_OK(cache_->Release(session_, a.sequence_id));
  ASSERT_OK(cache_->Release(session_, b.sequence_id));
  const OpenedSequence c = Open(Tokens(100, 9));
  EXPECT_EQ(c.num_cached_tokens, 8);
  EXPECT_EQ(c.block_ids[0], a.block_ids[0]);
  EXPECT_EQ(c.block_ids[1], b.block_ids[1]);
}

TEST_F(PoolTest, DecodeBlocksAreCommittedSoTheNextTurnHitsItsOwnAnswer) {
  const std::vector<uint32_t> prompt = Tokens(100, 6);
  const OpenedSequence opened = Open(prompt);
  ASSERT_OK(cache_->Commit(session_, opened.sequence_id, 6).status());
  std::vector<uint32_t> conversation = prompt;
  for (uint32_t token = 700; token < 707; ++token) {  // decode 7 tokens, one at a time
    auto extended = cache_->Extend(session_, opened.sequence_id, {token});
    ASSERT_OK(extended);
    conversation.push_back(token);
    EXPECT_EQ(extended->num_tokens, conversation.size());
    EXPECT_EQ(extended->new_block_ids.size(), conversation.size() % kBlockSize == 1 ? 1 : 0);
    ASSERT_OK(cache_->Commit(session_, opened.sequence_id, conversation.size()).status());
  }
  ASSERT_OK(cache_->Release(session_, opened.sequence_id));
  // Next turn: the whole conversation plus a new user message.
  const OpenedSequence next = Open(Concat(conversation, Tokens(800, 3)));
  EXPECT_EQ(next.num_cached_tokens, 12);
}

TEST_F(PoolTest, ForkSharesFullBlocksAndCopiesThePartialOne) {
  const OpenedSequence parent = Open(Tokens(100, 6));
  auto& memory = static_cast<HostPoolMemory&>(cache_->memory());
  const uint64_t block_bytes = memory.block_bytes();
  std::memset(memory.Block(parent.block_ids[1]), 0x5a, block_bytes);
  auto forked = cache_->Fork(session_, parent.sequence_id);
  ASSERT_OK(forked);
  ASSERT_EQ(forked->block_ids.size(), 2);
  EXPECT_EQ(forked->block_ids[0], parent.block_ids[0]);
  EXPECT_NE(forked->block_ids[1], parent.block_ids[1]);
  EXPECT_EQ(forked->copied_from_block, parent.block_ids[1]);
  EXPECT_EQ(std::memcmp(memory.Block(forked->block_ids[1]), memory.Block(parent.block_ids[1]),
                        block_bytes),
            0);
  EXPECT_EQ(Counts(), std::make_tuple(5u, 0u, 3u));
  // The child diverges on its own copy; releasing the parent keeps the shared block alive.
  ASSERT_OK(cache_->Extend(session_, forked->sequence_id, {1, 2}).status());
  ASSERT_OK(cache_->Release(session_, parent.sequence_id));
  EXPECT_EQ(Counts(), std::make_tuple(6u, 0u, 2u));
  ASSERT_OK(cache_->Commit(session_, forked->sequence_id, 8).status());
  ASSERT_OK(cache_->Release(session_, forked->sequence_id));
  std::vector<uint32_t> child_tokens = Concat(Tokens(100, 6), {1, 2});
  EXPECT_EQ(CachedTokens(child_tokens), 8);
}

TEST_F(PoolTest, ForkOnABlockBoundaryCopiesNothing) {
  const OpenedSequence parent = Open(Tokens(100, 8));
  auto forked = cache_->Fork(session_, parent.sequence_id);
  ASSERT_OK(forked);
  EXPECT_EQ(forked->block_ids, parent.block_ids);
  EXPECT_EQ(forked->copied_from_block, kNoBlock);
}

TEST_F(PoolTest, BlockChecksumIsKeptUntilTheBlockIsReused) {
  auto& memory = static_cast<HostPoolMemory&>(cache_->memory());
  const OpenedSequence opened = Open(Tokens(100, 5));
  std::memset(memory.Block(opened.block_ids[0]), 7, memory.block_bytes());
  ASSERT_OK(cache_->Commit(session_, opened.sequence_id, 4).status());
  const uint64_t expected = *memory.Checksum(opened.block_ids[0]);
  EXPECT_EQ(*cache_->BlockChecksum(opened.block_ids[0]), expected);
  // Kept: bytes changed behind the daemon's back (a contract breach) do not change the answer,
  // so a reader detects the breach as a checksum mismatch.
  std::memset(memory.Block(opened.block_ids[0]), 8, memory.block_bytes());
  EXPECT_EQ(*cache_->BlockChecksum(opened.block_ids[0]), expected);
  ASSERT_OK(cache_->Release(session_, opened.sequence_id));
  // Evicted and reused: the next checksum is of the new bytes.
  const OpenedSequence filler = Open(Tokens(500, 4 * 8));
  ASSERT_OK(cache_->Commit(session_, filler.sequence_id, 4 * 8).status());
  for (BlockId block : filler.block_ids) {
    EXPECT_EQ(*cache_->BlockChecksum(block), *memory.Checksum(block));
  }
}

TEST_F(PoolTest, LookupAcquiresNothing) {
  Compute(Tokens(100, 9));
  const auto before = Counts();
  EXPECT_EQ(CachedTokens(Tokens(100, 9)), 8);
  EXPECT_EQ(Counts(), before);
  EXPECT_EQ(cache_->Stats().pool.resurrections, 0);
}

TEST_F(PoolTest, SequencesAreScopedToTheirSession) {
  const OpenedSequence opened = Open(Tokens(100, 5));
  EXPECT_THAT(cache_->Release(other_session_, opened.sequence_id),
              StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(cache_->Commit(other_session_, opened.sequence_id, 4),
              StatusIs(absl::StatusCode::kNotFound));
  ASSERT_OK(cache_->Release(session_, opened.sequence_id));
  EXPECT_THAT(cache_->Release(session_, opened.sequence_id), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(cache_->Extend(session_, 12345, {1}), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(PoolTest, EndedSessionIsAbortedAndReleaseSessionFreesEverything) {
  Open(Tokens(100, 5));
  Open(Tokens(200, 9));
  Open(Tokens(300, 3), &other_session_);
  EXPECT_EQ(cache_->ReleaseSession(session_.id), 2);
  EXPECT_EQ(cache_->ReleaseSession(session_.id), 0);
  EXPECT_EQ(Counts(), std::make_tuple(7u, 0u, 1u));
  session_.closed = true;
  EXPECT_THAT(cache_->Open(session_, SequenceSpec{Tokens(1, 3)}),
              StatusIs(absl::StatusCode::kAborted));
}

TEST_F(PoolTest, BadInputIsInvalidArgumentAndChangesNothing) {
  const auto before = Counts();
  EXPECT_THAT(cache_->Open(session_, SequenceSpec{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no tokens")));
  EXPECT_THAT(cache_->Open(session_, SequenceSpec{Tokens(1, 3), std::string(257, 's')}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cache_salt")));
  EXPECT_THAT(cache_->Open(session_, SequenceSpec{Tokens(1, 3), "",
                                                  ExtraKeys{.lora_id = std::string(300, 'l')}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("lora_id")));
  ExtraKeys outside{.multimodal_items = {MultimodalItem{"img", 2, 5}}};
  EXPECT_THAT(cache_->Open(session_, SequenceSpec{Tokens(1, 6), "", outside}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("outside the 6-token")));
  ExtraKeys empty_hash{.multimodal_items = {MultimodalItem{"", 0, 1}}};
  EXPECT_THAT(cache_->Open(session_, SequenceSpec{Tokens(1, 6), "", empty_hash}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("content_hash")));
  const OpenedSequence opened = Open(Tokens(1, 3));
  EXPECT_THAT(cache_->Extend(session_, opened.sequence_id, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  ASSERT_OK(cache_->Release(session_, opened.sequence_id));
  EXPECT_EQ(Counts(), before);
}

TEST_F(PoolTest, StatsCountHitsMissesAndPromptTokens) {
  Compute(Tokens(100, 9));
  Compute(Tokens(100, 9));
  const PoolStatsSnapshot stats = cache_->Stats();
  EXPECT_EQ(stats.prompt_tokens, 18);
  EXPECT_EQ(stats.hit_blocks, 2);
  EXPECT_EQ(stats.hit_tokens, 8);
  EXPECT_EQ(stats.miss_blocks, 4);
  EXPECT_EQ(stats.pool.published, 2);
}

// A pool whose options set testing_hash_bits, for forced collisions.
absl::StatusOr<std::unique_ptr<Pool>> MakeWeakHashPool(const PoolOptions& options) {
  auto memory = HostPoolMemory::Create(options.layout.BlockBytes(), options.num_blocks);
  if (!memory.ok()) return memory.status();
  return Pool::Create(options, 0, *std::move(memory));
}

// Regression (issue 17, forced collisions): block 0 was verified against its parent hash, the
// root, alone, so two tenants (or cache salts) whose roots collided shared their blocks: a hit on
// another tenant's KV. Roots of 1 bit collide for one pair among any three tenants.
TEST(PoolCollisionTest, RootCollisionBetweenTenantsIsAMissNotAnotherTenantsBlock) {
  PoolOptions options = TestPoolOptions();
  options.testing_hash_bits = 1;
  auto pool = MakeWeakHashPool(options);
  ASSERT_OK(pool);
  BlockHasher hasher(options.hash_algorithm, options.testing_hash_bits);
  const auto root = [&](absl::string_view tenant) {
    return hasher.Root(HashNamespace{options.model_id, options.layout.Fingerprint(), tenant, ""});
  };
  std::string first = "tenant-0", second = "tenant-1";
  if (root(first) != root(second)) (root("tenant-2") == root(first) ? second : first) = "tenant-2";
  ASSERT_EQ(root(first), root(second));

  Session owner{1, "uid:1", first, "test", absl::Seconds(10)};
  Session stranger{2, "uid:2", second, "test", absl::Seconds(10)};
  // One block: with 1-bit hashes a second would collide with the first.
  const std::vector<uint32_t> prompt = Tokens(100, kBlockSize);
  auto put = (*pool)->Open(owner, SequenceSpec{prompt}, OpenMode::kPut);
  ASSERT_OK(put);
  ASSERT_OK((*pool)->Commit(owner, put->sequence_id, prompt.size()));
  ASSERT_OK((*pool)->Release(owner, put->sequence_id));
  auto lookup = (*pool)->Lookup(first, SequenceSpec{prompt});
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_cached_tokens, kBlockSize);

  lookup = (*pool)->Lookup(second, SequenceSpec{prompt});
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_cached_tokens, 0);
  auto pinned = (*pool)->Open(stranger, SequenceSpec{prompt}, OpenMode::kPinCached);
  ASSERT_OK(pinned);
  EXPECT_THAT(pinned->block_ids, ::testing::IsEmpty());
  EXPECT_EQ((*pool)->collisions_caught(), 2);
  ASSERT_OK((*pool)->Release(stranger, pinned->sequence_id));
  EXPECT_OK((*pool)->CheckInvariants());
}

// Regression (issue 17, forced collisions): Commit linked a block to whatever block its parent
// hash indexed. When that hash indexed other content (a collision: this sequence's own parent
// stayed private), the block hung off a prefix it was not computed from, and a walk along that
// other prefix verified it (same parent hash, parent block and tokens) and served KV computed
// over a different prompt.
TEST(PoolCollisionTest, CommitNeverLinksABlockUnderACollidingParent) {
  PoolOptions options = TestPoolOptions();
  options.testing_hash_bits = 8;
  auto pool = MakeWeakHashPool(options);
  ASSERT_OK(pool);
  Session session{1, "uid:1", "tenant-a", "test", absl::Seconds(10)};
  BlockHasher hasher(options.hash_algorithm, options.testing_hash_bits);
  const Hash128 root =
      hasher.Root(HashNamespace{options.model_id, options.layout.Fingerprint(), "tenant-a", ""});
  const auto chain = [&](const std::vector<uint32_t>& tokens) {
    std::vector<Hash128> hashes;
    hasher.ExtendChain(root, tokens, kBlockSize, {}, &hashes);
    return hashes;
  };
  // P and Q: one block each, different tokens, the same 8-bit hash.
  const std::vector<uint32_t> p = Tokens(100, kBlockSize);
  std::vector<uint32_t> q;
  for (uint32_t y = 1000; q.empty() && y < 100000; ++y) {
    if (chain({y, 0, 0, 0}) == chain(p)) q = {y, 0, 0, 0};
  }
  ASSERT_FALSE(q.empty());
  const std::vector<uint32_t> tail = Tokens(500, kBlockSize);
  ASSERT_NE(chain(Concat(p, tail))[1], chain(q)[0]);
  const auto compute = [&](const std::vector<uint32_t>& tokens) {
    auto opened = (*pool)->Open(session, SequenceSpec{tokens}, OpenMode::kPut);
    ASSERT_OK(opened);
    ASSERT_OK((*pool)->Commit(session, opened->sequence_id, tokens.size()));
    ASSERT_OK((*pool)->Release(session, opened->sequence_id));
  };
  const auto cached = [&](const std::vector<uint32_t>& tokens) {
    auto lookup = (*pool)->Lookup("tenant-a", SequenceSpec{tokens});
    EXPECT_OK(lookup);
    return lookup.ok() ? lookup->num_cached_tokens : 0;
  };

  compute(q);
  compute(Concat(p, tail));  // P's block collides with Q's and stays private
  EXPECT_EQ(cached(q), kBlockSize);
  EXPECT_EQ(cached(Concat(p, tail)), 0);
  // Q's continuation must not find P's: its KV was computed over P.
  EXPECT_EQ(cached(Concat(q, tail)), kBlockSize);
  EXPECT_GE((*pool)->collisions_caught(), 3);
  EXPECT_OK((*pool)->CheckInvariants());
}

TEST(PoolCreateTest, RejectsBadOptions) {
  PoolOptions options;
  options.name = "p";
  options.layout = PoolLayout{.num_layers = 1, .num_kv_heads = 1, .head_dim = 1, .block_size = 4};
  options.num_blocks = 0;
  auto memory = HostPoolMemory::Create(options.layout.BlockBytes(), 1);
  ASSERT_OK(memory);
  EXPECT_THAT(Pool::Create(options, 0, *std::move(memory)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvcache
