// DeviceKvPool over the CUDA runtime (built with KVCACHE_WITH_CUDA; device_kv_pool_stub.cc
// otherwise).
#include "model/cuda/device_kv_pool.h"

#include <cuda_runtime_api.h>

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_device.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/scoped_cuda_device.h"
#include "common/status_macros.h"

namespace kvcache::worker {

absl::StatusOr<DeviceKvPool> DeviceKvPool::Create(int device, const PoolLayout& layout,
                                                  uint32_t num_blocks) {
  RETURN_IF_ERROR(layout.Validate());
  if (num_blocks == 0) return absl::InvalidArgumentError("a device KV pool needs blocks");
  if (device < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CUDA device ", device, " is not a device"));
  }
  RETURN_IF_ERROR(CheckCudaDevice(device));
  ScopedCudaDevice scoped;
  KVCACHE_CUDA_RETURN_IF_ERROR(scoped.Set(device), absl::StrCat("cudaSetDevice(", device, ")"));
  const uint64_t bytes = uint64_t{num_blocks} * layout.BlockBytes();
  void* base = nullptr;
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, bytes),
                               absl::StrCat("cudaMalloc of a ", bytes, "-byte KV pool"));
  DeviceKvPool pool(static_cast<uint8_t*>(base), device, layout, num_blocks);
  // cudaMemset on the legacy default stream; the synchronize makes the fill complete before any
  // stream (the model's is non-blocking, so it would not wait for it) touches the pool.
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaMemset(base, 0, bytes), "zero-filling the device KV pool");
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaDeviceSynchronize(), "zero-filling the device KV pool");
  return pool;
}

DeviceKvPool::~DeviceKvPool() { Free(); }

DeviceKvPool::DeviceKvPool(DeviceKvPool&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      device_(other.device_),
      layout_(other.layout_),
      num_blocks_(other.num_blocks_) {}

DeviceKvPool& DeviceKvPool::operator=(DeviceKvPool&& other) noexcept {
  if (this != &other) {
    Free();
    base_ = std::exchange(other.base_, nullptr);
    device_ = other.device_;
    layout_ = other.layout_;
    num_blocks_ = other.num_blocks_;
  }
  return *this;
}

void DeviceKvPool::Free() {
  if (base_ == nullptr) return;
  ScopedCudaDevice scoped;
  (void)scoped.Set(device_);  // freed on whichever device is current if this fails
  if (cudaFree(base_) != cudaSuccess) cudaGetLastError();
  base_ = nullptr;
}

}  // namespace kvcache::worker
