// PoolMemory: the bytes behind a pool's blocks, block-major (block i at offset i * block_bytes).
// HostPoolMemory is host memory, either private (tests, benchmarks) or a POSIX shared-memory
// object created owner-only that workers on the node map themselves. CudaPoolMemory (built with
// CUDA) is device memory exported as a CUDA IPC handle.
//
// Errors of the block operations: OUT_OF_RANGE for bytes outside the pool (the caller's bug);
// INTERNAL or DATA_LOSS only when the memory itself failed (a device fault, e.g. a sticky CUDA
// error): the owning Pool then latches it for good (cache/device_fault_latch.h), so an
// implementation must not use those two codes for anything a retry could fix.
//
// Thread safety: all methods may run concurrently as long as no two of them touch the same block
// at once; callers pin blocks (hold a reference) for the duration.
#ifndef KVCACHE_CACHE_POOL_MEMORY_H_
#define KVCACHE_CACHE_POOL_MEMORY_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kvcache {

// How another process on this node maps the memory (kvcache.v1.PoolMapping).
struct MappingInfo {
  enum class Kind { kNone = 0, kShm = 1, kCudaIpc = 2 };
  Kind kind = Kind::kNone;
  std::string shm_name;
  uint64_t size_bytes = 0;
  std::string cuda_ipc_handle;
  int cuda_device = -1;
};

class PoolMemory {
 public:
  virtual ~PoolMemory() = default;
  virtual std::string kind() const = 0;  // "host", "cuda"
  virtual MappingInfo mapping() const = 0;
  uint64_t block_bytes() const { return block_bytes_; }
  uint32_t num_blocks() const { return num_blocks_; }

  // Copies all bytes of block `src` into block `dst`.
  virtual absl::Status CopyBlock(uint32_t src, uint32_t dst) = 0;
  // Writes `bytes` at `offset` inside `block`. OUT_OF_RANGE past the block. The bytes are for
  // other processes and later gets: a host pool writes them past the cache (StreamingCopy).
  virtual absl::Status Write(uint32_t block, uint64_t offset, absl::string_view bytes) = 0;
  // Reads `size` bytes at `offset` inside `block` into `out`. OUT_OF_RANGE past the block.
  virtual absl::Status Read(uint32_t block, uint64_t offset, uint64_t size, char* out) const = 0;
  // XXH3-64 (seed 0) of the whole block: the checksum the data RPCs carry.
  virtual absl::StatusOr<uint64_t> Checksum(uint32_t block) const = 0;
  // Checksum of each of `blocks` into `checksums` (one per block), in one batch: a device pool
  // hashes them all on the device in one launch, where Checksum stages each block through the
  // host; the default calls Checksum. Errors as Read; a failed batch leaves `checksums`
  // unspecified. REQUIRES: checksums.size() == blocks.size(); the blocks are pinned.
  virtual absl::Status ChecksumBlocks(absl::Span<const uint32_t> blocks,
                                      absl::Span<uint64_t> checksums) const;
  // The block's bytes in this process's address space, or nullptr when they are not host memory
  // (callers then Read). REQUIRES: block < num_blocks().
  virtual const uint8_t* HostBlock(uint32_t block) const { return nullptr; }
  // The same, writable: where a load from the cluster tier copies a block's bytes (cache/pool.h).
  // REQUIRES: the caller holds the block's only reference.
  virtual uint8_t* MutableHostBlock(uint32_t block) { return nullptr; }

  // Whole blocks to or from host memory, in batches: the lower tiers' offloads and loads
  // (cache/pool.h). A device pool queues every copy of a batch on its stream and synchronizes
  // once (D2H, H2D), fastest from memory given to RegisterHostMemory; the defaults go through
  // Read and Write. Errors as Read and Write; a failed batch leaves its destinations unspecified.
  struct HostCopy {
    uint32_t block = 0;
    uint8_t* host = nullptr;  // block_bytes() of host memory
  };
  // Copies each block into its host memory. REQUIRES: the blocks are pinned and published.
  virtual absl::Status CopyToHost(absl::Span<const HostCopy> copies) const;
  // Copies each host memory into its block. With `host_checksums` (one per copy; empty: none
  // wanted), also each source's BlockChecksum, to verify what was loaded: the default computes it
  // as it copies (ChecksumWhileCopying: the source is read from memory once; into host memory in
  // one pass, checksummed from the copy's registers), a device pool on the host while its copy
  // engine runs. The sources must not change until this
  // returns. REQUIRES: the caller holds the blocks' only references.
  virtual absl::Status CopyFromHost(absl::Span<const HostCopy> copies,
                                    absl::Span<uint64_t> host_checksums);
  // Makes [base, base + size) fast for the copies above (page-locked, cudaHostRegister, for a
  // device pool; nothing for host memory) until UnregisterHostMemory(base), which must come before
  // the memory is unmapped. RESOURCE_EXHAUSTED when it cannot be locked.
  virtual absl::Status RegisterHostMemory(void* base, uint64_t size) { return absl::OkStatus(); }
  virtual void UnregisterHostMemory(void* base) {}

