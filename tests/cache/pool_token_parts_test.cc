// Token blocks with parts (DESIGN §13): a pool declaring "kv" on every block and a one-block
// trailing "state"; commits name each block's parts, and Open and Lookup answer the greatest
// block endpoint every asked part restores, over tier 1, tier 2 and the disk tier (across a
// restart), with extra keys and masks side by side. A block committed again with more parts
// supersedes the poorer copy in every tier. Every test ends with the invariants checked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "cache/pool.h"
#include "common/block_checksum.h"
#include "common/status_macros.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/small_pool_options.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_keys.h"

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

constexpr uint32_t kKvBytes = 96;

// The bytes of block `i` of a prompt holding the parts `mask`: a function of its seed and
// position, with zeros where a part it lacks would be (so a copy with the state and one without
// differ in their bytes, as an engine's would).
std::string BlockBytes(uint32_t seed, size_t i, uint32_t mask = kBoth) {
  std::string bytes(kBlockBytes, '\0');
  for (size_t b = 0; b < bytes.size(); ++b) {
    const uint32_t part = b < kKvBytes ? kKv : kState;
    if ((mask & part) != 0) bytes[b] = static_cast<char>(seed * 31 + i * 7 + b);
  }
  return bytes;
}

class PoolTokenPartsTest : public ::testing::Test {
 protected:
  void SetUp() override { MakePool(16); }
  void TearDown() override {
    if (pool_ != nullptr) {
      EXPECT_OK(pool_->CheckInvariants());
    }
  }

