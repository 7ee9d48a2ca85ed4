// Issue 34's cold checks in processes: kvcache-worker with the tiny hybrid checkpoint (Qwen3-Next:
// linear-attention state + full-attention KV) against a real kvcache-manager whose pool holds
// pages of [kv | state] (worker/hybrid_pages.h). Every cached run — at 0, 50 and 90% of the
// prompt cached, a second worker process reusing the first's prefix, a prefix brought back from
// tier 2, one from the disk tier after the daemon was killed with SIGKILL, and one from another
// daemon through the cluster tier — produces tokens
// and logits bit-identical to a cold run in this process (GenerateColdHybrid over a private pool).
// The state travels inside each page's bytes, so the tiers move it with the KV, and the masks go
// with the records: a hit restores both or is not a hit.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/integration/hybrid_worker_cases.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/redis_cluster_process.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"
#include "worker/hybrid_pages.h"

namespace kvcache::testing {
namespace {

constexpr uint32_t kNewTokens = 12;
constexpr uint32_t kHybridPoolBlocks = 24;

class HybridWorkerProcessTest : public DaemonProcessTest {
 protected:
  void SetUp() override {
    DaemonProcessTest::SetUp();
    absl::StatusOr<WorkerRunner> runner =
        WorkerRunner::Create(bin_dir_, KVCACHE_TINY_HYBRID_CHECKPOINT_DIR, kBlockSize, kNewTokens);
    ASSERT_OK(runner);
    runner_.emplace(*std::move(runner));
    ASSERT_TRUE(runner_->model().hybrid());
    geometry_ = worker::HybridPoolGeometryFor(runner_->model().hybrid_model().config(), kBlockSize,
                                              DType::kBFloat16);
    pool_name_ = "next";
    ASSERT_NO_FATAL_FAILURE(BeforeDaemon());
    pool_flag_ = absl::StrCat("next:model=tiny-next", geometry_.SpecFields(),
                              ":blocks=", kHybridPoolBlocks, ExtraPoolFields());
    StartDaemon();
  }

  virtual std::string ExtraPoolFields() const { return ""; }
  virtual void BeforeDaemon() {}

  // Runs kvcache-worker on `prompt` (with `extra_flags`) and expects `cached` tokens from the
  // cache and the cold run's tokens and logits.
  ClientResult ExpectCold(const std::vector<uint32_t>& prompt, uint32_t cached,
                          const std::vector<std::string>& extra_flags = {}) {
    std::vector<std::string> argv = runner_->Argv(target_, "next", prompt);
    argv.insert(argv.end(), extra_flags.begin(), extra_flags.end());
    const ClientResult result = runner_->Run(argv, kClientBound);
    EXPECT_EQ(result.num_cached_tokens, cached);
    runner_->ExpectMatchesCold(result, prompt);
    return result;
  }

  // Expects `cached` tokens of `prompt` in lower tier `tier` ("host" or "disk") and none in the
  // pool; then a worker loads them from there, verified, and matches a cold run.
  void ExpectLoadedFrom(const std::string& tier, const std::vector<uint32_t>& prompt,
                        uint32_t cached) {
    absl::StatusOr<KvCacheClient::LookupResult> lookup = observer_->Lookup("next", "", prompt);
    ASSERT_OK(lookup);
    EXPECT_EQ(lookup->cached_tokens_by_tier.pool, 0u);
    EXPECT_EQ(
        tier == "host" ? lookup->cached_tokens_by_tier.host : lookup->cached_tokens_by_tier.disk,
        cached);
    const ClientResult loaded = ExpectCold(prompt, cached);
    EXPECT_EQ(loaded.Number("cached_" + tier), cached);
    EXPECT_EQ(PoolTier(tier).verify_failures, 0u);
    EXPECT_TRUE(AwaitAllReleased());
  }

  uint64_t PageBytes() const { return geometry_.pool_layout.BlockBytes(); }

