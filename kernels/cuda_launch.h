// Launch-error check shared by the CUDA launchers (included from .cu files only).
#ifndef KVCACHE_KERNELS_CUDA_LAUNCH_H_
#define KVCACHE_KERNELS_CUDA_LAUNCH_H_

#include <cuda_runtime.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"

namespace kvcache::kernels {

// The launch error, if any, as CudaStatus maps it ("<op>: kernel launch failed: <CUDA text>").
// Does not synchronize.
inline absl::Status CheckLaunch(const char* op) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return absl::OkStatus();
  return CudaStatus(err, absl::StrCat(op, ": kernel launch failed"));
}

}  // namespace kvcache::kernels

#endif  // KVCACHE_KERNELS_CUDA_LAUNCH_H_
