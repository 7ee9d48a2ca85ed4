// CudaQwen3NextModel (model/cuda/qwen3_next_cuda.h) against the CPU model (model/qwen3_next.h).
//
// Label unit (every build, every machine): what Create answers for this build and machine.
//
// Label gpu (CUDA builds; every case skips without a device): CudaQwen3NextModelGpuTest, on the
// tiny hybrid checkpoint:
//  - logits within kLogitTolerance * max |logit| of the CPU model's, same argmax, for fp32 and
//    bf16 pools; the recurrent state within kStateTolerance;
//  - one-shot, chunked and token-by-token prefill, and a prefill resumed from the state saved
//    after m tokens (through host bytes, into a fresh device state) with the KV copied to other
//    blocks, are bit-identical on the GPU: logits, state bytes and KV bytes;
//  - a CPU state and CPU KV bytes carried onto the GPU continue within tolerance of the CPU;
//  - a state at the wrong position is FAILED_PRECONDITION, with nothing written.
#include "model/cuda/qwen3_next_cuda.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "common/cuda/cuda_device.h"
#include "model/cuda/device_kv_pool.h"
#include "model/ops.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"

#if KVCACHE_WITH_CUDA
#include <cuda_runtime.h>
#endif

namespace kvcache::worker {
namespace {

using ::kvcache::testing::StatusIs;
using ::kvcache::worker::testing::BitIdentical;
using ::kvcache::worker::testing::HostPool;
using ::kvcache::worker::testing::MakePrompt;
using ::testing::HasSubstr;

const Qwen3NextModel& TinyHybrid() { return testing::TinyHybridModel(); }

TEST(CudaQwen3NextModelTest, CreateAnswersForTheBuildAndTheMachine) {
  absl::StatusOr<CudaQwen3NextModel> model = CudaQwen3NextModel::Create(TinyHybrid(), 0);
  if (!BuiltWithCuda()) {
    EXPECT_THAT(model, StatusIs(absl::StatusCode::kFailedPrecondition, "built without CUDA"));
  } else if (!CudaDeviceAvailable()) {
    EXPECT_THAT(model,
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("no CUDA device")));
  } else {
    EXPECT_OK(model);
  }
}

#if KVCACHE_WITH_CUDA

constexpr uint32_t kBlockSize = 16;
constexpr uint32_t kBlocks = 16;
// max |gpu - cpu| <= kLogitTolerance * max |cpu| (attention, expert sums and the gates' exp run
// in another order or precision on the GPU).
constexpr float kLogitTolerance = 1e-3f;
constexpr float kStateTolerance = 1e-3f;

std::vector<uint32_t> Iota(uint32_t begin, uint32_t count) {
  std::vector<uint32_t> ids(count);
  for (uint32_t i = 0; i < count; ++i) ids[i] = begin + i;
  return ids;
}

void ExpectClose(const std::vector<float>& gpu, const std::vector<float>& cpu, float tolerance,
                 const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  float max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    ASSERT_TRUE(std::isfinite(gpu[i])) << what << " [" << i << "]";
    max_diff = std::max(max_diff, std::fabs(gpu[i] - cpu[i]));
    max_abs = std::max(max_abs, std::fabs(cpu[i]));
  }
  EXPECT_LE(max_diff, tolerance * max_abs) << what << ": max |cpu| " << max_abs;
}

std::vector<float> StateFloats(const DeviceLinearAttentionState& state) {
  std::vector<uint8_t> bytes(state.StateBytes());
  EXPECT_OK(state.SaveTo(absl::MakeSpan(bytes), nullptr));
  std::vector<float> floats(bytes.size() / sizeof(float));
  std::memcpy(floats.data(), bytes.data(), bytes.size());
  return floats;
}

