// A pool with tier 2 (PoolOptions::host_tier_bytes): the mover copies blocks near eviction into
// the host tier, and Open, Lookup, reads (kPinCached) and puts (kPut) continue the verified prefix
// walk there — bytes identical, corrupt records recomputed, max_load_ms bounding the load, a
// full tier evicting its own oldest. The mover runs synchronously (testing_manual_offload) except
// in the one test of its thread. Every test ends with the pool's invariants checked.
//
// Every test runs on the three pool memories of tests/testing/pool_memories.h: host, staged (the
// CPU reference of the device path) and, in a CUDA build on a machine with a device, cuda (label
// gpu: pool_tier_gpu_test).
// Tier 3's cases are in pool_disk_tier_test.cc, in the same binary.
#include "tests/cache/pool_tier_fixture.h"

namespace kvcache {
namespace pool_tier_test {
namespace {

INSTANTIATE_TEST_SUITE_P(Memories, PoolTierTest, testing::AllPoolMemories(),
                         testing::PoolMemoryName);

TEST_P(PoolTierTest, EvictedPrefixComesBackFromTier2WithIdenticalBytes) {
  MakePool(8, 16);
  const std::vector<uint32_t> a = Tokens(100, 17);  // four full blocks and a partial one
  Compute(a);
  EXPECT_EQ(pool_->OffloadForTesting(), 4u);  // 4 free < the window of 8: all four go down
  Compute(Tokens(500, 32));                   // eight blocks: A's four are evicted
  EXPECT_EQ(pool_->Stats().pool.evicted_offloaded, 4u);

  auto lookup = pool_->Lookup("tenant-a", SequenceSpec{.tokens = a});
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_cached_tokens, 16u);
  EXPECT_EQ(lookup->num_host_tier_tokens, 16u);
  EXPECT_EQ(TierStats().store.loaded, 0u);  // a lookup loads nothing

  absl::StatusOr<OpenedSequence> opened = Open(a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 16u);
  EXPECT_EQ(opened->num_host_tier_tokens, 16u);
  ASSERT_EQ(opened->block_ids.size(), 5u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ReadBack(opened->block_ids[i]), BlockBytes(a, i)) << "block " << i;
    const std::string expected = BlockBytes(a, i);
    auto checksum = pool_->BlockChecksum(opened->block_ids[i]);
    ASSERT_OK(checksum);
    EXPECT_EQ(*checksum, BlockChecksum(expected.data(), expected.size()));
  }
  const PoolHostTierStats stats = TierStats();
  EXPECT_EQ(stats.hit_blocks, 4u);
  EXPECT_EQ(stats.store.loaded, 4u);
  EXPECT_EQ(stats.load_failures, 0u);
  EXPECT_EQ(pool_->Stats().hit_tokens, 16u);
  ASSERT_OK(pool_->Release(session_, opened->sequence_id));
  // Published again in tier 1: the next walk ends there.
  lookup = pool_->Lookup("tenant-a", SequenceSpec{.tokens = a});
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_cached_tokens, 16u);
  EXPECT_EQ(lookup->num_host_tier_tokens, 0u);
}

TEST_P(PoolTierTest, WalkContinuesInTier2AfterTier1Hits) {
  MakePool(8, 16);
  const std::vector<uint32_t> a = Tokens(100, 17);
  Compute(a);
  pool_->OffloadForTesting();
  // Evict only A's tail (released first, so at the LRU front): 4 free + 2 evicted.
  Compute(Tokens(500, 24));
  auto opened = Open(a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 16u);
  EXPECT_EQ(opened->num_host_tier_tokens, 8u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ReadBack(opened->block_ids[i]), BlockBytes(a, i));
}

