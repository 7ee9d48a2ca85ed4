// Issue 34 on the GPU: kvcache-worker with the tiny hybrid checkpoint (Qwen3-Next) over a daemon
// pool in device memory (--device cuda:0) whose pages are [kv | state] (worker/hybrid_pages.h).
// The worker runs CudaQwen3NextModel over the pool's CUDA IPC mapping — the KV through the page
// stride, the state copied device to device from the endpoint page and into every page it fills —
// and every cached run (0, 50 and 90% of the prompt cached, each a new worker process reusing what
// the ones before committed; a hit ending at the last page that holds a state; a decode continuing
// from pages a prefill worker shipped over NCCL from another daemon's pool) gives tokens and
// logits bit-identical to a cold GPU run: GenerateColdHybridCuda in this process (the same CUDA
// model over a fresh device buffer) and the worker's own --check_cold. (A CPU run is not the
// reference: the GPU model matches it only within a tolerance.)
//
// Label gpu: every case skips ("no CUDA device") without a device or in a build without CUDA;
// the prefill/decode case is built only with NCCL.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/mapped_pool.h"
#include "common/cuda/cuda_device.h"
#include "model/cuda/qwen3_next_cuda.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/integration/hybrid_worker_cases.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/status_matchers.h"
#include "worker/hybrid_pages.h"

namespace kvcache::testing {
namespace {

using ::testing::EndsWith;
using ::testing::StartsWith;

constexpr uint32_t kNewTokens = 12;
constexpr uint32_t kHybridPoolBlocks = 24;
// A GPU worker pays CUDA (and NCCL) initialization on top of its work: a generous bound.
constexpr absl::Duration kGpuProcessBound = absl::Seconds(90);

using WorkerRun = WorkerTurn;

class HybridWorkerGpuProcessTest : public DaemonProcessTest {
 protected:
  void SetUp() override {
    DaemonProcessTest::SetUp();
    if (!MappedPool::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device (built without CUDA)";
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<WorkerRunner> runner =
        WorkerRunner::Create(bin_dir_, KVCACHE_TINY_HYBRID_CHECKPOINT_DIR, kBlockSize, kNewTokens);
    ASSERT_OK(runner);
    runner_.emplace(*std::move(runner));
    ASSERT_TRUE(runner_->model().hybrid());
    absl::StatusOr<worker::CudaQwen3NextModel> gpu =
        worker::CudaQwen3NextModel::Create(runner_->model().hybrid_model(), 0);
    ASSERT_OK(gpu);
    gpu_.emplace(*std::move(gpu));
    geometry_ = worker::HybridPoolGeometryFor(runner_->model().hybrid_model().config(), kBlockSize,
                                              DType::kBFloat16);
    pool_name_ = "next";
    pool_flag_ =
        absl::StrCat("next:model=tiny-next", geometry_.SpecFields(), ":blocks=", kHybridPoolBlocks);
    device_flag_ = "cuda:0";
    ASSERT_NO_FATAL_FAILURE(StartDaemon());
  }

  // Runs a worker to its exit, which must be 0, reading its "turn 1:" and result lines.
  WorkerRun Run(const std::vector<std::string>& argv) {
    return WorkerRunner::RunTurn(argv, kGpuProcessBound, /*read_turn_line=*/true);
  }

  WorkerRun RunWorker(const std::string& target, const std::vector<uint32_t>& prompt,
                      const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = runner_->Argv(target, "next", prompt);
    argv.push_back("--check_cold");
    argv.insert(argv.end(), extra.begin(), extra.end());
    return Run(argv);
  }

  // The run computed on the GPU, passed its own cold check, and equals this process's cold GPU
  // run (GenerateColdHybridCuda).
  void ExpectGpuRunMatchesCold(const WorkerRun& run, const std::vector<uint32_t>& prompt) {
    EXPECT_EQ(run.result.Field("compute"), "cuda:0");
    EXPECT_THAT(run.turn_line, EndsWith("cold check: identical"));
    worker::Sampler sampler = worker::Sampler::Greedy();
    absl::StatusOr<worker::GenerationResult> cold =
        worker::GenerateColdHybridCuda(*gpu_, runner_->model().hybrid_model().config(), prompt,
                                       kNewTokens, sampler, kBlockSize, DType::kBFloat16);
    ASSERT_OK(cold);
    EXPECT_EQ(run.result.Field("tokens"), absl::StrJoin(cold->tokens, ","));
    EXPECT_EQ(run.result.Field("digest"), absl::StrFormat("%016x", cold->logits_digest));
  }

  // A worker on this fixture's daemon, expecting `cached` tokens from the cache and a cold run's
  // tokens and logits.
  WorkerRun ExpectCold(const std::vector<uint32_t>& prompt, uint32_t cached,
                       const std::vector<std::string>& extra = {}) {
    WorkerRun run = RunWorker(target_, prompt, extra);
    EXPECT_EQ(run.result.num_cached_tokens, cached);
    ExpectGpuRunMatchesCold(run, prompt);
    return run;
  }

  uint64_t PageBytes() const { return geometry_.pool_layout.BlockBytes(); }

  std::optional<WorkerRunner> runner_;
  std::optional<worker::CudaQwen3NextModel> gpu_;
  worker::HybridPoolGeometry geometry_;
};

TEST_F(HybridWorkerGpuProcessTest, SecondProcessesReuseAtZeroFiftyAndNinetyPercent) {
  ReuseAtZeroFiftyAndNinetyPercent([this](const auto& prompt, uint32_t cached, const auto& flags) {
    ExpectCold(prompt, cached, flags);
  });
  EXPECT_TRUE(AwaitAllReleased());
}

TEST_F(HybridWorkerGpuProcessTest, AnEndpointWithoutItsStateIsNotAHit) {
  AnEndpointWithoutItsStateIsNotAHit(
      [this](const auto& prompt, uint32_t cached, const auto& flags) {
        ExpectCold(prompt, cached, flags);
      });
  EXPECT_TRUE(AwaitAllReleased());
}

// A conversation: each turn hits its own earlier answer, pages decode filled (and saved the
// state into) on the GPU.
TEST_F(HybridWorkerGpuProcessTest, MultiTurnConversationHitsItsOwnAnswers) {
  const std::vector<uint32_t> prompt = HybridPrompt(6, 40);
  std::vector<std::string> argv = runner_->Argv(target_, "next", prompt);
  argv.insert(argv.end(), {"--max_new_tokens=20", "--turns=3", "--check_cold"});
  // Exit 0: every turn passed --check_cold against the GPU cold run.
  const std::vector<ClientResult> turns = WorkerRunner::RunTurns(argv, 3, kGpuProcessBound);
  EXPECT_EQ(turns[0].Field("compute"), "cuda:0");
  EXPECT_EQ(turns[0].num_cached_tokens, 0u);
  EXPECT_GT(turns[1].num_cached_tokens, prompt.size());
  EXPECT_TRUE(AwaitAllReleased());
}

#if KVCACHE_WITH_NCCL

// Prefill -> decode of the hybrid on one GPU: daemon A (this fixture's) and daemon B, both with
// --device cuda:0; the prefill worker on A ships its prompt's pages — the KV and the state inside
// each page's bytes — over a single-rank NCCL channel into B's pool; a decode worker on B hits
// them (KV up to the endpoint and the state at it) and continues identical to one worker.
class HybridPdGpuProcessTest : public HybridWorkerGpuProcessTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(HybridWorkerGpuProcessTest::SetUp());
    if (IsSkipped()) return;
    decode_target_ = "unix://" + dir_.File("decode.sock");
    absl::StatusOr<Subprocess> decode_daemon =
        StartManager(bin_dir_,
                     {"--listen=" + decode_target_, "--pool=" + pool_flag_, "--device=cuda:0",
                      "--session_ttl=2s"},
                     kStartBound);
    ASSERT_OK(decode_daemon);
    decode_daemon_.emplace(*std::move(decode_daemon));
  }

