// What one generation produced, in a form two processes can compare exactly: the tokens, and a
// digest of every logits vector in order (XXH3-64 over their bytes). GenerateCold (CPU) and
// GenerateColdCuda (GPU) are the references: one process, a private pool, no cache — the run
// every cached run on the same backend must equal. Both are GenerateOver, the one cold generation
// loop, over their backend's PoolForward (worker/pool_forward.h).
//
// Thread-safety: GenerateCold is thread-safe for distinct samplers; GenerateColdCuda uses the
// CUDA model's stream and scratch (one call at a time per model, as its Forward);
// LogitsDigest is thread-compatible.
#ifndef KVCACHE_WORKER_GENERATION_H_
#define KVCACHE_WORKER_GENERATION_H_

#include <xxhash.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/pool_layout.h"
#include "model/cuda/qwen3_moe_cuda.h"
#include "model/qwen3_moe.h"
#include "model/sampler.h"
#include "worker/pool_forward.h"

namespace kvcache::worker {

struct GenerationResult {
  std::vector<uint32_t> tokens;  // generated, max_new_tokens of them
  uint32_t prompt_tokens = 0;
  uint32_t cached_tokens = 0;  // prompt tokens whose KV came from the cache
  // Of cached_tokens, those the daemon loaded from a lower tier for this request (the rest were
  // in its pool): where a cross-node hit shows.
  uint32_t host_tier_tokens = 0;
  uint32_t disk_tier_tokens = 0;
  uint32_t cluster_tier_tokens = 0;
  uint64_t logits_digest = 0;   // over the logits of the prompt's last token, then each step's
  absl::Duration prefill_time;  // computing the uncached prompt tokens
  absl::Duration decode_time;   // every decode step after the prefill
};

class LogitsDigest {
 public:
  LogitsDigest() : state_(XXH3_createState(), &XXH3_freeState) {
    XXH3_64bits_reset_withSeed(state_.get(), 0);
  }
  void Update(absl::Span<const float> logits) {
    XXH3_64bits_update(state_.get(), logits.data(), logits.size() * sizeof(float));
  }
  uint64_t value() const { return XXH3_64bits_digest(state_.get()); }

 private:
  std::unique_ptr<XXH3_state_t, decltype(&XXH3_freeState)> state_;
};

// Blocks 0, 1, ... of a private pool, enough for the prompt and every generated token.
std::vector<uint32_t> PrivateBlockTable(size_t prompt_tokens, uint32_t max_new_tokens,
                                        uint32_t block_size);

// The cold generation loop over any pool: prefill the whole prompt in one forward pass, then
// decode max_new_tokens - 1 steps (the last sampled token is not fed back; max_new_tokens 0
// samples one token all the same), position p in block block_table[p / block_size]. Tests that
// inspect or share a pool run it over their own (HostPoolForward over a test buffer).
// Errors, before anything is computed: INVALID_ARGUMENT for an empty prompt, OUT_OF_RANGE when
// the table does not cover prompt.size() + max_new_tokens - 1 positions; then as `forward` /
// Sample.
absl::StatusOr<GenerationResult> GenerateOver(const PoolForward& forward, uint32_t block_size,
                                              absl::Span<const uint32_t> block_table,
                                              absl::Span<const uint32_t> prompt,
                                              uint32_t max_new_tokens, Sampler& sampler);

// GenerateOver with the CPU model over a private, zero-filled host pool of `dtype` and
// `block_size`. Errors as Forward / Sample.
absl::StatusOr<GenerationResult> GenerateCold(const Qwen3MoeModel& model,
                                              absl::Span<const uint32_t> prompt,
                                              uint32_t max_new_tokens, Sampler& sampler,
                                              uint32_t block_size, DType dtype);

// GenerateOver with the CUDA model over a fresh, zero-filled device pool of `layout` on
// model.device() (DeviceKvPool), freed on return. The reference of cached GPU runs on the same
// device and build, which it equals bit for bit (the CUDA model is deterministic and
// batch-invariant) — not of GenerateCold, which the GPU matches only within a tolerance.
// Errors: DeviceKvPool::Create's (FAILED_PRECONDITION without CUDA or a device), then as
// CudaQwen3MoeModel::Forward / Sample.
absl::StatusOr<GenerationResult> GenerateColdCuda(CudaQwen3MoeModel& model,
                                                  absl::Span<const uint32_t> prompt,
                                                  uint32_t max_new_tokens, Sampler& sampler,
                                                  const PoolLayout& layout);

}  // namespace kvcache::worker

#endif  // KVCACHE_WORKER_GENERATION_H_
