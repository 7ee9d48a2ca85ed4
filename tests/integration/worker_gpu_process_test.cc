// kvcache-worker processes computing on the GPU: daemons started with --device cuda:0 serve
// device pools, and a worker on such a pool runs the CUDA model over the pool's CUDA IPC mapping.
// Every cached GPU run — a prefix shared with another worker process, a resurrection from
// soft-free, a conversation hitting its own answers, a decode continuing from KV that a prefill
// worker shipped over NCCL from another daemon's pool — gives tokens and logits bit-identical to
// a cold GPU run: GenerateColdCuda in this process (the same CUDA model over a fresh device
// buffer) and the worker's own --check_cold. (A cold CPU run is not the reference: the GPU model
// matches it only within a tolerance.)
//
// Label gpu: every case skips ("no CUDA device") without a device or in a build without CUDA;
// the prefill/decode cases are built only with NCCL.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/mapped_pool.h"
#include "common/cuda/cuda_device.h"
#include "model/cuda/qwen3_moe_cuda.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"
#include "worker/generation.h"

namespace kvcache::testing {
namespace {

using ::testing::StartsWith;

constexpr uint32_t kNewTokens = 12;
constexpr char kPool[] =
    "qwen:model=tiny:layers=3:kv_heads=2:head_dim=16:block_size=16:dtype=bf16:blocks=64";
// A GPU worker pays CUDA (and NCCL) initialization on top of its work: a generous bound.
constexpr absl::Duration kGpuProcessBound = absl::Seconds(90);

std::vector<uint32_t> Prompt(uint32_t seed, size_t length) {
  std::vector<uint32_t> tokens(length);
  for (size_t i = 0; i < length; ++i) tokens[i] = (seed * 131 + i * 7 + (i * i) % 13) % 256;
  return tokens;
}

std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

using WorkerRun = WorkerTurn;

class WorkerGpuProcessTest : public DaemonProcessTest {
 protected:
  WorkerGpuProcessTest() {
    pool_name_ = "qwen";
    pool_flag_ = kPool;
  }

