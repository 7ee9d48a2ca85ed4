#include "worker/generation.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "model/cuda/device_kv_pool.h"

namespace kvcache::worker {
std::vector<uint32_t> PrivateBlockTable(size_t prompt_tokens, uint32_t max_new_tokens,
                                        uint32_t block_size) {
  const size_t positions = prompt_tokens + max_new_tokens;
  std::vector<uint32_t> table((positions + block_size - 1) / block_size);
  std::iota(table.begin(), table.end(), 0);
  return table;
}

absl::StatusOr<GenerationResult> GenerateOver(const PoolForward& forward, uint32_t block_size,
                                              absl::Span<const uint32_t> block_table,
                                              absl::Span<const uint32_t> prompt,
                                              uint32_t max_new_tokens, Sampler& sampler) {
  if (prompt.empty()) return absl::InvalidArgumentError("generation needs a non-empty prompt");
  const uint64_t needed = uint64_t{prompt.size()} + std::max<uint32_t>(max_new_tokens, 1) - 1;
  const uint64_t capacity = uint64_t{block_table.size()} * block_size;
  if (needed > capacity) {
    return absl::OutOfRangeError(absl::StrCat("generating ", max_new_tokens, " tokens after a ",
                                              prompt.size(), "-token prompt needs ", needed,
                                              " KV slots; the block table has ", capacity));
  }
  GenerationResult result{.prompt_tokens = static_cast<uint32_t>(prompt.size())};
  LogitsDigest digest;
  absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::vector<float> logits, forward(prompt, 0, block_table));
  result.prefill_time = absl::Now() - start;
  start = absl::Now();
  uint32_t position = static_cast<uint32_t>(prompt.size());
  while (true) {
    digest.Update(logits);
    ASSIGN_OR_RETURN(uint32_t token, sampler.Sample(logits));
    result.tokens.push_back(token);
    if (result.tokens.size() >= max_new_tokens) break;
    ASSIGN_OR_RETURN(logits, forward({&token, 1}, position++, block_table));
  }
  result.decode_time = absl::Now() - start;
  result.logits_digest = digest.value();
  return result;
}

absl::StatusOr<GenerationResult> GenerateCold(const Qwen3MoeModel& model,
                                              absl::Span<const uint32_t> prompt,
                                              uint32_t max_new_tokens, Sampler& sampler,
                                              uint32_t block_size, DType dtype) {
  const PoolLayout layout = model.KvLayout(block_size, dtype);
  RETURN_IF_ERROR(layout.Validate());
  const std::vector<uint32_t> table = PrivateBlockTable(prompt.size(), max_new_tokens, block_size);
  std::vector<uint8_t> pool(table.size() * layout.BlockBytes());
  return GenerateOver(HostPoolForward(model, pool.data(), layout, table.size()), block_size, table,
                      prompt, max_new_tokens, sampler);
}

absl::StatusOr<GenerationResult> GenerateColdCuda(CudaQwen3MoeModel& model,
                                                  absl::Span<const uint32_t> prompt,
                                                  uint32_t max_new_tokens, Sampler& sampler,
                                                  const PoolLayout& layout) {
  RETURN_IF_ERROR(layout.Validate());
  const std::vector<uint32_t> table =
      PrivateBlockTable(prompt.size(), max_new_tokens, layout.block_size);
  ASSIGN_OR_RETURN(DeviceKvPool pool, DeviceKvPool::Create(model.device(), layout,
                                                           static_cast<uint32_t>(table.size())));
  // Every Forward synchronized its stream before returning, so the pool is idle when freed.
  return GenerateOver(DevicePoolForward(model, pool.base(), layout, pool.num_blocks()),
                      layout.block_size, table, prompt, max_new_tokens, sampler);
}

}  // namespace kvcache::worker
