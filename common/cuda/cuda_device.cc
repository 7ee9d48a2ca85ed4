// The build-independent half of cuda_device.h; the CUDA calls are in cuda_device_runtime.cc (or
// cuda_device_stub.cc).
#include "common/cuda/cuda_device.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"

namespace kvcache {

bool CudaDeviceAvailable() { return CudaDeviceCount().ok(); }

absl::Status CheckCudaDevice(int device) {
  if (device < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CUDA device ", device, " does not exist: ordinals start at 0"));
  }
  ASSIGN_OR_RETURN(const int count, CudaDeviceCount());
  if (device >= count) {
    return absl::FailedPreconditionError(absl::StrCat("CUDA device ", device,
                                                      " does not exist here: this process sees ",
                                                      count, " device(s) (CUDA_VISIBLE_DEVICES)"));
  }
  return absl::OkStatus();
}

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