TEST_P(PoolTierTest, CorruptedRecordIsDetectedAndRecomputed) {
  MakePool(8, 16);
  const std::vector<uint32_t> a = Tokens(100, 17);
  ComputeOffloadEvict(a);
  ASSERT_TRUE(pool_->host_tier()->CorruptForTesting(Chain(a)[1], 5));
  auto opened = Open(a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 4u);  // block 0 only: 1 failed, 2 and 3 hang off it
  EXPECT_EQ(opened->num_host_tier_tokens, 4u);
  EXPECT_EQ(ReadBack(opened->block_ids[0]), BlockBytes(a, 0));
  const PoolHostTierStats stats = TierStats();
  EXPECT_EQ(stats.load_failures, 1u);
  EXPECT_EQ(stats.store.verify_failures, 1u);
  EXPECT_EQ(stats.store.misses, 1u);
  EXPECT_EQ(stats.hit_blocks, 1u);
  EXPECT_EQ(stats.store.loaded, 1u);  // blocks 2 and 3, copied in the same batch, are not used
  EXPECT_FALSE(pool_->host_tier()->Contains(Chain(a)[1]));  // dropped, never served
  EXPECT_TRUE(pool_->host_tier()->Contains(Chain(a)[2]));
  // The rest is computed and committed as usual.
  for (size_t i = 1; i < 4; ++i) {
    ASSERT_OK(pool_->WriteBlock(opened->block_ids[i], 0, BlockBytes(a, i)));
  }
  ASSERT_OK(pool_->Commit(session_, opened->sequence_id, a.size()));
}

// A host pool's load of kSlicedCopyMinBytes or more is cut into slices, the later ones
// copied on the pool's workers: every block arrives whole and is verified on its own, and a corrupt
// record in the workers' slice ends the hit right before it. (Other memories copy it in one.)
TEST_P(PoolTierTest, ALargeLoadIsCopiedOnTheWorkersAndVerifiedBlockByBlock) {
  head_dim_ = 8192;  // 256 KiB blocks: a 12-block prompt is 3 MiB, one batch of two slices
  workers_ = std::make_shared<TaskWorkers>(1, absl::ZeroDuration());
  MakePool(13, 32);
  ASSERT_GE(12 * block_bytes_, kSlicedCopyMinBytes);
  const std::vector<uint32_t> a = Tokens(100, 12 * kBlockSize + 1);
  const std::vector<uint32_t> b = Tokens(50000, 13 * kBlockSize);  // evicts all of A
  Compute(a);
  pool_->OffloadForTesting();
  Compute(b);
  const auto open_a = [&](uint32_t expected_blocks) {
    auto opened = Open(a);
    ASSERT_OK(opened);
    ASSERT_EQ(opened->num_host_tier_tokens, expected_blocks * kBlockSize);
    for (size_t i = 0; i < expected_blocks; ++i) {
      EXPECT_EQ(ReadBack(opened->block_ids[i]), BlockBytes(a, i)) << "block " << i;
    }
    ASSERT_OK(pool_->Release(session_, opened->sequence_id));
  };
  ASSERT_NO_FATAL_FAILURE(open_a(12));
  const uint64_t handed_out = workers_->ran_on_workers() + workers_->ran_by_callers();
  EXPECT_EQ(handed_out, GetParam() == PoolMemoryKind::kHost ? 1u : 0u);

  Compute(b);  // A out of tier 1 again; its records stay in tier 2
  ASSERT_TRUE(pool_->host_tier()->CorruptForTesting(Chain(a)[9], 5));
  ASSERT_NO_FATAL_FAILURE(open_a(9));
  EXPECT_EQ(TierStats().load_failures, 1u);
  EXPECT_FALSE(pool_->host_tier()->Contains(Chain(a)[9]));  // dropped, never served
}

