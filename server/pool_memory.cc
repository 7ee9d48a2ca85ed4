#include "server/pool_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvcache {

absl::StatusOr<std::unique_ptr<HostPoolMemory>> HostPoolMemory::Create(uint64_t block_bytes,
                                                                      uint32_t num_blocks) {
  const uint64_t total = block_bytes * num_blocks;
  if (total == 0) return absl::InvalidArgumentError("pool memory of 0 bytes");
  // Anonymous mappings are zero-filled and only backed by pages once touched.
  void* base = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cannot map ", total, " bytes of pool memory: ", std::strerror(errno)));
  }
  return std::unique_ptr<HostPoolMemory>(
      new HostPoolMemory(static_cast<uint8_t*>(base), block_bytes, num_blocks));
}

HostPoolMemory::~HostPoolMemory() { munmap(base_, block_bytes_ * num_blocks_); }

absl::Status HostPoolMemory::CopyBlock(uint32_t src, uint32_t dst) {
  if (src >= num_blocks_ || dst >= num_blocks_) {
    return absl::OutOfRangeError(absl::StrCat("copy ", src, " -> ", dst, " outside a pool of ",
                                              num_blocks_, " blocks"));
  }
  if (src != dst) std::memcpy(Block(dst), Block(src), block_bytes_);
  return absl::OkStatus();
}

}  // namespace kvcache
