// The launchers of worker_kernels.h up to the launch: their argument checks and the pool geometry,
// built in every configuration so that a build without CUDA runs (and tests) the same checks. The
// launches themselves are in worker_kernels_{dense,attention,moe}.cu (worker_kernels_stub.cc
// without CUDA).
#include <cmath>
#include <cstdint>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/block_copy_internal.h"
#include "kernels/worker_kernels.h"
#include "kernels/worker_kernels_internal.h"

namespace kvcache::kernels {
namespace {

using internal::CheckNotNull;

// PoolLayout::Validate, the layer, the page stride (0: the KV block's bytes) and the pool's size;
// fills `g`.
absl::Status CheckPool(const char* op, const PoolLayout& layout, uint32_t layer,
                       uint64_t num_pool_blocks, uint64_t page_stride_bytes,
                       internal::KvGeometry& g) {
  if (const absl::Status valid = layout.Validate(); !valid.ok()) {
    return absl::Status(valid.code(), absl::StrCat(op, ": ", valid.message()));
  }
  if (layer >= layout.num_layers) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: layer %u out of range: the pool has %u",
                                                      op, layer, layout.num_layers));
  }
  if (num_pool_blocks == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: num_pool_blocks must be > 0", op));
  }
  const uint64_t kv_bytes = layout.BlockBytes();
  const uint64_t block_bytes = page_stride_bytes == 0 ? kv_bytes : page_stride_bytes;
  if (block_bytes < kv_bytes || block_bytes % DTypeBytes(layout.dtype) != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: page stride %u is below the KV block's %u bytes or not a multiple of the %u-byte "
        "elements",
        op, block_bytes, kv_bytes, DTypeBytes(layout.dtype)));
  }
  if (num_pool_blocks > std::numeric_limits<uint64_t>::max() / block_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: pool of %u blocks of %u bytes overflows uint64", op, num_pool_blocks, block_bytes));
  }
  g.block_bytes = block_bytes;
  g.k_offset = layout.KvOffset(layer, 0);
  g.v_minus_k = layout.KvOffset(layer, 1) - g.k_offset;
  g.token_bytes = layout.TokenBytes();
  g.num_blocks = num_pool_blocks;
  g.block_size = layout.block_size;
  g.token_elems = layout.num_kv_heads * layout.head_dim;  // < 2^30 given Validate's 1 GiB bound
  g.head_dim = layout.head_dim;
  g.elem_bytes = DTypeBytes(layout.dtype);
  g.dtype = layout.dtype;
  return absl::OkStatus();
}

absl::Status CheckPoolAlignment(const char* op, const void* pool, uint32_t elem_bytes) {
  if (reinterpret_cast<uintptr_t>(pool) % elem_bytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: pool is not aligned to its %u-byte elements", op, elem_bytes));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RmsNormCuda(const float* x, const float* weight, float eps, uint32_t rows,
                         uint32_t dim, float* out, void* stream) {
  constexpr char kOp[] = "RmsNormCuda";
  if (dim == 0) return absl::InvalidArgumentError(absl::StrFormat("%s: dim must be > 0", kOp));
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull(kOp, "x", x));
  RETURN_IF_ERROR(CheckNotNull(kOp, "weight", weight));
  RETURN_IF_ERROR(CheckNotNull(kOp, "out", out));
  return internal::LaunchRmsNorm(x, weight, eps, rows, dim, out, stream);
}

absl::Status RopeCuda(float* x, const uint32_t* positions, uint32_t num_tokens, uint32_t num_heads,
                      uint32_t head_dim, double theta, void* stream) {
  return PartialRopeCuda(x, positions, num_tokens, num_heads, head_dim, head_dim, theta, stream);
}

absl::Status PartialRopeCuda(float* x, const uint32_t* positions, uint32_t num_tokens,
                             uint32_t num_heads, uint32_t head_dim, uint32_t rotary_dim,
                             double theta, void* stream) {
  constexpr char kOp[] = "RopeCuda";
  if (num_heads == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: num_heads must be > 0", kOp));
  }
  if (head_dim == 0 || head_dim % 2 != 0 || head_dim > kMaxCudaHeadDim) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: head_dim %u must be even and in [2, %u]",
                                                      kOp, head_dim, kMaxCudaHeadDim));
  }
  if (rotary_dim == 0 || rotary_dim % 2 != 0 || rotary_dim > head_dim) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: rotary_dim %u must be even and in [2, head_dim %u]", kOp, rotary_dim, head_dim));
  }
  if (!(theta > 0.0) || !std::isfinite(theta)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: theta %g must be positive and finite", kOp, theta));
  }
  if (num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull(kOp, "x", x));
  RETURN_IF_ERROR(CheckNotNull(kOp, "positions", positions));
  return internal::LaunchRope(x, positions, num_tokens, num_heads, head_dim, rotary_dim, theta,
                              stream);
}

