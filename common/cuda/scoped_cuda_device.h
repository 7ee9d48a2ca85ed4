// ScopedCudaDevice: makes a CUDA device current for a scope and gives the caller's current device
// back at its end (the calls that take a device ordinal must not change the calling thread's
// state). Include only from files built with CUDA (kvcache::cuda links the runtime for them).
#ifndef KVCACHE_COMMON_CUDA_SCOPED_CUDA_DEVICE_H_
#define KVCACHE_COMMON_CUDA_SCOPED_CUDA_DEVICE_H_

#include <cuda_runtime_api.h>

namespace kvcache {

class ScopedCudaDevice {
 public:
  ScopedCudaDevice() = default;
  ~ScopedCudaDevice() {
    // Nothing to report from a destructor: clear a failed restore's sticky error.
    if (restore_ && cudaSetDevice(previous_) != cudaSuccess) cudaGetLastError();
  }
  ScopedCudaDevice(const ScopedCudaDevice&) = delete;
  ScopedCudaDevice& operator=(const ScopedCudaDevice&) = delete;

  // cudaSuccess, or the error of cudaGetDevice / cudaSetDevice(device). The error is returned,
  // not left behind: it is cleared from the runtime's last error, so that a caller that goes on
  // regardless (a destructor freeing on whichever device is current) cannot see it resurface in
  // a later launch check.
  cudaError_t Set(int device) {
    int previous = 0;
    cudaError_t error = cudaGetDevice(&previous);
    if (error == cudaSuccess && previous != device) error = cudaSetDevice(device);
    if (error != cudaSuccess) {
      cudaGetLastError();
      return error;
    }
    if (previous == device) return cudaSuccess;
    previous_ = previous;
    restore_ = true;
    return cudaSuccess;
  }

 private:
  int previous_ = 0;
  bool restore_ = false;
};

}  // namespace kvcache

#endif  // KVCACHE_COMMON_CUDA_SCOPED_CUDA_DEVICE_H_
