// PagedKv: a view of one sequence's K/V inside a block-major KV pool that someone else owns (the
// daemon's shared memory, or a test's buffer). Position p of the sequence lives in physical block
// block_table[p / block_size], token slot p % block_size; inside a block, K (kv = 0) or V (kv = 1)
// of `layer` starts at layout.KvOffset(layer, kv), one token's [kv_head][head_dim] elements being
// TokenBytes() long; block b starts at pool_base + b * BlockBytes() (see common/pool_layout.h).
//
// Writes convert float32 to the pool dtype (fp32 copy; bf16, fp16 and fp8 E4M3 round to nearest
// even, see common/float_convert.h); reads convert back exactly. So reading what was written gives
// the same floats whichever physical block holds the bytes — the property the prefix cache relies
// on: a block copied byte-wise into another block, or computed by another sequence, reads back
// bit-identical.
//
// Thread-safety: thread-compatible. The view holds raw pointers: the pool memory and the block
// table must outlive it. Concurrent writers to the same token slot race; the KV manager guarantees
// that a block being written belongs to one sequence.
#ifndef KVCACHE_MODEL_PAGED_KV_H_
#define KVCACHE_MODEL_PAGED_KV_H_

#include <cstdint>
#include <limits>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/pool_layout.h"

namespace kvcache::worker {

class PagedKv {
 public:
  static constexpr uint64_t kUnknownPoolBlocks = std::numeric_limits<uint64_t>::max();

  // `num_pool_blocks`, when known, lets Validate() check every block id against the pool size.
  // `page_stride_bytes`, when not 0, is the distance between blocks in a pool whose pages hold
  // more than the KV (parts, common/page_parts.h: the KV part first, then e.g. a recurrent
  // state); 0 means layout.BlockBytes(), a pool of KV alone.
  PagedKv(uint8_t* pool_base, PoolLayout layout, absl::Span<const uint32_t> block_table,
          uint64_t num_pool_blocks = kUnknownPoolBlocks, uint64_t page_stride_bytes = 0);

  // INVALID_ARGUMENT for a bad layout, a null pool or a page stride below the KV block's bytes;
  // OUT_OF_RANGE for a block id outside the pool.
  absl::Status Validate() const;
  // FAILED_PRECONDITION unless the layout has exactly these dimensions (a pool built for another
  // model), naming both.
  absl::Status CheckModelShape(uint32_t num_layers, uint32_t num_kv_heads, uint32_t head_dim) const;

  // Number of token positions the block table covers.
  uint64_t capacity_tokens() const { return uint64_t{block_table_.size()} * layout_.block_size; }
  // Elements per token per layer for K (or V): num_kv_heads * head_dim.
  uint32_t token_elements() const { return layout_.num_kv_heads * layout_.head_dim; }
  const PoolLayout& layout() const { return layout_; }
  absl::Span<const uint32_t> block_table() const { return block_table_; }

  // `values` / `out` hold token_elements() floats, [kv_head][head_dim].
  // INVALID_ARGUMENT for a layer out of range; OUT_OF_RANGE for a position past capacity_tokens().
  absl::Status WriteK(uint32_t layer, uint64_t position, const float* values) {
    return Write(layer, 0, position, values);
  }
  absl::Status WriteV(uint32_t layer, uint64_t position, const float* values) {
    return Write(layer, 1, position, values);
  }
  absl::Status ReadK(uint32_t layer, uint64_t position, float* out) const {
    return Read(layer, 0, position, out);
  }
  absl::Status ReadV(uint32_t layer, uint64_t position, float* out) const {
    return Read(layer, 1, position, out);
  }

  // K (kv = 0) or V (kv = 1) of `layer` for positions [begin, end) into out[(p - begin) *
  // token_elements() ...]. Same checks as ReadK; faster for runs inside one block.
  absl::Status ReadRange(uint32_t layer, uint32_t kv, uint64_t begin, uint64_t end,
                         float* out) const;

 private:
  absl::Status Write(uint32_t layer, uint32_t kv, uint64_t position, const float* values);
  absl::Status Read(uint32_t layer, uint32_t kv, uint64_t position, float* out) const;
  absl::Status CheckAccess(uint32_t layer, uint32_t kv, uint64_t position) const;
  // Address of token `position`'s K or V for `layer`. REQUIRES: CheckAccess() passed.
  uint8_t* Slot(uint32_t layer, uint32_t kv, uint64_t position) const;

  uint8_t* pool_base_;
  PoolLayout layout_;
  absl::Span<const uint32_t> block_table_;
  uint64_t num_pool_blocks_;
  uint64_t page_stride_;  // bytes from one block to the next
  uint64_t token_bytes_;
};

// Element-wise conversions between float32 and a pool dtype (little-endian storage).
void EncodeKv(DType dtype, const float* values, uint32_t count, uint8_t* dst);
void DecodeKv(DType dtype, const uint8_t* src, uint32_t count, float* out);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_PAGED_KV_H_
