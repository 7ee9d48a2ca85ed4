// CudaStatus: the one mapping of a CUDA runtime error onto an absl::Status, for every library that
// calls the runtime (pools, kernels, the CUDA model, NCCL channels, the client's IPC mappings):
//   RESOURCE_EXHAUSTED   out of device memory (cudaErrorMemoryAllocation) or of peer mappings
//                        (cudaErrorTooManyPeers): retrying with less can succeed;
//   FAILED_PRECONDITION  no usable device or driver on this machine: no device, no or a stub or
//                        too old driver, no such device ordinal, devices unavailable
//                        (exclusive-process mode), a call this device or system does not
//                        support. Another machine (or a fixed install) can serve the call;
//   INTERNAL             anything else: a fault of ours or of the device.
// Includes cuda_runtime_api.h: only sources built with CUDA include this header (stubs use
// common/cuda/not_built.h).
#ifndef KVCACHE_COMMON_CUDA_CUDA_STATUS_H_
#define KVCACHE_COMMON_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace kvcache {

// OK for cudaSuccess; otherwise the code above with the message
// "<what>: <cudaGetErrorString> (<cudaGetErrorName>)". Also clears the runtime's last error (a
// non-sticky error already reported here must not resurface as a later launch's failure).
absl::Status CudaStatus(cudaError_t error, absl::string_view what);

}  // namespace kvcache

// Returns CudaStatus(error, what) from the enclosing function when `expr` is not cudaSuccess.
// `what` is evaluated only then, so it may build its text with StrCat.
#define KVCACHE_CUDA_RETURN_IF_ERROR(expr, what)                                             \
  do {                                                                                       \
    const cudaError_t _kv_cuda_error = (expr);                                               \
    if (_kv_cuda_error != cudaSuccess) return ::kvcache::CudaStatus(_kv_cuda_error, (what)); \
  } while (0)

#endif  // KVCACHE_COMMON_CUDA_CUDA_STATUS_H_
