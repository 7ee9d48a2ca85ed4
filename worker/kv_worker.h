// KvWorker: runs the model with its KV in the daemon's pool. A generation opens a sequence (the
// daemon hands back the longest cached prefix), computes only the uncached prompt tokens at the
// positions after the cached ones, writes their KV in place through the shared mapping, commits
// the prompt, then decodes, appending tokens to the sequence and committing each block as it
// fills (one round trip per block, not per token), so a later turn hits its own earlier answer.
// The sequence is released (tail first) at the end, or on any error.
//
// Thread-safety: thread-compatible (one generation at a time per KvWorker).
#ifndef KVCACHE_WORKER_KV_WORKER_H_
#define KVCACHE_WORKER_KV_WORKER_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"
#include "worker/generation.h"
#include "worker/qwen3_moe.h"
#include "worker/sampler.h"

namespace kvcache::worker {

class KvWorker {
 public:
  // `client` must have an open session and outlive the worker; so must `model`. Maps `pool`.
  // FAILED_PRECONDITION when the pool's layout is not the model's (layers, KV heads, head dim),
  // or when it is device memory (the model runs on the CPU over a host mapping).
  static absl::StatusOr<std::unique_ptr<KvWorker>> Create(KvCacheClient* client,
                                                          std::string pool,
                                                          const Qwen3MoeModel* model);

  // Called once the prompt's KV is written and committed, with the sequence's block table, while
  // the sequence still pins its blocks (a prefill worker ships them to a decode worker here).
  using AfterPrefill = std::function<absl::Status(absl::Span<const uint32_t> block_table)>;

  // Errors: the daemon's (e.g. RESOURCE_EXHAUSTED when the pool is full), the model's, the
  // hook's, or FAILED_PRECONDITION after a daemon restart (the mapping belongs to the old epoch).
  absl::StatusOr<GenerationResult> Generate(absl::Span<const uint32_t> prompt,
                                            uint32_t max_new_tokens, Sampler& sampler,
                                            absl::string_view cache_salt = "",
                                            const AfterPrefill& after_prefill = nullptr);

  const PoolLayout& layout() const { return mapped_->layout(); }
  const MappedPool& mapped() const { return *mapped_; }

 private:
  KvWorker(KvCacheClient* client, std::string pool, const Qwen3MoeModel* model,
           std::unique_ptr<MappedPool> mapped)
      : client_(client), pool_(std::move(pool)), model_(model), mapped_(std::move(mapped)) {}

  absl::StatusOr<GenerationResult> Run(uint64_t sequence_id, std::vector<uint32_t> table,
                                       uint32_t cached, absl::Span<const uint32_t> prompt,
                                       uint32_t max_new_tokens, Sampler& sampler,
                                       const AfterPrefill& after_prefill);

  KvCacheClient* const client_;
  const std::string pool_;
  const Qwen3MoeModel* const model_;
  const std::unique_ptr<MappedPool> mapped_;
};

}  // namespace kvcache::worker

#endif  // KVCACHE_WORKER_KV_WORKER_H_
