// A pool with tier 2 (PoolOptions::host_tier_bytes): the mover copies blocks near eviction into
// the host tier, and Open, Lookup, reads (kPinCached) and puts (kPut) continue the verified prefix
// walk there — bytes identical, corrupt records recomputed, max_load_ms bounding the load, a
// full tier evicting its own oldest. The mover runs synchronously (testing_manual_offload) except
// in the one test of its thread. Every test ends with the pool's invariants checked.
//
// Every test runs on the three pool memories of tests/testing/pool_memories.h: host, staged (the
// CPU reference of the device path) and, in a CUDA build on a machine with a device, cuda (label
// gpu: pool_tier_gpu_test).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <memory>
#include <numeric>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cache/pool.h"
#include "common/block_checksum.h"
#include "common/cuda/cuda_device.h"
#include "common/task_workers.h"
#include "tests/testing/event_index.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injection_pool_memory.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/pool_memories.h"
#include "tests/testing/small_pool_options.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_files.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint32_t kBlockSize = 4;

using ::kvcache::testing::Tokens;

PoolOptions TierPoolOptions(uint32_t num_blocks, uint32_t tier_blocks) {
  PoolOptions options = testing::SmallPoolOptions("tiered", num_blocks, kBlockSize);
  options.host_tier_bytes = uint64_t{tier_blocks} * options.layout.BlockBytes();
  options.testing_manual_offload = true;
  return options;
}

using ::kvcache::testing::PoolMemoryKind;

class PoolTierTest : public ::testing::TestWithParam<PoolMemoryKind> {
 protected:
  void SetUp() override {
    if (GetParam() == PoolMemoryKind::kCuda && !CudaDeviceAvailable()) {
      GTEST_SKIP() << "no CUDA device";
    }
  }

  void MakePool(uint32_t num_blocks, uint32_t tier_blocks, bool manual = true,
                uint32_t offload_window = 0, uint64_t disk_bytes = 0) {
    PoolOptions options = TierPoolOptions(num_blocks, tier_blocks);
    options.layout.head_dim = head_dim_;
    options.host_tier_bytes = uint64_t{tier_blocks} * options.layout.BlockBytes();
    options.workers = workers_;
    options.testing_manual_offload = manual;
    options.offload_window = offload_window;
    if (disk_bytes != 0) {
      options.disk_tier_path = DiskPath();
      options.disk_tier_bytes = disk_bytes;
      options.testing_disk_tier_options = [this](DiskTierOptions* disk) {
        if (disk_read_depth_ != 0) disk->read_depth = disk_read_depth_;
        disk->testing_before_read = disk_before_read_;
        disk->testing_write_errno = disk_write_errno_;
        if (disk_max_queued_stores_ != 0) disk->max_queued_stores = disk_max_queued_stores_;
      };
      options.disk_admission = disk_admission_;
    }
    block_bytes_ = options.layout.BlockBytes();
    auto memory = testing::CreatePoolMemory(GetParam(), block_bytes_, num_blocks);
    ASSERT_OK(memory);
    // Each pool a new daemon: a new event log.
    pool_.reset();
    events_ = std::make_unique<KvEventLog>();
    events_->AddPool(0, options.name, "CPU", kBlockSize);
    auto pool =
        Pool::Create(options, 0, *std::move(memory), nullptr, nullptr, events_.get(), &clock_);
    ASSERT_OK(pool);
    pool_ = *std::move(pool);
  }
  void TearDown() override {
    if (pool_ != nullptr) {
      EXPECT_OK(pool_->CheckInvariants());
    }
  }

  // The bytes a worker would write for block `i` of `tokens`: a function of its tokens.
  std::string BlockBytes(const std::vector<uint32_t>& tokens, size_t i) const {
    std::string bytes(block_bytes_, '\0');
    for (size_t b = 0; b < bytes.size(); ++b) {
      bytes[b] = static_cast<char>(tokens[i * kBlockSize + b % kBlockSize] * 7 + b);
    }
    return bytes;
  }

