// DeviceKvPool's CUDA calls in a build without CUDA (KVCACHE_WITH_CUDA off). Create's
// CheckCudaDevice already answers "built without CUDA", so no pool ever exists.
#include "common/cuda/not_built.h"
#include "model/cuda/device_kv_pool.h"

namespace kvcache::worker {

absl::StatusOr<uint8_t*> DeviceKvPool::AllocateZeroed(int, uint64_t) {
  return NotBuiltWith("CUDA", "no device KV pool");
}

void DeviceKvPool::Release(uint8_t*, int) {}

}  // namespace kvcache::worker
