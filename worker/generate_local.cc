#include "worker/generate_local.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvcache::worker {

absl::StatusOr<std::vector<uint32_t>> GenerateLocal(const Qwen3MoeModel& model,
                                                    absl::Span<const uint32_t> prompt,
                                                    uint32_t max_new_tokens, Sampler& sampler,
                                                    uint8_t* pool_base, const PoolLayout& layout,
                                                    absl::Span<const uint32_t> block_table) {
  if (prompt.empty()) return absl::InvalidArgumentError("GenerateLocal needs a non-empty prompt");
  std::vector<uint32_t> generated;
  if (max_new_tokens == 0) return generated;
  PagedKv kv(pool_base, layout, block_table);
  const uint64_t needed = uint64_t{prompt.size()} + max_new_tokens - 1;
  if (needed > kv.capacity_tokens()) {
    return absl::OutOfRangeError(absl::StrCat(
        "generating ", max_new_tokens, " tokens after a ", prompt.size(), "-token prompt needs ",
        needed, " KV slots; the block table has ", kv.capacity_tokens()));
  }
  generated.reserve(max_new_tokens);
  ASSIGN_OR_RETURN(std::vector<float> logits, model.Forward(prompt, 0, kv));
  uint32_t position = static_cast<uint32_t>(prompt.size());
  while (true) {
    ASSIGN_OR_RETURN(const uint32_t token, sampler.Sample(logits));
    generated.push_back(token);
    if (generated.size() == max_new_tokens) break;
    ASSIGN_OR_RETURN(logits, model.Forward(absl::MakeConstSpan(&token, 1), position, kv));
    ++position;
  }
  return generated;
}

}  // namespace kvcache::worker
