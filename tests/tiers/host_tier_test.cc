// HostTier: store, find, verified load, its LRU under a full tier, and the counters. Every test
// ends with the tier's invariants checked.
#include "tiers/host_tier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <vector>

#include "common/block_checksum.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kBlockBytes = 256;

std::vector<uint8_t> Bytes(uint8_t seed) {
  std::vector<uint8_t> bytes(kBlockBytes);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(seed * 31 + i);
  return bytes;
}

BlockRecordIdentity Identity(uint64_t n, const std::vector<uint8_t>& bytes) {
  return BlockRecordIdentity{.hash = {n, n * 7 + 1},
                             .parent_hash = {n - 1, n},
                             .namespace_digest = 42,
                             .extras_digest = 0,
                             .prefix_digest = n * 13 + 5,
                             .tokens = {uint32_t(n), 1, 2, 3},
                             .checksum = BlockChecksum(bytes.data(), bytes.size())};
}

class HostTierTest : public ::testing::Test {
 protected:
  void MakeTier(uint32_t slots) {
    auto tier = HostTier::Create(slots * kBlockBytes + kBlockBytes / 2, kBlockBytes);
    ASSERT_OK(tier);
    tier_ = *std::move(tier);
  }
  void TearDown() override {
    if (tier_ != nullptr) {
      EXPECT_OK(tier_->CheckInvariants());
    }
  }
  void StoreBlock(uint64_t n) {
    const std::vector<uint8_t> bytes = Bytes(static_cast<uint8_t>(n));
    ASSERT_OK(tier_->Store(Identity(n, Bytes(static_cast<uint8_t>(n))), bytes.data()));
  }

  std::unique_ptr<HostTier> tier_;
};

TEST_F(HostTierTest, CreateNeedsAtLeastOneBlock) {
  EXPECT_THAT(HostTier::Create(kBlockBytes - 1, kBlockBytes).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("holds 0 blocks of 256")));
  auto tier = HostTier::Create(3 * kBlockBytes + 1, kBlockBytes);
  ASSERT_OK(tier);
  EXPECT_EQ((*tier)->num_slots(), 3u);
  EXPECT_EQ((*tier)->counters().capacity_bytes, 3 * kBlockBytes);
}

TEST_F(HostTierTest, StoredBlockLoadsBackIdentical) {
  MakeTier(4);
  StoreBlock(1);
  ASSERT_TRUE(tier_->Find(Identity(1, Bytes(1)).hash).has_value());
  EXPECT_EQ(*tier_->Find(Identity(1, Bytes(1)).hash), Identity(1, Bytes(1)));
  std::vector<uint8_t> out(kBlockBytes);
  ASSERT_OK(tier_->Load(Identity(1, Bytes(1)), out.data()));
  EXPECT_EQ(out, Bytes(1));
  const HostTierCounters counters = tier_->counters();
  EXPECT_EQ(counters.stored, 1u);
  EXPECT_EQ(counters.loaded, 1u);
  EXPECT_EQ(counters.records, 1u);
  EXPECT_EQ(counters.bytes_used, kBlockBytes);
  EXPECT_EQ(counters.misses, 0u);
}