TEST_P(PoolTierTest, MaxLoadMsLeavesTheRestToCompute) {
  MakePool(8, 16);
  const std::vector<uint32_t> a = Tokens(100, 17);
  ComputeOffloadEvict(a);
  // Each load takes 10 ms of the fake clock: blocks start at 0, 10, 20 ms; the fourth at 30 ms
  // is past a 25 ms bound.
  pool_->host_tier()->SetLoadHookForTesting(
      [this](const Hash128&) { clock_.Advance(absl::Milliseconds(10)); });
  auto opened = Open(a, OpenMode::kCompute, /*max_load_ms=*/25);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 12u);
  EXPECT_EQ(opened->num_host_tier_tokens, 12u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ReadBack(opened->block_ids[i]), BlockBytes(a, i));
  EXPECT_EQ(TierStats().deadline_blocks, 1u);
  EXPECT_EQ(TierStats().hit_blocks, 3u);
  // The block left behind is not published: nothing half-loaded is findable.
  ASSERT_OK(pool_->Release(session_, opened->sequence_id));
  auto lookup = pool_->Lookup("tenant-a", SequenceSpec{.tokens = a});
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_cached_tokens, 16u);  // three in tier 1, the fourth still in tier 2
  EXPECT_EQ(lookup->num_host_tier_tokens, 4u);
}

TEST_P(PoolTierTest, ReadsAndPutsCountTier2BlocksAsCached) {
  MakePool(8, 16);
  const std::vector<uint32_t> a = Tokens(100, 16);
  ComputeOffloadEvict(a);
  auto read = Open(a, OpenMode::kPinCached);
  ASSERT_OK(read);
  EXPECT_EQ(read->num_cached_tokens, 16u);
  ASSERT_EQ(read->block_ids.size(), 4u);
  EXPECT_EQ(ReadBack(read->block_ids[3]), BlockBytes(a, 3));
  ASSERT_OK(pool_->Release(session_, read->sequence_id));
  auto put = Open(Tokens(100, 20), OpenMode::kPut);  // A plus one new block
  ASSERT_OK(put);
  EXPECT_EQ(put->num_cached_tokens, 16u);
  EXPECT_EQ(put->block_ids.size(), 5u);
}

TEST_P(PoolTierTest, ReadOfAPrefixOnlyInTier2FailsNothingWhenTier1IsFull) {
  MakePool(8, 16);
  const std::vector<uint32_t> a = Tokens(100, 16);
  Compute(a);
  pool_->OffloadForTesting();
  auto hold = Open(Tokens(500, 32));  // every block referenced
  ASSERT_OK(hold);
  auto read = Open(a, OpenMode::kPinCached);
  ASSERT_OK(read);
  EXPECT_EQ(read->num_cached_tokens, 0u);
  EXPECT_TRUE(read->block_ids.empty());
}

TEST_P(PoolTierTest, SessionEndingDuringTheLoadLeavesNothingBehind) {
  MakePool(8, 16);
  const std::vector<uint32_t> a = Tokens(100, 17);
  ComputeOffloadEvict(a);
  // The evicting prompt goes below too: the open evicts nothing unsaved, so the first record it
  // pins is its load's (a pass-down keeps the records it will load pinned meanwhile).
  pool_->OffloadForTesting();
  pool_->host_tier()->SetLoadHookForTesting([this](const Hash128&) {
    if (session_.closed.exchange(true)) return;
    pool_->ReleaseSession(session_.id);  // the sweep runs while the opening sequence loads
  });
  EXPECT_THAT(Open(a).status(), StatusIs(absl::StatusCode::kAborted, HasSubstr("during the open")));
  EXPECT_EQ(pool_->Stats().referenced, 0u);
  EXPECT_EQ(pool_->Stats().open_sequences, 0u);
}

TEST_P(PoolTierTest, OnlyBlocksNearEvictionGoDown) {
  MakePool(64, 64);  // default offload window: max(8, 64 / 8) = 8
  ASSERT_EQ(pool_->offload_window(), 8u);
  Compute(Tokens(1000, 40 * kBlockSize));  // 24 free: eviction is far, nothing goes down
  EXPECT_EQ(pool_->OffloadForTesting(), 0u);
  Compute(Tokens(5000, 20 * kBlockSize));  // 4 free: the oldest 8 evictable go down, no more
  EXPECT_EQ(pool_->OffloadForTesting(), 8u);
  EXPECT_EQ(pool_->OffloadForTesting(), 0u);
  EXPECT_EQ(TierStats().store.records, 8u);
}

