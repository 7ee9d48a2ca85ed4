// MappedPool's CUDA side over the CUDA runtime (built with KVCACHE_WITH_CUDA; see
// mapped_pool_cuda_stub.cc otherwise).
#include "client/mapped_pool_cuda.h"

#include <cuda_runtime_api.h>

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_device.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/scoped_cuda_device.h"

namespace kvcache::mapped_pool_internal {
namespace {

static_assert(sizeof(cudaIpcMemHandle_t) == kCudaIpcHandleBytes,
              "kCudaIpcHandleBytes must match cudaIpcMemHandle_t");

// What cudaIpcOpenMemHandle answers when the handle's exporter is gone (a stopped or restarted
// daemon), when the bytes are no handle at all, or when this process exported it itself: a state
// of the pool, not a fault, so FAILED_PRECONDITION with what to do. Other errors map as usual.
absl::Status OpenStatus(cudaError_t error, absl::string_view what) {
  switch (error) {
    case cudaErrorMapBufferObjectFailed:
    case cudaErrorInvalidResourceHandle:
    case cudaErrorInvalidValue:
    case cudaErrorDeviceUninitialized:
      return absl::FailedPreconditionError(
          absl::StrCat(CudaStatus(error, what).message(),
                       " (the daemon that exported it may have stopped or restarted: describe the "
                       "pool again; a daemon's own process cannot map its pools)"));
    default:
      return CudaStatus(error, what);
  }
}

}  // namespace

absl::StatusOr<uint8_t*> OpenCudaIpcMapping(absl::string_view handle, int device,
                                            absl::string_view pool) {
  const std::string what = absl::StrCat("mapping pool '", pool, "' (CUDA IPC, cuda:", device, ")");
  if (const absl::Status usable = CheckCudaDevice(device); !usable.ok()) {
    // The daemon and its workers must see the same devices.
    return absl::Status(usable.code(), absl::StrCat(what, ": ", usable.message()));
  }
  cudaIpcMemHandle_t ipc_handle;
  std::memcpy(&ipc_handle, handle.data(), sizeof(ipc_handle));
  ScopedCudaDevice scoped;
  KVCACHE_CUDA_RETURN_IF_ERROR(scoped.Set(device),
                               absl::StrCat(what, ": cudaSetDevice(", device, ")"));
  // Lazy peer access: a process whose current device is another GPU may still use the pointer.
  void* base = nullptr;
  const cudaError_t opened =
      cudaIpcOpenMemHandle(&base, ipc_handle, cudaIpcMemLazyEnablePeerAccess);
  if (opened != cudaSuccess)
    return OpenStatus(opened, absl::StrCat(what, ": cudaIpcOpenMemHandle"));
  return static_cast<uint8_t*>(base);
}

void CloseCudaIpcMapping(uint8_t* base, int device) {
  ScopedCudaDevice scoped;
  (void)scoped.Set(device);  // closed on whichever device is current if this fails
  cudaIpcCloseMemHandle(base);
  cudaGetLastError();
}

}  // namespace kvcache::mapped_pool_internal