  absl::StatusOr<OpenedSequence> Open(const std::vector<uint32_t>& tokens,
                                      OpenMode mode = OpenMode::kCompute,
                                      uint32_t max_load_ms = 0) {
    SequenceSpec spec{.tokens = tokens};
    spec.max_load_ms = max_load_ms;
    return pool_->Open(session_, spec, mode);
  }

  // Opens, writes every full block not cached, commits and releases.
  OpenedSequence Compute(const std::vector<uint32_t>& tokens) {
    absl::StatusOr<OpenedSequence> opened = Open(tokens);
    EXPECT_OK(opened);
    if (!opened.ok()) return {};
    for (size_t i = opened->num_cached_tokens / kBlockSize; i < tokens.size() / kBlockSize; ++i) {
      EXPECT_OK(pool_->WriteBlock(opened->block_ids[i], 0, BlockBytes(tokens, i)));
    }
    EXPECT_OK(pool_->Commit(session_, opened->sequence_id, tokens.size()));
    EXPECT_OK(pool_->Release(session_, opened->sequence_id));
    return *opened;
  }

  // A PutBlocks: opens the full blocks, writes every one not cached, commits and releases.
  void Put(const std::vector<uint32_t>& tokens) {
    absl::StatusOr<OpenedSequence> opened = Open(tokens, OpenMode::kPut);
    ASSERT_OK(opened);
    for (size_t i = opened->num_cached_tokens / kBlockSize; i < opened->block_ids.size(); ++i) {
      ASSERT_OK(pool_->WriteBlock(opened->block_ids[i], 0, BlockBytes(tokens, i)));
    }
    ASSERT_OK(pool_->Commit(session_, opened->sequence_id, tokens.size()));
    ASSERT_OK(pool_->Release(session_, opened->sequence_id));
  }

  // Computes `tokens`, copies what the mover would to tier 2, then evicts it all from tier 1 with
  // eight blocks of another prompt (the 8-block pools of these tests).
  void ComputeOffloadEvict(const std::vector<uint32_t>& tokens) {
    Compute(tokens);
    pool_->OffloadForTesting();
    Compute(Tokens(500, 32));
  }

  // The chain hashes the pool computes for `tokens` in session_'s tenant.
  std::vector<Hash128> Chain(const std::vector<uint32_t>& tokens) {
    BlockHasher hasher(HashAlgorithm::kXxh3_128);
    const HashNamespace ns{"model", pool_->layout_fingerprint(), session_.tenant, ""};
    std::vector<Hash128> chain;
    hasher.ExtendChain(hasher.Root(ns), tokens, kBlockSize, ExtraKeys{}, &chain);
    return chain;
  }

  // A pool of `prompt_blocks` + 1 blocks over a tier 2 of 8 slots and a disk: prompt A, then
  // prompt B, which evicts all of A from tier 1 (a mover pass after each, or none: B's open then
  // passes A down itself). Expects every block of A below, no eviction's loss, and A's hit.
  void ComputeTwoPromptsOverEightTier2Slots(uint32_t prompt_blocks, bool mover_between) {
    const uint32_t disk_records = 2 * prompt_blocks + 128;  // both prompts
    disk_max_queued_stores_ = disk_records;
    MakePool(prompt_blocks + 1, 8, /*manual=*/true, /*offload_window=*/prompt_blocks + 1,
             DiskBytes(disk_records));
    const std::vector<uint32_t> a = Tokens(100, prompt_blocks * kBlockSize + 1);
    const std::vector<uint32_t> b = Tokens(50000, prompt_blocks * kBlockSize + 1);
    for (const std::vector<uint32_t>* prompt : {&a, &b}) {
      ASSERT_NO_FATAL_FAILURE(Compute(*prompt));
      if (mover_between) pool_->OffloadForTesting();
    }
    pool_->disk_tier()->Flush();
    size_t below = 0;
    for (const Hash128& hash : Chain(a)) {
      below += pool_->disk_tier()->Contains(hash) || pool_->host_tier()->Contains(hash) ? 1 : 0;
    }
    EXPECT_EQ(below, prompt_blocks);
    const PoolStatsSnapshot stats = pool_->Stats();
    EXPECT_EQ(stats.host_tier->evicted_unsaved, 0u);
    EXPECT_EQ(stats.disk_tier->evicted_unsaved, 0u);
    auto found = pool_->Lookup("tenant-a", SequenceSpec{.tokens = a});
    ASSERT_OK(found);
    EXPECT_EQ(found->num_cached_tokens, prompt_blocks * kBlockSize);
    EXPECT_OK(pool_->CheckInvariants());
  }

