// MoeDispatchPlan: how one MoE layer's routed tokens are grouped by expert so that each selected
// expert runs once over a contiguous block of rows, and how the experts' outputs are summed back
// per token in expert-index order (the order of Qwen3MoeModel::Moe). Host-side bookkeeping for the
// CUDA model (model/cuda/qwen3_moe_cuda.h); built in every configuration so that it is tested
// everywhere.
// Thread-safety: a plain value; PlanMoeDispatch is a pure function of its inputs.
#ifndef KVCACHE_MODEL_CUDA_MOE_DISPATCH_H_
#define KVCACHE_MODEL_CUDA_MOE_DISPATCH_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace kvcache::worker {

struct MoeDispatchPlan {
  // [num_experts + 1]: the grouped rows of expert e are [expert_begin[e], expert_begin[e + 1]).
  // An expert has at most num_tokens rows (a token selects an expert at most once).
  std::vector<uint32_t> expert_begin;
  // [num_tokens * top_k]: the token of each grouped row; within an expert, tokens ascend.
  std::vector<uint32_t> gather_tokens;
  // [num_tokens, top_k]: token t's grouped rows, ordered by ascending expert index.
  std::vector<uint32_t> combine_rows;
  // [num_tokens, top_k]: the routing weights matching combine_rows.
  std::vector<float> combine_weights;
};

// topk_ids, topk_weights: [num_tokens, top_k], a router's picks per token in any order (as
// kernels::MoeRouteCuda writes them). Fills `plan`, reusing its vectors' capacity.
// INVALID_ARGUMENT for sizes other than num_tokens * top_k, an id >= num_experts, or a token that
// selects one expert twice; `plan` is then unspecified.
absl::Status PlanMoeDispatch(absl::Span<const uint32_t> topk_ids,
                             absl::Span<const float> topk_weights, uint32_t num_tokens,
                             uint32_t top_k, uint32_t num_experts, MoeDispatchPlan& plan);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_CUDA_MOE_DISPATCH_H_
