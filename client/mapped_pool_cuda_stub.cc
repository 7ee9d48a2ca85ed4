// MappedPool's CUDA side in a build without CUDA: device pools cannot be mapped.
#include "absl/strings/str_cat.h"
#include "client/mapped_pool_cuda.h"
#include "common/cuda/not_built.h"
#include "kernels/page_checksum.h"

namespace kvcache::mapped_pool_internal {

absl::StatusOr<uint8_t*> OpenCudaIpcMapping(absl::string_view handle, int device,
                                            absl::string_view pool) {
  return NotBuiltWith("CUDA", absl::StrCat("pool '", pool, "' is device memory (CUDA IPC, cuda:",
                                           device, "; GetBlocks / PutBlocks move its bytes)"));
}

void CloseCudaIpcMapping(uint8_t* base, int device) {}

absl::Status CopyPagesChecksummed(int device, absl::Span<const kernels::PageCopy> copies,
                                  uint64_t page_bytes, absl::Span<uint64_t> checksums) {
  return NotBuiltWith("CUDA", absl::StrCat("copying pages on cuda:", device));
}

}  // namespace kvcache::mapped_pool_internal
