// A pool with tier 2 over a disk tier (PoolTierTest::MakeDiskPool): tier 2's oldest records are
// passed down, and the walk continues on disk — bytes identical after a restart too, corrupt
// records recomputed, a full disk stopping the pass-down, max_load_ms between disk batches. Part
// of pool_tier_test's binary (the fixture: pool_tier_fixture.h), on the same pool memories.
#include "tests/cache/pool_tier_fixture.h"

namespace kvcache {
namespace pool_tier_test {
namespace {

// Tier 3: tier 2's oldest records are passed down to the disk tier, and the walk continues there.
TEST_P(PoolTierTest, EvictedPrefixComesBackFromDiskWithIdenticalBytes) {
  MakeDiskPool();
  ASSERT_EQ(pool_->demotion_window(), 8u);
  const std::vector<uint32_t> a = Tokens(100, 17);
  ComputeIntoDiskOnly(a);
  EXPECT_EQ(DiskStats().demoted_blocks, 12u);     // A's 4, then the other prompt's 8
  EXPECT_EQ(DiskStats().evicted_from_above, 4u);  // A's tier-2 records left, already on disk
  EXPECT_EQ(DiskStats().store.records, 12u);

  auto lookup = pool_->Lookup("tenant-a", SequenceSpec{.tokens = a});
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_cached_tokens, 16u);
  EXPECT_EQ(lookup->num_host_tier_tokens, 0u);
  EXPECT_EQ(lookup->num_disk_tier_tokens, 16u);
  EXPECT_EQ(DiskStats().store.loads, 0u);  // a lookup reads nothing

  auto opened = Open(a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 16u);
  EXPECT_EQ(opened->num_disk_tier_tokens, 16u);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(ReadBack(opened->block_ids[i]), BlockBytes(a, i)) << "block " << i;
  }
  EXPECT_EQ(DiskStats().hit_blocks, 4u);
  EXPECT_EQ(DiskStats().load_failures, 0u);
  EXPECT_EQ(pool_->Stats().hit_tokens, 16u);

