// PoolMemory: the bytes behind a pool's blocks, block-major (block i at offset i * block_bytes).
// HostPoolMemory maps anonymous host memory; the device and shared-memory kinds plug in here.
//
// Thread safety: base() and block_bytes() are constant; CopyBlock may run concurrently on
// disjoint destination blocks (callers pin both blocks for the duration).
#ifndef KVCACHE_SERVER_POOL_MEMORY_H_
#define KVCACHE_SERVER_POOL_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"

namespace kvcache {

class PoolMemory {
 public:
  virtual ~PoolMemory() = default;
  virtual std::string kind() const = 0;  // "host", "cuda"
  virtual uint64_t block_bytes() const = 0;
  virtual uint32_t num_blocks() const = 0;
  // Copies all bytes of block `src` into block `dst`.
  virtual absl::Status CopyBlock(uint32_t src, uint32_t dst) = 0;
};

class HostPoolMemory final : public PoolMemory {
 public:
  // RESOURCE_EXHAUSTED when the mapping fails.
  static absl::StatusOr<std::unique_ptr<HostPoolMemory>> Create(uint64_t block_bytes,
                                                               uint32_t num_blocks);
  ~HostPoolMemory() override;

  std::string kind() const override { return "host"; }
  uint64_t block_bytes() const override { return block_bytes_; }
  uint32_t num_blocks() const override { return num_blocks_; }
  absl::Status CopyBlock(uint32_t src, uint32_t dst) override;

  uint8_t* Block(uint32_t block) { return base_ + uint64_t{block} * block_bytes_; }

 private:
  HostPoolMemory(uint8_t* base, uint64_t block_bytes, uint32_t num_blocks)
      : base_(base), block_bytes_(block_bytes), num_blocks_(num_blocks) {}

  uint8_t* const base_;
  const uint64_t block_bytes_;
  const uint32_t num_blocks_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_POOL_MEMORY_H_
