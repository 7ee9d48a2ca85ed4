// Device allocations (device_bytes.h) and DeviceLinearAttentionState's copies over the CUDA
// runtime (built with KVCACHE_WITH_CUDA; device_bytes_stub.cc otherwise).
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/scoped_cuda_device.h"
#include "model/cuda/device_bytes.h"
#include "model/cuda/device_kv_pool.h"
#include "model/cuda/device_linear_state.h"

namespace kvcache::worker {

absl::StatusOr<uint8_t*> AllocateZeroedDeviceBytes(int device, uint64_t bytes,
                                                   absl::string_view what) {
  ScopedCudaDevice scoped;
  KVCACHE_CUDA_RETURN_IF_ERROR(scoped.Set(device), absl::StrCat("cudaSetDevice(", device, ")"));
  void* base = nullptr;
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, bytes),
                               absl::StrCat("cudaMalloc of a ", bytes, "-byte ", what));
  // cudaMemset on the legacy default stream; the synchronize makes the fill complete before any
  // stream (the model's is non-blocking, so it would not wait for it) touches the memory.
  cudaError_t error = cudaMemset(base, 0, bytes);
  if (error == cudaSuccess) error = cudaDeviceSynchronize();
  if (error != cudaSuccess) {
    const absl::Status status = CudaStatus(error, absl::StrCat("zero-filling the device ", what));
    ReleaseDeviceBytes(static_cast<uint8_t*>(base), device);
    return status;
  }
  return static_cast<uint8_t*>(base);
}

void ReleaseDeviceBytes(uint8_t* base, int device) {
  ScopedCudaDevice scoped;
  (void)scoped.Set(device);  // freed on whichever device is current if this fails
  if (cudaFree(base) != cudaSuccess) cudaGetLastError();
}

absl::StatusOr<uint8_t*> DeviceKvPool::AllocateZeroed(int device, uint64_t bytes) {
  return AllocateZeroedDeviceBytes(device, bytes, "KV pool");
}

void DeviceKvPool::Release(uint8_t* base, int device) { ReleaseDeviceBytes(base, device); }

namespace {

// A copy in order on `stream`, waited for.
absl::Status CopyAndWait(void* dst, const void* src, uint64_t bytes, cudaMemcpyKind kind,
                         void* stream, const char* what) {
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(dst, src, bytes, kind, cuda_stream), what);
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cuda_stream), what);
  return absl::OkStatus();
}

}  // namespace

absl::Status DeviceLinearAttentionState::CopyToHost(const float* device_src, uint8_t* dst,
                                                    uint64_t bytes, void* stream) {
  return CopyAndWait(dst, device_src, bytes, cudaMemcpyDeviceToHost, stream,
                     "copying the linear-attention state to the host");
}

absl::Status DeviceLinearAttentionState::CopyToDevice(const uint8_t* src, float* device_dst,
                                                      uint64_t bytes, void* stream) {
  return CopyAndWait(device_dst, src, bytes, cudaMemcpyHostToDevice, stream,
                     "copying the linear-attention state to the device");
}

absl::Status DeviceLinearAttentionState::CopyOnDevice(int device, const void* device_src,
                                                      void* device_dst, uint64_t bytes,
                                                      void* stream) {
  ScopedCudaDevice scoped;
  KVCACHE_CUDA_RETURN_IF_ERROR(scoped.Set(device), absl::StrCat("cudaSetDevice(", device, ")"));
  return CopyAndWait(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, stream,
                     "copying a linear-attention state on the device");
}

absl::Status DeviceLinearAttentionState::ZeroOnDevice(int device, float* device_dst, uint64_t bytes,
                                                      void* stream) {
  ScopedCudaDevice scoped;
  KVCACHE_CUDA_RETURN_IF_ERROR(scoped.Set(device), absl::StrCat("cudaSetDevice(", device, ")"));
  const auto cuda_stream = static_cast<cudaStream_t>(stream);
  constexpr char kWhat[] = "zeroing the linear-attention state";
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaMemsetAsync(device_dst, 0, bytes, cuda_stream), kWhat);
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(cuda_stream), kWhat);
  return absl::OkStatus();
}

}  // namespace kvcache::worker