  void MakePool(uint32_t num_blocks, uint32_t tier_blocks = 0, uint64_t disk_records = 0,
                bool with_parts = true) {
    // The disk's hook outlives any pool: a test arms it for its next read.
    before_disk_read_ = nullptr;
    PoolOptions options = testing::SmallPoolOptions("tokens", num_blocks, kBlockSize);
    ASSERT_EQ(options.layout.BlockBytes(), kBlockBytes);
    if (with_parts) options.parts = *ParsePageParts("kv/96+state/32/trailing1", kBlockBytes);
    options.testing_manual_offload = true;
    options.tier_keyring = keyring_;
    options.host_tier_bytes = uint64_t{tier_blocks} * kBlockBytes;
    if (disk_records != 0) {
      options.disk_tier_path = disk_dir_.path() + "/tokens.tier";
      options.disk_tier_bytes = disk_records * 4096;
      options.testing_disk_tier_options = [this](DiskTierOptions* disk) {
        disk->testing_before_read = [this] {
          if (before_disk_read_ == nullptr) return;
          std::function<void()> armed = std::move(before_disk_read_);
          before_disk_read_ = nullptr;
          armed();
        };
      };
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
    const bool whole_blocks = masks.empty() || pool_->options().parts.empty();
    for (size_t i = opened.num_cached_tokens / kBlockSize; i < blocks; ++i) {
      RETURN_IF_ERROR(pool_->WriteBlock(opened.block_ids[i], 0,
                                        BlockBytes(seed, i, whole_blocks ? kBoth : masks[i])));
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
      const uint32_t mask = opened->part_masks.empty() ? kBoth : opened->part_masks[i];
      EXPECT_EQ(bytes, BlockBytes(seed, i, mask)) << "block " << i;
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

  // The chain hashes of prompt `seed`'s first `blocks` blocks.
  std::vector<Hash128> Chain(uint32_t seed, size_t blocks) const {
    BlockHasher hasher(HashAlgorithm::kXxh3_128);
    const HashNamespace ns{pool_->options().model_id, pool_->layout_fingerprint(), "tenant-a", ""};
    std::vector<Hash128> chain;
    hasher.ExtendChain(hasher.Root(ns), Prompt(seed, blocks), kBlockSize, extras_, &chain);
    chain.resize(blocks);
    return chain;
  }

  // The part mask of the record tier 2 (or the disk tier) holds under `hash`; 0 for none.
  uint32_t HostTierMask(const Hash128& hash) const {
    const std::optional<BlockRecordIdentity> found = pool_->host_tier()->Find(hash);
    return found.has_value() ? PartMaskIn(found->extras_digest) : 0;
  }
  uint32_t DiskTierMask(const Hash128& hash) const {
    const absl::StatusOr<BlockRecordIdentity> found = pool_->disk_tier()->Find(hash);
    return found.ok() ? PartMaskIn(found->extras_digest) : 0;
  }

  // The disk tier's half of superseding, sealed or not (keyring_).
  void CheckARicherCopySupersedesTheDisksAcrossARestart();

  testing::FakeClock clock_;
  testing::ScopedTempDir disk_dir_;
  // Run once by the disk tier before its next read (after the load pinned its slots).
  std::function<void()> before_disk_read_;
  // Seals the disk tier's records when set (before MakePool).
  std::shared_ptr<const TierKeyring> keyring_;
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

// The lower tiers' half of superseding: tier 2 held the KV-only copy when the block was
// committed again with its state; passed down again, the richer copy replaces it, so an open
// asking for the state after tier 1 evicted the block still hits all of it.
TEST_F(PoolTokenPartsTest, ARicherCopySupersedesTierTwos) {
  MakePool(8, /*tier_blocks=*/16);
  ASSERT_OK(Store(20, 4, {kKv, kKv, kKv, kKv}));
  PassEverythingDown();
  const std::vector<Hash128> chain = Chain(20, 4);
  ASSERT_EQ(HostTierMask(chain[3]), kKv);
  absl::StatusOr<CommitResult> committed = Store(20, 4, {kKv, kKv, kKv, kBoth}, kBoth);
  ASSERT_OK(committed);
  EXPECT_EQ(committed->num_published_blocks, 1u);  // tier 1's copy superseded
  PassEverythingDown();
  EXPECT_EQ(HostTierMask(chain[3]), kBoth);
  EXPECT_EQ(pool_->host_tier()->counters().superseded, 1u);
  EXPECT_EQ(pool_->host_tier()->counters().records, 4u);  // replaced, not added

  ASSERT_OK(Store(21, 7, {}));  // evicts the first prompt from tier 1
  const LookupResult below = Lookup(20, 4, kBoth);
  EXPECT_EQ(below.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(below.num_host_tier_tokens, 4 * kBlockSize);
  EXPECT_THAT(below.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  const OpenedSequence loaded = OpenChecked(20, 4, kBoth);  // the state's bytes too
  EXPECT_EQ(loaded.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(loaded.num_host_tier_tokens, 4 * kBlockSize);
  EXPECT_THAT(loaded.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  EXPECT_OK(pool_->host_tier()->CheckInvariants());
}

// A poorer copy committed later (the richer one's load failed, so the open computed the prompt
// again with the KV alone) never replaces the richer record tier 2 holds: equal or fewer parts
// leave the stored copy, as in tier 1.
TEST_F(PoolTokenPartsTest, APoorerCopyLaterLeavesTierTwosRicherOne) {
  MakePool(8, /*tier_blocks=*/16);
  ASSERT_OK(Store(22, 4, {kKv, kKv, kKv, kBoth}));
  PassEverythingDown();
  ASSERT_OK(Store(23, 7, {}));  // evicts the first prompt from tier 1
  const std::vector<Hash128> chain = Chain(22, 4);
  ASSERT_TRUE(pool_->host_tier()->CorruptForTesting(chain[0], 5));
  absl::StatusOr<CommitResult> poorer = Store(22, 4, {kKv, kKv, kKv, kKv}, kKv);
  ASSERT_OK(poorer);
  EXPECT_EQ(poorer->num_published_blocks, 4u);  // the load failed: computed again
  PassEverythingDown();
  EXPECT_EQ(HostTierMask(chain[0]), kKv);  // stored again after its corrupt copy was dropped
  EXPECT_EQ(HostTierMask(chain[3]), kBoth);
  EXPECT_EQ(pool_->host_tier()->counters().superseded, 0u);

  ASSERT_OK(Store(24, 7, {}));  // evicts the poorer copies from tier 1
  const OpenedSequence loaded = OpenChecked(22, 4, kBoth);
  EXPECT_EQ(loaded.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(loaded.num_host_tier_tokens, 4 * kBlockSize);
  EXPECT_THAT(loaded.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
}

// A tier-2 slot being read is never overwritten: the richer copy is written into another slot
// and replaces the record in the index, while the load that pinned the poorer one copies it
// whole, with the bytes its checksum covers; the old slot is freed when the load ends.
TEST_F(PoolTokenPartsTest, ATierTwoSlotBeingReadIsNotOverwrittenBySuperseding) {
  MakePool(8, /*tier_blocks=*/16);
  ASSERT_OK(Store(25, 4, {kKv, kKv, kKv, kKv}));
  PassEverythingDown();
  const std::vector<Hash128> chain = Chain(25, 4);
  HostTier& tier = *pool_->host_tier();
  const std::optional<BlockRecordIdentity> poorer = tier.Find(chain[3]);
  ASSERT_TRUE(poorer.has_value());
  absl::StatusOr<HostTier::PinnedRecord> reading = tier.PinForLoad(*poorer);
  ASSERT_OK(reading);

  ASSERT_OK(Store(25, 4, {kKv, kKv, kKv, kBoth}, kBoth));
  PassEverythingDown();
  EXPECT_EQ(HostTierMask(chain[3]), kBoth);
  EXPECT_EQ(tier.counters().superseded, 1u);
  // The pinned slot still holds the KV-only copy, whole.
  const std::string read(reinterpret_cast<const char*>(reading->bytes), kBlockBytes);
  EXPECT_EQ(read, BlockBytes(25, 3, kKv));
  EXPECT_EQ(BlockChecksum(reading->bytes, kBlockBytes), reading->checksum);
  EXPECT_NE(reading->bytes, tier.RecordBytesForTesting(chain[3]));
  EXPECT_OK(tier.FinishLoad(*reading, HostTier::LoadVerdict::kVerified));
  EXPECT_OK(tier.CheckInvariants());
  EXPECT_EQ(tier.counters().records, 4u);

  ASSERT_OK(Store(26, 7, {}));  // evicts the first prompt from tier 1
  EXPECT_EQ(OpenChecked(25, 4, kBoth).num_host_tier_tokens, 4 * kBlockSize);
}

// The disk tier supersedes the same way: the richer copy passed down from tier 2 replaces the
// poorer record, and a daemon restarted over the file keeps the richer of the two records it
// finds there (the newer), so an open asking for the state hits all of it from disk.
void PoolTokenPartsTest::CheckARicherCopySupersedesTheDisksAcrossARestart() {
  MakePool(8, /*tier_blocks=*/8, /*disk_records=*/64);
  ASSERT_OK(Store(27, 4, {kKv, kKv, kKv, kKv}));
  PassEverythingDown();
  const std::vector<Hash128> chain = Chain(27, 4);
  ASSERT_EQ(DiskTierMask(chain[3]), kKv);
  ASSERT_OK(Store(27, 4, {kKv, kKv, kKv, kBoth}, kBoth));
  PassEverythingDown();
  EXPECT_EQ(HostTierMask(chain[3]), kBoth);
  EXPECT_EQ(DiskTierMask(chain[3]), kBoth);
  EXPECT_EQ(pool_->disk_tier()->stats().superseded, 1u);
  EXPECT_EQ(pool_->disk_tier()->stats().records, 4u);
  EXPECT_OK(pool_->disk_tier()->CheckInvariants());

  MakePool(8, 8, 64);  // a new daemon over the same disk file
  const DiskTierStats restarted = pool_->disk_tier()->stats();
  EXPECT_EQ(restarted.restart_records, 4u);
  EXPECT_EQ(restarted.restart_duplicates, 1u);  // the superseded record, still in its slot
  EXPECT_EQ(DiskTierMask(chain[3]), kBoth);
  const OpenedSequence reloaded = OpenChecked(27, 4, kBoth);
  EXPECT_EQ(reloaded.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(reloaded.num_disk_tier_tokens, 4 * kBlockSize);
  EXPECT_THAT(reloaded.part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
}

TEST_F(PoolTokenPartsTest, ARicherCopySupersedesTheDisksAcrossARestart) {
  CheckARicherCopySupersedesTheDisksAcrossARestart();
}

// A sealed disk (--tier_key_file) seals the superseding record like any other, and a restart
// with the same keys opens and keeps it.
TEST_F(PoolTokenPartsTest, ARicherCopySupersedesASealedDisksAcrossARestart) {
  keyring_ = testing::TestTierKeyring({testing::TestTierKey(1, 'a')});
  CheckARicherCopySupersedesTheDisksAcrossARestart();
  EXPECT_TRUE(pool_->disk_tier()->sealed());
  EXPECT_EQ(pool_->disk_tier()->stats().restart_unopened, 0u);
}

// A poorer copy passed down to the disk later (here straight to the tier, as a mover would)
// leaves the richer record; the restart serves the richer one.
TEST_F(PoolTokenPartsTest, APoorerCopyLaterLeavesTheDisksRicherOne) {
  MakePool(8, /*tier_blocks=*/8, /*disk_records=*/64);
  ASSERT_OK(Store(28, 4, {kKv, kKv, kKv, kBoth}));
  PassEverythingDown();
  const std::vector<Hash128> chain = Chain(28, 4);
  absl::StatusOr<BlockRecordIdentity> poorer = pool_->disk_tier()->Find(chain[3]);
  ASSERT_OK(poorer);
  ASSERT_EQ(PartMaskIn(poorer->extras_digest), kBoth);
  poorer->extras_digest = WithPartMask(poorer->extras_digest, kKv);
  const std::string kv_only = BlockBytes(28, 3, kKv);
  poorer->checksum = BlockChecksum(kv_only.data(), kv_only.size());
  EXPECT_THAT(pool_->disk_tier()->Store(*poorer, kv_only),
              StatusIs(absl::StatusCode::kAlreadyExists));
  pool_->disk_tier()->Flush();
  EXPECT_EQ(DiskTierMask(chain[3]), kBoth);
  EXPECT_EQ(pool_->disk_tier()->stats().superseded, 0u);

  MakePool(8, 8, 64);
  EXPECT_EQ(pool_->disk_tier()->stats().restart_duplicates, 0u);
  EXPECT_THAT(OpenChecked(28, 4, kBoth).part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
}

// A disk slot being read is never overwritten: a load has pinned the KV-only record when the
// richer copy becomes durable; the load reads the slot it pinned, whole, and verifies (a slot
// rewritten under it would fail as "replaced"), and the richer record serves from then on.
TEST_F(PoolTokenPartsTest, ADiskSlotBeingReadIsNotOverwrittenBySuperseding) {
  MakePool(8, /*tier_blocks=*/8, /*disk_records=*/64);
  ASSERT_OK(Store(29, 4, {kKv, kKv, kKv, kKv}));
  PassEverythingDown();
  MakePool(8, 8, 64);  // tier 1 and tier 2 empty: the prompt is on disk only
  const std::vector<Hash128> chain = Chain(29, 4);
  absl::StatusOr<BlockRecordIdentity> richer = pool_->disk_tier()->Find(chain[3]);
  ASSERT_OK(richer);
  richer->extras_digest = WithPartMask(richer->extras_digest, kBoth);
  const std::string with_state = BlockBytes(29, 3, kBoth);
  richer->checksum = BlockChecksum(with_state.data(), with_state.size());
  DiskTier& disk = *pool_->disk_tier();
  before_disk_read_ = [&] {
    // The load holds its slots now; the richer copy is written and made durable meanwhile.
    EXPECT_OK(disk.Store(*richer, with_state));
    disk.Flush();
    EXPECT_EQ(DiskTierMask(chain[3]), kBoth);
  };
  const OpenedSequence loaded = OpenChecked(29, 4, kKv);
  EXPECT_TRUE(before_disk_read_ == nullptr);  // the hook ran
  EXPECT_EQ(loaded.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(loaded.num_disk_tier_tokens, 4 * kBlockSize);
  EXPECT_THAT(loaded.part_masks, ElementsAre(kKv, kKv, kKv, kKv));  // what it pinned
  const DiskTierStats stats = disk.stats();
  EXPECT_EQ(stats.superseded, 1u);
  EXPECT_EQ(stats.load_corrupt, 0u);
  EXPECT_EQ(stats.load_hits, 4u);
  EXPECT_OK(disk.CheckInvariants());

  MakePool(8, 8, 64);
  EXPECT_THAT(OpenChecked(29, 4, kBoth).part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
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
