// Token blocks with parts (DESIGN §13): a pool declaring "kv" on every block and a one-block
// trailing "state"; commits name each block's parts, and Open and Lookup answer the greatest
// block endpoint every asked part restores, over tier 1, tier 2 and the disk tier (across a
// restart), with extra keys and masks side by side. Every test ends with the invariants checked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cache/pool.h"
#include "common/status_macros.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/small_pool_options.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint32_t kBlockSize = 4;
constexpr uint32_t kBlockBytes = 128;
constexpr uint32_t kKv = 1;     // part masks: bit 0 "kv" (96 bytes, every block)
constexpr uint32_t kState = 2;  // bit 1 "state" (32 bytes, the last block)
constexpr uint32_t kBoth = kKv | kState;

// `blocks` full blocks of tokens and one more token, so a compute open may hit every block.
std::vector<uint32_t> Prompt(uint32_t seed, size_t blocks) {
  std::vector<uint32_t> tokens;
  for (size_t i = 0; i < blocks * kBlockSize + 1; ++i) tokens.push_back(seed * 1000 + i);
  return tokens;
}

// The bytes of block `i` of a prompt: a function of its seed and position.
std::string BlockBytes(uint32_t seed, size_t i) {
  std::string bytes(kBlockBytes, '\0');
  for (size_t b = 0; b < bytes.size(); ++b) bytes[b] = static_cast<char>(seed * 31 + i * 7 + b);
  return bytes;
}

class PoolTokenPartsTest : public ::testing::Test {
 protected:
  void SetUp() override { MakePool(16); }
  void TearDown() override {
    if (pool_ != nullptr) EXPECT_OK(pool_->CheckInvariants());
  }

  void MakePool(uint32_t num_blocks, uint32_t tier_blocks = 0, uint64_t disk_records = 0,
                bool with_parts = true) {
    PoolOptions options = testing::SmallPoolOptions("tokens", num_blocks, kBlockSize);
    ASSERT_EQ(options.layout.BlockBytes(), kBlockBytes);
    if (with_parts) options.parts = *ParsePageParts("kv/96+state/32/trailing1", kBlockBytes);
    options.testing_manual_offload = true;
    options.host_tier_bytes = uint64_t{tier_blocks} * kBlockBytes;
    if (disk_records != 0) {
      options.disk_tier_path = disk_dir_.path() + "/tokens.tier";
      options.disk_tier_bytes = disk_records * 4096;
    }
    pool_.reset();
    auto memory = HostPoolMemory::Create(kBlockBytes, num_blocks);
    ASSERT_OK(memory);
    auto pool = Pool::Create(options, 0, *std::move(memory), nullptr, nullptr, nullptr, &clock_);
    ASSERT_OK(pool);
    pool_ = *std::move(pool);
  }

  SequenceSpec Spec(const std::vector<uint32_t>& tokens, uint32_t wanted = 0) {
    return SequenceSpec{.tokens = tokens, .extra_keys = extras_, .wanted_parts = wanted};
  }

  // Opens the prompt, writes every block past the hit, commits its full blocks with `masks`
  // and releases. Returns the commit's result.
  absl::StatusOr<CommitResult> Store(uint32_t seed, size_t blocks, std::vector<uint32_t> masks,
                                     uint32_t wanted = 0) {
    const std::vector<uint32_t> tokens = Prompt(seed, blocks);
    ASSIGN_OR_RETURN(OpenedSequence opened, pool_->Open(session_, Spec(tokens, wanted)));
    for (size_t i = opened.num_cached_tokens / kBlockSize; i < blocks; ++i) {
      RETURN_IF_ERROR(pool_->WriteBlock(opened.block_ids[i], 0, BlockBytes(seed, i)));
    }
    absl::StatusOr<CommitResult> committed =
        pool_->Commit(session_, opened.sequence_id, blocks * kBlockSize, masks);
    RETURN_IF_ERROR(pool_->Release(session_, opened.sequence_id));
    return committed;
  }