TEST_P(PoolTierTest, MoverKeepsTheWindowCoveredAsEvictionsConsumeIt) {
  // A window of 20 takes three batches of at most 8; the scan resumes where it stopped.
  MakePool(64, 64, /*manual=*/true, /*offload_window=*/20);
  Compute(Tokens(1000, 60 * kBlockSize));  // 60 evictable, 4 free
  EXPECT_EQ(pool_->OffloadForTesting(), 20u);
  EXPECT_EQ(pool_->OffloadForTesting(), 0u);
  // Ten new blocks: the 4 free ones and 6 evictions, all of blocks already below.
  auto hold = Open(Tokens(9000, 10 * kBlockSize));
  ASSERT_OK(hold);
  EXPECT_EQ(pool_->Stats().pool.evicted_offloaded, 6u);
  EXPECT_EQ(pool_->Stats().pool.evictions, 6u);
  // The window moved 6 blocks on: 6 more go down, and no more.
  EXPECT_EQ(pool_->OffloadForTesting(), 6u);
  EXPECT_EQ(pool_->OffloadForTesting(), 0u);
  EXPECT_EQ(TierStats().store.records, 26u);
}

TEST_P(PoolTierTest, FullTierEvictsItsOldestAndRequestsGoOn) {
  MakePool(8, 2);
  const std::vector<uint32_t> a = Tokens(100, 16);
  Compute(a);
  // LRU order is A3, A2, A1, A0 (tails are released first): the tier keeps the last two stored.
  EXPECT_EQ(pool_->OffloadForTesting(), 4u);
  EXPECT_EQ(TierStats().store.evicted, 2u);
  EXPECT_EQ(TierStats().store.records, 2u);
  EXPECT_EQ(TierStats().store.bytes_used, 2 * block_bytes_);
  Compute(Tokens(500, 32));  // requests go on; A leaves tier 1
  auto opened = Open(a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 8u);  // A0 and A1 from tier 2
  EXPECT_EQ(opened->num_host_tier_tokens, 8u);
}

// Tier 2's records are announced with its own medium, apart from tier 1's: stored with the
// tenant and parent their blocks had above, removed when tier 2 evicts them, and still announced
// (in a snapshot too) after tier 1 evicted the blocks.
TEST_P(PoolTierTest, Tier2StoresAndEvictionsAreEventsWithItsMedium) {
  MakePool(8, 2);
  const std::vector<uint32_t> a = Tokens(100, 16);
  const std::vector<Hash128> chain = Chain(a);
  Compute(a);
  EXPECT_EQ(pool_->OffloadForTesting(), 4u);  // A3, A2, A1, A0; the tier keeps A1 and A0
  const MediumEvents tier2 = EventsIn(kKvMediumCpuPinned);
  ASSERT_EQ(tier2.stored.size(), 4u);
  EXPECT_EQ(tier2.stored[0], std::make_tuple(chain[3], std::optional(chain[2]), "tenant-a"));
  EXPECT_EQ(tier2.stored[3], std::make_tuple(chain[0], std::optional<Hash128>(), "tenant-a"));
  EXPECT_THAT(tier2.removed, ::testing::ElementsAre(chain[3], chain[2]));

  Compute(Tokens(500, 32));  // A leaves tier 1
  EXPECT_THAT(EventsIn(kKvMediumCpu).removed, ::testing::IsSupersetOf(chain));
  std::vector<std::pair<std::string, Hash128>> snapshot;
  for (const KvEvent& event : events_->TakeSnapshot(KvEventFilter{}).events) {
    if (event.medium == kKvMediumCpuPinned) {
      snapshot.emplace_back(event.medium, event.blocks[0].hash);
      if (event.blocks[0].hash == chain[0]) {
        EXPECT_EQ(event.parent_hash, std::nullopt);
      }
    }
  }
  EXPECT_THAT(snapshot, ::testing::ElementsAre(std::pair(std::string("CPU_PINNED"), chain[0]),
                                               std::pair(std::string("CPU_PINNED"), chain[1])));
}

