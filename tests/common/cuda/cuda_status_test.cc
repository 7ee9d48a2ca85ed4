// common/cuda/cuda_status.h: the one CUDA error mapping. Built with CUDA only (it names CUDA
// error codes); needs no device, since it maps codes without calling the failing API.
#include "common/cuda/cuda_status.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TEST(CudaStatusTest, SuccessIsOk) { EXPECT_OK(CudaStatus(cudaSuccess, "anything")); }

TEST(CudaStatusTest, OutOfMemoryIsResourceExhausted) {
  EXPECT_THAT(CudaStatus(cudaErrorMemoryAllocation, "cudaMalloc of 8 bytes"),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       AllOf(HasSubstr("cudaMalloc of 8 bytes: "),
                             HasSubstr(cudaGetErrorString(cudaErrorMemoryAllocation)),
                             HasSubstr("cudaErrorMemoryAllocation"))));
  EXPECT_THAT(CudaStatus(cudaErrorTooManyPeers, "x"),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST(CudaStatusTest, NoDeviceOrDriverIsFailedPrecondition) {
  for (cudaError_t error :
       {cudaErrorNoDevice, cudaErrorInvalidDevice, cudaErrorDevicesUnavailable,
        cudaErrorInsufficientDriver, cudaErrorStubLibrary, cudaErrorCallRequiresNewerDriver,
        cudaErrorSystemDriverMismatch, cudaErrorSystemNotReady, cudaErrorCompatNotSupportedOnDevice,
        cudaErrorNotSupported, cudaErrorPeerAccessUnsupported}) {
    EXPECT_THAT(CudaStatus(error, "x"), StatusIs(absl::StatusCode::kFailedPrecondition))
        << cudaGetErrorName(error);
  }
}

TEST(CudaStatusTest, AnythingElseIsInternal) {
  for (cudaError_t error : {cudaErrorInvalidValue, cudaErrorIllegalAddress, cudaErrorLaunchFailure,
                            cudaErrorInvalidResourceHandle}) {
    EXPECT_THAT(CudaStatus(error, "x"), StatusIs(absl::StatusCode::kInternal))
        << cudaGetErrorName(error);
  }
}

TEST(CudaStatusTest, ReturnIfErrorReturnsTheMappedStatusAndEvaluatesWhatOnlyOnError) {
  int evaluated = 0;
  const auto what = [&evaluated] {
    ++evaluated;
    return "allocating";
  };
  const auto run = [&](cudaError_t error) -> absl::Status {
    KVCACHE_CUDA_RETURN_IF_ERROR(error, what());
    return absl::OkStatus();
  };
  EXPECT_OK(run(cudaSuccess));
  EXPECT_EQ(evaluated, 0);
  EXPECT_THAT(run(cudaErrorMemoryAllocation),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("allocating: ")));
  EXPECT_EQ(evaluated, 1);
}

}  // namespace
}  // namespace kvcache
