// Disaggregated prefill/decode on one machine as two "nodes": two kvcache-manager processes, a
// prefill worker process on daemon A shipping KV to daemon B over a transport, and a decode worker
// process on daemon B that finds it as a prefix hit. Decode output must equal a cold single-process
// run bit for bit; blocks the decode side holds are not sent; a prefill killed mid-shipment leaves
// no hash and no pinned block behind; the nccl transport refuses these host pools cleanly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

constexpr uint32_t kNewTokens = 10;
constexpr char kPool[] =
    "qwen:model=tiny:layers=3:kv_heads=2:head_dim=16:block_size=16:"
    "dtype=bf16:blocks=64";

std::vector<uint32_t> Prompt(uint32_t seed, size_t length) {
  std::vector<uint32_t> tokens(length);
  for (size_t i = 0; i < length; ++i) tokens[i] = (seed * 97 + i * 5 + (i * i) % 11) % 256;
  return tokens;
}

class PdProcessTest : public DaemonProcessTest, public ::testing::WithParamInterface<std::string> {
 protected:
  PdProcessTest() {
    pool_name_ = "qwen";
    pool_flag_ = kPool;
  }

  void SetUp() override {
    DaemonProcessTest::SetUp();
    StartDaemon();  // daemon A: the prefill node
    decode_target_ = "unix://" + dir_.File("decode.sock");
    absl::StatusOr<Subprocess> decode_daemon = StartManager(
        bin_dir_,
        {"--listen=" + decode_target_, std::string("--pool=") + kPool, "--session_ttl=2s"},
        kStartBound);
    ASSERT_OK(decode_daemon);
    decode_daemon_.emplace(*std::move(decode_daemon));
    auto observer = KvCacheClient::Connect(decode_target_);
    ASSERT_OK(observer);
    decode_observer_ = *std::move(observer);
    absl::StatusOr<WorkerRunner> runner =
        WorkerRunner::Create(bin_dir_, KVCACHE_TINY_CHECKPOINT_DIR, kBlockSize, kNewTokens);
    ASSERT_OK(runner);
    runner_.emplace(*std::move(runner));
  }

  void TearDown() override {
    decode_observer_.reset();
    if (decode_daemon_.has_value()) {
      EXPECT_OK(StopManager(*decode_daemon_, kStartBound));
    }
    DaemonProcessTest::TearDown();
  }

  std::vector<std::string> WorkerArgs(const std::string& target,
                                      const std::vector<uint32_t>& prompt) {
    return runner_->Argv(target, "qwen", prompt);
  }

  ClientResult Run(const std::vector<std::string>& argv) {
    return runner_->Run(argv, kClientBound);
  }

  ClientResult Prefill(const std::vector<uint32_t>& prompt) {
    std::vector<std::string> argv = WorkerArgs(target_, prompt);
    argv.push_back("--role=prefill");
    argv.push_back("--decode_target=" + decode_target_);
    argv.push_back("--transport=" + GetParam());
    return Run(argv);
  }

  ClientResult Decode(const std::vector<uint32_t>& prompt) {
    std::vector<std::string> argv = WorkerArgs(decode_target_, prompt);
    argv.push_back("--role=decode");
    return Run(argv);
  }

  void ExpectMatchesCold(const ClientResult& result, const std::vector<uint32_t>& prompt) {
    runner_->ExpectMatchesCold(result, prompt);
  }

  KvCacheClient::PoolStats DecodeStats() {
    auto stats = decode_observer_->GetStats("qwen");
    EXPECT_OK(stats);
    return stats.ok() && !stats->pools.empty() ? stats->pools[0] : KvCacheClient::PoolStats{};
  }

  uint32_t DecodeCached(const std::vector<uint32_t>& prompt) {
    // The workers' tenant: their --tenant default, the caller's own.
    auto lookup = decode_observer_->Lookup("qwen", "", prompt);
    EXPECT_OK(lookup);
    return lookup.ok() ? lookup->num_cached_tokens : 0;
  }

