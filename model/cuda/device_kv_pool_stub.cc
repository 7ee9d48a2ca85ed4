// DeviceKvPool in a build without CUDA (KVCACHE_WITH_CUDA off): it exists so that callers link
// either way; Create answers FAILED_PRECONDITION("built without CUDA") and no pool ever exists.
#include <utility>

#include "common/cuda/not_built.h"
#include "model/cuda/device_kv_pool.h"

namespace kvcache::worker {

absl::StatusOr<DeviceKvPool> DeviceKvPool::Create(int, const PoolLayout&, uint32_t) {
  return NotBuiltWith("CUDA", "no device KV pool");
}

DeviceKvPool::~DeviceKvPool() = default;

DeviceKvPool::DeviceKvPool(DeviceKvPool&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      device_(other.device_),
      layout_(other.layout_),
      num_blocks_(other.num_blocks_) {}

DeviceKvPool& DeviceKvPool::operator=(DeviceKvPool&& other) noexcept {
  base_ = std::exchange(other.base_, nullptr);
  device_ = other.device_;
  layout_ = other.layout_;
  num_blocks_ = other.num_blocks_;
  return *this;
}

void DeviceKvPool::Free() {}

}  // namespace kvcache::worker
