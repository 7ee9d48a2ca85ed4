// Device allocations and copies in a build without CUDA (KVCACHE_WITH_CUDA off). The creators'
// CheckCudaDevice already answers "built without CUDA", so nothing is ever allocated.
#include "common/cuda/not_built.h"
#include "model/cuda/device_bytes.h"
#include "model/cuda/device_kv_pool.h"
#include "model/cuda/device_linear_state.h"

namespace kvcache::worker {

absl::StatusOr<uint8_t*> AllocateZeroedDeviceBytes(int, uint64_t, absl::string_view what) {
  return NotBuiltWith("CUDA", what);
}

void ReleaseDeviceBytes(uint8_t*, int) {}

absl::StatusOr<uint8_t*> DeviceKvPool::AllocateZeroed(int device, uint64_t bytes) {
  return AllocateZeroedDeviceBytes(device, bytes, "no device KV pool");
}

void DeviceKvPool::Release(uint8_t*, int) {}

absl::Status DeviceLinearAttentionState::CopyToHost(const float*, uint8_t*, uint64_t, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status DeviceLinearAttentionState::CopyToDevice(const uint8_t*, float*, uint64_t, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status DeviceLinearAttentionState::CopyOnDevice(int, const void*, void*, uint64_t, void*) {
  return NotBuiltWith("CUDA");
}

absl::Status DeviceLinearAttentionState::ZeroOnDevice(int, float*, uint64_t, void*) {
  return NotBuiltWith("CUDA");
}

}  // namespace kvcache::worker
