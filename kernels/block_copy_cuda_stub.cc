// The CUDA entry points of block_copy.h for a build without CUDA: they exist so that callers link
// either way, and report UNIMPLEMENTED.
#include "kernels/block_copy.h"

namespace kvcache::kernels {
namespace {

absl::Status NoCuda() { return absl::UnimplementedError("built without CUDA"); }

}  // namespace

bool BuiltWithCuda() { return false; }

bool CudaDeviceAvailable() { return false; }

absl::Status CopyBlocksCuda(uint8_t*, uint64_t, uint32_t, const int64_t*, const int64_t*, uint32_t,
                            void*) {
  return NoCuda();
}

absl::Status GatherBlocksCuda(const uint8_t*, uint64_t, uint32_t, const int64_t*, uint32_t,
                              uint8_t*, void*) {
  return NoCuda();
}

absl::Status ScatterBlocksCuda(const uint8_t*, uint64_t, uint32_t, const int64_t*, uint32_t,
                               uint8_t*, void*) {
  return NoCuda();
}

}  // namespace kvcache::kernels
