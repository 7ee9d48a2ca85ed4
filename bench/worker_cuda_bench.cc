// The worker model on the GPU (model/cuda/qwen3_moe_cuda.h) against the CPU model, in one run:
// 512-token prefill time and greedy decode tokens/s, each as a ratio GPU vs CPU, with the KV in
// a bf16 paged pool (device memory for the GPU, host memory for the CPU).
// With a hybrid checkpoint (Qwen3-Next) as third argument, also the hybrid's 512-token prefill on
// the GPU (model/cuda/qwen3_next_cuda.h, its state in a DeviceLinearAttentionState) vs the CPU,
// as the worker runs it: over pages of [kv | state] (worker/hybrid_pages.h), the state saved into
// every page (device to device on the GPU); and its state bytes per page vs its KV bytes.
// Usage: worker_cuda_bench CHECKPOINT_DIR [reps [HYBRID_CHECKPOINT_DIR]]
// Exits 1 on an error; without a CUDA device it says so and exits 77, skipped
// (bench/bench_run.h). The tests' tiny model is
// launch-bound on a GPU; a wider one (scripts/make_tiny_checkpoint.py OUT --hidden 512
// --moe_intermediate 512 --layers 2) is closer to real MoE proportions.
#include <cuda_runtime.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/bench_run.h"
#include "common/cuda/cuda_device.h"
#include "model/cuda/device_linear_state.h"
#include "model/cuda/qwen3_moe_cuda.h"
#include "model/cuda/qwen3_next_cuda.h"
#include "model/linear_attention_state.h"
#include "model/qwen3_moe.h"
#include "model/qwen3_next.h"
#include "model/sampler.h"
#include "worker/hybrid_pages.h"

namespace kvcache::worker {
namespace {

constexpr uint32_t kBlockSize = 16;
constexpr uint32_t kPromptTokens = 512;
constexpr uint32_t kDecodeTokens = 64;

double MedianMs(std::vector<absl::Duration> samples) {
  std::sort(samples.begin(), samples.end());
  return absl::ToDoubleMilliseconds(samples[samples.size() / 2]);
}

// A zero-filled device pool, freed on scope exit.
class DevicePool {
 public:
  explicit DevicePool(uint64_t bytes) {
    if (cudaMalloc(&data_, bytes) != cudaSuccess || cudaMemset(data_, 0, bytes) != cudaSuccess ||
        cudaDeviceSynchronize() != cudaSuccess) {
      data_ = nullptr;
    }
  }
  ~DevicePool() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DevicePool(const DevicePool&) = delete;
  DevicePool& operator=(const DevicePool&) = delete;
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_ = nullptr;
};

// One sequence's KV twice, blocks 0, 1, ... of `layout` for `positions` tokens: a zero host pool
// for the CPU model and a zero device pool for the GPU model. Blocks are `page_bytes` apart (0:
// layout.BlockBytes(); more for pages that hold a state after the KV).
struct BenchPools {
  BenchPools(const PoolLayout& pool_layout, uint32_t positions, uint64_t page_bytes = 0)
      : layout(pool_layout),
        table((positions + layout.block_size - 1) / layout.block_size),
        host(uint64_t{table.size()} * (page_bytes == 0 ? layout.BlockBytes() : page_bytes), 0),
        device(host.size()) {
    for (uint32_t i = 0; i < table.size(); ++i) table[i] = i;
  }
  PagedKv HostKv() { return PagedKv(host.data(), layout, table, table.size()); }
  DevicePagedKv DeviceKv() const {
    return DevicePagedKv{device.data(), layout, table, table.size()};
  }