  void SetUp() override {
    DaemonProcessTest::SetUp();
    if (!MappedPool::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device (built without CUDA)";
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
    device_flag_ = "cuda:0";
    ASSERT_NO_FATAL_FAILURE(StartDaemon());
    absl::StatusOr<worker::Qwen3MoeModel> model =
        worker::Qwen3MoeModel::Load(KVCACHE_TINY_CHECKPOINT_DIR);
    ASSERT_OK(model);
    model_.emplace(*std::move(model));
    absl::StatusOr<worker::CudaQwen3MoeModel> gpu = worker::CudaQwen3MoeModel::Create(*model_, 0);
    ASSERT_OK(gpu);
    gpu_.emplace(*std::move(gpu));
  }

  std::vector<std::string> WorkerArgs(const std::string& target,
                                      const std::vector<uint32_t>& prompt) {
    return {bin_dir_ + "/kvcache-worker",
            "--target=" + target,
            "--pool=qwen",
            "--checkpoint=" KVCACHE_TINY_CHECKPOINT_DIR,
            "--tokens=" + absl::StrJoin(prompt, ","),
            "--max_new_tokens=" + std::to_string(kNewTokens)};
  }

  // Runs a worker to its exit, which must be 0; reads its "turn 1:" line unless `prefill`.
  WorkerRun Run(const std::vector<std::string>& argv, bool prefill = false) {
    return WorkerRunner::RunTurn(argv, kGpuProcessBound, /*read_turn_line=*/!prefill);
  }

  WorkerRun RunWorker(const std::vector<uint32_t>& prompt,
                      const std::vector<std::string>& extra = {}) {
    std::vector<std::string> argv = WorkerArgs(target_, prompt);
    argv.insert(argv.end(), extra.begin(), extra.end());
    return Run(argv);
  }

  // The cold GPU run of `prompt` in this process, as the worker prints tokens and digest.
  std::pair<std::string, std::string> GpuCold(const std::vector<uint32_t>& prompt,
                                              uint32_t new_tokens = kNewTokens) {
    worker::Sampler sampler = worker::Sampler::Greedy();
    absl::StatusOr<worker::GenerationResult> cold = worker::GenerateColdCuda(
        *gpu_, prompt, new_tokens, sampler, model_->KvLayout(16, DType::kBFloat16));
    EXPECT_OK(cold);
    if (!cold.ok()) return {};
    return {absl::StrJoin(cold->tokens, ","), absl::StrFormat("%016x", cold->logits_digest)};
  }

  // The run computed on the GPU, passed its own cold check, and equals this process's cold run.
  void ExpectGpuRunMatchesCold(const WorkerRun& run, const std::vector<uint32_t>& prompt) {
    EXPECT_EQ(run.result.Field("compute"), "cuda:0");
    EXPECT_THAT(run.turn_line, ::testing::EndsWith("cold check: identical"));
    const auto [tokens, digest] = GpuCold(prompt);
    EXPECT_EQ(run.result.Field("tokens"), tokens);
    EXPECT_EQ(run.result.Field("digest"), digest);
  }

  std::optional<worker::Qwen3MoeModel> model_;
  std::optional<worker::CudaQwen3MoeModel> gpu_;
};

TEST_F(WorkerGpuProcessTest, SharedPrefixAndResurrectionOnTheGpuAreIdenticalToAColdGpuRun) {
  const std::vector<uint32_t> shared = Prompt(2, 64);
  const std::vector<uint32_t> first = Concat(shared, Prompt(3, 20));   // 84 tokens
  const std::vector<uint32_t> second = Concat(shared, Prompt(4, 30));  // 94 tokens

  const WorkerRun cold = RunWorker(first, {"--check_cold"});
  EXPECT_EQ(cold.result.num_cached_tokens, 0u);
  ExpectGpuRunMatchesCold(cold, first);

  // Another worker process: the shared prefix's 4 blocks, computed by the first one on the GPU.
  const WorkerRun hit = RunWorker(second, {"--check_cold"});
  EXPECT_EQ(hit.result.num_cached_tokens, 64u);
  ExpectGpuRunMatchesCold(hit, second);

  // The first prompt again: its 5 full blocks come back from soft-free.
  const uint64_t resurrected_before = PoolStats().resurrected_blocks;
  const WorkerRun again = RunWorker(first, {"--check_cold"});
  EXPECT_EQ(again.result.num_cached_tokens, 80u);
  ExpectGpuRunMatchesCold(again, first);
  EXPECT_GT(PoolStats().resurrected_blocks, resurrected_before);
  EXPECT_TRUE(AwaitAllReleased());
}

TEST_F(WorkerGpuProcessTest, MultiTurnConversationOnTheGpuHitsItsOwnAnswers) {
  const std::vector<uint32_t> prompt = Prompt(6, 40);
  std::vector<std::string> argv = WorkerArgs(target_, prompt);
  argv.insert(argv.end(), {"--max_new_tokens=20", "--turns=3", "--check_cold"});
  // Exit 0: every turn passed --check_cold against the GPU cold run.
  const std::vector<ClientResult> turns = WorkerRunner::RunTurns(argv, 3, kGpuProcessBound);
  EXPECT_EQ(turns[0].Field("compute"), "cuda:0");
  EXPECT_EQ(turns[0].num_cached_tokens, 0u);
  // Turn 2 hits past the first prompt into the answer: blocks that decode filled on the GPU and
  // committed.
  EXPECT_GT(turns[1].num_cached_tokens, prompt.size());
  EXPECT_GT(turns[2].num_cached_tokens, turns[1].Number("prompt_tokens") - 16);
  EXPECT_TRUE(AwaitAllReleased());
}

// Issue 18 on the GPU: a CUDA pool of 24 blocks (6 KiB each) with a page-locked tier 2 of 8
// blocks and a disk tier below it. A prompt's blocks go down by D2H copies and come back by H2D
// copies (from tier 2 or, through it, from disk), and after kill -9 and a restart from disk
// alone; each time the worker's tokens and logits equal a cold GPU run.
class WorkerGpuTierProcessTest : public WorkerGpuProcessTest {
 protected:
  WorkerGpuTierProcessTest() {
    pool_flag_ =
        "qwen:model=tiny:layers=3:kv_heads=2:head_dim=16:block_size=16:dtype=bf16:blocks=24:"
        "host_tier=48KiB:disk_tier=" +
        disk_dir_.path() + "/qwen.tier:4MiB";
  }

