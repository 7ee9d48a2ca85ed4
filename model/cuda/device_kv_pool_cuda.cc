// DeviceKvPool's CUDA calls over the CUDA runtime (built with KVCACHE_WITH_CUDA;
// device_kv_pool_stub.cc otherwise).
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/scoped_cuda_device.h"
#include "model/cuda/device_kv_pool.h"

namespace kvcache::worker {

absl::StatusOr<uint8_t*> DeviceKvPool::AllocateZeroed(int device, uint64_t bytes) {
  ScopedCudaDevice scoped;
  KVCACHE_CUDA_RETURN_IF_ERROR(scoped.Set(device), absl::StrCat("cudaSetDevice(", device, ")"));
  void* base = nullptr;
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, bytes),
                               absl::StrCat("cudaMalloc of a ", bytes, "-byte KV pool"));
  // cudaMemset on the legacy default stream; the synchronize makes the fill complete before any
  // stream (the model's is non-blocking, so it would not wait for it) touches the pool.
  cudaError_t error = cudaMemset(base, 0, bytes);
  if (error == cudaSuccess) error = cudaDeviceSynchronize();
  if (error != cudaSuccess) {
    const absl::Status status = CudaStatus(error, "zero-filling the device KV pool");
    Release(static_cast<uint8_t*>(base), device);
    return status;
  }
  return static_cast<uint8_t*>(base);
}

void DeviceKvPool::Release(uint8_t* base, int device) {
  ScopedCudaDevice scoped;
  (void)scoped.Set(device);  // freed on whichever device is current if this fails
  if (cudaFree(base) != cudaSuccess) cudaGetLastError();
}

}  // namespace kvcache::worker
