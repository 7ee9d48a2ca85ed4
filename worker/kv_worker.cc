#include "worker/kv_worker.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace kvcache::worker {
namespace {

// The forward pass over `mapped`: the hybrid's (over its pages and state), the CUDA model's for a
// device pool, the CPU model's otherwise.
PoolForward ForwardOver(const MappedPool& mapped, const Qwen3MoeModel* model,
                        const Qwen3NextModel* hybrid_model, CudaQwen3MoeModel* cuda_model,
                        KvWorker::HybridParts* hybrid) {
  if (hybrid != nullptr && hybrid->cuda_model != nullptr) {
    return HybridDevicePoolForward(*hybrid->cuda_model, mapped.Block(0), hybrid->pages,
                                   mapped.num_blocks(), hybrid->checkpoint_pages,
                                   hybrid->device_state.get());
  }
  if (hybrid != nullptr) {
    return HybridHostPoolForward(*hybrid_model, mapped.Block(0), hybrid->pages, mapped.num_blocks(),
                                 hybrid->checkpoint_pages, &hybrid->state);
  }
  if (cuda_model != nullptr) {
    return DevicePoolForward(*cuda_model, mapped.Block(0), mapped.layout(), mapped.num_blocks());
  }
  return HostPoolForward(*model, mapped.Block(0), mapped.layout(), mapped.num_blocks());
}

}  // namespace

KvWorker::KvWorker(KvCacheClient* client, std::string pool, const Qwen3MoeModel* model,
                   const Qwen3NextModel* hybrid_model, std::unique_ptr<MappedPool> mapped,
                   std::unique_ptr<CudaQwen3MoeModel> cuda_model,
                   std::unique_ptr<HybridParts> hybrid)
    : client_(client),
      pool_(std::move(pool)),
      model_(model),
      hybrid_model_(hybrid_model),
      mapped_(std::move(mapped)),
      cuda_model_(std::move(cuda_model)),
      hybrid_(std::move(hybrid)),
      forward_(ForwardOver(*mapped_, model_, hybrid_model_, cuda_model_.get(), hybrid_.get())) {}

absl::StatusOr<std::unique_ptr<KvWorker>> KvWorker::Create(KvCacheClient* client, std::string pool,
                                                           const Qwen3MoeModel* model) {
  ASSIGN_OR_RETURN(KvCacheClient::PoolDescription description, client->DescribePool(pool));
  // A device pool fails here in a build without CUDA or on a machine without a usable device.
  ASSIGN_OR_RETURN(std::unique_ptr<MappedPool> mapped, MappedPool::Map(description));
  const PoolLayout& layout = mapped->layout();
  const ModelConfig& config = model->config();
  if (layout.num_layers != config.num_hidden_layers ||
      layout.num_kv_heads != config.num_key_value_heads || layout.head_dim != config.head_dim) {
    return absl::FailedPreconditionError(
        absl::StrCat("pool '", pool, "' is laid out for ", layout.DebugString(),
                     " but the model has ", config.num_hidden_layers, " layers, ",
                     config.num_key_value_heads, " KV heads, head dim ", config.head_dim));
  }
  std::unique_ptr<CudaQwen3MoeModel> cuda_model;
  if (mapped->is_device()) {
    // The KV lives on the GPU: the model runs there too, on the pool's device (a host model
    // would fault on the device addresses). The weights are uploaded once, here.
    absl::StatusOr<CudaQwen3MoeModel> created = CudaQwen3MoeModel::Create(*model, mapped->device());
    if (!created.ok()) {
      return absl::Status(
          created.status().code(),
          absl::StrCat("pool '", pool, "' is device memory (cuda:", mapped->device(),
                       ") and the model cannot run there: ", created.status().message()));
    }
    cuda_model = std::make_unique<CudaQwen3MoeModel>(*std::move(created));
  }
  return std::unique_ptr<KvWorker>(new KvWorker(client, std::move(pool), model, nullptr,
                                                std::move(mapped), std::move(cuda_model), nullptr));
}

absl::StatusOr<std::unique_ptr<KvWorker>> KvWorker::Create(KvCacheClient* client, std::string pool,
                                                           const Qwen3NextModel* model,
                                                           uint32_t checkpoint_pages) {
  if (checkpoint_pages == 0) {
    return absl::InvalidArgumentError("a hybrid worker saves its state every 1 or more pages");
  }
  ASSIGN_OR_RETURN(KvCacheClient::PoolDescription description, client->DescribePool(pool));
  ASSIGN_OR_RETURN(std::unique_ptr<MappedPool> mapped, MappedPool::Map(description));
  ASSIGN_OR_RETURN(HybridPages pages, HybridPagesIn(model->config(), pool, mapped->layout(),
                                                    mapped->block_bytes(), mapped->parts()));
  auto hybrid = std::make_unique<HybridParts>(HybridParts{
      .pages = pages, .checkpoint_pages = checkpoint_pages, .state = model->NewState()});
  if (mapped->is_device()) {
    // The pages live on the GPU: the model and its state go there too (weights uploaded once).
    auto on_device = [&](const absl::Status& status) {
      return absl::Status(
          status.code(),
          absl::StrCat("pool '", pool, "' is device memory (cuda:", mapped->device(),
                       ") and the hybrid model cannot run there: ", status.message()));
    };
    absl::StatusOr<CudaQwen3NextModel> created =
        CudaQwen3NextModel::Create(*model, mapped->device());
    if (!created.ok()) return on_device(created.status());
    absl::StatusOr<DeviceLinearAttentionState> state =
        DeviceLinearAttentionState::Create(mapped->device(), model->config());
    if (!state.ok()) return on_device(state.status());
    hybrid->cuda_model = std::make_unique<CudaQwen3NextModel>(*std::move(created));
    hybrid->device_state = std::make_unique<DeviceLinearAttentionState>(*std::move(state));
  }
  return std::unique_ptr<KvWorker>(new KvWorker(client, std::move(pool), nullptr, model,
                                                std::move(mapped), nullptr, std::move(hybrid)));
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
  // Every part is restored: for the hybrid, KV and the state at the endpoint, so the daemon ends
  // the hit at a page that holds both.
  ASSIGN_OR_RETURN(KvCacheClient::Sequence sequence,
                   client_->OpenSequence(pool_, prompt, cache_salt, {}, /*max_load_ms=*/0,
                                         /*restore_parts=*/{}));
  absl::StatusOr<GenerationResult> result =
      Run(sequence, prompt, max_new_tokens, sampler, after_prefill);
  if (result.ok()) {
    result->host_tier_tokens = sequence.cached_tokens_by_tier.host;
    result->disk_tier_tokens = sequence.cached_tokens_by_tier.disk;
    result->cluster_tier_tokens = sequence.cached_tokens_by_tier.cluster;
  }
  const absl::Status released = client_->ReleaseSequence(sequence.sequence_id);
  if (result.ok() && !released.ok()) return released;
  return result;
}

