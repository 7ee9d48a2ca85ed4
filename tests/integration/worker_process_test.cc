// kvcache-worker processes against a real kvcache-manager: every cached run — a prefix hit, a
// resurrection from soft-free, a prefix shared by another worker process, a prefix evicted under
// memory pressure and recomputed, a prefix evicted into tier 2 and loaded back, a prefix on disk
// (tier 3) loaded back after the daemon was killed with SIGKILL and restarted — produces tokens
// and logits bit-identical to a cold run in this process (GenerateCold over a private pool).
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <csignal>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

constexpr uint32_t kNewTokens = 12;
constexpr uint32_t kWorkerPoolBlocks = 24;

std::vector<uint32_t> Prompt(uint32_t seed, size_t length) {
  std::vector<uint32_t> tokens(length);
  for (size_t i = 0; i < length; ++i) tokens[i] = (seed * 131 + i * 7 + (i * i) % 13) % 256;
  return tokens;
}

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

class WorkerProcessTest : public DaemonProcessTest {
 protected:
  WorkerProcessTest() {
    pool_name_ = "qwen";
    pool_flag_ = absl::StrFormat(
        "qwen:model=tiny:layers=3:kv_heads=2:head_dim=16:block_size=%u:dtype=bf16:blocks=%u",
        kBlockSize, kWorkerPoolBlocks);
  }

  void SetUp() override {
    DaemonProcessTest::SetUp();
    StartDaemon();
    absl::StatusOr<WorkerRunner> runner =
        WorkerRunner::Create(bin_dir_, KVCACHE_TINY_CHECKPOINT_DIR, kBlockSize, kNewTokens);
    ASSERT_OK(runner);
    runner_.emplace(*std::move(runner));
  }

  // Runs kvcache-worker on `prompt` and returns its result line.
  ClientResult RunWorker(const std::vector<uint32_t>& prompt) {
    return runner_->Run(runner_->Argv(target_, "qwen", prompt), kClientBound);
  }

  void ExpectMatchesCold(const ClientResult& result, const std::vector<uint32_t>& prompt) {
    runner_->ExpectMatchesCold(result, prompt);
  }

  std::optional<WorkerRunner> runner_;
};

TEST_F(WorkerProcessTest, ColdRunThenPrefixHitAndResurrectionAreIdentical) {
  const std::vector<uint32_t> prompt = Prompt(1, 100);
  const ClientResult cold = RunWorker(prompt);
  EXPECT_EQ(cold.num_cached_tokens, 0u);
  ExpectMatchesCold(cold, prompt);
  const uint64_t resurrected_before = PoolStats().resurrected_blocks;

  // The first worker released its blocks: they sit soft-freed until this hit resurrects them.
  const ClientResult hit = RunWorker(prompt);
  EXPECT_EQ(hit.num_cached_tokens, 96u);
  ExpectMatchesCold(hit, prompt);
  EXPECT_EQ(PoolStats().resurrected_blocks - resurrected_before, 6u);
  EXPECT_EQ(PoolStats().evictions, 0u);
  EXPECT_TRUE(AwaitAllReleased());
}

TEST_F(WorkerProcessTest, TwoWorkerProcessesShareAPrefix) {
  const std::vector<uint32_t> shared = Prompt(2, 64);
  const std::vector<uint32_t> first = Concat(shared, Prompt(3, 20));
  const std::vector<uint32_t> second = Concat(shared, Prompt(4, 30));
  const ClientResult a = RunWorker(first);
  ExpectMatchesCold(a, first);
  const ClientResult b = RunWorker(second);
  EXPECT_EQ(b.num_cached_tokens, 64u);
  ExpectMatchesCold(b, second);
}

TEST_F(WorkerProcessTest, EvictedPrefixIsRecomputedIdentically) {
  const std::vector<uint32_t> prompt = Prompt(5, 100);
  ExpectMatchesCold(RunWorker(prompt), prompt);
  // Unrelated requests that need the whole pool: the first prompt's blocks are evicted.
  for (uint32_t seed = 10; seed < 13; ++seed) {
    const std::vector<uint32_t> other = Prompt(seed, 16 * 20);
    ExpectMatchesCold(RunWorker(other), other);
  }
  EXPECT_GT(PoolStats().evictions, 0u);
  // The worker's tenant: its --tenant default, the caller's own.
  absl::StatusOr<KvCacheClient::LookupResult> lookup = observer_->Lookup("qwen", "", prompt);
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_cached_tokens, 0u);
  const ClientResult recomputed = RunWorker(prompt);
  EXPECT_EQ(recomputed.num_cached_tokens, 0u);
  ExpectMatchesCold(recomputed, prompt);
}

