// The launch behind CopyPagesChecksummedCuda in a build without CUDA: the function still checks
// its arguments (page_checksum.cc), then answers FAILED_PRECONDITION("built without CUDA").
#include "common/cuda/not_built.h"
#include "kernels/page_checksum_internal.h"

namespace kvcache::kernels::internal {

absl::Status LaunchCopyPagesChecksummed(const PageCopy*, uint32_t, uint64_t, uint64_t*,
                                        const xxh3_blocks::Keys&, void*) {
  return NotBuiltWith("CUDA");
}

}  // namespace kvcache::kernels::internal