  // Polls (bounded) until `stats` reports no referenced block.
  template <typename StatsFn>
  bool AwaitNoneReferenced(StatsFn stats) {
    const absl::Time give_up = absl::Now() + kLeaseBound;
    while (absl::Now() < give_up) {
      if (stats().counts.referenced == 0) return true;
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  std::string decode_target_;
  std::optional<Subprocess> decode_daemon_;
  std::unique_ptr<KvCacheClient> decode_observer_;
  std::optional<WorkerRunner> runner_;
};

TEST_P(PdProcessTest, DecodeContinuesFromShippedKvIdenticalToAColdRun) {
  const std::vector<uint32_t> prompt = Prompt(1, 100);  // 6 full blocks and 4 tokens
  const ClientResult prefill = Prefill(prompt);
  EXPECT_EQ(prefill.Number("sent_blocks"), 6);
  EXPECT_EQ(prefill.Number("skipped_blocks"), 0);
  EXPECT_EQ(prefill.Number("bytes"), 6 * 6144);
  EXPECT_EQ(DecodeCached(prompt), 96u);

  const ClientResult decode = Decode(prompt);
  EXPECT_EQ(decode.num_cached_tokens, 96u);  // only the partial tail is computed here
  ExpectMatchesCold(decode, prompt);
  EXPECT_THAT(decode.Field("tokens"), ::testing::StartsWith(prefill.Field("first_token") + ","));
}

TEST_P(PdProcessTest, BlocksTheDecodeSideHoldsAreNotSent) {
  const std::vector<uint32_t> first = Prompt(2, 100);
  Prefill(first);
  std::vector<uint32_t> second(first.begin(), first.begin() + 64);  // shares 4 blocks
  const std::vector<uint32_t> tail = Prompt(3, 50);
  second.insert(second.end(), tail.begin(), tail.end());
  const ClientResult prefill = Prefill(second);
  EXPECT_EQ(prefill.Number("skipped_blocks"), 4);
  EXPECT_EQ(prefill.Number("sent_blocks"), 3);  // 114 tokens: 7 full blocks, 4 already there
  const ClientResult decode = Decode(second);
  EXPECT_EQ(decode.num_cached_tokens, 112u);
  ExpectMatchesCold(decode, second);
}

TEST_P(PdProcessTest, PrefillKilledMidShipmentLeavesNoHashAndNoPin) {
  const std::vector<uint32_t> prompt = Prompt(4, 150);
  std::vector<std::string> argv = WorkerArgs(target_, prompt);
  argv.insert(argv.end(), {"--role=prefill", "--decode_target=" + decode_target_,
                           "--transport=" + GetParam(), "--pause_midway"});
  absl::StatusOr<Subprocess> prefill = Subprocess::Start(argv);
  ASSERT_OK(prefill);
  ASSERT_OK(prefill->ReadLineStartingWith("paused midway", kClientBound));
  ASSERT_OK(prefill->Signal(SIGKILL));
  ASSERT_OK(prefill->Wait(kClientBound).status());

  EXPECT_EQ(DecodeCached(prompt), 0u);  // nothing half-received is findable
  // The dead worker's sessions expire on both daemons and every pin goes.
  EXPECT_TRUE(AwaitNoneReferenced([&] { return DecodeStats(); }));
  EXPECT_TRUE(AwaitNoneReferenced([&] { return PoolStats(); }));
  EXPECT_EQ(DecodeStats().published_blocks, 0u);
  EXPECT_EQ(DecodeCached(prompt), 0u);

  // The same request then goes through whole.
  const ClientResult retry = Prefill(prompt);
  EXPECT_EQ(retry.Number("sent_blocks"), 9);
  ExpectMatchesCold(Decode(prompt), prompt);
}

// --transport nccl moves device pools; these daemons serve host pools (and this machine may have
// no GPU, CUDA or NCCL): the prefill worker must fail cleanly with FAILED_PRECONDITION, before
// any shipment, and leave nothing behind on the decode side.
class PdNcclOnHostPoolsTest : public PdProcessTest {};

TEST_F(PdNcclOnHostPoolsTest, PrefillWithNcclTransportFailsPreconditionAndShipsNothing) {
  const std::vector<uint32_t> prompt = Prompt(5, 40);
  std::vector<std::string> argv = WorkerArgs(target_, prompt);
  argv.insert(argv.end(),
              {"--role=prefill", "--decode_target=" + decode_target_, "--transport=nccl"});
  absl::StatusOr<Subprocess> prefill = Subprocess::Start(argv);
  ASSERT_OK(prefill);
  absl::StatusOr<std::string> error = prefill->ReadLineStartingWith("error ", kClientBound);
  ASSERT_OK(error);
  EXPECT_EQ(*error, "error code=FAILED_PRECONDITION");
  absl::StatusOr<int> status = prefill->Wait(kClientBound);
  ASSERT_OK(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1) << DescribeWaitStatus(*status);
  EXPECT_EQ(DecodeCached(prompt), 0u);
  EXPECT_EQ(DecodeStats().published_blocks, 0u);
  EXPECT_TRUE(AwaitNoneReferenced([&] { return DecodeStats(); }));
}

INSTANTIATE_TEST_SUITE_P(Transports, PdProcessTest, ::testing::Values("stream", "shm"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

}  // namespace
}  // namespace kvcache::testing