  std::optional<WorkerRunner> runner_;
  worker::HybridPoolGeometry geometry_;
};

TEST_F(HybridWorkerProcessTest, SecondProcessesReuseAtZeroFiftyAndNinetyPercent) {
  ReuseAtZeroFiftyAndNinetyPercent([this](const auto& prompt, uint32_t cached, const auto& flags) {
    ExpectCold(prompt, cached, flags);
  });
  EXPECT_TRUE(AwaitAllReleased());
}

TEST_F(HybridWorkerProcessTest, AnEndpointWithoutItsStateIsNotAHit) {
  AnEndpointWithoutItsStateIsNotAHit(
      [this](const auto& prompt, uint32_t cached, const auto& flags) {
        ExpectCold(prompt, cached, flags);
      });
}

// Tier 2 of 200 pages, never full: the prompt's pages are pushed down by fillers (the counts of
// worker_process_test's tier-2 check: 7 free blocks after the first filler, under the mover's
// window of 8, so the oldest 8 evictable — the prompt's 6 first — are copied down; the second
// filler evicts the prompt's), then come back up for a worker that matches a cold run.
class HybridWorkerTierProcessTest : public HybridWorkerProcessTest {
 protected:
  std::string ExtraPoolFields() const override {
    return absl::StrCat(":host_tier=", 200 * PageBytes());
  }
};

TEST_F(HybridWorkerTierProcessTest, PrefixLoadedFromTier2IsIdenticalToAColdRun) {
  const std::vector<uint32_t> prompt = HybridPrompt(20, 98);
  ExpectCold(prompt, 0);
  const std::vector<uint32_t> first_filler = HybridPrompt(21, 16 * 10 + 5);
  ExpectCold(first_filler, 0);
  ASSERT_TRUE(PollUntil([&] { return PoolTier("host").stored_blocks >= 8; }));
  const std::vector<uint32_t> second_filler = HybridPrompt(22, 16 * 12 + 5);
  ExpectCold(second_filler, 0);
  ExpectLoadedFrom("host", prompt, 96);
}

// The disk tier below a tier 2 of 8 pages: every page the mover stores goes on to disk; the
// daemon is killed with SIGKILL and restarted, and the prefix comes back from disk.
class HybridWorkerDiskTierProcessTest : public HybridWorkerProcessTest {
 protected:
  std::string ExtraPoolFields() const override {
    const uint64_t page = PageBytes();
    return absl::StrCat(":host_tier=", 8 * page, ":disk_tier=", disk_dir_.path(),
                        "/next.tier:", 64 * (page + 8192));
  }

  ScopedTempDir disk_dir_;
};

TEST_F(HybridWorkerDiskTierProcessTest, PrefixFromDiskAfterKill9IsIdenticalToAColdRun) {
  const std::vector<uint32_t> prompt = HybridPrompt(20, 98);
  ExpectCold(prompt, 0);
  const std::vector<uint32_t> filler = HybridPrompt(21, 16 * 10 + 5);
  ExpectCold(filler, 0);
  ASSERT_TRUE(PollUntil([&] { return PoolTier("disk").stored_blocks >= 8; }));

  KillAndRestartDaemon();
  ExpectLoadedFrom("disk", prompt, 96);
}

// Two daemons ("nodes") sharing a real 3-master Redis Cluster as their cluster tier, pools of 8
// pages (the mover's window covers the pool, so every published page goes to the cluster once
// the worker releases it): a prompt computed on node A is, on node B, a cluster hit of KV and
// state — the records carry each page's mask — and B's worker matches a cold run.
class HybridClusterProcessTest : public HybridWorkerProcessTest {
 protected:
  void BeforeDaemon() override {
    absl::StatusOr<std::unique_ptr<RedisClusterProcess>> redis =
        RedisClusterProcess::Start(redis_dir_.path());
    ASSERT_OK(redis);
    redis_ = *std::move(redis);
    extra_daemon_flags_.push_back("--cluster_tier=redis://" +
                                  absl::StrJoin(redis_->addresses(), ",redis://"));
  }
  std::string ExtraPoolFields() const override { return ":blocks=8"; }

  void TearDown() override {
    if (node_b_.has_value()) EXPECT_OK(StopManager(*node_b_, kStartBound));
    HybridWorkerProcessTest::TearDown();
  }

