#include "cache/pool_memory.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/block_checksum.h"
#include "common/status_macros.h"
#include "common/streaming_copy.h"
#include "kernels/block_copy.h"

namespace kvcache {
namespace {

absl::Status ErrnoStatus(absl::string_view what) {
  const int error = errno;
  const std::string message = absl::StrCat(what, ": ", std::strerror(error));
  if (error == EEXIST) return absl::AlreadyExistsError(message);
  if (error == ENOMEM || error == ENOSPC) return absl::ResourceExhaustedError(message);
  return absl::InternalError(message);
}

}  // namespace

absl::Status PoolMemory::CheckRange(uint32_t block, uint64_t offset, uint64_t size) const {
  if (block >= num_blocks_ || offset > block_bytes_ || size > block_bytes_ - offset) {
    return absl::OutOfRangeError(absl::StrCat("bytes [", offset, ", ", offset + size, ") of block ",
                                              block, " are outside a pool of ", num_blocks_,
                                              " blocks of ", block_bytes_, " bytes"));
  }
  return absl::OkStatus();
}

absl::Status PoolMemory::CopyToHost(absl::Span<const HostCopy> copies) const {
  for (const HostCopy& copy : copies) {
    RETURN_IF_ERROR(Read(copy.block, 0, block_bytes_, reinterpret_cast<char*>(copy.host)));
  }
  return absl::OkStatus();
}

absl::Status PoolMemory::CopyFromHost(absl::Span<const HostCopy> copies,
                                      absl::FunctionRef<void()> while_copying) {
  for (const HostCopy& copy : copies) {
    RETURN_IF_ERROR(Write(
        copy.block, 0, absl::string_view(reinterpret_cast<const char*>(copy.host), block_bytes_)));
  }
  while_copying();
  return absl::OkStatus();
}

std::string ShmNameFor(absl::string_view pool_name, uint64_t epoch) {
  return absl::StrFormat("/kvcache.%d.%016x.%s", getpid(), epoch, pool_name);
}

absl::StatusOr<std::unique_ptr<HostPoolMemory>> HostPoolMemory::Create(uint64_t block_bytes,
                                                                       uint32_t num_blocks) {
  const uint64_t total = block_bytes * num_blocks;
  if (total == 0) return absl::InvalidArgumentError("pool memory of 0 bytes");
  // Anonymous mappings are zero-filled and only backed by pages once touched.
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return ErrnoStatus(absl::StrCat("mapping ", total, " bytes"));
  return std::unique_ptr<HostPoolMemory>(
      new HostPoolMemory(static_cast<uint8_t*>(base), block_bytes, num_blocks, ""));
}

absl::StatusOr<std::unique_ptr<HostPoolMemory>> HostPoolMemory::CreateShared(std::string shm_name,
                                                                             uint64_t block_bytes,
                                                                             uint32_t num_blocks) {
  const uint64_t total = block_bytes * num_blocks;
  if (total == 0) return absl::InvalidArgumentError("pool memory of 0 bytes");
  const int fd = shm_open(shm_name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) return ErrnoStatus(absl::StrCat("creating shared memory ", shm_name));
  // The umask may have narrowed the mode further; never let it widen.
  fchmod(fd, 0600);
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    const absl::Status status = ErrnoStatus(absl::StrCat("sizing ", shm_name, " to ", total));
    close(fd);
    shm_unlink(shm_name.c_str());
    return status;
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (base == MAP_FAILED) {
    const absl::Status status = ErrnoStatus(absl::StrCat("mapping ", shm_name));
    shm_unlink(shm_name.c_str());
    return status;
  }
  return std::unique_ptr<HostPoolMemory>(new HostPoolMemory(
      static_cast<uint8_t*>(base), block_bytes, num_blocks, std::move(shm_name)));
}

HostPoolMemory::~HostPoolMemory() {
  munmap(base_, block_bytes() * num_blocks());
  if (!shm_name_.empty()) shm_unlink(shm_name_.c_str());
}

MappingInfo HostPoolMemory::mapping() const {
  MappingInfo info;
  if (shm_name_.empty()) return info;
  info.kind = MappingInfo::Kind::kShm;
  info.shm_name = shm_name_;
  info.size_bytes = block_bytes() * num_blocks();
  return info;
}

absl::Status HostPoolMemory::CopyBlock(uint32_t src, uint32_t dst) {
  if (src == dst) return CheckRange(src, 0, block_bytes());
  const int64_t from = src, to = dst;
  return kernels::CopyBlocksCpu(base_, block_bytes(), num_blocks(), {&from, 1}, {&to, 1});
}

absl::Status HostPoolMemory::Write(uint32_t block, uint64_t offset, absl::string_view bytes) {
  RETURN_IF_ERROR(CheckRange(block, offset, bytes.size()));
  StreamingCopy(Block(block) + offset, bytes.data(), bytes.size());
  return absl::OkStatus();
}

absl::Status HostPoolMemory::Read(uint32_t block, uint64_t offset, uint64_t size, char* out) const {
  RETURN_IF_ERROR(CheckRange(block, offset, size));
  std::memcpy(out, Block(block) + offset, size);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> HostPoolMemory::Checksum(uint32_t block) const {
  RETURN_IF_ERROR(CheckRange(block, 0, block_bytes()));
  return BlockChecksum(Block(block), block_bytes());
}

}  // namespace kvcache
