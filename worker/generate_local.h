// GenerateLocal: single-process generation over a caller-provided paged KV pool — prefill the
// prompt in one Forward, then decode one token per Forward. It is the cold reference the cache
// tests compare against; the daemon-backed worker loop lives elsewhere.
// Thread-safety: as Qwen3MoeModel::Forward; the sampler and the pool blocks are the caller's.
#ifndef KVCACHE_WORKER_GENERATE_LOCAL_H_
#define KVCACHE_WORKER_GENERATE_LOCAL_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/pool_layout.h"
#include "worker/qwen3_moe.h"
#include "worker/sampler.h"

namespace kvcache::worker {

// Returns the `max_new_tokens` generated tokens (no stop token). The block table must cover
// prompt.size() + max_new_tokens - 1 positions (the last sampled token is never fed back);
// OUT_OF_RANGE otherwise, before anything is computed. Other errors as Forward / Sample.
absl::StatusOr<std::vector<uint32_t>> GenerateLocal(const Qwen3MoeModel& model,
                                                    absl::Span<const uint32_t> prompt,
                                                    uint32_t max_new_tokens, Sampler& sampler,
                                                    uint8_t* pool_base, const PoolLayout& layout,
                                                    absl::Span<const uint32_t> block_table);

}  // namespace kvcache::worker

#endif  // KVCACHE_WORKER_GENERATE_LOCAL_H_
