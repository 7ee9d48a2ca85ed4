// cuda_device.h over the CUDA runtime (built with KVCACHE_WITH_CUDA).
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_device.h"

namespace kvcache {

bool BuiltWithCuda() { return true; }

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  const cudaError_t error = cudaGetDeviceCount(&count);
  if (error != cudaSuccess) {
    cudaGetLastError();  // not sticky: keep it from surfacing in a later launch check
    // Whatever the runtime says (no driver, a stub driver, no device), there is no GPU to use.
    return absl::FailedPreconditionError(absl::StrCat("no CUDA device: ", cudaGetErrorString(error),
                                                      " (", cudaGetErrorName(error), ")"));
  }
  if (count == 0) return absl::FailedPreconditionError("no CUDA device: the runtime finds none");
  return count;
}

}  // namespace kvcache
