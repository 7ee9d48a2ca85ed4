// Block gather/scatter/copy kernel bandwidth against one cudaMemcpyAsync device-to-device of the
// same bytes, for block sizes 64 KiB..2 MiB with random block ids. GB/s counts bytes copied (each
// read once and written once), 1 GB = 1e9 B. Prints figures and ratios from one run; asserts
// nothing. Exits 1 on a CUDA error; without a CUDA device it says so and exits 77, skipped
// (bench/bench_run.h).
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <numeric>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "bench/bench_run.h"
#include "common/cuda/cuda_device.h"
#include "common/cuda/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/block_copy.h"

namespace kvcache::kernels {
namespace {

constexpr uint64_t kBytesPerLaunch = uint64_t{256} << 20;  // moved by one timed launch
constexpr int kWarmup = 3;
constexpr int kIters = 20;

// Device allocation freed on scope exit.
class DeviceMemory {
 public:
  DeviceMemory() = default;
  ~DeviceMemory() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  absl::Status Allocate(size_t bytes) { return CudaStatus(cudaMalloc(&ptr_, bytes), "cudaMalloc"); }
  template <typename T = uint8_t>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
};

// A CUDA event destroyed on scope exit.
class Event {
 public:
  Event() = default;
  ~Event() {
    if (event_ != nullptr) cudaEventDestroy(event_);
  }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  absl::Status Create() { return CudaStatus(cudaEventCreate(&event_), "cudaEventCreate"); }
  cudaEvent_t get() const { return event_; }

 private:
  cudaEvent_t event_ = nullptr;
};

// Milliseconds per launch of `launch` (which returns absl::Status), timed with events on `stream`.
template <typename Launch>
absl::StatusOr<double> TimeMs(cudaStream_t stream, Launch launch) {
  Event start, stop;
  RETURN_IF_ERROR(start.Create());
  RETURN_IF_ERROR(stop.Create());
  for (int i = 0; i < kWarmup; ++i) RETURN_IF_ERROR(launch());
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(start.get(), stream), "cudaEventRecord"));
  for (int i = 0; i < kIters; ++i) RETURN_IF_ERROR(launch());
  RETURN_IF_ERROR(CudaStatus(cudaEventRecord(stop.get(), stream), "cudaEventRecord"));
  RETURN_IF_ERROR(CudaStatus(cudaEventSynchronize(stop.get()), "cudaEventSynchronize"));
  float ms = 0;
  RETURN_IF_ERROR(
      CudaStatus(cudaEventElapsedTime(&ms, start.get(), stop.get()), "cudaEventElapsedTime"));
  return static_cast<double>(ms) / kIters;
}

double GBps(uint64_t bytes, double ms) { return bytes / (ms * 1e-3) / 1e9; }