TEST_F(HostTierTest, AtMostOneRecordPerHash) {
  MakeTier(4);
  StoreBlock(1);
  const std::vector<uint8_t> other = Bytes(9);
  BlockRecordIdentity collision = Identity(1, other);
  collision.tokens = {9, 9, 9, 9};
  EXPECT_THAT(tier_->Store(collision, other.data()).status(),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_EQ(tier_->counters().records, 1u);
  EXPECT_EQ(tier_->Find(collision.hash)->tokens, Identity(1, Bytes(1)).tokens);
}

TEST_F(HostTierTest, MismatchedIdentityIsACountedMiss) {
  MakeTier(2);
  StoreBlock(1);
  BlockRecordIdentity expected = Identity(1, Bytes(1));
  expected.extras_digest = 77;
  EXPECT_EQ(tier_->Probe(expected), TierProbe::kMismatch);
  std::vector<uint8_t> out(kBlockBytes);
  EXPECT_THAT(tier_->Load(expected, out.data()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("extra_keys")));
  // Everything ours but the prefix digest: another prompt's block under a parent hash that
  // collides with ours.
  expected = Identity(1, Bytes(1));
  expected.prefix_digest += 1;
  EXPECT_EQ(tier_->Probe(expected), TierProbe::kMismatch);
  EXPECT_THAT(tier_->Load(expected, out.data()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("prefix")));
  EXPECT_THAT(tier_->Load(Identity(5, Bytes(5)), out.data()),
              StatusIs(absl::StatusCode::kNotFound));
  const HostTierCounters counters = tier_->counters();
  EXPECT_EQ(counters.misses, 3u);
  EXPECT_EQ(counters.mismatches, 2u);
  EXPECT_EQ(counters.records, 1u);  // a mismatch is another request's record, kept
}

// The seam for tier 3: the oldest records not yet below are pinned for the copy down, only while
// fewer than the window's slots are free, and once below are not offered again.
TEST_F(HostTierTest, DemotionOffersTheOldestRecordsOnceWhileFewSlotsAreFree) {
  MakeTier(8);
  for (uint64_t n = 1; n <= 4; ++n) StoreBlock(n);
  EXPECT_TRUE(tier_->PinForDemotion(/*window=*/4, 8).empty());  // 4 free: not below the window
  std::vector<HostTier::Demotion> batch = tier_->PinForDemotion(/*window=*/6, /*max=*/3);
  ASSERT_EQ(batch.size(), 3u);
  for (uint64_t i = 0; i < 3; ++i) {
    EXPECT_EQ(batch[i].identity, Identity(i + 1, Bytes(static_cast<uint8_t>(i + 1))));
    EXPECT_EQ(std::vector<uint8_t>(batch[i].bytes, batch[i].bytes + kBlockBytes),
              Bytes(static_cast<uint8_t>(i + 1)));
  }
  tier_->FinishDemotion(batch[0].slot, absl::OkStatus());
  tier_->FinishDemotion(batch[1].slot, absl::ResourceExhaustedError("queue full"));  // retried
  tier_->FinishDemotion(batch[2].slot, absl::DataLossError("bytes changed"));        // dropped
  EXPECT_EQ(tier_->counters().demoted, 1u);
  EXPECT_EQ(tier_->counters().verify_failures, 1u);
  EXPECT_FALSE(tier_->Contains(Identity(3, Bytes(3)).hash));
  batch = tier_->PinForDemotion(/*window=*/6, 8);
  ASSERT_EQ(batch.size(), 2u);  // 2 and 4; 1 is below, 3 is gone
  EXPECT_EQ(batch[0].identity.hash, Identity(2, Bytes(2)).hash);
  EXPECT_EQ(batch[1].identity.hash, Identity(4, Bytes(4)).hash);
  // A pinned record is not evicted: filling the tier evicts around it.
  for (uint64_t n = 10; n < 16; ++n) StoreBlock(n);
  EXPECT_TRUE(tier_->Contains(Identity(2, Bytes(2)).hash));
  EXPECT_FALSE(tier_->Contains(Identity(1, Bytes(1)).hash));
  for (const HostTier::Demotion& demotion : batch) {
    tier_->FinishDemotion(demotion.slot, absl::OkStatus());
  }
  EXPECT_EQ(tier_->counters().demoted, 3u);
}

// The demotion scan resumes where it stopped: once the window's records are below, further
// calls look at nothing new until evictions bring new records into the window — its work per
// pass is the window, not the window per call (a 64 GiB tier's window is 260k records).
TEST_F(HostTierTest, DemotionScanLooksAtEachRecordOncePerPass) {
  MakeTier(600);
  for (uint64_t n = 1; n <= 600; ++n) StoreBlock(n);
  constexpr uint32_t kWindow = 500;
  uint64_t demoted = 0;
  for (int call = 0; call < 200; ++call) {
    for (const HostTier::Demotion& demotion : tier_->PinForDemotion(kWindow, 8)) {
      tier_->FinishDemotion(demotion.slot, absl::OkStatus());
      ++demoted;
    }
  }
  EXPECT_EQ(demoted, kWindow);
  // Each of the window's records once, however many calls: before, every call rescanned it.
  EXPECT_EQ(tier_->counters().demotion_scanned, kWindow);
  EXPECT_OK(tier_->CheckInvariants());
  // Ten stores evict the ten oldest (below, passed): ten new records enter the window, and only
  // they are looked at.
  for (uint64_t n = 1001; n <= 1010; ++n) StoreBlock(n);
  for (int call = 0; call < 10; ++call) {
    for (const HostTier::Demotion& demotion : tier_->PinForDemotion(kWindow, 8)) {
      tier_->FinishDemotion(demotion.slot, absl::OkStatus());
      ++demoted;
    }
  }
  EXPECT_EQ(demoted, kWindow + 10);
  EXPECT_EQ(tier_->counters().demotion_scanned, kWindow + 10);
  // A record loaded (now the most recent) leaves the scanned part; the one whose store the tier
  // below refused starts a new pass that offers it again.
  std::vector<uint8_t> out(kBlockBytes);
  ASSERT_OK(tier_->Load(Identity(100, Bytes(100)), out.data()));
  EXPECT_OK(tier_->CheckInvariants());
  for (uint64_t n = 2001; n <= 2100; ++n) StoreBlock(n);  // 100 new records in the window
  std::vector<HostTier::Demotion> batch = tier_->PinForDemotion(kWindow, 1);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0].identity.hash, Identity(511, Bytes(static_cast<uint8_t>(511))).hash);
  tier_->FinishDemotion(batch[0].slot, absl::ResourceExhaustedError("queue full"));
  // The new pass walks the 399 records below first, at most kMaxDemotionScan per call.
  const uint64_t scanned_before = tier_->counters().demotion_scanned;
  batch = tier_->PinForDemotion(kWindow, 1);
  EXPECT_TRUE(batch.empty());
  EXPECT_EQ(tier_->counters().demotion_scanned - scanned_before, HostTier::kMaxDemotionScan);
  batch = tier_->PinForDemotion(kWindow, 1);
  ASSERT_EQ(batch.size(), 1u);
  EXPECT_EQ(batch[0].identity.hash, Identity(511, Bytes(static_cast<uint8_t>(511))).hash);
  tier_->FinishDemotion(batch[0].slot, absl::OkStatus());
}

