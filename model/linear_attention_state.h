// LinearAttentionState: one sequence's recurrent state across every Gated DeltaNet layer of a
// Qwen3-Next model, at a token boundary: what a prefix hit must restore together with the full-
// attention layers' KV (the page part "state" of a hybrid pool, see HybridPagePartsSpec).
//
// Byte layout (StateBytes(config) bytes, version 1): for each linear-attention layer in model
// order (the i-th is config.IndexWithinType(layer) == i),
//   recurrent state  [num_value_heads][key_head_dim][value_head_dim] float32
//   conv state       [conv_dim][conv_kernel - 1] float32, the last kernel - 1 conv inputs of each
//                    channel (channels q, then k, then v), oldest first
// every float IEEE-754 binary32 little-endian, no header and no padding. The floats in memory are
// in the same order, so the bytes are an exact copy: restoring them and running on gives
// bit-identical results to never having stopped. A device copy of the state
// (kernels/linear_attention_kernels.h) uses the same layout, so device bytes move to and from
// host bytes with a plain memcpy.
//
// A state also records the number of tokens it has consumed (position()); it is not part of the
// bytes (the page's key names it) and is given back to RestoreFrom.
// Thread-safety: value type; thread-compatible.
#ifndef KVCACHE_MODEL_LINEAR_ATTENTION_STATE_H_
#define KVCACHE_MODEL_LINEAR_ATTENTION_STATE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/pool_layout.h"
#include "model/qwen3_next_config.h"

namespace kvcache::worker {

class LinearAttentionState {
 public:
  // Bytes of one saved state of `config`'s model.
  static uint64_t StateBytes(const Qwen3NextConfig& config);
  // Float offsets inside the state of linear layer `linear_index`'s recurrent and conv states.
  static uint64_t RecurrentOffset(const Qwen3NextConfig& config, uint32_t linear_index);
  static uint64_t ConvOffset(const Qwen3NextConfig& config, uint32_t linear_index);

  // The state before the first token: all zeros, position 0. REQUIRES: config.Validate() is OK.
  explicit LinearAttentionState(const Qwen3NextConfig& config);

  // Writes the StateBytes() bytes. INVALID_ARGUMENT unless out.size() == StateBytes().
  absl::Status SaveTo(absl::Span<uint8_t> out) const;
  // Replaces the state with saved bytes taken after `position` tokens. INVALID_ARGUMENT unless
  // bytes.size() == StateBytes(); the state is unchanged on error.
  absl::Status RestoreFrom(absl::Span<const uint8_t> bytes, uint64_t position);
  // Back to the state before the first token.
  void Reset();

  uint64_t position() const { return position_; }
  void set_position(uint64_t position) { position_ = position; }
  uint64_t StateBytes() const { return values_.size() * sizeof(float); }

  // The layer's [num_value_heads][key_head_dim][value_head_dim] and [conv_dim][conv_kernel - 1].
  float* recurrent(uint32_t linear_index) {
    return values_.data() + recurrent_offsets_[linear_index];
  }
  float* conv(uint32_t linear_index) { return values_.data() + conv_offsets_[linear_index]; }
  // Every float, in the byte layout's order.
  absl::Span<const float> values() const { return values_; }

  bool operator==(const LinearAttentionState& other) const;

 private:
  std::vector<float> values_;
  std::vector<uint64_t> recurrent_offsets_;
  std::vector<uint64_t> conv_offsets_;
  uint64_t position_ = 0;
};

// The pool layout of the full-attention layers' KV (those layers only, in model order), blocks of
// `block_size` tokens of `kv_dtype`.
PoolLayout HybridKvLayout(const Qwen3NextConfig& config, uint32_t block_size, DType kv_dtype);

// Bytes of one page's full-attention KV: HybridKvLayout(...).BlockBytes().
uint64_t HybridKvBytesPerPage(const Qwen3NextConfig& config, uint32_t block_size, DType kv_dtype);

// The pool's `parts` value for a hybrid model (common/page_parts.h): "kv/<KV bytes per page>+
// state/<StateBytes>/trailing1" — every page up to a hit's endpoint needs its KV, and only the
// endpoint's page its state (the state at the page's last token). Sizes are in plain bytes, and
// the page bytes the pool must declare are their sum.
std::string HybridPagePartsSpec(const Qwen3NextConfig& config, uint32_t block_size, DType kv_dtype);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_LINEAR_ATTENTION_STATE_H_
