// MappedPool's CUDA side in a build without CUDA: device pools cannot be mapped.
#include "absl/strings/str_cat.h"
#include "client/mapped_pool_cuda.h"

namespace kvcache::mapped_pool_internal {

bool BuiltWithCuda() { return false; }

absl::StatusOr<uint8_t*> OpenCudaIpcMapping(absl::string_view handle, int device,
                                            absl::string_view pool) {
  return absl::FailedPreconditionError(absl::StrCat(
      "pool '", pool, "' is device memory (CUDA IPC, cuda:", device,
      "): this client was built without CUDA; move its bytes with GetBlocks / PutBlocks"));
}

void CloseCudaIpcMapping(uint8_t* base, int device) {}

}  // namespace kvcache::mapped_pool_internal
