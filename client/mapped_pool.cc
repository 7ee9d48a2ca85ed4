#include "client/mapped_pool.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "client/mapped_pool_cuda.h"
#include "common/cuda/cuda_device.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

absl::Status ErrnoStatus(int error, absl::string_view what) {
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  switch (error) {
    case ENOENT:
      return absl::NotFoundError(absl::StrCat(
          message, " (the daemon that made it has stopped or restarted: describe the pool again)"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(message);
    case ENOMEM:
    case EMFILE:
    case ENFILE:
      return absl::ResourceExhaustedError(message);
    default:
      return absl::InternalError(message);
  }
}

absl::Status CheckDescription(const KvCacheClient::PoolInfo& pool) {
  const uint64_t block_bytes = pool.layout.BlockBytes();
  if (!pool.layout.Validate().ok() || block_bytes != pool.block_bytes || pool.num_blocks == 0 ||
      pool.mapping.size_bytes / block_bytes < pool.num_blocks) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool '", pool.name, "' is described inconsistently: layout ", pool.layout.DebugString(),
        " (", block_bytes, " bytes per block), block_bytes ", pool.block_bytes, ", ",
        pool.num_blocks, " blocks, mapping of ", pool.mapping.size_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

bool MappedPool::BuiltWithCuda() { return ::kvcache::BuiltWithCuda(); }

absl::StatusOr<std::unique_ptr<MappedPool>> MappedPool::Map(const KvCacheClient::PoolInfo& pool,
                                                            uint64_t epoch) {
  using Kind = KvCacheClient::PoolMapping::Kind;
  switch (pool.mapping.kind) {
    case Kind::kShm:
      return MapShm(pool, epoch);
    case Kind::kCudaIpc:
      return MapCudaIpc(pool, epoch);
    default:
      return absl::FailedPreconditionError(absl::StrCat(
          "pool '", pool.name, "' offers no mapping: move its bytes with GetBlocks / PutBlocks"));
  }
}

absl::StatusOr<std::unique_ptr<MappedPool>> MappedPool::MapShm(const KvCacheClient::PoolInfo& pool,
                                                               uint64_t epoch) {
  const KvCacheClient::PoolMapping& mapping = pool.mapping;
  if (absl::Status status = CheckDescription(pool); !status.ok()) return status;

  const std::string& shm_name = mapping.shm_name;
  const int fd = shm_open(shm_name.c_str(), O_RDWR, 0);
  if (fd < 0) return ErrnoStatus(errno, absl::StrCat("opening shared memory ", shm_name));
  struct stat info;
  if (fstat(fd, &info) != 0) {
    const int error = errno;
    close(fd);
    return ErrnoStatus(error, absl::StrCat("inspecting shared memory ", shm_name));
  }
  if (static_cast<uint64_t>(info.st_size) != mapping.size_bytes) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("shared memory ", shm_name, " holds ", info.st_size, " bytes; pool '",
                     pool.name, "' of epoch ", epoch, " should have ", mapping.size_bytes,
                     ": it is not that daemon's pool (describe the pool again)"));
  }
  // Populated now, once: faulting the pages in block by block later cost shipments ~30% of
  // their bandwidth (bench/transport_bench).
  void* base =
      mmap(nullptr, mapping.size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  const int error = errno;
  close(fd);  // the mapping keeps the object alive
  if (base == MAP_FAILED) {
    return ErrnoStatus(error, absl::StrCat("mapping shared memory ", shm_name));
  }
  return std::unique_ptr<MappedPool>(
      new MappedPool(pool, epoch, static_cast<uint8_t*>(base), mapping.size_bytes, /*device=*/-1));
}

absl::StatusOr<std::unique_ptr<MappedPool>> MappedPool::MapCudaIpc(
    const KvCacheClient::PoolInfo& pool, uint64_t epoch) {
  const KvCacheClient::PoolMapping& mapping = pool.mapping;
  if (absl::Status status = CheckDescription(pool); !status.ok()) return status;
  if (mapping.cuda_ipc_handle.size() != mapped_pool_internal::kCudaIpcHandleBytes ||
      mapping.cuda_device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool '", pool.name, "' is described inconsistently: a CUDA IPC handle of ",
        mapping.cuda_ipc_handle.size(), " bytes (a handle is ",
        mapped_pool_internal::kCudaIpcHandleBytes, " bytes) on cuda:", mapping.cuda_device));
  }
  absl::StatusOr<uint8_t*> base = mapped_pool_internal::OpenCudaIpcMapping(
      mapping.cuda_ipc_handle, mapping.cuda_device, pool.name);
  if (!base.ok()) return base.status();
  return std::unique_ptr<MappedPool>(
      new MappedPool(pool, epoch, *base, mapping.size_bytes, mapping.cuda_device));
}

MappedPool::~MappedPool() {
  if (is_device()) {
    mapped_pool_internal::CloseCudaIpcMapping(base_, device_);
  } else {
    munmap(base_, size_bytes_);
  }
}

absl::Status MappedPool::CheckHost(absl::string_view accessor) const {
  if (!is_device()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "pool '", name_, "' is mapped as device memory on cuda:", device_, "; ", accessor,
      " hands out host memory: use Block() with CUDA (cudaMemcpy, kernels, NCCL)"));
}

absl::StatusOr<absl::Span<uint8_t>> MappedPool::CheckedBlock(uint32_t block_id) const {
  if (absl::Status status = CheckHost("CheckedBlock"); !status.ok()) return status;
  if (block_id >= num_blocks_) {
    return absl::OutOfRangeError(absl::StrCat("block ", block_id, " is past pool '", name_, "' of ",
                                              num_blocks_, " blocks"));
  }
  return absl::Span<uint8_t>(Block(block_id), block_bytes_);
}

absl::StatusOr<absl::Span<uint8_t>> MappedPool::Part(uint32_t block_id,
                                                     absl::string_view part) const {
  ASSIGN_OR_RETURN(const absl::Span<uint8_t> page, CheckedBlock(block_id));
  // The one-bit mask of `part`, or the daemon's own error naming the parts there are.
  ASSIGN_OR_RETURN(const uint32_t mask, PartMaskOf(parts_, {std::string(part)}));
  const PagePartLayout& layout = parts_[std::countr_zero(mask)];
  return page.subspan(layout.offset, layout.bytes);
}

absl::StatusOr<uint8_t*> MappedPool::KvStart(uint32_t block_id, uint32_t layer, uint32_t kv,
                                             size_t element_bytes) const {
  if (absl::Status status = CheckHost(kv == 0 ? "Keys" : "Values"); !status.ok()) return status;
  if (element_bytes != DTypeBytes(layout_.dtype)) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool '", name_, "' holds ", DTypeName(layout_.dtype), " elements of ",
                     DTypeBytes(layout_.dtype), " bytes; asked for a span of ", element_bytes,
                     "-byte elements"));
  }
  if (block_id >= num_blocks_ || layer >= layout_.num_layers) {
    return absl::OutOfRangeError(absl::StrCat("block ", block_id, " layer ", layer,
                                              " is past pool '", name_, "' of ", num_blocks_,
                                              " blocks and ", layout_.num_layers, " layers"));
  }
  return Block(block_id) + layout_.KvOffset(layer, kv);
}

}  // namespace kvcache
