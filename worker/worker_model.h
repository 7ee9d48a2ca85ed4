// WorkerModel: the model a checkpoint holds, whichever of the worker's models it is — Qwen3-MoE
// (config.json "model_type": "qwen3_moe") or the hybrid Qwen3-Next ("qwen3_next") — so that the
// binaries (kvcache-worker, kvcache-pd, worker_bench) and the process tests load a checkpoint,
// create its KvWorker and compute its cold reference in one way for both.
//
// Thread-safety: immutable after Load.
#ifndef KVCACHE_WORKER_WORKER_MODEL_H_
#define KVCACHE_WORKER_WORKER_MODEL_H_

#include <memory>
#include <string>
#include <variant>

#include "absl/status/statusor.h"
#include "client/kv_cache_client.h"
#include "model/qwen3_moe.h"
#include "model/qwen3_next.h"
#include "worker/generation.h"
#include "worker/kv_worker.h"

namespace kvcache::worker {

class WorkerModel {
 public:
  // Reads `checkpoint_dir`/config.json's model_type and loads that model. NOT_FOUND for a missing
  // file, INVALID_ARGUMENT for a malformed one or a model_type the worker does not run.
  static absl::StatusOr<WorkerModel> Load(const std::string& checkpoint_dir);

  bool hybrid() const { return std::holds_alternative<Qwen3NextModel>(model_); }
  // REQUIRES: hybrid() (for hybrid_model) or !hybrid() (for moe_model).
  const Qwen3NextModel& hybrid_model() const { return std::get<Qwen3NextModel>(model_); }
  const Qwen3MoeModel& moe_model() const { return std::get<Qwen3MoeModel>(model_); }

  // KvWorker::Create for this model; `checkpoint_pages`: the hybrid's state interval (ignored for
  // Qwen3-MoE).
  absl::StatusOr<std::unique_ptr<KvWorker>> CreateWorker(KvCacheClient* client, std::string pool,
                                                         uint32_t checkpoint_pages = 1) const;

  // The cold reference on the CPU: GenerateCold or GenerateColdHybrid.
  absl::StatusOr<GenerationResult> GenerateCold(absl::Span<const uint32_t> prompt,
                                                uint32_t max_new_tokens, Sampler& sampler,
                                                uint32_t block_size, DType dtype) const;

 private:
  explicit WorkerModel(std::variant<Qwen3MoeModel, Qwen3NextModel> model)
      : model_(std::move(model)) {}

  std::variant<Qwen3MoeModel, Qwen3NextModel> model_;
};

}  // namespace kvcache::worker

#endif  // KVCACHE_WORKER_WORKER_MODEL_H_
