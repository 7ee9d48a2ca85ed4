// What this binary and this machine offer of CUDA, asked in the same way by every library and
// test: whether the build has CUDA at all, and whether (and which) devices exist. Needs no CUDA
// header, so code built either way includes it; cuda_device_runtime.cc answers over the CUDA
// runtime, cuda_device_stub.cc for a build without CUDA. Thread-safe.
#ifndef KVCACHE_COMMON_CUDA_CUDA_DEVICE_H_
#define KVCACHE_COMMON_CUDA_CUDA_DEVICE_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvcache {

// True when this binary was compiled with the CUDA paths (KVCACHE_WITH_CUDA).
bool BuiltWithCuda();

// The number of CUDA devices this process sees (CUDA_VISIBLE_DEVICES applies), at least 1.
// FAILED_PRECONDITION "built without CUDA" in a build without CUDA, and "no CUDA device: <why>"
// when the runtime finds none, whatever the reason (no driver, a stub driver, no device).
absl::StatusOr<int> CudaDeviceCount();

// True when CudaDeviceCount succeeds: the build has CUDA and the machine a device.
bool CudaDeviceAvailable();

// OK when CUDA device `device` exists here. INVALID_ARGUMENT for a negative device;
// CudaDeviceCount's errors; FAILED_PRECONDITION "CUDA device N does not exist here" past the
// devices this process sees.
absl::Status CheckCudaDevice(int device);

// Parses "cuda:N" (N >= 0); INVALID_ARGUMENT otherwise. Says nothing about the device existing.
absl::StatusOr<int> ParseCudaDevice(absl::string_view device);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_CUDA_CUDA_DEVICE_H_
