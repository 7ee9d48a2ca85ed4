// DeviceKvPool's build-independent half: the checks, the ownership and the moves. The CUDA calls
// are in device_bytes_cuda.cc (device_bytes_stub.cc in a build without CUDA).
#include "model/cuda/device_kv_pool.h"

#include <utility>

#include "common/cuda/cuda_device.h"
#include "common/status_macros.h"

namespace kvcache::worker {

absl::StatusOr<DeviceKvPool> DeviceKvPool::Create(int device, const PoolLayout& layout,
                                                  uint32_t num_blocks) {
  RETURN_IF_ERROR(layout.Validate());
  if (num_blocks == 0) return absl::InvalidArgumentError("a device KV pool needs blocks");
  RETURN_IF_ERROR(CheckCudaDevice(device));  // INVALID_ARGUMENT for a negative device
  ASSIGN_OR_RETURN(uint8_t* const base,
                   AllocateZeroed(device, uint64_t{num_blocks} * layout.BlockBytes()));
  return DeviceKvPool(base, device, layout, num_blocks);
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
  Release(base_, device_);
  base_ = nullptr;
}

}  // namespace kvcache::worker
