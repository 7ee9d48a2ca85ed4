// MappedPool's CUDA side over the CUDA runtime (built with KVCACHE_WITH_CUDA; see
// mapped_pool_cuda_stub.cc otherwise).
#include "client/mapped_pool_cuda.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cuda/scoped_cuda_device.h"

namespace kvcache::mapped_pool_internal {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes,
              "kCudaIpcHandleBytes must match cudaIpcMemHandle_t");

// `what` failed with `error`, as the status the header promises. Clears the error, which is not
// sticky for these calls, so it cannot surface in the caller's next CUDA check.
absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  cudaGetLastError();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(error), ": ", cudaGetErrorString(error));
  switch (error) {
    case cudaErrorMemoryAllocation:
    case cudaErrorTooManyPeers:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorNotSupported:
    case cudaErrorPeerAccessUnsupported:
      return absl::FailedPreconditionError(message);
    // What opening a handle answers when its exporter is gone (a stopped or restarted daemon),
    // when the bytes are no handle at all, or when this process exported it itself.
    case cudaErrorMapBufferObjectFailed:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidValue:
    case cudaErrorDeviceUninitialized:
      return absl::FailedPreconditionError(
          absl::StrCat(message,
                       " (the daemon that exported it may have stopped or restarted: describe the "
                       "pool again; a daemon's own process cannot map its pools)"));
    default:
      return absl::InternalError(message);
  }
}

}  // namespace

bool BuiltWithCuda() { return true; }

absl::StatusOr<uint8_t*> OpenCudaIpcMapping(absl::string_view handle, int device,
                                            absl::string_view pool) {
  const std::string what = absl::StrCat("mapping pool '", pool, "' (CUDA IPC, cuda:", device, ")");
  int count = 0;
  const cudaError_t counted = cudaGetDeviceCount(&count);
  if (counted != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": no usable CUDA device: ", cudaGetErrorName(counted), ": ",
                     cudaGetErrorString(counted)));
  }
  if (device >= count) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, ": this process sees ", count,
                     " CUDA device(s); the daemon and its workers must see the same devices "
                     "(CUDA_VISIBLE_DEVICES)"));
  }
  cudaIpcMemHandle_t ipc_handle;
  std::memcpy(&ipc_handle, handle.data(), sizeof(ipc_handle));
  ScopedCudaDevice scoped;
  if (const cudaError_t error = scoped.Set(device); error != cudaSuccess) {
    return CudaStatus(error, absl::StrCat(what, ": cudaSetDevice(", device, ")"));
  }
  // Lazy peer access: a process whose current device is another GPU may still use the pointer.
  void* base = nullptr;
  const cudaError_t opened =
      cudaIpcOpenMemHandle(&base, ipc_handle, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess)
    return CudaStatus(opened, absl::StrCat(what, ": cudaIpcOpenMemHandle"));
  return static_cast<uint8_t*>(base);
}

void CloseCudaIpcMapping(uint8_t* base, int device) {
  ScopedCudaDevice scoped;
  (void)scoped.Set(device);  // closed on whichever device is current if this fails
  cudaIpcCloseMemHandle(base);
  cudaGetLastError();
}

}  // namespace kvcache::mapped_pool_internal