absl::Status WriteKvCuda(const float* k, const float* v, const int64_t* slot_mapping,
                         uint32_t num_tokens, uint32_t layer, const PoolLayout& layout,
                         uint64_t num_pool_blocks, uint8_t* pool, void* stream,
                         uint64_t page_stride_bytes) {
  constexpr char kOp[] = "WriteKvCuda";
  internal::KvGeometry g;
  RETURN_IF_ERROR(CheckPool(kOp, layout, layer, num_pool_blocks, page_stride_bytes, g));
  if (num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull(kOp, "k", k));
  RETURN_IF_ERROR(CheckNotNull(kOp, "v", v));
  RETURN_IF_ERROR(CheckNotNull(kOp, "slot_mapping", slot_mapping));
  RETURN_IF_ERROR(CheckNotNull(kOp, "pool", pool));
  RETURN_IF_ERROR(CheckPoolAlignment(kOp, pool, g.elem_bytes));
  return internal::LaunchWriteKv(k, v, slot_mapping, num_tokens, g, pool, stream);
}

absl::Status PagedAttentionCuda(const float* q, const uint32_t* positions, const uint32_t* seq_ids,
                                const uint32_t* block_tables, uint32_t num_tokens,
                                uint32_t num_q_heads, uint32_t num_seqs,
                                uint32_t max_blocks_per_seq, uint32_t layer,
                                const PoolLayout& layout, uint64_t num_pool_blocks,
                                const uint8_t* pool, float* out, void* stream,
                                uint64_t page_stride_bytes) {
  constexpr char kOp[] = "PagedAttentionCuda";
  internal::AttnParams p;
  RETURN_IF_ERROR(CheckPool(kOp, layout, layer, num_pool_blocks, page_stride_bytes, p.kv));
  if (num_q_heads == 0 || num_q_heads % layout.num_kv_heads != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: num_q_heads %u must be a positive multiple of num_kv_heads %u", kOp,
                        num_q_heads, layout.num_kv_heads));
  }
  if (layout.head_dim > kMaxCudaHeadDim) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: head_dim %u exceeds the kernel's %u",
                                                      kOp, layout.head_dim, kMaxCudaHeadDim));
  }
  if (num_seqs == 0 || max_blocks_per_seq == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: num_seqs (%u) and max_blocks_per_seq (%u) must be > 0", kOp, num_seqs,
                        max_blocks_per_seq));
  }
  if (num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull(kOp, "q", q));
  RETURN_IF_ERROR(CheckNotNull(kOp, "positions", positions));
  RETURN_IF_ERROR(CheckNotNull(kOp, "block_tables", block_tables));
  RETURN_IF_ERROR(CheckNotNull(kOp, "pool", pool));
  RETURN_IF_ERROR(CheckNotNull(kOp, "out", out));
  RETURN_IF_ERROR(CheckPoolAlignment(kOp, pool, p.kv.elem_bytes));
  p.num_tokens = num_tokens;
  p.num_q_heads = num_q_heads;
  p.group = num_q_heads / layout.num_kv_heads;
  p.num_seqs = num_seqs;
  p.max_blocks_per_seq = max_blocks_per_seq;
  // Qwen3MoeModel::Attention's scale, computed the same way.
  p.scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(layout.head_dim)));
  return internal::LaunchPagedAttention(q, positions, seq_ids, block_tables, p, pool, out, stream);
}