  // A device pool's disk records came up through tier 2, which keeps them under the checksum
  // the disk tier verified: once tier 1 loses them again they load from tier 2, verified.
  const bool device = GetParam() != PoolMemoryKind::kHost;
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(pool_->host_tier()->Contains(Chain(a)[i]), device);
  if (!device) return;
  ASSERT_OK(pool_->Release(session_, opened->sequence_id));
  Compute(Tokens(900, 32));  // eight fresh blocks: A leaves tier 1, tier 2 is not touched
  auto again = Open(a);
  ASSERT_OK(again);
  EXPECT_EQ(again->num_host_tier_tokens, 16u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ReadBack(again->block_ids[i]), BlockBytes(a, i));
  EXPECT_EQ(TierStats().store.verify_failures, 0u);
}

TEST_P(PoolTierTest, DiskRecordsOutliveThePool) {
  MakeDiskPool();
  const std::vector<uint32_t> a = Tokens(100, 17);
  ComputeIntoDiskOnly(a);
  ASSERT_OK(pool_->CheckInvariants());
  pool_.reset();  // a restart: tier 1 and tier 2 are gone, the file stays
  MakeDiskPool();
  EXPECT_EQ(DiskStats().store.restart_records, 12u);
  EXPECT_EQ(DiskStats().store.restart_torn, 0u);
  auto opened = Open(a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_disk_tier_tokens, 16u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ReadBack(opened->block_ids[i]), BlockBytes(a, i));
}

// Disk records are announced DISK once durable, removed when dropped, and after a restart the
// new daemon's log holds what the disk restored: each prompt a chain from its first block (no
// tenant: a record has none), parents first.
TEST_P(PoolTierTest, DiskRecordsAreEventsWhenDurableAndAfterARestart) {
  MakeDiskPool();
  const std::vector<uint32_t> a = Tokens(100, 17);
  const std::vector<Hash128> chain = Chain(a);
  ComputeIntoDiskOnly(a);
  const MediumEvents disk = EventsIn(kKvMediumDisk);
  ASSERT_EQ(disk.stored.size(), 12u);  // A's 4, the other prompt's 8
  EXPECT_EQ(disk.stored[0], std::make_tuple(chain[3], std::optional(chain[2]), "tenant-a"));
  EXPECT_EQ(disk.stored[3], std::make_tuple(chain[0], std::optional<Hash128>(), "tenant-a"));
  EXPECT_TRUE(disk.removed.empty());

  pool_.reset();
  MakeDiskPool();
  testing::EventIndex restored;
  for (const KvEvent& event : events_->TakeSnapshot(KvEventFilter{}).events) {
    ASSERT_EQ(event.medium, "DISK");
    restored.Store(event.pool, event.tenant, event.parent_hash, event.blocks[0].hash,
                   event.blocks[0].token_ids);
  }
  EXPECT_EQ(restored.size(), 12u);
  EXPECT_THAT(restored.violations(), ::testing::IsEmpty());
  EXPECT_EQ(restored.CachedBlocks("tiered", "", a, kBlockSize), 4u);
  EXPECT_EQ(restored.CachedBlocks("tiered", "", Tokens(500, 32), kBlockSize), 8u);
  // The live stream from the start says the same, a parent before its children.
  testing::EventIndex live;
  for (const auto& event : events_->Read(1, 100).events) {
    std::optional<Hash128> parent = event->parent_hash;
    for (const StoredBlock& block : event->blocks) {
      live.Store(event->pool, event->tenant, parent, block.hash, block.token_ids);
      parent = block.hash;
    }
  }
  EXPECT_EQ(live.CachedBlocks("tiered", "", a, kBlockSize), 4u);
  EXPECT_THAT(live.violations(), ::testing::IsEmpty());

  // A record dropped as corrupt is removed. Slots hold A3, A2, A1, A0 from slot 0.
  CorruptDiskSlot(2);
  ASSERT_OK(Open(a));
  EXPECT_THAT(EventsIn(kKvMediumDisk).removed, ::testing::ElementsAre(chain[1]));
}

TEST_P(PoolTierTest, CorruptDiskRecordIsDetectedAndRecomputed) {
  MakeDiskPool();
  const std::vector<uint32_t> a = Tokens(100, 17);
  ComputeIntoDiskOnly(a);
  // Passed down oldest first, as tier 1 released them (tail first): A3, A2, A1, A0 in slots
  // 0 to 3. A1's bytes change on disk.
  CorruptDiskSlot(2);
  auto opened = Open(a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 4u);  // A0; the rest is computed
  EXPECT_EQ(opened->num_disk_tier_tokens, 4u);
  EXPECT_EQ(ReadBack(opened->block_ids[0]), BlockBytes(a, 0));
  EXPECT_EQ(DiskStats().store.load_corrupt, 1u);
  EXPECT_EQ(DiskStats().load_failures, 1u);
  EXPECT_FALSE(pool_->disk_tier()->Find(Chain(a)[1]).ok());  // dropped, never served
}

// A prefix split over the tiers: A0 and A1 in tier 2 (A2 and A3, stored first, were evicted from
// it) and all four on disk. The walk takes each block from the highest tier holding it.
TEST_P(PoolTierTest, PrefixSplitBetweenTier2AndDiskLoadsFromBoth) {
  MakeDiskPool();
  const std::vector<uint32_t> a = Tokens(100, 17);
  Compute(a);
  pool_->OffloadForTesting();  // tier 2: A3 A2 A1 A0; disk: the same
  pool_->disk_tier()->Flush();
  Compute(Tokens(500, 24));    // six blocks: four free, A3 and A2 evicted from tier 1
  pool_->OffloadForTesting();  // the six into tier 2 evict A3 and A2 from it
  Compute(Tokens(900, 8));     // two blocks: A1 and A0 evicted from tier 1
  pool_->disk_tier()->Flush();
  auto lookup = pool_->Lookup("tenant-a", SequenceSpec{.tokens = a});
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_host_tier_tokens, 8u);
  EXPECT_EQ(lookup->num_disk_tier_tokens, 8u);
  // Loading A0 and A1 takes 10 ms each on the fake clock; a 15 ms bound ends the load before the
  // disk's batch: A2 and A3 are left to compute.
  pool_->host_tier()->SetLoadHookForTesting(
      [this](const Hash128&) { clock_.Advance(absl::Milliseconds(10)); });
  auto bounded = Open(a, OpenMode::kCompute, /*max_load_ms=*/15);
  ASSERT_OK(bounded);
  EXPECT_EQ(bounded->num_host_tier_tokens, 8u);
  EXPECT_EQ(bounded->num_disk_tier_tokens, 0u);
  EXPECT_EQ(DiskStats().deadline_blocks, 2u);
  ASSERT_OK(pool_->Release(session_, bounded->sequence_id));
  // Unbounded: A0 and A1 now in tier 1, A2 and A3 from disk.
  auto opened = Open(a);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 16u);
  EXPECT_EQ(opened->num_host_tier_tokens, 0u);
  EXPECT_EQ(opened->num_disk_tier_tokens, 8u);
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(ReadBack(opened->block_ids[i]), BlockBytes(a, i));
}

