#include "worker/generation.h"

#include <numeric>

#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace kvcache::worker {

absl::StatusOr<GenerationResult> GenerateCold(const Qwen3MoeModel& model,
                                              absl::Span<const uint32_t> prompt,
                                              uint32_t max_new_tokens, Sampler& sampler,
                                              uint32_t block_size, DType dtype) {
  const PoolLayout layout = model.KvLayout(block_size, dtype);
  const size_t positions = prompt.size() + max_new_tokens;
  std::vector<uint32_t> table((positions + block_size - 1) / block_size);
  std::iota(table.begin(), table.end(), 0);
  std::vector<uint8_t> pool(table.size() * layout.BlockBytes());
  PagedKv kv(pool.data(), layout, table, table.size());

  GenerationResult result{.prompt_tokens = static_cast<uint32_t>(prompt.size())};
  LogitsDigest digest;
  absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::vector<float> logits, model.Forward(prompt, 0, kv));
  result.prefill_time = absl::Now() - start;
  start = absl::Now();
  uint32_t position = static_cast<uint32_t>(prompt.size());
  while (true) {
    digest.Update(logits);
    ASSIGN_OR_RETURN(uint32_t token, sampler.Sample(logits));
    result.tokens.push_back(token);
    if (result.tokens.size() >= max_new_tokens) break;
    ASSIGN_OR_RETURN(logits, model.Forward({&token, 1}, position++, kv));
  }
  result.decode_time = absl::Now() - start;
  result.logits_digest = digest.value();
  return result;
}

}  // namespace kvcache::worker