TEST_P(PoolTierTest, MoverThreadOffloadsAheadOfEviction) {
  MakePool(8, 16, /*manual=*/false);
  const std::vector<uint32_t> a = Tokens(100, 16);
  Compute(a);
  ASSERT_TRUE(testing::PollUntil([&] { return TierStats().store.records == 4; }));
  EXPECT_EQ(TierStats().offloaded_blocks, 4u);
  Compute(Tokens(500, 32));
  auto opened = Open(a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 12u);  // capped: the last token is computed
  EXPECT_EQ(opened->num_host_tier_tokens, 12u);
}

// Regression: with every evictable block in the mover's batch, an open failed
// RESOURCE_EXHAUSTED ("0 free and 0 evictable") as if they were referenced. It now waits for the
// batch. The mover here is OffloadForTesting on a thread, held inside its first store until the
// open is waiting.
TEST_P(PoolTierTest, OpenNeedingTheMoversBatchWaitsForIt) {
  MakePool(8, 16);
  Compute(Tokens(500, 32));  // 8 evictable, none free
  std::atomic<bool> storing{false}, release{false};
  pool_->host_tier()->SetStoreHookForTesting([&](const Hash128&) {
    storing = true;  // the batch is pinned
    while (!release.load()) absl::SleepFor(absl::Milliseconds(1));
  });
  std::thread mover([&] { pool_->OffloadForTesting(); });
  std::thread releaser([&] {
    // Lets the batch go once the open waits for it (or after the bound, to fail, not hang).
    testing::PollUntil([&] { return TierStats().request_waits == 1; });
    release = true;
  });
  ASSERT_TRUE(testing::PollUntil([&] { return storing.load(); }));
  auto opened = Open(Tokens(100, 16));
  release = true;
  mover.join();
  releaser.join();
  ASSERT_OK(opened);
  EXPECT_EQ(opened->block_ids.size(), 4u);
  EXPECT_EQ(TierStats().request_waits, 1u);
}

TEST_P(PoolTierTest, TierFiguresArePoolWideInEveryTenantsView) {
  MakePool(8, 16);
  Compute(Tokens(100, 16));
  EXPECT_EQ(pool_->OffloadForTesting(), 4u);
  for (absl::string_view tenant : {"tenant-a", "never-used-the-pool"}) {
    const PoolStatsSnapshot stats = pool_->Stats(tenant);
    ASSERT_TRUE(stats.host_tier.has_value()) << tenant;
    EXPECT_EQ(stats.host_tier->offloaded_blocks, 4u) << tenant;
    EXPECT_EQ(stats.host_tier->store.records, 4u) << tenant;
  }
}