TEST_F(WorkerProcessTest, MultiTurnConversationHitsItsOwnAnswers) {
  const std::vector<uint32_t> prompt = Prompt(6, 40);
  absl::StatusOr<Subprocess> worker = Subprocess::Start(
      {bin_dir_ + "/kvcache-worker", "--target=" + target_, "--pool=qwen",
       "--checkpoint=" KVCACHE_TINY_CHECKPOINT_DIR, "--tokens=" + absl::StrJoin(prompt, ","),
       "--max_new_tokens=20", "--turns=3", "--check_cold"});
  ASSERT_OK(worker);
  const ClientResult turn1 = ReadResult(*worker);
  const ClientResult turn2 = ReadResult(*worker);
  const ClientResult turn3 = ReadResult(*worker);
  absl::StatusOr<int> status = worker->Wait(kClientBound);
  ASSERT_OK(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);  // --check_cold passed
  EXPECT_EQ(turn1.num_cached_tokens, 0u);
  // Turn 2's prompt is turn 1's prompt, its answer and a new message: it hits past the first
  // prompt into the answer.
  EXPECT_GT(turn2.num_cached_tokens, prompt.size());
  EXPECT_GT(turn3.num_cached_tokens, turn2.Number("prompt_tokens") - 16);
}

TEST_F(WorkerProcessTest, BadRequestsFailWithPreciseCodes) {
  auto run = [&](const std::vector<std::string>& args) {
    std::vector<std::string> argv = {bin_dir_ + "/kvcache-worker", "--target=" + target_};
    argv.insert(argv.end(), args.begin(), args.end());
    absl::StatusOr<Subprocess> worker = Subprocess::Start(argv);
    EXPECT_OK(worker);
    if (!worker.ok()) return std::string();
    absl::StatusOr<std::string> line = worker->ReadLineStartingWith("error ", kClientBound);
    absl::StatusOr<int> status = worker->Wait(kClientBound);
    EXPECT_OK(status);
    if (status.ok()) {
      EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    }
    return line.ok() ? *line : std::string();
  };
  const std::string checkpoint = "--checkpoint=" KVCACHE_TINY_CHECKPOINT_DIR;
  EXPECT_EQ(run({"--pool=qwen", checkpoint, "--tokens=1,2,300"}), "error code=INVALID_ARGUMENT");
  EXPECT_EQ(run({"--pool=qwen", "--checkpoint=/nonexistent", "--tokens=1"}),
            "error code=NOT_FOUND");
  EXPECT_EQ(run({"--pool=nope", checkpoint, "--tokens=1"}), "error code=NOT_FOUND");
  EXPECT_EQ(run({"--pool=qwen", checkpoint, "--tokens=1", "--max_new_tokens=0"}),
            "error code=INVALID_ARGUMENT");
  // A prompt longer than the whole pool.
  EXPECT_EQ(run({"--pool=qwen", checkpoint, "--tokens=" + absl::StrJoin(Prompt(7, 16 * 30), ",")}),
            "error code=RESOURCE_EXHAUSTED");
  // Nothing leaked by the failed requests.
  EXPECT_TRUE(AwaitAllReleased());
}

// The same pool with a tier 2 below it (host_tier=1MiB: 170 blocks of 6 KiB, so tier 2 never
// evicts here) and its mover thread; the offload window is the default 8 blocks.
class WorkerTierProcessTest : public WorkerProcessTest {
 protected:
  WorkerTierProcessTest() { pool_flag_ += ":host_tier=1MiB"; }

  KvCacheClient::TierStats HostTier() {
    KvCacheClient::PoolStats stats = PoolStats();
    EXPECT_EQ(stats.tiers.size(), 1u);
    return stats.tiers.empty() ? KvCacheClient::TierStats{} : stats.tiers[0];
  }
};

// Issue 18's cold check over tier 2. A worker writes the KV of positions 0 to prompt + 10 (its
// 12th token is not fed back): a 16k+5-token prompt ends on a block boundary, so every block it
// held is published and evictable once it is done, and none goes back to the free list.
TEST_F(WorkerTierProcessTest, PrefixLoadedFromTier2IsIdenticalToAColdRun) {
  // 98 tokens: 7 blocks, the 6 full ones published, the partial one freed: 18 free, 6 evictable.
  const std::vector<uint32_t> prompt = Prompt(20, 98);
  ExpectMatchesCold(RunWorker(prompt), prompt);
  // 11 blocks: 7 free left, under the window, so the mover copies the oldest 8 evictable blocks
  // (the prompt's 6, the LRU's front, and 2 of these) into tier 2 — and only those.
  const std::vector<uint32_t> first_filler = Prompt(21, 16 * 10 + 5);
  ExpectMatchesCold(RunWorker(first_filler), first_filler);
  EXPECT_EQ(PoolStats().evictions, 0u);
  ASSERT_TRUE(PollUntil([&] { return HostTier().stored_blocks >= 8; }));
  EXPECT_EQ(HostTier().stored_blocks, 8u);
  // 13 blocks: the 7 free ones and the 6 oldest evictable, the prompt's, which are below.
  const std::vector<uint32_t> second_filler = Prompt(22, 16 * 12 + 5);
  ExpectMatchesCold(RunWorker(second_filler), second_filler);
  EXPECT_EQ(PoolStats().evictions, 6u);
  EXPECT_EQ(HostTier().evicted_from_above, 6u);
  absl::StatusOr<KvCacheClient::LookupResult> lookup = observer_->Lookup("qwen", "", prompt);
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->cached_tokens_by_tier.pool, 0u);
  EXPECT_EQ(lookup->cached_tokens_by_tier.host, 96u);

  // The prompt again: its 6 full blocks come up from tier 2 into fresh tier-1 blocks (evicting
  // the first filler's oldest), verified, and the worker decodes from them.
  const uint64_t hits_before = HostTier().hit_blocks;
  const ClientResult loaded = RunWorker(prompt);
  EXPECT_EQ(loaded.num_cached_tokens, 96u);
  ExpectMatchesCold(loaded, prompt);
  const KvCacheClient::TierStats tier = HostTier();
  EXPECT_EQ(tier.hit_blocks - hits_before, 6u);
  EXPECT_EQ(tier.load_failures, 0u);
  EXPECT_EQ(tier.verify_failures, 0u);
  EXPECT_TRUE(AwaitAllReleased());
}