TEST_P(PoolTierTest, MaxLoadMsEndsADiskLoadBetweenBatches) {
  disk_read_depth_ = 1;  // a batch per block
  disk_before_read_ = [this] { clock_.Advance(absl::Milliseconds(10)); };
  MakeDiskPool();
  const std::vector<uint32_t> a = Tokens(100, 17);
  ComputeIntoDiskOnly(a);
  // Reads at 0, 10, 20 ms; the fourth would start at 30, past the bound.
  auto opened = Open(a, OpenMode::kCompute, /*max_load_ms=*/25);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 12u);
  EXPECT_EQ(opened->num_disk_tier_tokens, 12u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(ReadBack(opened->block_ids[i]), BlockBytes(a, i));
  EXPECT_EQ(DiskStats().deadline_blocks, 1u);
  ASSERT_OK(pool_->Release(session_, opened->sequence_id));
  // Nothing half-loaded is findable: the fourth block is still only on disk.
  auto lookup = pool_->Lookup("tenant-a", SequenceSpec{.tokens = a});
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_cached_tokens, 16u);
  EXPECT_EQ(lookup->num_disk_tier_tokens, 4u);
}

// A disk that fails its writes (ENOSPC here) stops taking records; tier 2 and requests go on.
TEST_P(PoolTierTest, FullDiskStopsPassingDownAndRequestsGoOn) {
  disk_write_errno_ = [] { return ENOSPC; };
  MakeDiskPool();
  const std::vector<uint32_t> a = Tokens(100, 17);
  Compute(a);
  pool_->OffloadForTesting();
  pool_->disk_tier()->Flush();
  EXPECT_GE(DiskStats().store.write_errors, 1u);
  EXPECT_EQ(DiskStats().store.records, 0u);
  for (int round = 0; round < 3; ++round) {
    Compute(Tokens(1000 + 100 * round, 32));
    pool_->OffloadForTesting();  // returns: the stopped disk refuses at once, nothing waits
  }
  EXPECT_GE(DiskStats().store.stores_refused_stopped, 1u);
  EXPECT_EQ(DiskStats().store.records, 0u);
  EXPECT_EQ(DiskStats().evicted_from_above, 0u);
  // The refusals are the disk row's store failures, the figure GetStats and /metrics both report.
  const PoolStatsSnapshot stats = pool_->Stats();
  ASSERT_EQ(stats.tiers.size(), 2u);
  EXPECT_EQ(stats.tiers[1].tier, "disk");
  EXPECT_EQ(stats.tiers[1].store_failures, stats.disk_tier->store.stores_refused_full +
                                               stats.disk_tier->store.stores_refused_stopped);
  EXPECT_GE(stats.tiers[1].write_errors, 1u);
  // Tier 2 kept working: the last round's blocks, evicted from tier 1, come back from it.
  Compute(Tokens(7000, 32));
  auto opened = Open(Tokens(1200, 32));
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_host_tier_tokens, 28u);  // capped: the last token is computed
}