std::vector<uint8_t> DownloadPool(const DeviceKvPool& pool) {
  std::vector<uint8_t> host(uint64_t{pool.num_blocks()} * pool.layout().BlockBytes());
  EXPECT_EQ(cudaMemcpy(host.data(), pool.base(), host.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  return host;
}

class CudaQwen3NextModelGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
    absl::StatusOr<CudaQwen3NextModel> created = CudaQwen3NextModel::Create(TinyHybrid(), 0);
    ASSERT_OK(created);
    gpu_.emplace(std::move(*created));
  }

  // A fresh device pool and zero state on device 0.
  struct DeviceSequence {
    DeviceKvPool pool;
    DeviceLinearAttentionState state;
  };
  DeviceSequence NewSequence(DType dtype) {
    absl::StatusOr<DeviceKvPool> pool =
        DeviceKvPool::Create(0, TinyHybrid().KvLayout(kBlockSize, dtype), kBlocks);
    EXPECT_OK(pool);
    absl::StatusOr<DeviceLinearAttentionState> state =
        DeviceLinearAttentionState::Create(0, TinyHybrid().config());
    EXPECT_OK(state);
    return DeviceSequence{std::move(*pool), std::move(*state)};
  }
  std::vector<float> RunTokens(DeviceSequence& seq, const std::vector<uint32_t>& table,
                               absl::Span<const uint32_t> tokens, uint32_t start) {
    const DevicePagedKv kv{seq.pool.base(), seq.pool.layout(), table, seq.pool.num_blocks()};
    absl::StatusOr<std::vector<float>> logits = gpu_->Forward(tokens, start, kv, seq.state);
    EXPECT_OK(logits);
    return logits.value_or(std::vector<float>{});
  }

  std::optional<CudaQwen3NextModel> gpu_;
};

TEST_F(CudaQwen3NextModelGpuTest, MatchesTheCpuModel) {
  const std::vector<uint32_t> prompt = MakePrompt(45, 2);
  const std::vector<uint32_t> table = Iota(2, 4);
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    const std::string what(DTypeName(dtype));
    HostPool host(TinyHybrid().KvLayout(kBlockSize, dtype), kBlocks);
    PagedKv host_kv = host.View(table);
    LinearAttentionState cpu_state = TinyHybrid().NewState();
    absl::StatusOr<std::vector<float>> cpu = TinyHybrid().Forward(prompt, 0, host_kv, cpu_state);
    ASSERT_OK(cpu);
    DeviceSequence seq = NewSequence(dtype);
    const std::vector<float> gpu = RunTokens(seq, table, prompt, 0);
    ExpectClose(gpu, *cpu, kLogitTolerance, what + " logits");
    EXPECT_EQ(TopK(gpu.data(), gpu.size(), 1), TopK(cpu->data(), cpu->size(), 1)) << what;
    EXPECT_EQ(seq.state.position(), 45u);
    ExpectClose(StateFloats(seq.state),
                std::vector<float>(cpu_state.values().begin(), cpu_state.values().end()),
                kStateTolerance, what + " state");
  }
}

