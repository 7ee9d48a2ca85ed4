#include "cache/cuda_pool_memory.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/block_checksum.h"
#include "common/cuda/cuda_status.h"
#include "common/status_macros.h"
#include "kernels/page_checksum.h"

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
    if (checksum_list_ != nullptr) cudaFreeHost(checksum_list_);
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

  // One kernel over the batch (kernels/page_checksum.h), reading each block where it lies: a
  // commit of pages written without their checksums (CommitPages) staged every block through
  // the host, one synchronized copy each. Block sizes the kernel cannot hash (not a multiple of
  // 64 bytes, or under 256) take that path still.
  absl::Status ChecksumBlocks(absl::Span<const uint32_t> blocks,
                              absl::Span<uint64_t> checksums) const override {
    if (blocks.empty()) return absl::OkStatus();
    if (!kernels::CheckChecksummedPageBytes(block_bytes()).ok()) {
      return PoolMemory::ChecksumBlocks(blocks, checksums);
    }
    for (const uint32_t block : blocks) RETURN_IF_ERROR(CheckRange(block, 0, block_bytes()));
    const size_t list_bytes = blocks.size() * sizeof(kernels::PageCopy);
    // The pool's device current before the list is allocated: it is mapped for that context.
    KVCACHE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_), "selecting the pool's device");
    absl::MutexLock lock(&checksum_mu_);
    ASSIGN_OR_RETURN(char* list, ChecksumListLocked(list_bytes + blocks.size() * sizeof(uint64_t)));
    auto* copies = reinterpret_cast<kernels::PageCopy*>(list);
    for (size_t i = 0; i < blocks.size(); ++i) {
      copies[i] = kernels::PageCopy{.source = BlockPointer(blocks[i]), .destination = nullptr};
    }
    auto* listed_checksums = reinterpret_cast<uint64_t*>(list + list_bytes);
    RETURN_IF_ERROR(kernels::CopyPagesChecksummedCuda(copies, static_cast<uint32_t>(blocks.size()),
                                                      block_bytes(), listed_checksums, stream_));
    KVCACHE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_), "checksumming blocks");
    std::memcpy(checksums.data(), listed_checksums, blocks.size() * sizeof(uint64_t));
    return absl::OkStatus();
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

  // ChecksumBlocks' list of blocks and their checksums, in page-locked host memory the device
  // reads and writes through its mapping (one address for both under unified addressing, as
  // client/mapped_pool_cuda.cc's lists): copying them through a device buffer cost more than
  // the kernel. Grown as batches need; one batch at a time.
  absl::StatusOr<char*> ChecksumListLocked(size_t bytes) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(checksum_mu_) {
    if (bytes <= checksum_list_bytes_) return checksum_list_;
    if (checksum_list_ != nullptr) cudaFreeHost(checksum_list_);
    checksum_list_ = nullptr;
    checksum_list_bytes_ = 0;
    const size_t capacity = std::max<size_t>(bytes, 4096);
    void* memory = nullptr;
    KVCACHE_CUDA_RETURN_IF_ERROR(
        cudaHostAlloc(&memory, capacity, cudaHostAllocMapped | cudaHostAllocPortable),
        "allocating the checksum list");
    checksum_list_ = static_cast<char*>(memory);
    checksum_list_bytes_ = capacity;
    return checksum_list_;
  }

  const int device_;
  uint8_t* const base_;
  const cudaStream_t stream_;
  const cudaIpcMemHandle_t handle_;
  mutable absl::Mutex checksum_mu_;
  mutable char* checksum_list_ ABSL_GUARDED_BY(checksum_mu_) = nullptr;
  mutable size_t checksum_list_bytes_ ABSL_GUARDED_BY(checksum_mu_) = 0;
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
