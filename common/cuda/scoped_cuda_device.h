// ScopedCudaDevice: makes a CUDA device current for a scope and gives the caller's current device
// back at its end (the calls that take a device ordinal must not change the calling thread's
// state). Include only from files built with CUDA; header-only, so every library can use it
// without linking the runtime through common/.
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

  // cudaSuccess, or the error of cudaGetDevice / cudaSetDevice(device).
  cudaError_t Set(int device) {
    int previous = 0;
    cudaError_t error = cudaGetDevice(&previous);
    if (error != cudaSuccess || previous == device) return error;
    error = cudaSetDevice(device);
    if (error != cudaSuccess) return error;
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
