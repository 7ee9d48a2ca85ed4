// The split of the worker kernels' launchers (worker_kernels.h): worker_kernels_args.cc, built in
// every configuration, checks the host-visible arguments and computes the pool geometry; the
// Launch* functions here enqueue the kernels (worker_kernels_dense.cu, worker_kernels_attention.cu,
// worker_kernels_moe.cu) or answer "built without CUDA" (worker_kernels_stub.cc). Not part of the
// public API.
#ifndef KVCACHE_KERNELS_WORKER_KERNELS_INTERNAL_H_
#define KVCACHE_KERNELS_WORKER_KERNELS_INTERNAL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/pool_layout.h"

namespace kvcache::kernels::internal {

// Byte geometry of one layer's K and V inside a block-major pool block.
struct KvGeometry {
  uint64_t block_bytes;  // bytes from one pool block (page) to the next: the page stride
  uint64_t k_offset;     // offset of `layer`'s K, token 0, inside a block
  uint64_t v_minus_k;    // offset of V minus offset of K (block_size * token_bytes)
  uint64_t token_bytes;  // bytes of one token's K (or V): num_kv_heads * head_dim * elem
  uint64_t num_blocks;   // pool blocks
  uint32_t block_size;   // tokens per block
  uint32_t token_elems;  // num_kv_heads * head_dim
  uint32_t head_dim;
  uint32_t elem_bytes;
  DType dtype;
};

struct AttnParams {
  KvGeometry kv;
  uint32_t num_tokens;
  uint32_t num_q_heads;
  uint32_t group;  // q heads per kv head
  uint32_t num_seqs;
  uint32_t max_blocks_per_seq;
  float scale;
};

// REQUIRES (for every Launch*): the public launcher's checks passed, so sizes are non-zero and
// pointers non-null (seq_ids may be null). Each enqueues on `stream` and returns the launch error
// (kernels/cuda_launch.h), or FAILED_PRECONDITION "built without CUDA".
absl::Status LaunchRmsNorm(const float* x, const float* weight, float eps, uint32_t rows,
                           uint32_t dim, float* out, void* stream);
absl::Status LaunchRope(float* x, const uint32_t* positions, uint32_t num_tokens,
                        uint32_t num_heads, uint32_t head_dim, uint32_t rotary_dim, double theta,
                        void* stream);
absl::Status LaunchWriteKv(const float* k, const float* v, const int64_t* slot_mapping,
                           uint32_t num_tokens, const KvGeometry& g, uint8_t* pool, void* stream);
absl::Status LaunchPagedAttention(const float* q, const uint32_t* positions,
                                  const uint32_t* seq_ids, const uint32_t* block_tables,
                                  const AttnParams& p, const uint8_t* pool, float* out,
                                  void* stream);
absl::Status LaunchMoeRoute(const float* logits, uint32_t num_tokens, uint32_t num_experts,
                            uint32_t top_k, bool norm_topk_prob, uint32_t* topk_ids,
                            float* topk_weights, void* stream);
absl::Status LaunchExpertSwiGlu(const float* x, const float* gate_proj, const float* up_proj,
                                const float* down_proj, uint32_t rows, uint32_t hidden,
                                uint32_t intermediate, float* workspace, float* out, void* stream);
absl::Status LaunchLinear(const float* x, const float* weight, uint32_t rows, uint32_t in_features,
                          uint32_t out_features, bool accumulate, float* out, void* stream);
absl::Status LaunchGatherRows(const float* src, uint64_t num_src_rows, uint32_t cols,
                              const uint32_t* row_ids, uint32_t num_rows, float* out, void* stream);
absl::Status LaunchMoeCombine(const float* expert_out, uint64_t num_expert_rows, uint32_t hidden,
                              const uint32_t* rows, const float* weights, uint32_t num_tokens,
                              uint32_t top_k, float* x, void* stream);

}  // namespace kvcache::kernels::internal

#endif  // KVCACHE_KERNELS_WORKER_KERNELS_INTERNAL_H_
