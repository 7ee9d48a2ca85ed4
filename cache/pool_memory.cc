#include "cache/pool_memory.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

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

// Whether the name `shm_name` still refers to the object open as `fd`.
bool NameRefersTo(const std::string& shm_name, int fd) {
  const int named = shm_open(shm_name.c_str(), O_RDONLY, 0);
  if (named < 0) return false;
  struct stat by_name, by_fd;
  const bool same = fstat(named, &by_name) == 0 && fstat(fd, &by_fd) == 0 &&
                    by_name.st_dev == by_fd.st_dev && by_name.st_ino == by_fd.st_ino;
  close(named);
  return same;
}

// Opens `shm_name` with an exclusive flock held until the descriptor is closed, creating it, or
// first unlinking one whose lock nobody holds and that has a size (a dead owner's pool). Returns an
// empty object: a lone empty one is one that its creator, dead or us, never sized. Every step that
// another claimant can overtake (it unlinks or replaces the object between our open and our lock)
// is detected by NameRefersTo and retried.
absl::StatusOr<int> ClaimSharedMemory(const std::string& shm_name, bool* reclaimed_stale) {
  for (int attempt = 0; attempt < 16; ++attempt) {
    const int fd = shm_open(shm_name.c_str(), O_CREAT | O_RDWR, 0600);
    if (fd < 0) return ErrnoStatus(absl::StrCat("creating shared memory ", shm_name));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
      const absl::Status status = ErrnoStatus(absl::StrCat("locking shared memory ", shm_name));
      const bool held = errno == EWOULDBLOCK;
      close(fd);
      if (!held) return status;
      return absl::AlreadyExistsError(absl::StrCat(
          "shared memory ", shm_name,
          " belongs to a live daemon (another kvcache-manager with the same listen address and "
          "pool); it is left alone"));
    }
    struct stat info;
    if (NameRefersTo(shm_name, fd) && fstat(fd, &info) == 0) {
      if (info.st_size == 0) return fd;
      shm_unlink(shm_name.c_str());
      *reclaimed_stale = true;
    }
    close(fd);
  }
  return absl::AbortedError(absl::StrCat("shared memory ", shm_name,
                                         " kept changing hands; is another daemon starting?"));
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

absl::Status PoolMemory::ChecksumBlocks(absl::Span<const uint32_t> blocks,
                                        absl::Span<uint64_t> checksums) const {
  for (size_t i = 0; i < blocks.size(); ++i) {
    ASSIGN_OR_RETURN(checksums[i], Checksum(blocks[i]));
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
                                      absl::Span<uint64_t> host_checksums) {
  for (size_t i = 0; i < copies.size(); ++i) {
    const HostCopy& copy = copies[i];
    if (host_checksums.empty()) {
      RETURN_IF_ERROR(
          Write(copy.block, 0,
                absl::string_view(reinterpret_cast<const char*>(copy.host), block_bytes_)));
      continue;
    }
    RETURN_IF_ERROR(CheckRange(copy.block, 0, block_bytes_));
    // Host memory: one pass that checksums the bytes from the registers the copy went through.
    if (uint8_t* block = MutableHostBlock(copy.block); block != nullptr) {
      host_checksums[i] =
          ChecksumWhileCopying(block, copy.host, block_bytes_, CopyStores::kStreaming);
      continue;
    }
    absl::Status written;
    host_checksums[i] =
        ChecksumWhileCopying(copy.host, block_bytes_, [&](uint64_t offset, uint64_t length) {
          if (!written.ok()) return;
          written =
              Write(copy.block, offset,
                    absl::string_view(reinterpret_cast<const char*>(copy.host) + offset, length));
        });
    RETURN_IF_ERROR(written);
  }
  return absl::OkStatus();
}

std::string ShmNameFor(absl::string_view owner, absl::string_view pool_name) {
  return absl::StrFormat("/kvcache.%016x.%s", XXH3_64bits(owner.data(), owner.size()), pool_name);
}

absl::StatusOr<std::unique_ptr<HostPoolMemory>> HostPoolMemory::Create(uint64_t block_bytes,
                                                                       uint32_t num_blocks) {
  const uint64_t total = block_bytes * num_blocks;
  if (total == 0) return absl::InvalidArgumentError("pool memory of 0 bytes");
  // Anonymous mappings are zero-filled and only backed by pages once touched.
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) return ErrnoStatus(absl::StrCat("mapping ", total, " bytes"));
  return std::unique_ptr<HostPoolMemory>(
      new HostPoolMemory(static_cast<uint8_t*>(base), block_bytes, num_blocks, "", -1, {}));
}

absl::StatusOr<std::unique_ptr<HostPoolMemory>> HostPoolMemory::CreateShared(std::string shm_name,
                                                                             uint64_t block_bytes,
                                                                             uint32_t num_blocks) {
  const uint64_t total = block_bytes * num_blocks;
  if (total == 0) return absl::InvalidArgumentError("pool memory of 0 bytes");
  Setup setup;
  ASSIGN_OR_RETURN(const int fd, ClaimSharedMemory(shm_name, &setup.reclaimed_stale));
  // The umask may have narrowed the mode further; never let it widen.
  fchmod(fd, 0600);
  const auto fail = [&](absl::string_view what) {
    const absl::Status status = ErrnoStatus(what);
    shm_unlink(shm_name.c_str());
    close(fd);
    return status;
  };
  if (ftruncate(fd, static_cast<off_t>(total)) != 0) {
    return fail(absl::StrCat("sizing ", shm_name, " to ", total, " bytes"));
  }
  // Pre-faulting: tmpfs charges a page to the cgroup of the process that allocates it, and
  // ftruncate allocates none, so without this the first worker to write a page would pay for it
  // (and a /dev/shm too small for the pool would be a SIGBUS there instead of an error here).
  // fallocate allocates every page in this process; the mapping's page tables then fill as pages
  // are first touched, which allocates nothing (MAP_POPULATE would fill them now, at several times
  // fallocate's cost: docs/benchmarks.md). Where fallocate is unsupported, writing one byte per
  // page allocates them instead.
  const absl::Time start = absl::Now();
  const bool allocated = fallocate(fd, 0, 0, static_cast<off_t>(total)) == 0;
  if (!allocated && errno != EOPNOTSUPP) {
    return fail(absl::StrCat("allocating ", total, " bytes for ", shm_name));
  }
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED) return fail(absl::StrCat("mapping ", shm_name));
  if (!allocated) {
    const uint64_t page = sysconf(_SC_PAGESIZE);
    auto* bytes = static_cast<volatile uint8_t*>(base);
    for (uint64_t offset = 0; offset < total; offset += page) bytes[offset] = 0;
  }
  setup.prefault_time = absl::Now() - start;
  return std::unique_ptr<HostPoolMemory>(new HostPoolMemory(
      static_cast<uint8_t*>(base), block_bytes, num_blocks, std::move(shm_name), fd, setup));
}

HostPoolMemory::~HostPoolMemory() {
  munmap(base_, block_bytes() * num_blocks());
  if (shm_fd_ < 0) return;
  // Unlinked before the lock goes with the descriptor: a successor that then
  // takes the lock finds the name free or its own.
  shm_unlink(shm_name_.c_str());
  close(shm_fd_);
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
