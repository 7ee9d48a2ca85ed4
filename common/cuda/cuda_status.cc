#include "common/cuda/cuda_status.h"

#include <string>

#include "absl/strings/str_cat.h"

namespace kvcache {

absl::Status CudaStatus(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorString(error), " (", cudaGetErrorName(error), ")");
  switch (error) {
    case cudaErrorMemoryAllocation:
    case cudaErrorTooManyPeers:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInvalidDevice:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInsufficientDriver:
    case cudaErrorStubLibrary:
    case cudaErrorCallRequiresNewerDriver:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorSystemNotReady:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNotSupported:
    case cudaErrorPeerAccessUnsupported:
      return absl::FailedPreconditionError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace kvcache
