// PoolTierTest: a pool with tier 2 (and, from MakeDiskPool, a disk tier below it) on one of the
// pool memories of tests/testing/pool_memories.h, shared by pool_tier_test.cc (tier 2) and
// pool_disk_tier_test.cc (tier 3), which are one test binary.
#ifndef KVCACHE_TESTS_CACHE_POOL_TIER_FIXTURE_H_
#define KVCACHE_TESTS_CACHE_POOL_TIER_FIXTURE_H_

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
namespace pool_tier_test {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

inline constexpr uint32_t kBlockSize = 4;

using ::kvcache::testing::Tokens;

inline PoolOptions TierPoolOptions(uint32_t num_blocks, uint32_t tier_blocks) {
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
    return testing::TokenBlockBytes(tokens, i, kBlockSize, block_bytes_);
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

}  // namespace pool_tier_test
}  // namespace kvcache

#endif  // KVCACHE_TESTS_CACHE_POOL_TIER_FIXTURE_H_