absl::Status KvWorker::Commit(uint64_t sequence_id, uint32_t tokens, std::vector<uint32_t>& masks) {
  if (hybrid_ == nullptr) return client_->CommitSequence(sequence_id, tokens).status();
  const uint32_t full_blocks = tokens / mapped_->layout().block_size;
  for (uint32_t block = static_cast<uint32_t>(masks.size()); block < full_blocks; ++block) {
    masks.push_back(hybrid_->pages.MaskOfPage(block, hybrid_->checkpoint_pages));
  }
  return client_->CommitSequence(sequence_id, tokens, absl::MakeConstSpan(masks).first(full_blocks))
      .status();
}

absl::StatusOr<GenerationResult> KvWorker::Run(const KvCacheClient::Sequence& sequence,
                                               absl::Span<const uint32_t> prompt,
                                               uint32_t max_new_tokens, Sampler& sampler,
                                               const AfterPrefill& after_prefill) {
  const uint64_t sequence_id = sequence.sequence_id;
  std::vector<uint32_t> table = sequence.block_ids;
  const uint32_t cached = sequence.num_cached_tokens;
  const uint32_t block_size = mapped_->layout().block_size;
  // The cached blocks' masks; the hybrid's commits append those of the blocks written here.
  std::vector<uint32_t> masks = sequence.part_masks;
  if (hybrid_ != nullptr) {
    masks.resize(cached / block_size, hybrid_->pages.kv_mask);
    const uint8_t* endpoint_page =
        cached == 0 ? nullptr : mapped_->Block(table[cached / block_size - 1]);
    if (hybrid_->device_state != nullptr) {
      RETURN_IF_ERROR(RestoreHybridStateOnDevice(hybrid_->pages, endpoint_page, cached,
                                                 *hybrid_->device_state));
    } else {
      RETURN_IF_ERROR(RestoreHybridState(hybrid_->pages, endpoint_page, cached, hybrid_->state));
    }
  }
  GenerationResult result{.prompt_tokens = static_cast<uint32_t>(prompt.size()),
                          .cached_tokens = cached};
  LogitsDigest digest;
  absl::Time start = absl::Now();
  ASSIGN_OR_RETURN(std::vector<float> logits, forward_(prompt.subspan(cached), cached, table));
  // The prompt's KV is written (and, on a GPU, synchronized): its full blocks may be published.
  RETURN_IF_ERROR(Commit(sequence_id, prompt.size(), masks));
  result.prefill_time = absl::Now() - start;
  // Only the hybrid commits masks; every other block was committed with every part.
  if (after_prefill) {
    RETURN_IF_ERROR(after_prefill(
        table, hybrid_ != nullptr ? absl::MakeConstSpan(masks) : absl::Span<const uint32_t>()));
  }

  // Decode talks to the daemon per block, not per token: sampled tokens wait in `pending` until
  // a new block is needed (ExtendSequence hands it out) or their block is full (they are sent,
  // then the block is committed and published).
  start = absl::Now();
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
    ASSIGN_OR_RETURN(logits, forward_({&token, 1}, position++, table));
    if (position % block_size == 0) {
      RETURN_IF_ERROR(send_pending());
      RETURN_IF_ERROR(Commit(sequence_id, position, masks));
    }
  }
  result.decode_time = absl::Now() - start;
  result.logits_digest = digest.value();
  return result;
}

absl::StatusOr<GenerationResult> KvWorker::GenerateColdReference(absl::Span<const uint32_t> prompt,
                                                                 uint32_t max_new_tokens,
                                                                 Sampler& sampler) {
  if (hybrid_ != nullptr && hybrid_->cuda_model != nullptr) {
    return GenerateColdHybridCuda(*hybrid_->cuda_model, hybrid_model_->config(), prompt,
                                  max_new_tokens, sampler, layout().block_size, layout().dtype);
  }
  if (hybrid_ != nullptr) {
    return GenerateColdHybrid(*hybrid_model_, prompt, max_new_tokens, sampler, layout().block_size,
                              layout().dtype);
  }
  if (cuda_model_ != nullptr) {
    return GenerateColdCuda(*cuda_model_, prompt, max_new_tokens, sampler, layout());
  }
  return GenerateCold(*model_, prompt, max_new_tokens, sampler, layout().block_size,
                      layout().dtype);
}

}  // namespace kvcache::worker