// disk_admission=reused: a block never hit stays off the disk; once hit (here in tier 1, after
// its record went to tier 2) its record is passed down.
TEST_P(PoolTierTest, ReusedAdmissionPassesDownOnlyBlocksHitAtLeastOnce) {
  disk_admission_ = DiskAdmission::kReused;
  MakeDiskPool();
  const std::vector<uint32_t> a = Tokens(100, 17);
  Compute(a);
  pool_->OffloadForTesting();  // tier 2 takes A's four records; none was hit: none goes on
  pool_->disk_tier()->Flush();
  EXPECT_EQ(TierStats().store.records, 4u);
  EXPECT_EQ(DiskStats().store.records, 0u);
  Compute(a);  // all four hit in tier 1
  pool_->OffloadForTesting();
  pool_->disk_tier()->Flush();
  EXPECT_EQ(DiskStats().store.records, 4u);
  EXPECT_EQ(DiskStats().demoted_blocks, 4u);
}

// Regression (issue 29): a request that evicts more blocks than the mover's offload window
// dropped the admitted blocks the mover had not copied down yet — with 32-block puts only 2 of 8
// prompts reached the lower tiers. Every block a put admits now reaches tier 2 or the disk before
// tier 1 evicts it, however large the batch: the evicting request passes its victims down, and so
// does tier 2's store that evicts a record the disk does not hold yet. The pool's windows are 8
// blocks, and the mover covers them between puts (OffloadForTesting: a mover never behind).
TEST_P(PoolTierTest, PutsLargerThanTheOffloadWindowLoseNoBlockOnTheWayDown) {
  // Room for a put's 32 records in the disk's queue: its back-pressure is not what is tested.
  disk_max_queued_stores_ = 64;
  MakePool(64, 64, /*manual=*/true, /*offload_window=*/0, DiskBytes(512));
  ASSERT_EQ(pool_->offload_window(), 8u);
  ASSERT_EQ(pool_->demotion_window(), 8u);
  constexpr size_t kPrompts = 8, kPutBlocks = 32;
  std::vector<std::vector<uint32_t>> prompts;
  for (size_t p = 0; p < kPrompts; ++p) {
    prompts.push_back(Tokens(static_cast<uint32_t>(10000 * (p + 1)), kPutBlocks * kBlockSize));
    Put(prompts.back());
    pool_->OffloadForTesting();
  }
  pool_->disk_tier()->Flush();  // what the disk took is durable, hence found
  size_t prompts_below = 0;
  for (size_t p = 0; p < kPrompts; ++p) {
    auto found = pool_->Lookup("tenant-a", SequenceSpec{.tokens = prompts[p]});
    ASSERT_OK(found);
    EXPECT_EQ(found->num_cached_blocks, kPutBlocks) << "prompt " << p;
    // The first six left tier 1 (it holds two puts): all of each is below.
    if (found->num_host_tier_tokens + found->num_disk_tier_tokens == kPutBlocks * kBlockSize) {
      ++prompts_below;
    }
  }
  EXPECT_EQ(prompts_below, kPrompts - 2);
  // Every tier-1 victim was below when evicted, and every tier-2 victim on disk.
  const PoolStatsSnapshot stats = pool_->Stats();
  EXPECT_EQ(stats.pool.evictions, (kPrompts - 2) * kPutBlocks);
  EXPECT_EQ(stats.pool.evicted_offloaded, stats.pool.evictions);
  EXPECT_EQ(stats.host_tier->evicted_unsaved, 0u);
  EXPECT_GT(stats.host_tier->store.evicted, 0u);
  EXPECT_EQ(stats.disk_tier->evicted_unsaved, 0u);
  EXPECT_EQ(stats.tiers[0].store_failures, 0u);
  EXPECT_EQ(stats.tiers[1].store_failures, 0u);
}