  ScopedTempDir redis_dir_{"kvcache-hybrid-redis"};
  std::unique_ptr<RedisClusterProcess> redis_;
  std::optional<Subprocess> node_b_;
};

TEST_F(HybridClusterProcessTest, APrefixFromAnotherDaemonIsIdenticalToAColdRun) {
  const std::vector<uint32_t> prompt = HybridPrompt(30, 98);  // 6 full pages
  ExpectCold(prompt, 0);
  ASSERT_TRUE(PollUntil([&] {
    const KvCacheClient::TierStats tier = PoolTier("cluster");
    return tier.stored_blocks + tier.store_failures >= 6;
  }));
  EXPECT_EQ(PoolTier("cluster").stored_blocks, 6u);

  const std::string target_b = "unix://" + dir_.File("b.sock");
  std::vector<std::string> flags = {"--listen=" + target_b, "--pool=" + pool_flag_};
  flags.insert(flags.end(), extra_daemon_flags_.begin(), extra_daemon_flags_.end());
  absl::StatusOr<Subprocess> node_b = StartManager(bin_dir_, flags, kStartBound);
  ASSERT_OK(node_b);
  node_b_.emplace(*std::move(node_b));
  const ClientResult on_b = runner_->Run(runner_->Argv(target_b, "next", prompt), kClientBound);
  EXPECT_EQ(on_b.num_cached_tokens, 96u);
  EXPECT_EQ(on_b.Number("cached_cluster"), 96);
  runner_->ExpectMatchesCold(on_b, prompt);
}

// Prefill -> decode of the hybrid: a prefill worker on daemon A ships its prompt's pages — the KV
// and the state inside each page's bytes — to daemon B over the transport; a decode worker there
// hits them (KV up to the endpoint and the state at it) and its output equals a cold run.
class HybridPdProcessTest : public HybridWorkerProcessTest,
                            public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override {
    HybridWorkerProcessTest::SetUp();
    decode_target_ = "unix://" + dir_.File("decode.sock");
    absl::StatusOr<Subprocess> decode_daemon = StartManager(
        bin_dir_, {"--listen=" + decode_target_, "--pool=" + pool_flag_, "--session_ttl=2s"},
        kStartBound);
    ASSERT_OK(decode_daemon);
    decode_daemon_.emplace(*std::move(decode_daemon));
  }

  void TearDown() override {
    if (decode_daemon_.has_value()) EXPECT_OK(StopManager(*decode_daemon_, kStartBound));
    HybridWorkerProcessTest::TearDown();
  }

  std::string decode_target_;
  std::optional<Subprocess> decode_daemon_;
};

TEST_P(HybridPdProcessTest, DecodeContinuesFromShippedKvAndStateIdenticalToAColdRun) {
  const std::vector<uint32_t> prompt = HybridPrompt(7, 100);  // 6 full pages and 4 tokens
  const ClientResult prefill =
      runner_->Prefill(target_, "next", prompt, decode_target_, GetParam(), kClientBound);
  EXPECT_EQ(prefill.Number("sent_blocks"), 6);
  EXPECT_EQ(prefill.Number("bytes"), static_cast<int64_t>(6 * PageBytes()));

  std::vector<std::string> decode_argv = runner_->Argv(decode_target_, "next", prompt);
  decode_argv.push_back("--role=decode");
  const ClientResult decode = runner_->Run(decode_argv, kClientBound);
  EXPECT_EQ(decode.num_cached_tokens, 96u);  // KV of 6 pages and the state after page 6
  runner_->ExpectMatchesCold(decode, prompt);
  EXPECT_THAT(decode.Field("tokens"), ::testing::StartsWith(prefill.Field("first_token") + ","));
}

// A prefill worker that saves a state only every second page ships each page's part mask: the
// decode side's hit ends at the last page that holds a state, never at one that does not, and
// its output equals a cold run. (Before the transports carried masks every page was published
// with every part, and the prefill role refused --state_every_pages other than 1.)
TEST_P(HybridPdProcessTest, AStateEveryFewPagesShipsItsMasksAndDecodeHitsWhatTheRuleAllows) {
  const std::vector<uint32_t> prompt = HybridPrompt(8, 84);  // 5 full pages and 4 tokens
  std::vector<std::string> prefill_argv = runner_->Argv(target_, "next", prompt);
  prefill_argv.insert(prefill_argv.end(), {"--role=prefill", "--decode_target=" + decode_target_,
                                           "--transport=" + GetParam(), "--state_every_pages=2"});
  const ClientResult prefill = runner_->Run(prefill_argv, kClientBound);
  EXPECT_EQ(prefill.Number("sent_blocks"), 5);

  std::vector<std::string> decode_argv = runner_->Argv(decode_target_, "next", prompt);
  decode_argv.push_back("--role=decode");
  const ClientResult decode = runner_->Run(decode_argv, kClientBound);
  // States after pages 2 and 4; page 5 holds KV only, so the hit ends after page 4.
  EXPECT_EQ(decode.num_cached_tokens, 64u);
  runner_->ExpectMatchesCold(decode, prompt);
  EXPECT_THAT(decode.Field("tokens"), ::testing::StartsWith(prefill.Field("first_token") + ","));
}

INSTANTIATE_TEST_SUITE_P(Transports, HybridPdProcessTest, ::testing::Values("stream", "shm"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace kvcache::testing