  ScopedTempDir disk_dir_;
};

TEST_F(WorkerGpuTierProcessTest, PrefixFromTier2AndFromDiskAfterKill9IsIdenticalToAColdGpuRun) {
  // 98 tokens: its 6 full blocks published and evictable (worker_process_test says why).
  const std::vector<uint32_t> prompt = Prompt(20, 98);
  ExpectGpuRunMatchesCold(RunWorker(prompt, {"--check_cold"}), prompt);
  // 11 blocks: the mover copies the 8 oldest evictable (the prompt's 6 first) down to tier 2,
  // which passes them on to disk; 13 more evict the prompt from the device.
  const std::vector<uint32_t> first_filler = Prompt(21, 16 * 10 + 5);
  RunWorker(first_filler);
  ASSERT_TRUE(PollUntil([&] { return PoolTier("disk").stored_blocks >= 8; }));
  const std::vector<uint32_t> second_filler = Prompt(22, 16 * 12 + 5);
  RunWorker(second_filler);
  absl::StatusOr<KvCacheClient::LookupResult> lookup = observer_->Lookup("qwen", "", prompt);
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->cached_tokens_by_tier.pool, 0u);
  EXPECT_EQ(lookup->cached_tokens_by_tier.host + lookup->cached_tokens_by_tier.disk, 96u);

  const WorkerRun loaded = RunWorker(prompt, {"--check_cold"});
  EXPECT_EQ(loaded.result.num_cached_tokens, 96u);
  EXPECT_EQ(loaded.result.Number("cached_host") + loaded.result.Number("cached_disk"), 96);
  ExpectGpuRunMatchesCold(loaded, prompt);
  EXPECT_EQ(PoolTier("host").verify_failures, 0u);
  EXPECT_EQ(PoolTier("disk").verify_failures, 0u);

  KillAndRestartDaemon();
  EXPECT_GE(PoolTier("disk").restored_records, 6u);
  const WorkerRun restored = RunWorker(prompt, {"--check_cold"});
  EXPECT_EQ(restored.result.num_cached_tokens, 96u);
  EXPECT_EQ(restored.result.Number("cached_disk"), 96);
  ExpectGpuRunMatchesCold(restored, prompt);
  EXPECT_EQ(PoolTier("disk").hit_blocks, 6u);
  EXPECT_TRUE(AwaitAllReleased());
}

#if KVCACHE_WITH_NCCL

// Disaggregated prefill/decode on one GPU: daemon A (this fixture's) and daemon B, both with
// --device cuda:0; the prefill worker on A ships over a single-rank NCCL channel into B's pool.
class PdGpuProcessTest : public WorkerGpuProcessTest {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(WorkerGpuProcessTest::SetUp());
    if (IsSkipped()) return;
    decode_target_ = "unix://" + dir_.File("decode.sock");
    absl::StatusOr<Subprocess> decode_daemon =
        Subprocess::Start({bin_dir_ + "/kvcache-manager", "--listen=" + decode_target_,
                           std::string("--pool=") + kPool, "--device=cuda:0", "--session_ttl=2s"});
    ASSERT_OK(decode_daemon);
    decode_daemon_.emplace(*std::move(decode_daemon));
    ASSERT_OK(decode_daemon_->ReadLineStartingWith("kvcache-manager: listening on", kStartBound));
    absl::StatusOr<std::unique_ptr<KvCacheClient>> observer =
        KvCacheClient::Connect(decode_target_);
    ASSERT_OK(observer);
    decode_observer_ = *std::move(observer);
  }

