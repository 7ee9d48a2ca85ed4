#include "cache/cuda_pool_memory.h"

#include <cuda_runtime_api.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "common/cuda/cuda_status.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

class CudaPoolMemory final : public PoolMemory {
 public:
  CudaPoolMemory(int device, uint8_t* base, cudaStream_t stream, cudaIpcMemHandle_t handle,
                 uint64_t block_bytes, uint32_t num_blocks)
      : PoolMemory(block_bytes, num_blocks),
        device_(device),
        base_(base),
        stream_(stream),
        handle_(handle) {}

  ~CudaPoolMemory() override {
    cudaSetDevice(device_);
    cudaStreamDestroy(stream_);
    cudaFree(base_);
  }

  std::string kind() const override { return "cuda"; }

  MappingInfo mapping() const override {
    MappingInfo info;
    info.kind = MappingInfo::Kind::kCudaIpc;
    info.size_bytes = block_bytes() * num_blocks();
    info.cuda_ipc_handle.assign(reinterpret_cast<const char*>(&handle_), sizeof(handle_));
    info.cuda_device = device_;
    return info;
  }

  absl::Status CopyBlock(uint32_t src, uint32_t dst) override {
    RETURN_IF_ERROR(CheckRange(src, 0, block_bytes()));
    RETURN_IF_ERROR(CheckRange(dst, 0, block_bytes()));
    if (src == dst) return absl::OkStatus();
    KVCACHE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "selecting the pool's device");
    KVCACHE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(BlockPointer(dst), BlockPointer(src),
                                                 block_bytes(), cudaMemcpyDeviceToDevice, stream_),
                                 "copying a block");
    return CudaStatus(cudaStreamSynchronize(stream_), "copying a block");
  }

  // Every copy runs on the pool's own stream, which is non-blocking: a plain cudaMemcpy runs on
  // the legacy stream and may return before its DMA lands (from pageable memory), so a batch
  // queued next on stream_ could read the block's old bytes.
  absl::Status Write(uint32_t block, uint64_t offset, absl::string_view bytes) override {
    RETURN_IF_ERROR(CheckRange(block, offset, bytes.size()));
    KVCACHE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "selecting the pool's device");
    KVCACHE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(BlockPointer(block) + offset, bytes.data(),
                                                 bytes.size(), cudaMemcpyHostToDevice, stream_),
                                 "writing block bytes");
    return CudaStatus(cudaStreamSynchronize(stream_), "writing block bytes");
  }

  absl::Status Read(uint32_t block, uint64_t offset, uint64_t size, char* out) const override {
    RETURN_IF_ERROR(CheckRange(block, offset, size));
    KVCACHE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "selecting the pool's device");
    KVCACHE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(out, BlockPointer(block) + offset, size, cudaMemcpyDeviceToHost, stream_),
        "reading block bytes");
    return CudaStatus(cudaStreamSynchronize(stream_), "reading block bytes");
  }

  absl::Status CopyToHost(absl::Span<const HostCopy> copies) const override {
    return CopyBatch(copies, cudaMemcpyDeviceToHost, "copying blocks to the host", [] {});
  }

  absl::Status CopyFromHost(absl::Span<const HostCopy> copies,
                            absl::Span<uint64_t> host_checksums) override {
    return CopyBatch(copies, cudaMemcpyHostToDevice, "copying blocks from the host", [&] {
      for (size_t i = 0; i < host_checksums.size(); ++i) {
        host_checksums[i] = BlockChecksum(copies[i].host, block_bytes());
      }
    });
  }

  absl::Status RegisterHostMemory(void* base, uint64_t size) override {
    KVCACHE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "selecting the pool's device");
    return CudaStatus(cudaHostRegister(base, size, cudaHostRegisterPortable),
                      absl::StrCat("page-locking ", size, " bytes of host memory"));
  }

  void UnregisterHostMemory(void* base) override { cudaHostUnregister(base); }

  absl::StatusOr<uint64_t> Checksum(uint32_t block) const override {
    std::vector<char> host(block_bytes());
    RETURN_IF_ERROR(Read(block, 0, block_bytes(), host.data()));
    return BlockChecksum(host.data(), host.size());
  }

 private:
  uint8_t* BlockPointer(uint32_t block) const { return base_ + uint64_t{block} * block_bytes(); }

  // Queues every copy of the batch on the pool's stream, runs `while_copying` while they run,
  // and waits. What was queued is waited for even when a later copy fails to queue: the caller
  // reuses the host memory on failure, and no copy may outlive it.
  absl::Status CopyBatch(absl::Span<const HostCopy> copies, cudaMemcpyKind kind,
                         absl::string_view what, absl::FunctionRef<void()> while_copying) const {
    for (const HostCopy& copy : copies) RETURN_IF_ERROR(CheckRange(copy.block, 0, block_bytes()));
    KVCACHE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "selecting the pool's device");
    absl::Status queued;
    for (const HostCopy& copy : copies) {
      void* const device = BlockPointer(copy.block);
      queued = CudaStatus(kind == cudaMemcpyHostToDevice
                              ? cudaMemcpyAsync(device, copy.host, block_bytes(), kind, stream_)
                              : cudaMemcpyAsync(copy.host, device, block_bytes(), kind, stream_),
                          what);
      if (!queued.ok()) break;
    }
    if (queued.ok()) while_copying();
    const absl::Status done = CudaStatus(cudaStreamSynchronize(stream_), what);
    return queued.ok() ? done : queued;
  }

  const int device_;
  uint8_t* const base_;
  const cudaStream_t stream_;
  const cudaIpcMemHandle_t handle_;
};

}  // namespace

absl::StatusOr<std::unique_ptr<PoolMemory>> CreateCudaPoolMemory(int device, uint64_t block_bytes,
                                                                 uint32_t num_blocks) {
  const uint64_t total = block_bytes * num_blocks;
  if (total == 0) return absl::InvalidArgumentError("pool memory of 0 bytes");
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), absl::StrCat("selecting cuda:", device));
  void* base = nullptr;
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaMalloc(&base, total),
                               absl::StrCat("allocating ", total, " bytes on cuda:", device));
  cudaIpcMemHandle_t handle;
  cudaStream_t stream = nullptr;
  absl::Status status = CudaStatus(cudaIpcGetMemHandle(&handle, base), "exporting the pool");
  if (status.ok()) {
    status = CudaStatus(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                        "creating the pool's stream");
  }
  if (!status.ok()) {
    cudaFree(base);
    return status;
  }
  return std::unique_ptr<PoolMemory>(new CudaPoolMemory(device, static_cast<uint8_t*>(base), stream,
                                                        handle, block_bytes, num_blocks));
}

}  // namespace kvcache