  void TearDown() override {
    if (decode_daemon_.has_value()) EXPECT_OK(StopManager(*decode_daemon_, kStartBound));
    HybridWorkerGpuProcessTest::TearDown();
  }

  std::string decode_target_;
  std::optional<Subprocess> decode_daemon_;
};

TEST_F(HybridPdGpuProcessTest, DecodeContinuesFromKvAndStateShippedOverNcclIdenticalToOneWorker) {
  const std::vector<uint32_t> prompt = HybridPrompt(7, 100);  // 6 full pages and 4 tokens
  const ClientResult prefill =
      runner_->Prefill(target_, "next", prompt, decode_target_, "nccl", kGpuProcessBound);
  EXPECT_EQ(prefill.Field("compute"), "cuda:0");
  EXPECT_EQ(prefill.Number("sent_blocks"), 6);
  EXPECT_EQ(prefill.Number("bytes"), static_cast<int64_t>(6 * PageBytes()));

  std::vector<std::string> decode_argv = runner_->Argv(decode_target_, "next", prompt);
  decode_argv.insert(decode_argv.end(), {"--role=decode", "--check_cold"});
  const WorkerRun decode = Run(decode_argv);
  EXPECT_EQ(decode.result.num_cached_tokens, 96u);  // KV of 6 pages and the state after page 6
  ExpectGpuRunMatchesCold(decode, prompt);
  EXPECT_THAT(decode.result.Field("tokens"), StartsWith(prefill.Field("first_token") + ","));

  // A single worker on daemon A (which holds the prefill's pages) generates the same.
  const WorkerRun single = RunWorker(target_, prompt);
  EXPECT_EQ(single.result.num_cached_tokens, 96u);
  EXPECT_EQ(single.result.Field("tokens"), decode.result.Field("tokens"));
  EXPECT_EQ(single.result.Field("digest"), decode.result.Field("digest"));
}

// kvcache-pd, prefill and decode workers in one process over the two device pools: each request's
// pages (KV and state) go over NCCL and the decode side's first token must be the prefill side's
// (kvcache-pd fails otherwise); the second request hits the shared prefix on both sides.
TEST_F(HybridPdGpuProcessTest, KvcachePdShipsHybridRequestsOverNccl) {
  absl::StatusOr<Subprocess> pd = Subprocess::Start(
      {bin_dir_ + "/kvcache-pd", "--prefill_target=" + target_, "--decode_target=" + decode_target_,
       "--pool=next", "--checkpoint=" KVCACHE_TINY_HYBRID_CHECKPOINT_DIR, "--transport=nccl",
       "--requests=2", "--prompt_tokens=100", "--shared_prefix=48", "--max_new_tokens=4"});
  ASSERT_OK(pd);
  absl::StatusOr<std::string> hits = pd->ReadLineStartingWith("prefix hits:", kGpuProcessBound);
  ASSERT_OK(hits);
  absl::StatusOr<int> status = pd->Wait(kGpuProcessBound);
  ASSERT_OK(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "kvcache-pd " << DescribeWaitStatus(*status);
  EXPECT_TRUE(AwaitAllReleased());
}

#endif  // KVCACHE_WITH_NCCL

}  // namespace
}  // namespace kvcache::testing