TEST(PoolTierSpecTest, HostTierOfLessThanOneBlockIsRefused) {
  PoolOptions options = TierPoolOptions(8, 4);
  options.host_tier_bytes = options.layout.BlockBytes() - 1;
  auto host = HostPoolMemory::Create(options.layout.BlockBytes(), 8);
  ASSERT_OK(host);
  EXPECT_THAT(Pool::Create(options, 0, *std::move(host)).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pool 'tiered': host_tier=")));
}

// An 8-block pool over a 16-slot tier 2 whose memory fails when told to (a sticky CUDA error,
// here injected into host memory's reads or writes).
class PoolTierFaultTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto base = HostPoolMemory::Create(options_.layout.BlockBytes(), 8);
    ASSERT_OK(base);
    auto memory = std::make_unique<testing::FaultInjectionPoolMemory>(*std::move(base));
    memory_ = memory.get();
    auto pool = Pool::Create(options_, 0, std::move(memory));
    ASSERT_OK(pool);
    pool_ = *std::move(pool);
  }

  // Opens, writes every full block, commits and releases.
  void Compute(const std::vector<uint32_t>& tokens) {
    auto opened = pool_->Open(session_, SequenceSpec{.tokens = tokens}, OpenMode::kCompute);
    ASSERT_OK(opened);
    const std::string bytes(options_.layout.BlockBytes(), 'k');
    for (size_t i = 0; i < tokens.size() / kBlockSize; ++i) {
      ASSERT_OK(pool_->WriteBlock(opened->block_ids[i], 0, bytes));
    }
    ASSERT_OK(pool_->Commit(session_, opened->sequence_id, tokens.size()));
    ASSERT_OK(pool_->Release(session_, opened->sequence_id));
  }

  const PoolOptions options_ = TierPoolOptions(8, 16);
  const Session session_{1, "uid:1", "tenant-a", "test", absl::Seconds(10)};
  testing::FaultInjectionPoolMemory* memory_ = nullptr;  // pool_'s
  std::unique_ptr<Pool> pool_;
};

// A device fault in the middle of a copy from tier 2 latches: the open that hit it fails like
// every call after it, and hands out nothing.
TEST_F(PoolTierFaultTest, DeviceFaultWhileLoadingFromTier2FailsTheOpen) {
  const std::vector<uint32_t> a = Tokens(100, 16);
  Compute(a);
  EXPECT_EQ(pool_->OffloadForTesting(), 4u);
  Compute(Tokens(500, 32));  // A's four leave tier 1
  memory_->FailNth(testing::FaultInjectionPoolMemory::Op::kWrite, 2,
                   testing::FaultInjectionPoolMemory::StickyCudaError());
  EXPECT_THAT(pool_->Open(session_, SequenceSpec{.tokens = a}, OpenMode::kCompute),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("illegal memory access")));
  EXPECT_TRUE(memory_->tripped());
  EXPECT_THAT(pool_->Lookup("tenant-a", SequenceSpec{.tokens = a}).status(),
              StatusIs(absl::StatusCode::kUnavailable));
  const PoolStatsSnapshot stats = pool_->Stats();
  EXPECT_EQ(stats.referenced, 0u);  // the failed open holds nothing
  // A's records stay, no verdict on them, beside the four the open passed down on evicting them.
  EXPECT_EQ(stats.host_tier->store.records, 8u);
  EXPECT_EQ(stats.host_tier->passed_down_on_eviction, 4u);
  EXPECT_OK(pool_->CheckInvariants());
}

// A device fault while an open copies its victims down (reading them) fails that open
// UNAVAILABLE as well; it holds nothing, and nothing was marked below.
TEST_F(PoolTierFaultTest, DeviceFaultWhilePassingVictimsDownFailsTheOpen) {
  Compute(Tokens(100, 32));  // the whole pool, never offloaded
  memory_->FailNth(testing::FaultInjectionPoolMemory::Op::kRead, 1,
                   testing::FaultInjectionPoolMemory::StickyCudaError());
  EXPECT_THAT(pool_->Open(session_, SequenceSpec{.tokens = Tokens(500, 16)}, OpenMode::kCompute),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("illegal memory access")));
  EXPECT_TRUE(memory_->tripped());
  const PoolStatsSnapshot stats = pool_->Stats();
  EXPECT_EQ(stats.referenced, 0u);
  EXPECT_EQ(stats.evictable, 8u);  // nothing was evicted
  EXPECT_EQ(stats.host_tier->passed_down_on_eviction, 0u);
  EXPECT_OK(pool_->CheckInvariants());
}

}  // namespace
}  // namespace pool_tier_test
}  // namespace kvcache