  void TearDown() override {
    decode_observer_.reset();
    if (decode_daemon_.has_value()) {
      ASSERT_OK(decode_daemon_->Signal(SIGTERM));
      absl::StatusOr<int> status = decode_daemon_->Wait(kStartBound);
      ASSERT_OK(status);
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    }
    WorkerGpuProcessTest::TearDown();
  }

  WorkerRun Prefill(const std::vector<uint32_t>& prompt) {
    std::vector<std::string> argv = WorkerArgs(target_, prompt);
    argv.insert(argv.end(),
                {"--role=prefill", "--decode_target=" + decode_target_, "--transport=nccl"});
    return Run(argv, /*prefill=*/true);
  }

  WorkerRun Decode(const std::vector<uint32_t>& prompt) {
    std::vector<std::string> argv = WorkerArgs(decode_target_, prompt);
    argv.insert(argv.end(), {"--role=decode", "--check_cold"});
    return Run(argv);
  }

  uint32_t DecodeCached(const std::vector<uint32_t>& prompt) {
    // The workers' tenant: their --tenant default, the caller's own.
    absl::StatusOr<KvCacheClient::LookupResult> lookup =
        decode_observer_->Lookup("qwen", "", prompt);
    EXPECT_OK(lookup);
    return lookup.ok() ? lookup->num_cached_tokens : 0;
  }

  std::string decode_target_;
  std::optional<Subprocess> decode_daemon_;
  std::unique_ptr<KvCacheClient> decode_observer_;
};

TEST_F(PdGpuProcessTest, DecodeOnTheGpuContinuesFromKvShippedOverNcclIdenticalToOneWorker) {
  const std::vector<uint32_t> prompt = Prompt(1, 100);  // 6 full blocks and 4 tokens
  const WorkerRun prefill = Prefill(prompt);
  EXPECT_EQ(prefill.result.Field("compute"), "cuda:0");
  EXPECT_EQ(prefill.result.Number("sent_blocks"), 6);
  EXPECT_EQ(prefill.result.Number("skipped_blocks"), 0);
  EXPECT_EQ(prefill.result.Number("bytes"), 6 * 6144);
  EXPECT_EQ(DecodeCached(prompt), 96u);

  const WorkerRun decode = Decode(prompt);
  EXPECT_EQ(decode.result.num_cached_tokens, 96u);  // only the partial tail is computed on B
  ExpectGpuRunMatchesCold(decode, prompt);
  EXPECT_THAT(decode.result.Field("tokens"), StartsWith(prefill.result.Field("first_token") + ","));

  // A single worker on daemon A (which holds the prefill's blocks) generates the same.
  const WorkerRun single = RunWorker(prompt);
  EXPECT_EQ(single.result.num_cached_tokens, 96u);
  EXPECT_EQ(single.result.Field("tokens"), decode.result.Field("tokens"));
  EXPECT_EQ(single.result.Field("digest"), decode.result.Field("digest"));
}

TEST_F(PdGpuProcessTest, BlocksTheDecodeSideHoldsAreNotShippedAgain) {
  const std::vector<uint32_t> first = Prompt(2, 100);
  Prefill(first);
  const std::vector<uint32_t> second =
      Concat(std::vector<uint32_t>(first.begin(), first.begin() + 64), Prompt(3, 50));
  const WorkerRun prefill = Prefill(second);  // 114 tokens: 7 full blocks, 4 already on B
  EXPECT_EQ(prefill.result.Number("skipped_blocks"), 4);
  EXPECT_EQ(prefill.result.Number("sent_blocks"), 3);
  const WorkerRun decode = Decode(second);
  EXPECT_EQ(decode.result.num_cached_tokens, 112u);
  ExpectGpuRunMatchesCold(decode, second);
}

#endif  // KVCACHE_WITH_NCCL

}  // namespace
}  // namespace kvcache::testing
