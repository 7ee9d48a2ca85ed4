// DeviceKvPool: a private, zero-filled KV pool in device memory (cudaMalloc) that this process
// owns: the pool of a GPU run that involves no daemon, such as the cold reference a cached GPU
// run is compared with (GenerateColdCuda, worker/generation.h). Block i starts at
// base() + i * layout().BlockBytes(), as in a daemon's pool.
//
// Built without CUDA, Create checks its arguments and then answers FAILED_PRECONDITION ("built
// without CUDA").
// Thread-safety: thread-compatible; the bytes are the caller's to synchronize. The calling
// thread's current CUDA device is restored by Create and the destructor.
#ifndef KVCACHE_MODEL_CUDA_DEVICE_KV_POOL_H_
#define KVCACHE_MODEL_CUDA_DEVICE_KV_POOL_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/pool_layout.h"

namespace kvcache::worker {

class DeviceKvPool {
 public:
  // Allocates and zero-fills `num_blocks` blocks of `layout` on CUDA device `device` (the fill is
  // complete when Create returns). Errors: INVALID_ARGUMENT for an invalid layout, zero blocks or
  // a negative device; FAILED_PRECONDITION in a build without CUDA ("built without CUDA") or with
  // no usable CUDA device ("no CUDA device") or no device `device`; RESOURCE_EXHAUSTED when the
  // device is out of memory; INTERNAL for any other CUDA error, with its text.
  static absl::StatusOr<DeviceKvPool> Create(int device, const PoolLayout& layout,
                                             uint32_t num_blocks);

  // cudaFree. REQUIRES: no device work still uses the pool (synchronize it first; a
  // CudaQwen3MoeModel::Forward that returned has). Move-only; a moved-from pool owns nothing.
  ~DeviceKvPool();
  DeviceKvPool(DeviceKvPool&& other) noexcept;
  DeviceKvPool& operator=(DeviceKvPool&& other) noexcept;
  DeviceKvPool(const DeviceKvPool&) = delete;
  DeviceKvPool& operator=(const DeviceKvPool&) = delete;

  // Device address of block 0 on device(); nullptr for a moved-from pool.
  uint8_t* base() const { return base_; }
  int device() const { return device_; }
  const PoolLayout& layout() const { return layout_; }
  uint32_t num_blocks() const { return num_blocks_; }

 private:
  DeviceKvPool(uint8_t* base, int device, const PoolLayout& layout, uint32_t num_blocks)
      : base_(base), device_(device), layout_(layout), num_blocks_(num_blocks) {}
  void Free();

  // The CUDA calls, in device_bytes_cuda.cc (device_bytes_stub.cc without CUDA). Both leave
  // the calling thread's current device as they found it.
  // `bytes` of zero-filled memory on `device`, the fill complete. REQUIRES: device exists.
  static absl::StatusOr<uint8_t*> AllocateZeroed(int device, uint64_t bytes);
  // Frees an allocation of AllocateZeroed; best effort.
  static void Release(uint8_t* base, int device);

  uint8_t* base_ = nullptr;  // owned device allocation; nullptr when moved from
  int device_ = -1;
  PoolLayout layout_;
  uint32_t num_blocks_ = 0;
};

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_CUDA_DEVICE_KV_POOL_H_
