#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cache/cuda_pool_memory.h"

namespace kvcache {

absl::StatusOr<int> ParseCudaDevice(absl::string_view device) {
  int index = -1;
  absl::string_view number = device;
  if (!absl::ConsumePrefix(&number, "cuda:") || !absl::SimpleAtoi(number, &index) || index < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("device '", device, "' is not of the form cuda:N"));
  }
  return index;
}

}  // namespace kvcache