absl::Status MoeRouteCuda(const float* logits, uint32_t num_tokens, uint32_t num_experts,
                          uint32_t top_k, bool norm_topk_prob, uint32_t* topk_ids,
                          float* topk_weights, void* stream) {
  constexpr char kOp[] = "MoeRouteCuda";
  if (num_experts == 0 || num_experts > kMaxCudaExperts || top_k == 0 || top_k > num_experts) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: need 1 <= top_k (%u) <= num_experts (%u) <= %u", kOp, top_k,
                        num_experts, kMaxCudaExperts));
  }
  if (num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull(kOp, "logits", logits));
  RETURN_IF_ERROR(CheckNotNull(kOp, "topk_ids", topk_ids));
  RETURN_IF_ERROR(CheckNotNull(kOp, "topk_weights", topk_weights));
  return internal::LaunchMoeRoute(logits, num_tokens, num_experts, top_k, norm_topk_prob, topk_ids,
                                  topk_weights, stream);
}

absl::Status ExpertSwiGluCuda(const float* x, const float* gate_proj, const float* up_proj,
                              const float* down_proj, uint32_t rows, uint32_t hidden,
                              uint32_t intermediate, float* workspace, float* out, void* stream) {
  constexpr char kOp[] = "ExpertSwiGluCuda";
  if (hidden == 0 || intermediate == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: hidden (%u) and intermediate (%u) must be > 0", kOp, hidden, intermediate));
  }
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull(kOp, "x", x));
  RETURN_IF_ERROR(CheckNotNull(kOp, "gate_proj", gate_proj));
  RETURN_IF_ERROR(CheckNotNull(kOp, "up_proj", up_proj));
  RETURN_IF_ERROR(CheckNotNull(kOp, "down_proj", down_proj));
  RETURN_IF_ERROR(CheckNotNull(kOp, "workspace", workspace));
  RETURN_IF_ERROR(CheckNotNull(kOp, "out", out));
  return internal::LaunchExpertSwiGlu(x, gate_proj, up_proj, down_proj, rows, hidden, intermediate,
                                      workspace, out, stream);
}

absl::Status LinearCuda(const float* x, const float* weight, uint32_t rows, uint32_t in_features,
                        uint32_t out_features, bool accumulate, float* out, void* stream) {
  constexpr char kOp[] = "LinearCuda";
  if (in_features == 0 || out_features == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: in_features (%u) and out_features (%u) must be > 0", kOp, in_features, out_features));
  }
  if (rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull(kOp, "x", x));
  RETURN_IF_ERROR(CheckNotNull(kOp, "weight", weight));
  RETURN_IF_ERROR(CheckNotNull(kOp, "out", out));
  return internal::LaunchLinear(x, weight, rows, in_features, out_features, accumulate, out,
                                stream);
}

absl::Status GatherRowsCuda(const float* src, uint64_t num_src_rows, uint32_t cols,
                            const uint32_t* row_ids, uint32_t num_rows, float* out, void* stream) {
  constexpr char kOp[] = "GatherRowsCuda";
  if (cols == 0 || num_src_rows == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: cols (%u) and num_src_rows (%u) must be > 0", kOp, cols, num_src_rows));
  }
  if (num_rows == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull(kOp, "src", src));
  RETURN_IF_ERROR(CheckNotNull(kOp, "row_ids", row_ids));
  RETURN_IF_ERROR(CheckNotNull(kOp, "out", out));
  return internal::LaunchGatherRows(src, num_src_rows, cols, row_ids, num_rows, out, stream);
}

absl::Status MoeCombineCuda(const float* expert_out, uint64_t num_expert_rows, uint32_t hidden,
                            const uint32_t* rows, const float* weights, uint32_t num_tokens,
                            uint32_t top_k, float* x, void* stream) {
  constexpr char kOp[] = "MoeCombineCuda";
  if (top_k == 0 || hidden == 0 || num_expert_rows == 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: top_k (%u), hidden (%u) and num_expert_rows (%u) must be > 0", kOp,
                        top_k, hidden, num_expert_rows));
  }
  if (num_tokens == 0) return absl::OkStatus();
  RETURN_IF_ERROR(CheckNotNull(kOp, "expert_out", expert_out));
  RETURN_IF_ERROR(CheckNotNull(kOp, "rows", rows));
  RETURN_IF_ERROR(CheckNotNull(kOp, "weights", weights));
  RETURN_IF_ERROR(CheckNotNull(kOp, "x", x));
  return internal::LaunchMoeCombine(expert_out, num_expert_rows, hidden, rows, weights, num_tokens,
                                    top_k, x, stream);
}

}  // namespace kvcache::kernels