  // How the memory was set up, for the daemon's start-up report.
  struct Setup {
    absl::Duration prefault_time;  // allocating every page up front (shared host memory)
    bool reclaimed_stale = false;  // a dead owner's object of the same name was unlinked first
  };
  virtual Setup setup() const { return {}; }

 protected:
  PoolMemory(uint64_t block_bytes, uint32_t num_blocks)
      : block_bytes_(block_bytes), num_blocks_(num_blocks) {}
  absl::Status CheckRange(uint32_t block, uint64_t offset, uint64_t size) const;

 private:
  const uint64_t block_bytes_;
  const uint32_t num_blocks_;
};

class HostPoolMemory final : public PoolMemory {
 public:
  // Private anonymous memory. RESOURCE_EXHAUSTED when the mapping fails.
  static absl::StatusOr<std::unique_ptr<HostPoolMemory>> Create(uint64_t block_bytes,
                                                                uint32_t num_blocks);
  // A POSIX shared-memory object `shm_name` ("/name") of mode 0600, owned by this object: it
  // holds an exclusive flock(2) on the object until it is destroyed, then unlinks it. An object
  // of that name whose lock nobody holds was left by an owner that died (SIGKILL, OOM kill): it is
  // unlinked (a process still mapping it keeps its pages until it unmaps) and created afresh.
  // Every page is allocated here (pre-faulted), so this process's cgroup pays for the pool, not
  // the first worker that writes a page. ALREADY_EXISTS while a live owner holds the name;
  // RESOURCE_EXHAUSTED when /dev/shm or memory has no room for the pool.
  static absl::StatusOr<std::unique_ptr<HostPoolMemory>> CreateShared(std::string shm_name,
                                                                      uint64_t block_bytes,
                                                                      uint32_t num_blocks);
  ~HostPoolMemory() override;

  std::string kind() const override { return "host"; }
  MappingInfo mapping() const override;
  absl::Status CopyBlock(uint32_t src, uint32_t dst) override;
  absl::Status Write(uint32_t block, uint64_t offset, absl::string_view bytes) override;
  absl::Status Read(uint32_t block, uint64_t offset, uint64_t size, char* out) const override;
  absl::StatusOr<uint64_t> Checksum(uint32_t block) const override;
  const uint8_t* HostBlock(uint32_t block) const override { return Block(block); }
  uint8_t* MutableHostBlock(uint32_t block) override { return Block(block); }

  Setup setup() const override { return setup_; }

  uint8_t* Block(uint32_t block) const { return base_ + uint64_t{block} * block_bytes(); }

 private:
  HostPoolMemory(uint8_t* base, uint64_t block_bytes, uint32_t num_blocks, std::string shm_name,
                 int shm_fd, Setup setup)
      : PoolMemory(block_bytes, num_blocks),
        base_(base),
        shm_name_(std::move(shm_name)),
        shm_fd_(shm_fd),
        setup_(setup) {}

  uint8_t* const base_;
  const std::string shm_name_;  // empty for private memory
  const int shm_fd_;            // the object, flock()ed while we live; -1 for private memory
  const Setup setup_;
};

// The shared-memory name of pool `pool_name` of the daemon `owner` (its listen address):
// "/kvcache.<XXH3-64 of owner, 16 hex digits>.<pool>". The same at every start of that daemon, so
// a restart finds what a killed predecessor left (CreateShared), and different for daemons on
// other addresses. Within NAME_MAX for every valid pool name.
std::string ShmNameFor(absl::string_view owner, absl::string_view pool_name);

}  // namespace kvcache

#endif  // KVCACHE_CACHE_POOL_MEMORY_H_
