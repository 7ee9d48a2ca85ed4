// The launch behind CopyPagesChecksummedCuda (page_checksum.cu, or page_checksum_cuda_stub.cc
// without CUDA). Not part of the public API.
#ifndef KVCACHE_KERNELS_PAGE_CHECKSUM_INTERNAL_H_
#define KVCACHE_KERNELS_PAGE_CHECKSUM_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "kernels/page_checksum.h"
#include "kernels/xxh3_blocks.h"

namespace kvcache::kernels::internal {

// REQUIRES: CopyPagesChecksummedCuda's checks passed (page bytes, num_pages > 0, non-null
// arrays). Enqueues on `stream` and returns the launch error (kernels/cuda_launch.h), or
// FAILED_PRECONDITION "built without CUDA".
absl::Status LaunchCopyPagesChecksummed(const PageCopy* copies, uint32_t num_pages,
                                        uint64_t page_bytes, uint64_t* checksums,
                                        const xxh3_blocks::Keys& keys, void* stream);

}  // namespace kvcache::kernels::internal

#endif  // KVCACHE_KERNELS_PAGE_CHECKSUM_INTERNAL_H_