  LookupResult Lookup(uint32_t seed, size_t blocks, uint32_t wanted = 0) {
    const std::vector<uint32_t> tokens = Prompt(seed, blocks);
    absl::StatusOr<LookupResult> found = pool_->Lookup("tenant-a", Spec(tokens, wanted));
    EXPECT_OK(found);
    return found.ok() ? *found : LookupResult{};
  }

  // Opens to compute, checks the cached blocks' bytes, releases; returns what the open said.
  OpenedSequence OpenChecked(uint32_t seed, size_t blocks, uint32_t wanted = 0) {
    const std::vector<uint32_t> tokens = Prompt(seed, blocks);
    absl::StatusOr<OpenedSequence> opened = pool_->Open(session_, Spec(tokens, wanted));
    EXPECT_OK(opened);
    if (!opened.ok()) return {};
    for (size_t i = 0; i < opened->num_cached_tokens / kBlockSize; ++i) {
      std::string bytes(kBlockBytes, '\0');
      EXPECT_OK(pool_->ReadBlock(opened->block_ids[i], 0, kBlockBytes, bytes.data()));
      EXPECT_EQ(bytes, BlockBytes(seed, i)) << "block " << i;
    }
    EXPECT_OK(pool_->Release(session_, opened->sequence_id));
    return *opened;
  }

  // Passes every evictable block down to tier 2 (and the disk tier when it has one).
  void PassEverythingDown() {
    pool_->OffloadForTesting();
    if (pool_->disk_tier() != nullptr) {
      pool_->disk_tier()->Flush();
      pool_->OffloadForTesting();
      pool_->disk_tier()->Flush();
    }
  }

  testing::FakeClock clock_;
  testing::ScopedTempDir disk_dir_;
  ExtraKeys extras_;
  Session session_{1, "uid:1", "tenant-a", "test", absl::Seconds(10)};
  std::unique_ptr<Pool> pool_;
};

