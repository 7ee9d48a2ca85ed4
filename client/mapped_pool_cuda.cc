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
#include "common/status_macros.h"
#include "kernels/page_checksum.h"

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

absl::Status CopyPagesChecksummed(int device, absl::Span<const kernels::PageCopy> copies,
                                  uint64_t page_bytes, absl::Span<uint64_t> checksums) {
  if (copies.empty()) return absl::OkStatus();
  ScopedCudaDevice scoped;
  KVCACHE_CUDA_RETURN_IF_ERROR(scoped.Set(device), absl::StrCat("cudaSetDevice(", device, ")"));
  // The list and the checksums are a few KiB: one stream-ordered allocation holds both, and the
  // per-thread stream keeps concurrent callers (and the legacy stream) apart.
  const cudaStream_t stream = cudaStreamPerThread;
  const size_t list_bytes = copies.size() * sizeof(kernels::PageCopy);
  void* scratch = nullptr;
  KVCACHE_CUDA_RETURN_IF_ERROR(
      cudaMallocAsync(&scratch, list_bytes + checksums.size() * sizeof(uint64_t), stream),
      "allocating the page list");
  auto* list = static_cast<kernels::PageCopy*>(scratch);
  auto* device_checksums = reinterpret_cast<uint64_t*>(static_cast<char*>(scratch) + list_bytes);
  absl::Status status =
      CudaStatus(cudaMemcpyAsync(list, copies.data(), list_bytes, cudaMemcpyHostToDevice, stream),
                 "uploading the page list");
  if (status.ok()) {
    status = kernels::CopyPagesChecksummedCuda(list, static_cast<uint32_t>(copies.size()),
                                               page_bytes, device_checksums, stream);
  }
  if (status.ok()) {
    status = CudaStatus(
        cudaMemcpyAsync(checksums.data(), device_checksums, checksums.size() * sizeof(uint64_t),
                        cudaMemcpyDeviceToHost, stream),
        "downloading the page checksums");
  }
  const cudaError_t freed = cudaFreeAsync(scratch, stream);
  const cudaError_t synchronized = cudaStreamSynchronize(stream);
  RETURN_IF_ERROR(status);
  KVCACHE_CUDA_RETURN_IF_ERROR(freed, "freeing the page list");
  KVCACHE_CUDA_RETURN_IF_ERROR(synchronized, "copying the pages");
  return absl::OkStatus();
}

}  // namespace kvcache::mapped_pool_internal
