// cuda_device.h in a build without CUDA: no device is ever available.
#include "common/cuda/cuda_device.h"
#include "common/cuda/not_built.h"

namespace kvcache {

bool BuiltWithCuda() { return false; }

absl::StatusOr<int> CudaDeviceCount() { return NotBuiltWith("CUDA"); }

}  // namespace kvcache