  const PoolLayout layout;
  std::vector<uint32_t> table;
  std::vector<uint8_t> host;
  DevicePool device;  // data() is null when the allocation failed
};

// kPromptTokens pseudo-random tokens below `vocab_size`, the same every run.
std::vector<uint32_t> RandomPrompt(uint32_t vocab_size) {
  std::mt19937 rng(7);
  std::vector<uint32_t> prompt(kPromptTokens);
  for (uint32_t& token : prompt) token = rng() % vocab_size;
  return prompt;
}

// Greedy decoding of kDecodeTokens after a prefilled prompt; returns the tokens, times the loop.
template <typename ForwardFn>
bool Decode(ForwardFn forward, std::vector<float> logits, std::vector<uint32_t>& tokens,
            absl::Duration& elapsed) {
  const absl::Time start = absl::Now();
  for (uint32_t position = kPromptTokens; tokens.size() < kDecodeTokens; ++position) {
    tokens.push_back(Argmax(logits));
    absl::StatusOr<std::vector<float>> next = forward(tokens.back(), position);
    if (!next.ok()) {
      std::fprintf(stderr, "decode: %s\n", next.status().ToString().c_str());
      return false;
    }
    logits = std::move(*next);
  }
  elapsed = absl::Now() - start;
  return true;
}

int Run(const Qwen3MoeModel& model, CudaQwen3MoeModel& gpu, int reps) {
  const PoolLayout layout = model.KvLayout(kBlockSize, DType::kBFloat16);
  BenchPools pools(layout, kPromptTokens + kDecodeTokens);
  if (pools.device.data() == nullptr) {
    std::fprintf(stderr, "cannot allocate the device pool\n");
    return 1;
  }
  PagedKv host_kv = pools.HostKv();
  const DevicePagedKv device_kv = pools.DeviceKv();
  const std::vector<uint32_t> prompt = RandomPrompt(model.config().vocab_size);

  // Prefill, CPU and GPU alternating within each repetition so that they share the machine's
  // noise; repetition 0 warms the GPU (allocation of scratch buffers, module loading).
  std::vector<absl::Duration> cpu_times, gpu_times;
  absl::StatusOr<std::vector<float>> cpu_logits, gpu_logits;
  for (int rep = 0; rep <= reps; ++rep) {
    absl::Time start = absl::Now();
    cpu_logits = model.Forward(prompt, 0, host_kv);
    const absl::Duration cpu = absl::Now() - start;
    start = absl::Now();
    gpu_logits = gpu.Forward(prompt, 0, device_kv);
    const absl::Duration gpu_time = absl::Now() - start;
    if (!cpu_logits.ok() || !gpu_logits.ok()) {
      std::fprintf(stderr, "prefill: %s / %s\n", cpu_logits.status().ToString().c_str(),
                   gpu_logits.status().ToString().c_str());
      return 1;
    }
    if (rep == 0) continue;
    cpu_times.push_back(cpu);
    gpu_times.push_back(gpu_time);
  }

  std::vector<uint32_t> cpu_tokens, gpu_tokens;
  absl::Duration cpu_decode, gpu_decode;
  const auto cpu_step = [&](uint32_t token, uint32_t position) {
    return model.Forward(absl::MakeConstSpan(&token, 1), position, host_kv);
  };
  const auto gpu_step = [&](uint32_t token, uint32_t position) {
    return gpu.Forward(absl::MakeConstSpan(&token, 1), position, device_kv);
  };
  if (!Decode(cpu_step, *cpu_logits, cpu_tokens, cpu_decode) ||
      !Decode(gpu_step, *gpu_logits, gpu_tokens, gpu_decode)) {
    return 1;
  }

  const double cpu_ms = MedianMs(cpu_times);
  const double gpu_ms = MedianMs(gpu_times);
  const double cpu_tps = kDecodeTokens / absl::ToDoubleSeconds(cpu_decode);
  const double gpu_tps = kDecodeTokens / absl::ToDoubleSeconds(gpu_decode);
  std::printf("Qwen3-MoE worker model, bf16 paged KV pool, median of %d\n", reps);
  std::printf("%-34s %12s %12s %10s\n", "", "CPU", "GPU", "GPU/CPU");
  std::printf("%-34s %10.2fms %10.2fms %9.1fx\n", "prefill, 512 tokens (time)", cpu_ms, gpu_ms,
              cpu_ms / gpu_ms);
  std::printf("%-34s %10.1f/s %10.1f/s %9.1fx\n", "greedy decode, 64 tokens (tokens/s)", cpu_tps,
              gpu_tps, gpu_tps / cpu_tps);
  std::printf("greedy tokens identical on CPU and GPU: %s\n",
              cpu_tokens == gpu_tokens ? "yes" : "no");
  return 0;
}

// The hybrid's prefill of kPromptTokens from a zero state, CPU vs GPU; each repetition restarts
// both states at 0 (and overwrites the same pool slots).
int RunHybrid(const std::string& checkpoint, int reps) {
  absl::StatusOr<Qwen3NextModel> model = Qwen3NextModel::Load(checkpoint);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  absl::StatusOr<CudaQwen3NextModel> gpu = CudaQwen3NextModel::Create(*model, 0);
  absl::StatusOr<DeviceLinearAttentionState> gpu_state =
      DeviceLinearAttentionState::Create(0, model->config());
  if (!gpu.ok() || !gpu_state.ok()) {
    std::fprintf(stderr, "%s / %s\n", gpu.status().ToString().c_str(),
                 gpu_state.status().ToString().c_str());
    return 1;
  }
  const HybridPages pages =
      HybridPagesOf(HybridPoolGeometryFor(model->config(), kBlockSize, DType::kBFloat16));
  const PoolLayout& layout = pages.kv_layout;
  BenchPools pools(layout, kPromptTokens, pages.page_bytes);
  if (pools.device.data() == nullptr) {
    std::fprintf(stderr, "cannot allocate the device pool\n");
    return 1;
  }
  const uint64_t num_pages = pools.table.size();
  LinearAttentionState cpu_state = model->NewState();
  const PoolForward cpu_forward = HybridHostPoolForward(*model, pools.host.data(), pages, num_pages,
                                                        /*checkpoint_pages=*/1, &cpu_state);
  const PoolForward gpu_forward = HybridDevicePoolForward(
      *gpu, pools.device.data(), pages, num_pages, /*checkpoint_pages=*/1, &*gpu_state);
  const std::vector<uint32_t> prompt = RandomPrompt(model->config().base.vocab_size);
  std::vector<absl::Duration> cpu_times, gpu_times;
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms the GPU
    cpu_state.Reset();
    absl::Time start = absl::Now();
    absl::StatusOr<std::vector<float>> cpu_logits = cpu_forward(prompt, 0, pools.table);
    const absl::Duration cpu = absl::Now() - start;
    const absl::Status reset = gpu_state->Reset(nullptr);
    start = absl::Now();
    absl::StatusOr<std::vector<float>> gpu_logits =
        reset.ok() ? gpu_forward(prompt, 0, pools.table) : reset;
    const absl::Duration gpu_time = absl::Now() - start;
    if (!cpu_logits.ok() || !gpu_logits.ok()) {
      std::fprintf(stderr, "hybrid prefill: %s / %s\n", cpu_logits.status().ToString().c_str(),
                   gpu_logits.status().ToString().c_str());
      return 1;
    }
    if (rep == 0) continue;
    cpu_times.push_back(cpu);
    gpu_times.push_back(gpu_time);
  }
  const double cpu_ms = MedianMs(cpu_times);
  const double gpu_ms = MedianMs(gpu_times);
  std::printf(
      "Qwen3-Next hybrid worker model, [bf16 KV | float32 state] pages, a state saved into every "
      "page, median of %d\n",
      reps);
  std::printf("%-34s %10.2fms %10.2fms %9.1fx\n", "prefill, 512 tokens (time)", cpu_ms, gpu_ms,
              cpu_ms / gpu_ms);
  std::printf("state bytes per page %llu, KV bytes per page %llu (%.2fx)\n",
              static_cast<unsigned long long>(gpu_state->StateBytes()),
              static_cast<unsigned long long>(layout.BlockBytes()),
              static_cast<double>(gpu_state->StateBytes()) / layout.BlockBytes());
  return 0;
}

int Main(const std::string& checkpoint, int reps, const std::string& hybrid_checkpoint) {
  absl::StatusOr<Qwen3MoeModel> model = Qwen3MoeModel::Load(checkpoint);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  if (!BuiltWithCuda() || !CudaDeviceAvailable()) {
    std::printf("worker_cuda_bench: skipped: no CUDA device\n");
    return bench::kSkipped;
  }
  absl::StatusOr<CudaQwen3MoeModel> gpu = CudaQwen3MoeModel::Create(*model, 0);
  if (!gpu.ok()) {
    std::fprintf(stderr, "%s\n", gpu.status().ToString().c_str());
    return 1;
  }
  if (const int failed = Run(*model, *gpu, reps); failed != 0) return failed;
  return hybrid_checkpoint.empty() ? 0 : RunHybrid(hybrid_checkpoint, reps);
}

}  // namespace
}  // namespace kvcache::worker

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CHECKPOINT_DIR [reps [HYBRID_CHECKPOINT_DIR]]\n", argv[0]);
    return 2;
  }
  const int reps = argc > 2 ? std::max(1, atoi(argv[2])) : 5;
  return kvcache::worker::Main(argv[1], reps, argc > 3 ? argv[3] : "");
}
