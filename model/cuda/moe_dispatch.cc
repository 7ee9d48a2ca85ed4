#include "model/cuda/moe_dispatch.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace kvcache::worker {

absl::Status PlanMoeDispatch(absl::Span<const uint32_t> topk_ids,
                             absl::Span<const float> topk_weights, uint32_t num_tokens,
                             uint32_t top_k, uint32_t num_experts, MoeDispatchPlan& plan) {
  const size_t entries = size_t{num_tokens} * top_k;
  if (topk_ids.size() != entries || topk_weights.size() != entries) {
    return absl::InvalidArgumentError(
        absl::StrCat(topk_ids.size(), " expert ids and ", topk_weights.size(), " weights for ",
                     num_tokens, " tokens of top ", top_k, " (want ", entries, " each)"));
  }
  // Counting sort by expert: expert_begin is the exclusive prefix sum of the rows per expert.
  plan.expert_begin.assign(size_t{num_experts} + 1, 0);
  for (size_t i = 0; i < entries; ++i) {
    if (topk_ids[i] >= num_experts) {
      return absl::InvalidArgumentError(absl::StrCat("expert id ", topk_ids[i], " of token ",
                                                     i / top_k, " is not below the ", num_experts,
                                                     " experts"));
    }
    ++plan.expert_begin[topk_ids[i] + 1];
  }
  std::partial_sum(plan.expert_begin.begin(), plan.expert_begin.end(), plan.expert_begin.begin());
  std::vector<uint32_t> next_row(plan.expert_begin.begin(), plan.expert_begin.end() - 1);
  plan.gather_tokens.resize(entries);
  plan.combine_rows.resize(entries);
  plan.combine_weights.resize(entries);
  std::vector<uint32_t> picks(top_k);
  for (uint32_t t = 0; t < num_tokens; ++t) {
    const uint32_t* ids = &topk_ids[size_t{t} * top_k];
    // The token's picks by ascending expert index: the order its contributions are summed in.
    std::iota(picks.begin(), picks.end(), 0u);
    std::sort(picks.begin(), picks.end(),
              [ids](uint32_t a, uint32_t b) { return ids[a] < ids[b]; });
    for (uint32_t i = 0; i < top_k; ++i) {
      const uint32_t expert = ids[picks[i]];
      if (i > 0 && expert == ids[picks[i - 1]]) {
        return absl::InvalidArgumentError(
            absl::StrCat("token ", t, " selects expert ", expert, " twice"));
      }
      const uint32_t row = next_row[expert]++;  // tokens ascend within an expert: t ascends
      plan.gather_tokens[row] = t;
      plan.combine_rows[size_t{t} * top_k + i] = row;
      plan.combine_weights[size_t{t} * top_k + i] = topk_weights[size_t{t} * top_k + picks[i]];
    }
  }
  return absl::OkStatus();
}

}  // namespace kvcache::worker
