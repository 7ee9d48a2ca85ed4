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
//  - a state at the wrong position is FAILED_PRECONDITION, with nothing written;
//  - over [kv | state] pages (DevicePagedKv's page stride) the logits, state and KV bytes are
//    those of a KV-only pool, and the bytes past each page's KV are untouched;
//  - a state saved into device memory (a page's state part) holds the host SaveTo's bytes, and
//    restored from there continues bit-identically; Reset gives the zero state;
//  - HybridDevicePoolForward saving every page's state leaves in each page the state a resumed
//    run restores (RestoreHybridStateOnDevice) to continue bit-identically to the cold run
//    (GenerateColdHybridCuda's forward pass).
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
#include "worker/hybrid_pages.h"

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

// [kv | state] pages, as a hybrid daemon pool lays them out (HybridPoolGeometryFor).
struct DevicePages {
  HybridPages pages;
  DeviceKvPool pool;  // of the geometry's pool layout: blocks of page_bytes
  DevicePagedKv View(const std::vector<uint32_t>& table) const {
    return DevicePagedKv{.pool_base = pool.base(),
                         .layout = pages.kv_layout,
                         .block_table = table,
                         .num_pool_blocks = pool.num_blocks(),
                         .page_stride_bytes = pages.page_bytes};
  }
};

DevicePages NewPages(DType dtype) {
  const HybridPoolGeometry geometry =
      HybridPoolGeometryFor(TinyHybrid().config(), kBlockSize, dtype);
  absl::StatusOr<DeviceKvPool> pool = DeviceKvPool::Create(0, geometry.pool_layout, kBlocks);
  EXPECT_OK(pool);
  return DevicePages{HybridPagesOf(geometry), std::move(*pool)};
}