// Tier 3 below a tier 2 of 8 blocks (48 KiB of 6 KiB blocks): tier 2's demotion window is all
// of it, so every block the mover stores there goes on to the disk tier's file.
class WorkerDiskTierProcessTest : public WorkerProcessTest {
 protected:
  WorkerDiskTierProcessTest() {
    pool_flag_ += ":host_tier=48KiB:disk_tier=" + DiskPath() + ":4MiB";
  }

  std::string DiskPath() const { return disk_dir_.path() + "/qwen.tier"; }

  // Flips the first KV byte of the file's slots [0, count): a slot is a 4 KiB header page and
  // the 6 KiB block padded to 8 KiB.
  void CorruptSlots(uint64_t count) {
    constexpr uint64_t kSlotBytes = 4096 + 8192;
    const int fd = ::open(DiskPath().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    for (uint64_t slot = 0; slot < count; ++slot) {
      char byte = 0;
      const off_t offset = static_cast<off_t>(slot * kSlotBytes + 4096);
      ASSERT_EQ(::pread(fd, &byte, 1, offset), 1);
      byte ^= 0x01;
      ASSERT_EQ(::pwrite(fd, &byte, 1, offset), 1);
    }
    ::close(fd);
  }

  ScopedTempDir disk_dir_;
};

// Issue 18's warm restart and cold check over tier 3: a prompt's blocks reach the disk tier, the
// daemon is killed with SIGKILL and started again with the same flags; the prompt's prefix comes
// back from disk, verified, and a worker decoding from it matches a cold run. Then every record
// on disk gets a flipped byte: detected on load, recomputed, still identical to a cold run.
TEST_F(WorkerDiskTierProcessTest, PrefixFromDiskAfterKill9IsIdenticalToAColdRun) {
  // 98 tokens: the 6 full blocks published, evictable (see PrefixLoadedFromTier2...).
  const std::vector<uint32_t> prompt = Prompt(20, 98);
  ExpectMatchesCold(RunWorker(prompt), prompt);
  // 11 blocks: the mover copies the oldest 8 evictable (the prompt's 6 and 2 of these) into
  // tier 2, which passes all 8 on to disk.
  const std::vector<uint32_t> filler = Prompt(21, 16 * 10 + 5);
  ExpectMatchesCold(RunWorker(filler), filler);
  ASSERT_TRUE(PollUntil([&] { return PoolTier("disk").stored_blocks >= 8; }));
  EXPECT_EQ(PoolTier("disk").capacity_bytes % (4096 + 8192), 0u);

  KillAndRestartDaemon();
  EXPECT_EQ(PoolTier("disk").restored_records, 8u);
  EXPECT_EQ(PoolTier("disk").restore_skipped, 0u);
  absl::StatusOr<KvCacheClient::LookupResult> lookup = observer_->Lookup("qwen", "", prompt);
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->cached_tokens_by_tier.pool, 0u);
  EXPECT_EQ(lookup->cached_tokens_by_tier.disk, 96u);
  const ClientResult restored = RunWorker(prompt);
  EXPECT_EQ(restored.num_cached_tokens, 96u);
  EXPECT_EQ(restored.Number("cached_disk"), 96);
  ExpectMatchesCold(restored, prompt);
  EXPECT_EQ(PoolTier("disk").hit_blocks, 6u);
  EXPECT_EQ(PoolTier("disk").verify_failures, 0u);

  KillAndRestartDaemon();
  CorruptSlots(8);
  EXPECT_EQ(PoolTier("disk").restored_records, 8u);  // headers intact: indexed, checked on load
  const ClientResult recomputed = RunWorker(prompt);
  EXPECT_EQ(recomputed.num_cached_tokens, 0u);
  ExpectMatchesCold(recomputed, prompt);
  EXPECT_GE(PoolTier("disk").verify_failures, 1u);
  EXPECT_EQ(PoolTier("disk").load_failures, 1u);
  EXPECT_EQ(PoolTier("disk").hit_blocks, 0u);
  EXPECT_TRUE(AwaitAllReleased());
}

}  // namespace
}  // namespace kvcache::testing
