// MappedPool: a daemon pool's memory mapped into this process, so a worker on the daemon's node
// reads and writes KV in place instead of moving bytes over gRPC. The daemon hands out the
// mapping in PoolInfo (DescribePool / ListPools); Map opens it once, and then every access is a
// block offset: block i starts at byte i * block_bytes and holds
// [layer][K,V][token][kv_head][head_dim] elements (common/pool_layout.h).
//
// Two kinds of mapping, after the pool's memory:
//   host    (PoolMapping kShm, a daemon with --device host): POSIX shared memory, mmap'ed.
//           Block(), CheckedBlock() and the typed Keys<T>/Values<T> spans are host memory.
//   device  (PoolMapping kCudaIpc, a daemon with --device cuda:N): the daemon's cudaMalloc'ed
//           pool, opened with cudaIpcOpenMemHandle (lazy peer access) on the device the daemon
//           names, cuda:N. is_device() is true, device() is N, and Block() is a device address
//           on it, for kernels, cudaMemcpy and NCCL; the host accessors (CheckedBlock, Keys,
//           Values) refuse with FAILED_PRECONDITION rather than hand out device memory as a host
//           span. The daemon and its workers must see the same devices (same
//           CUDA_VISIBLE_DEVICES): N is the daemon's ordinal. Opening a handle costs
//           milliseconds: map once per process and epoch, not per request. A daemon cannot map
//           its own pools (CUDA refuses to open a handle in the process that exported it).
//
// Epochs: a mapping belongs to the daemon start (epoch) that described the pool. After a daemon
// restart the old pool memory is gone (the shm object unlinked, the device allocation freed) and
// the new daemon's pool is other memory: a host mapping still points at the old object, which no
// other process sees any more; a device mapping points at freed device memory, which CUDA leaves
// undefined to touch. Compare epoch() with the client's session epoch, destroy the mapping and
// map again after a restart; never use block ids of one epoch with a mapping of another. A handle
// of a stopped daemon no longer opens. Destroy device mappings before their daemon stops where
// the deployment allows it.
//
// What a process may touch: only blocks of its own open sequences, and among them only tokens
// it has not committed (committed and hit blocks are shared read-only by contract; nothing stops
// a write, so a stray one corrupts other sequences' KV). Writes become visible to other
// processes through the shared mapping; the daemon publishes a block only after CommitSequence,
// so commit after the writes are done — for a device pool, after the device work that wrote
// them is synchronized (a cudaMemcpy returned, the stream synchronized).
//
// Thread safety: thread-compatible. The accessors are const and may run concurrently; the bytes
// behind them are shared memory, synchronized by the caller (and the commit protocol).
#ifndef KVCACHE_CLIENT_MAPPED_POOL_H_
#define KVCACHE_CLIENT_MAPPED_POOL_H_

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "client/kv_cache_client.h"
#include "common/page_parts.h"
#include "common/pool_layout.h"

namespace kvcache {

class MappedPool {
 public:
  // Maps `pool` as described by a daemon of epoch `epoch`. Errors:
  //   FAILED_PRECONDITION  the pool has no mapping (use PutBlocks / GetBlocks); the shm object's
  //                        size is not size_bytes (a different daemon start, or a foreign
  //                        object); a CUDA IPC pool in a build without CUDA ("built without
  //                        CUDA"), with no usable CUDA device or no device cuda:N here, or whose
  //                        handle does not open (its daemon stopped or restarted)
  //   NOT_FOUND            the shm object is gone (the daemon stopped or restarted)
  //   PERMISSION_DENIED    the object belongs to another user (pools are owner-only)
  //   RESOURCE_EXHAUSTED   out of address space, file descriptors or device mappings
  //   INVALID_ARGUMENT     the description is inconsistent (layout vs block_bytes vs size; a
  //                        CUDA IPC handle that is not 64 bytes or a negative device)
  static absl::StatusOr<std::unique_ptr<MappedPool>> Map(const KvCacheClient::PoolInfo& pool,
                                                         uint64_t epoch);
  static absl::StatusOr<std::unique_ptr<MappedPool>> Map(
      const KvCacheClient::PoolDescription& description) {
    return Map(description.pool, description.epoch);
  }

  // Returns true when this binary can map device pools (it was built with CUDA).
  static bool BuiltWithCuda();

  ~MappedPool();  // munmap, or cudaIpcCloseMemHandle for a device mapping
  MappedPool(const MappedPool&) = delete;
  MappedPool& operator=(const MappedPool&) = delete;

  const std::string& name() const { return name_; }
  // The daemon epoch this mapping is valid for.
  uint64_t epoch() const { return epoch_; }
  const PoolLayout& layout() const { return layout_; }
  uint64_t block_bytes() const { return block_bytes_; }
  uint32_t num_blocks() const { return num_blocks_; }
  // The named parts of every page (PoolInfo::parts), in page order.
  const std::vector<PagePartLayout>& parts() const { return parts_; }
  // True for a device pool (CUDA IPC): Block() is then a device address on device().
  bool is_device() const { return device_ >= 0; }
  // The CUDA device of a device mapping (the daemon's cuda:N); -1 for a host mapping.
  int device() const { return device_; }