TEST_F(PoolTokenPartsTest, StateOnBlockThreeOfSixEndsTheHitAtFourBlocks) {
  ASSERT_OK(Store(1, 6, {kKv, kKv, kKv, kBoth, kKv, kKv}));
  const LookupResult both = Lookup(1, 6, kBoth);
  EXPECT_EQ(both.num_cached_tokens, 4 * kBlockSize);
  EXPECT_THAT(both.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  const LookupResult kv = Lookup(1, 6, kKv);
  EXPECT_EQ(kv.num_cached_tokens, 6 * kBlockSize);
  EXPECT_THAT(kv.part_masks, ElementsAre(kKv, kKv, kKv, kBoth, kKv, kKv));
  EXPECT_EQ(Lookup(1, 6).num_cached_tokens, 4 * kBlockSize);  // default: every part

  const OpenedSequence opened = OpenChecked(1, 6, kBoth);
  EXPECT_EQ(opened.num_cached_tokens, 4 * kBlockSize);
  EXPECT_THAT(opened.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  EXPECT_EQ(OpenChecked(1, 6, kKv).num_cached_tokens, 6 * kBlockSize);
}

TEST_F(PoolTokenPartsTest, BlocksPastTheEndpointAreFreshNotTheCachedOnes) {
  ASSERT_OK(Store(1, 6, {kKv, kKv, kKv, kBoth, kKv, kKv}));
  const std::vector<uint32_t> tokens = Prompt(1, 6);
  absl::StatusOr<OpenedSequence> all = pool_->Open(session_, Spec(tokens, kKv));
  ASSERT_OK(all);
  absl::StatusOr<OpenedSequence> opened = pool_->Open(session_, Spec(tokens, kBoth));
  ASSERT_OK(opened);
  ASSERT_EQ(opened->block_ids.size(), 7u);
  // The first four are the cached blocks; blocks 4 and 5 are computed into fresh ones, never
  // into the published blocks another sequence holds.
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(opened->block_ids[i], all->block_ids[i]);
  for (size_t i = 4; i < 7; ++i) {
    for (BlockId cached : all->block_ids) EXPECT_NE(opened->block_ids[i], cached) << i;
  }
  EXPECT_OK(pool_->Release(session_, opened->sequence_id));
  EXPECT_OK(pool_->Release(session_, all->sequence_id));
}

TEST_F(PoolTokenPartsTest, AStateMissingOnAnInnerBlockDoesNotEndTheHit) {
  ASSERT_OK(Store(2, 6, {kKv, kBoth, kKv, kKv, kKv, kBoth}));
  EXPECT_EQ(Lookup(2, 6, kBoth).num_cached_tokens, 6 * kBlockSize);
  EXPECT_EQ(OpenChecked(2, 6, kBoth).num_cached_tokens, 6 * kBlockSize);
  // Without any state the hybrid model restores nothing; the KV alone is all there.
  ASSERT_OK(Store(3, 3, {kKv, kKv, kKv}));
  EXPECT_EQ(Lookup(3, 3, kBoth).num_cached_tokens, 0u);
  EXPECT_EQ(Lookup(3, 3, kKv).num_cached_tokens, 3 * kBlockSize);
}

TEST_F(PoolTokenPartsTest, ACommitWithoutMasksHoldsEveryPart) {
  ASSERT_OK(Store(4, 3, {}));
  const LookupResult found = Lookup(4, 3, kBoth);
  EXPECT_EQ(found.num_cached_tokens, 3 * kBlockSize);
  EXPECT_THAT(found.part_masks, ElementsAre(kBoth, kBoth, kBoth));
}

TEST_F(PoolTokenPartsTest, ACommitWithMorePartsSupersedesThePoorerCopy) {
  ASSERT_OK(Store(5, 4, {kKv, kKv, kKv, kKv}));
  EXPECT_EQ(Lookup(5, 4, kBoth).num_cached_tokens, 0u);
  // Computed again (no hit with the state), committed with the state at its end.
  absl::StatusOr<CommitResult> committed = Store(5, 4, {kKv, kKv, kKv, kBoth}, kBoth);
  ASSERT_OK(committed);
  EXPECT_EQ(committed->num_published_blocks, 1u);  // the rest were duplicates
  const LookupResult found = Lookup(5, 4, kBoth);
  EXPECT_EQ(found.num_cached_tokens, 4 * kBlockSize);
  EXPECT_THAT(found.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  EXPECT_EQ(OpenChecked(5, 4, kBoth).num_cached_tokens, 4 * kBlockSize);
  // A poorer commit later changes nothing.
  ASSERT_OK(Store(5, 4, {kKv, kKv, kKv, kKv}, kKv));
  EXPECT_THAT(Lookup(5, 4, kBoth).part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
}

TEST_F(PoolTokenPartsTest, APoorerCopySomebodyHoldsIsNotSuperseded) {
  ASSERT_OK(Store(6, 2, {kKv, kKv}));
  const std::vector<uint32_t> tokens = Prompt(6, 2);
  absl::StatusOr<OpenedSequence> holder = pool_->Open(session_, Spec(tokens, kKv));
  ASSERT_OK(holder);
  ASSERT_EQ(holder->num_cached_tokens, 2 * kBlockSize);
  absl::StatusOr<CommitResult> committed = Store(6, 2, {kKv, kBoth}, kBoth);
  ASSERT_OK(committed);
  EXPECT_EQ(committed->num_published_blocks, 0u);
  EXPECT_EQ(Lookup(6, 2, kBoth).num_cached_tokens, 0u);
  ASSERT_OK(pool_->Release(session_, holder->sequence_id));
  ASSERT_OK(Store(6, 2, {kKv, kBoth}, kBoth));  // nobody holds it now
  EXPECT_EQ(Lookup(6, 2, kBoth).num_cached_tokens, 2 * kBlockSize);
}

TEST_F(PoolTokenPartsTest, MasksTravelThroughTierTwo) {
  MakePool(8, /*tier_blocks=*/16);
  ASSERT_OK(Store(7, 6, {kKv, kKv, kKv, kBoth, kKv, kKv}));
  PassEverythingDown();
  ASSERT_OK(Store(8, 7, {}));  // evicts the first prompt from tier 1
  const LookupResult below = Lookup(7, 6, kBoth);
  EXPECT_EQ(below.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(below.num_host_tier_tokens, 4 * kBlockSize);
  EXPECT_THAT(below.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  EXPECT_EQ(Lookup(7, 6, kKv).num_cached_tokens, 6 * kBlockSize);
  const OpenedSequence loaded = OpenChecked(7, 6, kBoth);
  EXPECT_EQ(loaded.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(loaded.num_host_tier_tokens, 4 * kBlockSize);
  EXPECT_THAT(loaded.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  // Loaded and published with their masks: tier 1 answers the same.
  EXPECT_THAT(Lookup(7, 6, kBoth).part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
}

TEST_F(PoolTokenPartsTest, MasksTravelThroughTheDiskAcrossARestart) {
  MakePool(8, /*tier_blocks=*/8, /*disk_records=*/64);
  ASSERT_OK(Store(7, 6, {kKv, kKv, kKv, kBoth, kKv, kKv}));
  PassEverythingDown();
  MakePool(8, 8, 64);  // a new daemon over the same disk file
  const LookupResult from_disk = Lookup(7, 6, kBoth);
  EXPECT_EQ(from_disk.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(from_disk.num_disk_tier_tokens, 4 * kBlockSize);
  EXPECT_THAT(from_disk.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  const OpenedSequence reloaded = OpenChecked(7, 6, kBoth);
  EXPECT_EQ(reloaded.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(reloaded.num_disk_tier_tokens, 4 * kBlockSize);
}

// A load that fails verification can leave the tier-1 hits before it restoring no state: the
// open then answers no hit and computes those blocks into fresh ones, never into the cached.
TEST_F(PoolTokenPartsTest, ALoadThatFailsEndsTheHitWhereTheRuleSays) {
  MakePool(12, /*tier_blocks=*/16);
  ASSERT_OK(Store(14, 4, {kKv, kKv, kKv, kBoth}));
  pool_->OffloadForTesting();
  // Takes the 8 free blocks and evicts block 3 only (released first, so the LRU's front):
  // blocks 0 to 2 stay in tier 1.
  const std::vector<uint32_t> other = Prompt(15, 8);
  absl::StatusOr<OpenedSequence> evicting = pool_->Open(session_, Spec(other));
  ASSERT_OK(evicting);
  ASSERT_OK(pool_->Release(session_, evicting->sequence_id));
  const LookupResult before = Lookup(14, 4, kBoth);
  ASSERT_EQ(before.num_cached_tokens, 4 * kBlockSize);
  ASSERT_EQ(before.num_host_tier_tokens, kBlockSize);
  const LookupResult kv = Lookup(14, 4, kKv);

  BlockHasher hasher(HashAlgorithm::kXxh3_128);
  const HashNamespace ns{pool_->options().model_id, pool_->layout_fingerprint(), "tenant-a", ""};
  std::vector<Hash128> chain;
  hasher.ExtendChain(hasher.Root(ns), Prompt(14, 4), kBlockSize, ExtraKeys{}, &chain);
  ASSERT_TRUE(pool_->host_tier()->CorruptForTesting(chain[3], 5));
  absl::StatusOr<OpenedSequence> opened = pool_->Open(session_, Spec(Prompt(14, 4), kBoth));
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 0u);
  EXPECT_THAT(opened->part_masks, IsEmpty());
  absl::StatusOr<OpenedSequence> holder = pool_->Open(session_, Spec(Prompt(14, 4), kKv));
  ASSERT_OK(holder);
  EXPECT_EQ(holder->num_cached_tokens, 3 * kBlockSize);  // the cached blocks are still there
  for (BlockId fresh : opened->block_ids) {
    for (size_t i = 0; i < 3; ++i) EXPECT_NE(fresh, holder->block_ids[i]);
  }
  ASSERT_OK(pool_->Release(session_, holder->sequence_id));
  ASSERT_OK(pool_->Release(session_, opened->sequence_id));
  EXPECT_EQ(pool_->Stats().referenced, 0u);
  EXPECT_EQ(kv.num_cached_tokens, 4 * kBlockSize);
}

TEST_F(PoolTokenPartsTest, ExtraKeysAndMasksAreKeptSideBySide) {
  MakePool(8, /*tier_blocks=*/16);
  extras_.lora_id = "adapter-a";
  ASSERT_OK(Store(9, 3, {kKv, kBoth, kKv}));
  EXPECT_THAT(Lookup(9, 3, kBoth).part_masks, ElementsAre(kKv, kBoth));
  extras_.lora_id = "adapter-b";
  EXPECT_EQ(Lookup(9, 3, kKv).num_cached_tokens, 0u);
  extras_.lora_id = "adapter-a";
  pool_->OffloadForTesting();
  ASSERT_OK(Store(10, 7, {}));  // evicts the first prompt from tier 1
  EXPECT_THAT(Lookup(9, 3, kKv).part_masks, ElementsAre(kKv, kBoth, kKv));
  extras_.lora_id = "adapter-b";
  EXPECT_EQ(Lookup(9, 3, kKv).num_cached_tokens, 0u);
}

TEST_F(PoolTokenPartsTest, BadMasksAreInvalidArgumentAndPublishNothing) {
  const std::vector<uint32_t> tokens = Prompt(11, 3);
  absl::StatusOr<OpenedSequence> opened = pool_->Open(session_, Spec(tokens));
  ASSERT_OK(opened);
  const uint32_t written = 3 * kBlockSize;
  EXPECT_THAT(pool_->Commit(session_, opened->sequence_id, written, {kKv, 4, kKv}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 1 has part mask 0x4 but the pool has 2 part(s)")));
  EXPECT_THAT(pool_->Commit(session_, opened->sequence_id, written, {kKv, kKv, kState}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 2 has part mask 0x2 without part 'kv'")));
  EXPECT_THAT(pool_->Commit(session_, opened->sequence_id, written, {0, kKv, kKv}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block 0")));
  EXPECT_THAT(pool_->Commit(session_, opened->sequence_id, written, {kKv, kKv}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("2 part masks for a commit of 12 tokens (3 full blocks")));
  EXPECT_EQ(Lookup(11, 3, kKv).num_cached_tokens, 0u);
  EXPECT_EQ(pool_->Stats().pool.published, 0u);
  ASSERT_OK(pool_->Release(session_, opened->sequence_id));
  EXPECT_EQ(pool_->Stats().referenced, 0u);
}

TEST_F(PoolTokenPartsTest, APoolWithoutPartsTakesOnlyTheWholeBlock) {
  MakePool(8, 0, 0, /*with_parts=*/false);
  ASSERT_OK(Store(12, 2, {kKv, kKv}));
  const LookupResult found = Lookup(12, 2);
  EXPECT_EQ(found.num_cached_tokens, 2 * kBlockSize);
  EXPECT_THAT(found.part_masks, IsEmpty());  // every block holds the one part
  EXPECT_THAT(OpenChecked(12, 2).part_masks, IsEmpty());
  const std::vector<uint32_t> tokens = Prompt(13, 1);
  absl::StatusOr<OpenedSequence> opened = pool_->Open(session_, Spec(tokens));
  ASSERT_OK(opened);
  EXPECT_THAT(pool_->Commit(session_, opened->sequence_id, kBlockSize, {kBoth}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pool has 1 part(s)")));
  ASSERT_OK(pool_->Release(session_, opened->sequence_id));
}

}  // namespace
}  // namespace kvcache