TEST_F(HostTierTest, CorruptedRecordFailsVerificationAndIsDropped) {
  MakeTier(2);
  StoreBlock(1);
  ASSERT_TRUE(tier_->CorruptForTesting(Identity(1, Bytes(1)).hash, 17));
  std::vector<uint8_t> out(kBlockBytes);
  EXPECT_THAT(tier_->Load(Identity(1, Bytes(1)), out.data()),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("checksum")));
  const HostTierCounters counters = tier_->counters();
  EXPECT_EQ(counters.verify_failures, 1u);
  EXPECT_EQ(counters.misses, 1u);
  EXPECT_EQ(counters.loaded, 0u);
  EXPECT_EQ(counters.records, 0u);
  EXPECT_FALSE(tier_->Contains(Identity(1, Bytes(1)).hash));
}

TEST_F(HostTierTest, FullTierEvictsItsLeastRecentlyUsed) {
  MakeTier(2);
  StoreBlock(1);
  StoreBlock(2);
  // A load makes 1 the most recently used, so storing 3 evicts 2.
  std::vector<uint8_t> out(kBlockBytes);
  ASSERT_OK(tier_->Load(Identity(1, Bytes(1)), out.data()));
  const std::vector<uint8_t> bytes = Bytes(3);
  auto result = tier_->Store(Identity(3, bytes), bytes.data());
  ASSERT_OK(result);
  ASSERT_TRUE(result->evicted.has_value());
  EXPECT_EQ(result->evicted->hash, Identity(2, Bytes(2)).hash);
  EXPECT_TRUE(tier_->Contains(Identity(1, Bytes(1)).hash));
  EXPECT_FALSE(tier_->Contains(Identity(2, Bytes(2)).hash));
  EXPECT_TRUE(tier_->Contains(Identity(3, bytes).hash));
  const HostTierCounters counters = tier_->counters();
  EXPECT_EQ(counters.evicted, 1u);
  EXPECT_EQ(counters.records, 2u);
  EXPECT_EQ(counters.bytes_used, 2 * kBlockBytes);
}

