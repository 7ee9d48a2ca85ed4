#include "worker/kv_worker.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace kvcache::worker {

absl::StatusOr<std::unique_ptr<KvWorker>> KvWorker::Create(KvCacheClient* client,
                                                          std::string pool,
                                                          const Qwen3MoeModel* model) {
  ASSIGN_OR_RETURN(KvCacheClient::PoolDescription description, client->DescribePool(pool));
  ASSIGN_OR_RETURN(std::unique_ptr<MappedPool> mapped, MappedPool::Map(description));
  if (mapped->is_device()) {
    // The model runs on the CPU over host addresses (PagedKv): a device pointer would fault.
    return absl::FailedPreconditionError(absl::StrCat(
        "pool '", pool, "' is device memory (cuda:", mapped->device(),
        "); this worker computes on the CPU and needs a host pool (a daemon with --device host)"));
  }
  const PoolLayout& layout = mapped->layout();
  const ModelConfig& config = model->config();
  if (layout.num_layers != config.num_hidden_layers ||
      layout.num_kv_heads != config.num_key_value_heads || layout.head_dim != config.head_dim) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool '", pool, "' is laid out for ", layout.DebugString(), " but the model has ",
        config.num_hidden_layers, " layers, ", config.num_key_value_heads, " KV heads, head dim ",
        config.head_dim));
  }
  return std::unique_ptr<KvWorker>(
      new KvWorker(client, std::move(pool), model, std::move(mapped)));
}

absl::StatusOr<GenerationResult> KvWorker::Generate(absl::Span<const uint32_t> prompt,
                                                    uint32_t max_new_tokens, Sampler& sampler,
                                                    absl::string_view cache_salt,
                                                    const AfterPrefill& after_prefill) {
  if (max_new_tokens == 0) return absl::InvalidArgumentError("max_new_tokens must be positive");
  if (client_->session_epoch() != mapped_->epoch()) {
    return absl::FailedPreconditionError(
        "the daemon restarted since the pool was mapped; create a new worker");
  }
  ASSIGN_OR_RETURN(KvCacheClient::Sequence sequence,
                   client_->OpenSequence(pool_, prompt, cache_salt));
  absl::StatusOr<GenerationResult> result =
      Run(sequence.sequence_id, std::move(sequence.block_ids), sequence.num_cached_tokens, prompt,
          max_new_tokens, sampler, after_prefill);
  const absl::Status released = client_->ReleaseSequence(sequence.sequence_id);
  if (result.ok() && !released.ok()) return released;
  return result;
}

absl::StatusOr<GenerationResult> KvWorker::Run(uint64_t sequence_id, std::vector<uint32_t> table,
                                               uint32_t cached, absl::Span<const uint32_t> prompt,
                                               uint32_t max_new_tokens, Sampler& sampler,
                                               const AfterPrefill& after_prefill) {
  GenerationResult result{.prompt_tokens = static_cast<uint32_t>(prompt.size()),
                          .cached_tokens = cached};
  auto pool_view = [&] {
    return PagedKv(mapped_->Block(0), mapped_->layout(), table, mapped_->num_blocks());
  };
  LogitsDigest digest;
  absl::Time start = absl::Now();
  PagedKv kv = pool_view();
  ASSIGN_OR_RETURN(std::vector<float> logits, model_->Forward(prompt.subspan(cached), cached, kv));
  // The prompt's KV is written: its full blocks may now be published.
  RETURN_IF_ERROR(client_->CommitSequence(sequence_id, prompt.size()).status());
  result.prefill_time = absl::Now() - start;
  if (after_prefill) RETURN_IF_ERROR(after_prefill(table));

  // Decode talks to the daemon per block, not per token: sampled tokens wait in `pending` until
  // a new block is needed (ExtendSequence hands it out) or their block is full (they are sent,
  // then the block is committed and published).
  start = absl::Now();
  const uint32_t block_size = mapped_->layout().block_size;
  uint32_t position = static_cast<uint32_t>(prompt.size());
  std::vector<uint32_t> pending;
  auto send_pending = [&]() -> absl::Status {
    if (pending.empty()) return absl::OkStatus();
    ASSIGN_OR_RETURN(KvCacheClient::Extension extension,
                     client_->ExtendSequence(sequence_id, pending));
    table.insert(table.end(), extension.new_block_ids.begin(), extension.new_block_ids.end());
    pending.clear();
    return absl::OkStatus();
  };
  while (true) {
    digest.Update(logits);
    ASSIGN_OR_RETURN(uint32_t token, sampler.Sample(logits));
    result.tokens.push_back(token);
    if (result.tokens.size() >= max_new_tokens) break;
    pending.push_back(token);
    if (position >= table.size() * block_size) RETURN_IF_ERROR(send_pending());
    kv = pool_view();
    ASSIGN_OR_RETURN(logits, model_->Forward({&token, 1}, position++, kv));
    if (position % block_size == 0) {
      RETURN_IF_ERROR(send_pending());
      RETURN_IF_ERROR(client_->CommitSequence(sequence_id, position).status());
    }
  }
  result.decode_time = absl::Now() - start;
  result.logits_digest = digest.value();
  return result;
}

}  // namespace kvcache::worker