TEST_F(CudaQwen3NextModelGpuTest, PagesOfKvAndStateGiveTheResultsOfAKvOnlyPool) {
  const std::vector<uint32_t> prompt = MakePrompt(70, 6);
  const std::vector<uint32_t> table = {7, 2, 11, 0, 5};
  DeviceSequence plain = NewSequence(DType::kBFloat16);
  const std::vector<float> plain_logits = RunTokens(plain, table, prompt, 0);
  const std::vector<uint8_t> plain_pool = DownloadPool(plain.pool);

  DevicePages pages = NewPages(DType::kBFloat16);
  // A pattern in every byte past the KV: the model must leave it alone.
  const uint64_t page_bytes = pages.pages.page_bytes;
  const uint64_t kv_bytes = pages.pages.kv_layout.BlockBytes();
  ASSERT_GT(page_bytes, kv_bytes);
  for (uint32_t b = 0; b < kBlocks; ++b) {
    ASSERT_EQ(cudaMemset(pages.pool.base() + uint64_t{b} * page_bytes + kv_bytes, 0xA5,
                         page_bytes - kv_bytes),
              cudaSuccess);
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  absl::StatusOr<DeviceLinearAttentionState> state =
      DeviceLinearAttentionState::Create(0, TinyHybrid().config());
  ASSERT_OK(state);
  absl::StatusOr<std::vector<float>> logits = gpu_->Forward(prompt, 0, pages.View(table), *state);
  ASSERT_OK(logits);
  EXPECT_TRUE(BitIdentical(*logits, plain_logits));
  EXPECT_TRUE(BitIdentical(StateFloats(*state), StateFloats(plain.state)));
  const std::vector<uint8_t> paged = DownloadPool(pages.pool);
  for (uint32_t b = 0; b < kBlocks; ++b) {
    const uint8_t* page = paged.data() + uint64_t{b} * page_bytes;
    EXPECT_EQ(std::memcmp(page, plain_pool.data() + uint64_t{b} * kv_bytes, kv_bytes), 0)
        << "block " << b;
    EXPECT_TRUE(
        std::all_of(page + kv_bytes, page + page_bytes, [](uint8_t byte) { return byte == 0xA5; }))
        << "block " << b << ": the bytes past the KV were written";
  }
  // A stride below the KV block is the CPU model's INVALID_ARGUMENT, nothing written.
  DevicePagedKv short_stride = pages.View(table);
  short_stride.page_stride_bytes = kv_bytes - 2;
  EXPECT_THAT(gpu_->Forward(absl::MakeConstSpan(prompt).first(4), 70, short_stride, *state),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page stride")));
}

TEST_F(CudaQwen3NextModelGpuTest, AStateSavedIntoDeviceMemoryHoldsTheHostBytes) {
  const std::vector<uint32_t> prompt = MakePrompt(64, 7);
  const absl::Span<const uint32_t> all(prompt);
  const std::vector<uint32_t> table = Iota(0, 4);
  DeviceSequence cold = NewSequence(DType::kBFloat16);
  const std::vector<float> cold_logits = RunTokens(cold, table, prompt, 0);

  DeviceSequence first = NewSequence(DType::kBFloat16);
  RunTokens(first, table, all.subspan(0, 32), 0);
  std::vector<uint8_t> host_bytes(first.state.StateBytes());
  ASSERT_OK(first.state.SaveTo(absl::MakeSpan(host_bytes), nullptr));
  absl::StatusOr<DeviceKvPool> part =
      DeviceKvPool::Create(0, TinyHybrid().KvLayout(kBlockSize, DType::kFloat32), 8);
  ASSERT_OK(part);
  ASSERT_GE(uint64_t{8} * part->layout().BlockBytes(), first.state.StateBytes());
  ASSERT_OK(first.state.SaveToDevice(part->base(), nullptr));
  std::vector<uint8_t> device_bytes(first.state.StateBytes());
  ASSERT_EQ(
      cudaMemcpy(device_bytes.data(), part->base(), device_bytes.size(), cudaMemcpyDeviceToHost),
      cudaSuccess);
  EXPECT_EQ(device_bytes, host_bytes);

  // Restored from the device bytes into a state that ran elsewhere: continues as the cold run.
  DeviceSequence resumed = NewSequence(DType::kBFloat16);
  RunTokens(resumed, table, MakePrompt(5, 9), 0);
  ASSERT_OK(resumed.state.RestoreFromDevice(part->base(), 32, nullptr));
  EXPECT_EQ(resumed.state.position(), 32u);
  ASSERT_EQ(
      cudaMemcpy(resumed.pool.base(), first.pool.base(),
                 uint64_t{kBlocks} * first.pool.layout().BlockBytes(), cudaMemcpyDeviceToDevice),
      cudaSuccess);
  // A device-to-device cudaMemcpy may still run when it returns; the model's stream would not
  // wait for it.
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_TRUE(BitIdentical(RunTokens(resumed, table, all.subspan(32), 32), cold_logits));
  EXPECT_TRUE(BitIdentical(StateFloats(resumed.state), StateFloats(cold.state)));

  ASSERT_OK(resumed.state.Reset(nullptr));
  EXPECT_EQ(resumed.state.position(), 0u);
  const std::vector<float> zero = StateFloats(resumed.state);
  EXPECT_TRUE(std::all_of(zero.begin(), zero.end(), [](float x) { return x == 0.0f; }));
  EXPECT_THAT(resumed.state.SaveToDevice(nullptr, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(resumed.state.RestoreFromDevice(nullptr, 16, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(resumed.state.position(), 0u);
}

// The worker's forward pass over device pages: a prefill saving the state into every page, then a
// run resumed at each page end from that page's state and the pages' KV, continue bit-identically
// to the cold run's forward pass (no checkpoints).
TEST_F(CudaQwen3NextModelGpuTest, StatesSavedIntoPagesResumeBitIdentically) {
  const std::vector<uint32_t> prompt = MakePrompt(70, 8);
  const absl::Span<const uint32_t> all(prompt);
  const std::vector<uint32_t> table = {3, 9, 1, 12, 6};

  DevicePages cold_pages = NewPages(DType::kBFloat16);
  absl::StatusOr<DeviceLinearAttentionState> cold_state =
      DeviceLinearAttentionState::Create(0, TinyHybrid().config());
  ASSERT_OK(cold_state);
  const PoolForward cold = HybridDevicePoolForward(*gpu_, cold_pages.pool.base(), cold_pages.pages,
                                                   kBlocks, /*checkpoint_pages=*/0, &*cold_state);
  absl::StatusOr<std::vector<float>> cold_logits = cold(prompt, 0, table);
  ASSERT_OK(cold_logits);

  DevicePages pages = NewPages(DType::kBFloat16);
  absl::StatusOr<DeviceLinearAttentionState> state =
      DeviceLinearAttentionState::Create(0, TinyHybrid().config());
  ASSERT_OK(state);
  const PoolForward saving = HybridDevicePoolForward(*gpu_, pages.pool.base(), pages.pages, kBlocks,
                                                     /*checkpoint_pages=*/1, &*state);
  // Resumed mid-page (at 5) so that the first chunk is not a whole page.
  ASSERT_OK(saving(all.subspan(0, 5), 0, table).status());
  absl::StatusOr<std::vector<float>> logits = saving(all.subspan(5), 5, table);
  ASSERT_OK(logits);
  EXPECT_TRUE(BitIdentical(*logits, *cold_logits));
  EXPECT_TRUE(BitIdentical(StateFloats(*state), StateFloats(*cold_state)));

  for (uint32_t m : {16u, 32u, 48u, 64u}) {
    absl::StatusOr<DeviceLinearAttentionState> resumed =
        DeviceLinearAttentionState::Create(0, TinyHybrid().config());
    ASSERT_OK(resumed);
    const uint8_t* endpoint_page =
        pages.pool.base() + uint64_t{table[m / kBlockSize - 1]} * pages.pages.page_bytes;
    ASSERT_OK(RestoreHybridStateOnDevice(pages.pages, endpoint_page, m, *resumed));
    const PoolForward plain = HybridDevicePoolForward(*gpu_, pages.pool.base(), pages.pages,
                                                      kBlocks, /*checkpoint_pages=*/0, &*resumed);
    absl::StatusOr<std::vector<float>> resumed_logits = plain(all.subspan(m), m, table);
    ASSERT_OK(resumed_logits);
    EXPECT_TRUE(BitIdentical(*resumed_logits, *cold_logits)) << m;
  }
  absl::StatusOr<DeviceLinearAttentionState> inside =
      DeviceLinearAttentionState::Create(0, TinyHybrid().config());
  ASSERT_OK(inside);
  EXPECT_THAT(RestoreHybridStateOnDevice(pages.pages, pages.pool.base(), 20, *inside),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("inside a page")));
  ASSERT_OK(RestoreHybridStateOnDevice(pages.pages, nullptr, 0, *inside));
  EXPECT_EQ(inside->position(), 0u);
}

#endif  // KVCACHE_WITH_CUDA

}  // namespace
}  // namespace kvcache::worker