absl::Status RunOne(uint64_t block_bytes, cudaStream_t stream) {
  const uint32_t n = static_cast<uint32_t>(std::max<uint64_t>(kBytesPerLaunch / block_bytes, 16));
  const uint32_t num_blocks = 2 * n;  // ids are a random half of the pool
  const uint64_t bytes = uint64_t{n} * block_bytes;

  std::mt19937_64 rng(block_bytes);
  std::vector<int64_t> perm(num_blocks);
  std::iota(perm.begin(), perm.end(), 0);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<int64_t> ids(perm.begin(), perm.begin() + n);
  const std::vector<int64_t> dst_ids(perm.begin() + n, perm.end());  // disjoint from `ids`

  DeviceMemory pool, staging, d_ids, d_dst_ids;
  RETURN_IF_ERROR(pool.Allocate(uint64_t{num_blocks} * block_bytes));
  RETURN_IF_ERROR(staging.Allocate(bytes));
  RETURN_IF_ERROR(d_ids.Allocate(n * sizeof(int64_t)));
  RETURN_IF_ERROR(d_dst_ids.Allocate(n * sizeof(int64_t)));
  RETURN_IF_ERROR(
      CudaStatus(cudaMemsetAsync(pool.get(), 1, uint64_t{num_blocks} * block_bytes, stream),
                 "cudaMemsetAsync"));
  RETURN_IF_ERROR(CudaStatus(
      cudaMemcpyAsync(d_ids.get(), ids.data(), n * sizeof(int64_t), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync"));
  RETURN_IF_ERROR(CudaStatus(cudaMemcpyAsync(d_dst_ids.get(), dst_ids.data(), n * sizeof(int64_t),
                                             cudaMemcpyHostToDevice, stream),
                             "cudaMemcpyAsync"));

  auto memcpy_d2d = [&] {
    return CudaStatus(
        cudaMemcpyAsync(staging.get(), pool.get(), bytes, cudaMemcpyDeviceToDevice, stream),
        "cudaMemcpyAsync");
  };
  auto gather = [&] {
    return GatherBlocksCuda(pool.get(), block_bytes, num_blocks, d_ids.get<int64_t>(), n,
                            staging.get(), stream);
  };
  auto scatter = [&] {
    return ScatterBlocksCuda(staging.get(), block_bytes, num_blocks, d_ids.get<int64_t>(), n,
                             pool.get(), stream);
  };
  auto copy = [&] {
    return CopyBlocksCuda(pool.get(), block_bytes, num_blocks, d_ids.get<int64_t>(),
                          d_dst_ids.get<int64_t>(), n, stream);
  };
  ASSIGN_OR_RETURN(const double memcpy_ms, TimeMs(stream, memcpy_d2d));
  ASSIGN_OR_RETURN(const double gather_ms, TimeMs(stream, gather));
  ASSIGN_OR_RETURN(const double scatter_ms, TimeMs(stream, scatter));
  ASSIGN_OR_RETURN(const double copy_ms, TimeMs(stream, copy));

  const double memcpy_gbps = GBps(bytes, memcpy_ms);
  const double gather_gbps = GBps(bytes, gather_ms);
  const double scatter_gbps = GBps(bytes, scatter_ms);
  const double copy_gbps = GBps(bytes, copy_ms);
  std::printf("%8llu KiB %6u %10.1f %10.1f %6.2f %10.1f %6.2f %10.1f %6.2f\n",
              static_cast<unsigned long long>(block_bytes >> 10), n, memcpy_gbps, gather_gbps,
              gather_gbps / memcpy_gbps, scatter_gbps, scatter_gbps / memcpy_gbps, copy_gbps,
              copy_gbps / memcpy_gbps);
  return absl::OkStatus();
}

int Main() {
  if (!CudaDeviceAvailable()) {
    std::printf("kernels_bench: skipped: no CUDA device\n");
    return bench::kSkipped;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) std::printf("device: %s\n", prop.name);
  cudaStream_t stream;
  if (absl::Status s = CudaStatus(cudaStreamCreate(&stream), "cudaStreamCreate"); !s.ok()) {
    std::fprintf(stderr, "%s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("GB/s of bytes copied per launch (~%llu MiB, random ids); ratio = kernel / memcpy\n",
              static_cast<unsigned long long>(kBytesPerLaunch >> 20));
  std::printf("%12s %6s %10s %10s %6s %10s %6s %10s %6s\n", "block", "blocks", "memcpy", "gather",
              "ratio", "scatter", "ratio", "copy", "ratio");
  for (uint64_t block_bytes = 64 << 10; block_bytes <= (2 << 20); block_bytes *= 2) {
    if (absl::Status s = RunOne(block_bytes, stream); !s.ok()) {
      std::fprintf(stderr, "block_bytes %llu: %s\n", static_cast<unsigned long long>(block_bytes),
                   s.ToString().c_str());
      cudaStreamDestroy(stream);
      return 1;
    }
  }
  cudaStreamDestroy(stream);
  return 0;
}

}  // namespace
}  // namespace kvcache::kernels

int main() { return kvcache::kernels::Main(); }