  // First byte of block `block_id`: a host address, or a device address on device() for a device
  // mapping. REQUIRES: block_id < num_blocks().
  uint8_t* Block(uint32_t block_id) const { return base_ + uint64_t{block_id} * block_bytes_; }
  // The whole block as host memory; OUT_OF_RANGE for a block id past the pool,
  // FAILED_PRECONDITION for a device mapping (use Block() with CUDA).
  absl::StatusOr<absl::Span<uint8_t>> CheckedBlock(uint32_t block_id) const;

  // Pages named by keys (KvCacheClient's page calls): the page in block `block_id` (a block id of
  // ReservePages or AcquirePages), whole or one named part of it, as host memory. Errors as
  // CheckedBlock's, and INVALID_ARGUMENT naming the pool's parts for a part it does not have.
  absl::StatusOr<absl::Span<uint8_t>> Page(uint32_t block_id) const {
    return CheckedBlock(block_id);
  }
  absl::StatusOr<absl::Span<uint8_t>> Part(uint32_t block_id, absl::string_view part) const;

  // The K (or V) of `layer` in block `block_id` as host memory: block_size * num_kv_heads *
  // head_dim elements, indexed [token][kv_head][head_dim]. T is the element's storage type
  // (uint16_t for fp16/bf16 bits, float for fp32, uint8_t for fp8): FAILED_PRECONDITION for a
  // device mapping; INVALID_ARGUMENT unless sizeof(T) is the dtype's size; OUT_OF_RANGE for a
  // block or layer past the pool.
  template <typename T>
  absl::StatusOr<absl::Span<T>> Keys(uint32_t block_id, uint32_t layer) const {
    return KvSpan<T>(block_id, layer, /*kv=*/0);
  }
  template <typename T>
  absl::StatusOr<absl::Span<T>> Values(uint32_t block_id, uint32_t layer) const {
    return KvSpan<T>(block_id, layer, /*kv=*/1);
  }

 private:
  MappedPool(const KvCacheClient::PoolInfo& pool, uint64_t epoch, uint8_t* base,
             uint64_t size_bytes, int device)
      : name_(pool.name),
        epoch_(epoch),
        layout_(pool.layout),
        block_bytes_(pool.block_bytes),
        num_blocks_(pool.num_blocks),
        // A daemon from before pages describes no parts: its pages are one "kv" part.
        parts_(pool.parts.empty() ? SinglePagePart(pool.block_bytes) : pool.parts),
        base_(base),
        size_bytes_(size_bytes),
        device_(device) {}

  static absl::StatusOr<std::unique_ptr<MappedPool>> MapShm(const KvCacheClient::PoolInfo& pool,
                                                            uint64_t epoch);
  static absl::StatusOr<std::unique_ptr<MappedPool>> MapCudaIpc(const KvCacheClient::PoolInfo& pool,
                                                                uint64_t epoch);

  // FAILED_PRECONDITION naming `accessor` for a device mapping.
  absl::Status CheckHost(absl::string_view accessor) const;
  // Start of K (kv = 0) or V (kv = 1) of `layer` in `block_id`, after checking that the mapping
  // is host memory and the element size.
  absl::StatusOr<uint8_t*> KvStart(uint32_t block_id, uint32_t layer, uint32_t kv,
                                   size_t element_bytes) const;
  template <typename T>
  absl::StatusOr<absl::Span<T>> KvSpan(uint32_t block_id, uint32_t layer, uint32_t kv) const {
    static_assert(std::is_trivially_copyable_v<T>, "KV elements are raw bytes");
    absl::StatusOr<uint8_t*> start = KvStart(block_id, layer, kv, sizeof(T));
    if (!start.ok()) return start.status();
    // The pool is page-aligned and every offset is a multiple of the element size.
    return absl::Span<T>(reinterpret_cast<T*>(*start), elements_per_kv());
  }
  size_t elements_per_kv() const {
    return size_t{layout_.block_size} * layout_.num_kv_heads * layout_.head_dim;
  }

  // Constant after construction.
  const std::string name_;
  const uint64_t epoch_;
  const PoolLayout layout_;
  const uint64_t block_bytes_;
  const uint32_t num_blocks_;
  const std::vector<PagePartLayout> parts_;
  uint8_t* const base_;        // host address, or device address on device_
  const uint64_t size_bytes_;  // of the whole mapping
  const int device_;           // CUDA device of a device mapping; -1 for a host mapping
};

}  // namespace kvcache

#endif  // KVCACHE_CLIENT_MAPPED_POOL_H_