TEST_F(CudaQwen3NextModelGpuTest, SplitAndResumedPrefillAreBitIdenticalOnTheGpu) {
  const std::vector<uint32_t> prompt = MakePrompt(70, 3);
  const std::vector<uint32_t> table = Iota(0, 5);
  DeviceSequence cold = NewSequence(DType::kBFloat16);
  const std::vector<float> cold_logits = RunTokens(cold, table, prompt, 0);
  const std::vector<float> cold_state = StateFloats(cold.state);
  const std::vector<uint8_t> cold_pool = DownloadPool(cold.pool);

  // Chunks, then the tail token by token.
  DeviceSequence chunked = NewSequence(DType::kBFloat16);
  const absl::Span<const uint32_t> all(prompt);
  RunTokens(chunked, table, all.subspan(0, 16), 0);
  RunTokens(chunked, table, all.subspan(16, 37), 16);
  std::vector<float> logits;
  for (uint32_t p = 53; p < 70; ++p) logits = RunTokens(chunked, table, all.subspan(p, 1), p);
  EXPECT_TRUE(BitIdentical(logits, cold_logits));
  EXPECT_TRUE(BitIdentical(StateFloats(chunked.state), cold_state));
  EXPECT_EQ(DownloadPool(chunked.pool), cold_pool);

  // Resumed at each page boundary: state through host bytes, KV blocks copied to blocks 8..12.
  for (uint32_t m : {16u, 32u, 48u, 64u}) {
    DeviceSequence first = NewSequence(DType::kBFloat16);
    RunTokens(first, table, all.subspan(0, m), 0);
    std::vector<uint8_t> saved(first.state.StateBytes());
    ASSERT_OK(first.state.SaveTo(absl::MakeSpan(saved), nullptr));
    DeviceSequence resumed = NewSequence(DType::kBFloat16);
    const uint64_t block_bytes = first.pool.layout().BlockBytes();
    const std::vector<uint32_t> other = Iota(8, 5);
    ASSERT_EQ(cudaMemcpy(resumed.pool.base() + 8 * block_bytes, first.pool.base(), 5 * block_bytes,
                         cudaMemcpyDeviceToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    ASSERT_OK(resumed.state.RestoreFrom(saved, m, nullptr));
    EXPECT_TRUE(BitIdentical(RunTokens(resumed, other, all.subspan(m), m), cold_logits)) << m;
    EXPECT_TRUE(BitIdentical(StateFloats(resumed.state), cold_state)) << m;
  }
}

// The state and KV a CPU run leaves, carried as bytes onto the GPU, continue there as the CPU does.
TEST_F(CudaQwen3NextModelGpuTest, ACpuStateContinuesOnTheGpu) {
  const std::vector<uint32_t> prompt = MakePrompt(48, 4);
  const std::vector<uint32_t> table = Iota(0, 3);
  const absl::Span<const uint32_t> all(prompt);
  HostPool host(TinyHybrid().KvLayout(kBlockSize, DType::kFloat32), kBlocks);
  PagedKv host_kv = host.View(table);
  LinearAttentionState cpu_state = TinyHybrid().NewState();
  ASSERT_OK(TinyHybrid().Forward(all.subspan(0, 32), 0, host_kv, cpu_state).status());
  std::vector<uint8_t> state_bytes(cpu_state.StateBytes());
  ASSERT_OK(cpu_state.SaveTo(absl::MakeSpan(state_bytes)));

  DeviceSequence seq = NewSequence(DType::kFloat32);
  ASSERT_EQ(
      cudaMemcpy(seq.pool.base(), host.bytes.data(), host.bytes.size(), cudaMemcpyHostToDevice),
      cudaSuccess);
  ASSERT_OK(seq.state.RestoreFrom(state_bytes, 32, nullptr));
  const std::vector<float> gpu = RunTokens(seq, table, all.subspan(32), 32);
  absl::StatusOr<std::vector<float>> cpu =
      TinyHybrid().Forward(all.subspan(32), 32, host_kv, cpu_state);
  ASSERT_OK(cpu);
  ExpectClose(gpu, *cpu, kLogitTolerance, "continued logits");
}

TEST_F(CudaQwen3NextModelGpuTest, AStateAtTheWrongPositionIsRefused) {
  DeviceSequence seq = NewSequence(DType::kBFloat16);
  const std::vector<uint32_t> table = Iota(0, 2);
  const std::vector<uint8_t> before = DownloadPool(seq.pool);
  const DevicePagedKv kv{seq.pool.base(), seq.pool.layout(), table, seq.pool.num_blocks()};
  EXPECT_THAT(gpu_->Forward(MakePrompt(4, 5), 8, kv, seq.state),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("state is at position 0, not at start position 8")));
  EXPECT_EQ(DownloadPool(seq.pool), before);
  EXPECT_EQ(seq.state.position(), 0u);
}

#endif  // KVCACHE_WITH_CUDA

}  // namespace
}  // namespace kvcache::worker
