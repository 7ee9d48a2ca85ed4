// MappedPool's CUDA side over the CUDA runtime (built with KVCACHE_WITH_CUDA; see
// mapped_pool_cuda_stub.cc otherwise).
#include "client/mapped_pool_cuda.h"

#include <cuda_runtime_api.h>

#include <algorithm>
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

// This thread's page-locked, device-mapped scratch of at least `bytes` (CopyPagesChecksummed's
// list and checksums), grown as needed and freed when the thread exits. Under unified addressing
// (every 64-bit platform CUDA supports) its host address is also its device address, on every
// device (cudaHostAllocPortable).
absl::StatusOr<char*> ThreadPageList(size_t bytes) {
  struct PageList {
    ~PageList() {
      if (memory != nullptr) cudaFreeHost(memory);  // fails harmlessly after CUDA's own teardown
    }
    char* memory = nullptr;
    size_t capacity = 0;
  };
  thread_local PageList list;
  if (bytes <= list.capacity) return list.memory;
  if (list.memory != nullptr) cudaFreeHost(list.memory);
  list.memory = nullptr;
  list.capacity = 0;
  const size_t capacity = std::max<size_t>(bytes, 4096);
  void* memory = nullptr;
  KVCACHE_CUDA_RETURN_IF_ERROR(
      cudaHostAlloc(&memory, capacity, cudaHostAllocMapped | cudaHostAllocPortable),
      "allocating the page list");
  list.memory = static_cast<char*>(memory);
  list.capacity = capacity;
  return list.memory;
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
  // The kernel reads the list from, and writes the checksums into, page-locked host memory of
  // this thread's: copying them up and down through a device allocation cost 100 us of a 128-page
  // batch on an H200 host (the kernel itself: 19 us). A thread's calls run one after another, on
  // its own stream (which keeps concurrent callers, and the legacy stream, apart).
  const size_t list_bytes = copies.size() * sizeof(kernels::PageCopy);
  ASSIGN_OR_RETURN(char* list, ThreadPageList(list_bytes + checksums.size() * sizeof(uint64_t)));
  std::memcpy(list, copies.data(), list_bytes);
  auto* listed_checksums = reinterpret_cast<uint64_t*>(list + list_bytes);
  const cudaStream_t stream = cudaStreamPerThread;
  RETURN_IF_ERROR(kernels::CopyPagesChecksummedCuda(reinterpret_cast<kernels::PageCopy*>(list),
                                                    static_cast<uint32_t>(copies.size()),
                                                    page_bytes, listed_checksums, stream));
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "copying the pages");
  std::memcpy(checksums.data(), listed_checksums, checksums.size() * sizeof(uint64_t));
  return absl::OkStatus();
}

}  // namespace kvcache::mapped_pool_internal