TEST_F(HostTierTest, PinnedRecordIsNotEvictedAndAFullyPinnedTierRefusesStores) {
  MakeTier(1);
  StoreBlock(1);
  // During a load of 1 (its hook runs with the slot pinned), the only slot cannot be taken.
  absl::Status during_load;
  tier_->SetLoadHookForTesting([&](const Hash128&) {
    const std::vector<uint8_t> bytes = Bytes(2);
    during_load = tier_->Store(Identity(2, bytes), bytes.data()).status();
  });
  std::vector<uint8_t> out(kBlockBytes);
  ASSERT_OK(tier_->Load(Identity(1, Bytes(1)), out.data()));
  EXPECT_EQ(out, Bytes(1));
  EXPECT_THAT(during_load, StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(tier_->counters().store_rejections, 1u);
  tier_->SetLoadHookForTesting(nullptr);
  StoreBlock(2);  // unpinned now: 1 is evicted
  EXPECT_FALSE(tier_->Contains(Identity(1, Bytes(1)).hash));
}

// The two-step store a device pool uses (its D2H copy fills the slot): the slot is private until
// published, an unfilled one goes back, and a store that lost a race to the same hash is refused.
TEST_F(HostTierTest, TwoStepStorePublishesOnlyWhatWasFilled) {
  MakeTier(2);
  auto pending = tier_->BeginStore(Identity(1, Bytes(1)));
  ASSERT_OK(pending);
  EXPECT_FALSE(tier_->Contains(Identity(1, Bytes(1)).hash));  // private until finished
  const std::vector<uint8_t> bytes = Bytes(1);
  std::copy(bytes.begin(), bytes.end(), pending->bytes);
  // Meanwhile a plain store of the same hash wins.
  StoreBlock(1);
  EXPECT_THAT(tier_->FinishStore(*pending, Identity(1, Bytes(1)), false, true),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(tier_->BeginStore(Identity(1, Bytes(1))).status(),
              StatusIs(absl::StatusCode::kAlreadyExists));
  // An unfilled slot (its copy failed) is freed, and nothing is published.
  pending = tier_->BeginStore(Identity(2, Bytes(2)));
  ASSERT_OK(pending);
  EXPECT_OK(tier_->FinishStore(*pending, Identity(2, Bytes(2)), false, false));
  EXPECT_FALSE(tier_->Contains(Identity(2, Bytes(2)).hash));
  // A full tier evicts its oldest for the new slot and says which record left.
  StoreBlock(3);
  pending = tier_->BeginStore(Identity(4, Bytes(4)));
  ASSERT_OK(pending);
  ASSERT_TRUE(pending->evicted.has_value());
  EXPECT_EQ(pending->evicted->hash, Identity(1, Bytes(1)).hash);
  const std::vector<uint8_t> fourth = Bytes(4);
  std::copy(fourth.begin(), fourth.end(), pending->bytes);
  ASSERT_OK(tier_->FinishStore(*pending, Identity(4, Bytes(4)), true, true));
  std::vector<uint8_t> out(kBlockBytes);
  ASSERT_OK(tier_->Load(Identity(4, Bytes(4)), out.data()));
  EXPECT_EQ(out, fourth);
  EXPECT_EQ(tier_->counters().stored, 3u);
  EXPECT_EQ(tier_->counters().records, 2u);
}

// The two-step load a device pool uses (its H2D copy reads the pinned slot): the caller's verdict
// counts a load, drops a corrupt record, or — the copy itself failed — only unpins.
TEST_F(HostTierTest, TwoStepLoadTakesTheCallersVerdict) {
  MakeTier(1);
  StoreBlock(1);
  auto pinned = tier_->PinForLoad(Identity(1, Bytes(1)));
  ASSERT_OK(pinned);
  EXPECT_EQ(std::vector<uint8_t>(pinned->bytes, pinned->bytes + kBlockBytes), Bytes(1));
  EXPECT_EQ(pinned->checksum, Identity(1, Bytes(1)).checksum);
  // Pinned: a store into the one-slot tier cannot evict it.
  const std::vector<uint8_t> second = Bytes(2);
  EXPECT_THAT(tier_->Store(Identity(2, second), second.data()),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_OK(tier_->FinishLoad(*pinned, HostTier::LoadVerdict::kNotCopied));
  EXPECT_EQ(tier_->counters().loaded, 0u);
  EXPECT_EQ(tier_->counters().misses, 0u);

  pinned = tier_->PinForLoad(Identity(1, Bytes(1)));
  ASSERT_OK(pinned);
  EXPECT_OK(tier_->FinishLoad(*pinned, HostTier::LoadVerdict::kVerified));
  EXPECT_EQ(tier_->counters().loaded, 1u);

  pinned = tier_->PinForLoad(Identity(1, Bytes(1)));
  ASSERT_OK(pinned);
  EXPECT_THAT(tier_->FinishLoad(*pinned, HostTier::LoadVerdict::kCorrupt),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("failed its checksum")));
  EXPECT_FALSE(tier_->Contains(Identity(1, Bytes(1)).hash));
  EXPECT_EQ(tier_->counters().verify_failures, 1u);
  EXPECT_THAT(tier_->PinForLoad(Identity(1, Bytes(1))).status(),
              StatusIs(absl::StatusCode::kNotFound));
}

// Superseding (DESIGN §13): a copy of the block with more parts replaces the record, into a
// slot of its own, announced as stored and never as removed; the slot a load has pinned keeps
// the old bytes until the load ends; a copy with equal or fewer parts is a duplicate.
TEST(HostTierSupersedeTest, ACopyWithMorePartsReplacesTheRecordAndAReaderKeepsItsSlot) {
  std::vector<RecordChange> changes;
  auto tier = HostTier::Create(4 * kBlockBytes, kBlockBytes,
                               [&changes](absl::Span<const RecordChange> delivered) {
                                 changes.insert(changes.end(), delivered.begin(), delivered.end());
                               });
  ASSERT_OK(tier);
  const std::vector<uint8_t> kv_only = Bytes(1);
  const std::vector<uint8_t> with_state = Bytes(2);
  BlockRecordIdentity poorer = Identity(1, kv_only);
  poorer.extras_digest = 0x1;
  BlockRecordIdentity richer = Identity(1, with_state);
  richer.extras_digest = 0x3;
  ASSERT_OK((*tier)->Store(poorer, kv_only.data()));
  EXPECT_TRUE((*tier)->ContainsCopyOf(poorer.hash, poorer.extras_digest));
  EXPECT_FALSE((*tier)->ContainsCopyOf(poorer.hash, richer.extras_digest));
  absl::StatusOr<HostTier::PinnedRecord> reading = (*tier)->PinForLoad(poorer);
  ASSERT_OK(reading);
  changes.clear();

  ASSERT_OK((*tier)->Store(richer, with_state.data()));
  EXPECT_EQ((*tier)->counters().superseded, 1u);
  EXPECT_EQ((*tier)->counters().records, 1u);
  EXPECT_EQ((*tier)->Find(poorer.hash), richer);
  EXPECT_TRUE((*tier)->ContainsCopyOf(poorer.hash, poorer.extras_digest));
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].kind, RecordChange::Kind::kStored);
  EXPECT_EQ(changes[0].record, richer);
  // The load's slot is not the new record's, and still holds the bytes its checksum covers.
  EXPECT_NE(reading->bytes, (*tier)->RecordBytesForTesting(poorer.hash));
  EXPECT_TRUE(std::equal(kv_only.begin(), kv_only.end(), reading->bytes));
  EXPECT_OK((*tier)->FinishLoad(*reading, HostTier::LoadVerdict::kVerified));
  EXPECT_OK((*tier)->CheckInvariants());

  EXPECT_THAT((*tier)->Store(poorer, kv_only.data()).status(),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT((*tier)->Store(richer, with_state.data()).status(),
              StatusIs(absl::StatusCode::kAlreadyExists));
  std::vector<uint8_t> out(kBlockBytes);
  EXPECT_OK((*tier)->Load(richer, out.data()));
  EXPECT_EQ(out, with_state);
  EXPECT_THAT((*tier)->Load(poorer, out.data()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("extra_keys")));
  EXPECT_EQ((*tier)->counters().superseded, 1u);
  EXPECT_OK((*tier)->CheckInvariants());
}

// A device pool page-locks the tier's memory for its copies, and unlocks it before unmapping.
TEST(HostTierRegistrarTest, MemoryIsRegisteredOnceAndUnregisteredAtTheEnd) {
  void* registered = nullptr;
  uint64_t registered_size = 0;
  void* unregistered = nullptr;
  {
    auto tier = HostTier::Create(
        4 * kBlockBytes, kBlockBytes, {},
        HostMemoryRegistrar{.register_memory =
                                [&](void* base, uint64_t size) {
                                  registered = base;
                                  registered_size = size;
                                  return absl::OkStatus();
                                },
                            .unregister_memory = [&](void* base) { unregistered = base; }});
    ASSERT_OK(tier);
    EXPECT_NE(registered, nullptr);
    // The mapping's whole pages: 4 slots of 256 bytes, one page.
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    EXPECT_EQ(registered_size, page);
    EXPECT_EQ(unregistered, nullptr);
  }
  EXPECT_EQ(unregistered, registered);
  // A refusal (no page-locked memory left) is the tier's error, naming it.
  EXPECT_THAT(HostTier::Create(4 * kBlockBytes, kBlockBytes, {},
                               HostMemoryRegistrar{.register_memory =
                                                       [](void*, uint64_t) {
                                                         return absl::ResourceExhaustedError(
                                                             "page-locking: out of memory");
                                                       },
                                                   .unregister_memory = [](void*) { FAIL(); }})
                  .status(),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("host tier: page-locking: out of memory")));
}

}  // namespace
}  // namespace kvcache
