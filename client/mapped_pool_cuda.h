// The CUDA runtime side of MappedPool (client/mapped_pool.h): opening and closing a pool's CUDA
// IPC handle, and the page copies of the page calls through a device mapping. Kept apart so that
// only mapped_pool_cuda.cc includes the CUDA headers; a build without CUDA links
// mapped_pool_cuda_stub.cc instead, which refuses device pools.
//
// Thread safety: thread-safe (the CUDA runtime is); each call leaves the calling thread's current
// CUDA device as it found it.
#ifndef KVCACHE_CLIENT_MAPPED_POOL_CUDA_H_
#define KVCACHE_CLIENT_MAPPED_POOL_CUDA_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvcache::kernels {
struct PageCopy;  // kernels/page_checksum.h (not installed with the client's headers)
}  // namespace kvcache::kernels

namespace kvcache::mapped_pool_internal {

// Size of a raw cudaIpcMemHandle_t (CUDA_IPC_HANDLE_SIZE); checked against the CUDA headers in
// mapped_pool_cuda.cc.
inline constexpr size_t kCudaIpcHandleBytes = 64;

// Opens `handle` (kCudaIpcHandleBytes raw bytes; REQUIRES: that size) with
// cudaIpcOpenMemHandle(cudaIpcMemLazyEnablePeerAccess) on CUDA device `device` (REQUIRES:
// device >= 0) and returns the device address of the allocation's first byte. `pool` names the
// pool in error messages. Errors (CUDA's as common/cuda/cuda_status.h maps them):
//   FAILED_PRECONDITION  no usable CUDA device or driver ("no CUDA device"), no device `device`,
//                        the handle cannot be opened (its daemon stopped or restarted, or it is
//                        this process's own allocation), or a build without CUDA ("built
//                        without CUDA")
//   RESOURCE_EXHAUSTED   the device is out of memory or peer mappings
//   INTERNAL             any other CUDA error, with cudaGetErrorString
absl::StatusOr<uint8_t*> OpenCudaIpcMapping(absl::string_view handle, int device,
                                            absl::string_view pool);

// Closes a mapping that OpenCudaIpcMapping returned for `device`. Best effort: an error (a
// driver already torn down at exit) is dropped.
void CloseCudaIpcMapping(uint8_t* base, int device);

// The device side of KvCacheClient::WritePages and ReadPagesInto: copies each page (page_bytes)
// on CUDA device `device` and sets checksums[i] to its source's BlockChecksum, in one kernel
// (kernels/page_checksum.h) on the calling thread's per-thread stream, synchronized before it
// returns. Sources and destinations are device addresses on `device` (or memory it reaches).
// REQUIRES: checksums.size() == copies.size(), kernels::ValidatePageCopies passed. Errors:
// CUDA's, as common/cuda/cuda_status.h maps them (a bad address faults here, INTERNAL), or
// FAILED_PRECONDITION in a build without CUDA.
absl::Status CopyPagesChecksummed(int device, absl::Span<const kernels::PageCopy> copies,
                                  uint64_t page_bytes, absl::Span<uint64_t> checksums);

}  // namespace kvcache::mapped_pool_internal

#endif  // KVCACHE_CLIENT_MAPPED_POOL_CUDA_H_