  std::string ReadBack(BlockId block) {
    std::string bytes(block_bytes_, '\0');
    EXPECT_OK(pool_->ReadBlock(block, 0, block_bytes_, bytes.data()));
    return bytes;
  }

  PoolHostTierStats TierStats() const {
    return pool_->Stats().host_tier.value_or(PoolHostTierStats{});
  }
  PoolDiskTierStats DiskStats() const {
    return pool_->Stats().disk_tier.value_or(PoolDiskTierStats{});
  }

  std::string DiskPath() const { return disk_dir_.path() + "/pool.tier"; }
  // A disk tier of 64 records under an 8-slot tier 2 (whose demotion window is then all of it:
  // every record stored in tier 2 is passed down), below an 8-block pool.
  void MakeDiskPool() { MakePool(8, 8, /*manual=*/true, 0, DiskBytes(64)); }
  DiskAdmission disk_admission_ = DiskAdmission::kAll;
  static uint64_t DiskBytes(uint64_t records) {
    const uint64_t block_bytes = TierPoolOptions(1, 1).layout.BlockBytes();
    return records * (4096 + (block_bytes + 4095) / 4096 * 4096);  // a header page and the block
  }
  // Computes `tokens`, passes them down to tier 2 and on to disk (durable), then evicts them from
  // tier 1 and, with eight blocks of another prompt passed down too, from tier 2: only the disk
  // tier holds them.
  void ComputeIntoDiskOnly(const std::vector<uint32_t>& tokens) {
    Compute(tokens);
    pool_->OffloadForTesting();
    pool_->disk_tier()->Flush();
    Compute(Tokens(500, 32));
    pool_->OffloadForTesting();
    pool_->disk_tier()->Flush();
  }
  // Flips a byte of the block bytes of the disk tier's slot `slot`, behind the tier's back.
  void CorruptDiskSlot(uint64_t slot) {
    const uint64_t slot_bytes = pool_->disk_tier()->slot_bytes();
    const uint64_t header_bytes = slot_bytes - ((block_bytes_ + 4095) / 4096) * 4096;
    const int fd = ::open(DiskPath().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char byte = 0;
    const off_t offset = static_cast<off_t>(slot * slot_bytes + header_bytes + 3);
    ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
    byte ^= 0x20;
    ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
    ::close(fd);
  }

  // The events of `medium` so far: each stored block as (hash, parent, tenant), in order, and
  // the removed hashes.
  struct MediumEvents {
    std::vector<std::tuple<Hash128, std::optional<Hash128>, std::string>> stored;
    std::vector<Hash128> removed;
  };
  MediumEvents EventsIn(absl::string_view medium) const {
    MediumEvents seen;
    for (const auto& event : events_->Read(0, 1 << 20).events) {
      if (event->medium != medium) continue;
      std::optional<Hash128> parent = event->parent_hash;
      for (const StoredBlock& block : event->blocks) {
        seen.stored.emplace_back(block.hash, parent, event->tenant);
        parent = block.hash;
      }
      seen.removed.insert(seen.removed.end(), event->removed.begin(), event->removed.end());
    }
    return seen;
  }

  testing::FakeClock clock_;
  Session session_{1, "uid:1", "tenant-a", "test", absl::Seconds(10)};
  uint64_t block_bytes_ = 0;
  ::kvcache::testing::ScopedTempDir disk_dir_;
  uint32_t head_dim_ = 4;  // TierPoolOptions': 128-byte blocks
  std::shared_ptr<TaskWorkers> workers_;
  uint32_t disk_read_depth_ = 0;
  uint32_t disk_max_queued_stores_ = 0;
  std::function<void()> disk_before_read_;
  std::function<int()> disk_write_errno_;
  std::unique_ptr<KvEventLog> events_;
  std::unique_ptr<Pool> pool_;
};

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
}  // namespace kvcache

namespace kvcache {
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
}  // namespace kvcache
