// Zero-filled device allocations owned by the model's device objects (DeviceKvPool,
// DeviceLinearAttentionState): one place for the allocate-fill-synchronize and the best-effort
// free. Implemented in device_bytes_cuda.cc (device_bytes_stub.cc without CUDA: FAILED_PRECONDITION
// "built without CUDA").
// Thread-safety: thread-safe; both leave the calling thread's current device as they found it.
#ifndef KVCACHE_MODEL_CUDA_DEVICE_BYTES_H_
#define KVCACHE_MODEL_CUDA_DEVICE_BYTES_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvcache::worker {

// `bytes` of zero-filled memory on `device`, the fill complete on return; `what` names the
// allocation in error messages. RESOURCE_EXHAUSTED when out of memory, other CUDA errors as
// common/cuda/cuda_status.h maps them. REQUIRES: device exists.
absl::StatusOr<uint8_t*> AllocateZeroedDeviceBytes(int device, uint64_t bytes,
                                                   absl::string_view what);
// Frees an allocation of AllocateZeroedDeviceBytes; best effort.
void ReleaseDeviceBytes(uint8_t* base, int device);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_CUDA_DEVICE_BYTES_H_