TEST_P(PoolTierTest, Tier2SmallerThanTheMoversBatchPassesEveryBlockOnToDisk) {
  // Eight tier-2 slots under the mover's batches of up to 32: a batch must not outgrow the slots
  // it is stored into, or the stores after the eighth are refused, the pass moves on, and a
  // prompt this long leaves more such blocks than the eviction's own pass-downs save: once tier 1
  // evicts them they reach no tier below (tier_bench's disk opens found 336 of 4,096 missing).
  ComputeTwoPromptsOverEightTier2Slots(2048, /*mover_between=*/true);
  EXPECT_EQ(pool_->Stats().pool.evicted_offloaded, pool_->Stats().pool.evictions);
}

TEST_P(PoolTierTest, ARequestEvictingMoreThanTier2HoldsPassesEveryVictimOnToDisk) {
  // No mover pass between the prompts: B's open evicts all 64 of A's blocks itself, and passes
  // them down in one batch, eight times the eight tier-2 slots. Stored in batches no larger than
  // tier 2, each batch's records evict the one before's to the disk; stored at once, the stores
  // past the eighth were refused, and those blocks reached no tier.
  ComputeTwoPromptsOverEightTier2Slots(64, /*mover_between=*/false);
  EXPECT_EQ(pool_->Stats().pool.evictions, 64u);
  EXPECT_EQ(pool_->Stats().host_tier->passed_down_on_eviction, 64u);
}

TEST_P(PoolTierTest, ALongPrefixOnlyOnDiskLoadsWholeInBatchesOfSeveralReadDepths) {
  disk_read_depth_ = 2;
  disk_max_queued_stores_ = 128;
  constexpr uint32_t kPromptBlocks = 40;
  const std::vector<uint32_t> a = Tokens(100, kPromptBlocks * kBlockSize + 1);
  const std::vector<uint32_t> b = Tokens(50000, kPromptBlocks * kBlockSize + 1);
  // Without max_load_ms, a host pool loads batches of 2 * kDiskBatchDepths records: two and a
  // short last one here. With it, batches of the read depth, the bound checked between them.
  for (const uint32_t max_load_ms : {0u, 60000u}) {
    pool_.reset();
    std::filesystem::remove(DiskPath());
    MakePool(kPromptBlocks + 1, 8, /*manual=*/true, /*offload_window=*/kPromptBlocks + 1,
             DiskBytes(128));
    for (const std::vector<uint32_t>* prompt : {&a, &b}) {
      Compute(*prompt);  // B evicts A from tier 1, and its records A's from the 8-slot tier 2
      pool_->OffloadForTesting();
      pool_->disk_tier()->Flush();
    }
    auto opened = Open(a, OpenMode::kCompute, max_load_ms);
    ASSERT_OK(opened);
    EXPECT_EQ(opened->num_cached_tokens, kPromptBlocks * kBlockSize) << max_load_ms;
    EXPECT_EQ(opened->num_disk_tier_tokens, kPromptBlocks * kBlockSize) << max_load_ms;
    for (size_t i = 0; i < kPromptBlocks; ++i) {
      EXPECT_EQ(ReadBack(opened->block_ids[i]), BlockBytes(a, i)) << "block " << i;
    }
    EXPECT_EQ(DiskStats().hit_blocks, kPromptBlocks);
    EXPECT_EQ(DiskStats().load_failures, 0u);
    ASSERT_OK(pool_->Release(session_, opened->sequence_id));
    EXPECT_OK(pool_->CheckInvariants());
  }
}

}  // namespace
}  // namespace pool_tier_test
}  // namespace kvcache
