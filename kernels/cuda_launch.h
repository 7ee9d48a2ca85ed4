// Launch-error check shared by the CUDA launchers (included from .cu files only).
#ifndef KVCACHE_KERNELS_CUDA_LAUNCH_H_
#define KVCACHE_KERNELS_CUDA_LAUNCH_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"

namespace kvcache::kernels {

// Returns the launch error, if any, as INTERNAL. Does not synchronize.
inline absl::Status CheckLaunch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    return absl::InternalError(
        absl::StrFormat("%s: kernel launch failed: %s", op, cudaGetErrorString(err)));
  }
  return absl::OkStatus();
}

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_CUDA_LAUNCH_H_
