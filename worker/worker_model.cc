#include "worker/worker_model.h"

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/hybrid_pages.h"

namespace kvcache::worker {
namespace {

// config.json's model_type; "qwen3_moe" when absent (as Qwen3MoeModel reads it).
absl::StatusOr<std::string> ModelType(const std::string& checkpoint_dir) {
  const std::string path = checkpoint_dir + "/config.json";
  std::ifstream file(path);
  if (!file) return absl::NotFoundError(absl::StrCat("cannot open ", path));
  std::stringstream text;
  text << file.rdbuf();
  const nlohmann::json root =
      nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) return absl::InvalidArgumentError(absl::StrCat(path, " is not JSON"));
  const auto it = root.find("model_type");
  if (it == root.end()) return std::string("qwen3_moe");
  if (!it->is_string()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": \"model_type\" is not a string"));
  }
  return it->get<std::string>();
}

}  // namespace

absl::StatusOr<WorkerModel> WorkerModel::Load(const std::string& checkpoint_dir) {
  ASSIGN_OR_RETURN(const std::string model_type, ModelType(checkpoint_dir));
  if (model_type == "qwen3_next") {
    ASSIGN_OR_RETURN(Qwen3NextModel model, Qwen3NextModel::Load(checkpoint_dir));
    return WorkerModel(std::move(model));
  }
  // Qwen3MoeModel names any other model_type in its INVALID_ARGUMENT.
  ASSIGN_OR_RETURN(Qwen3MoeModel model, Qwen3MoeModel::Load(checkpoint_dir));
  return WorkerModel(std::move(model));
}

absl::StatusOr<std::unique_ptr<KvWorker>> WorkerModel::CreateWorker(
    KvCacheClient* client, std::string pool, uint32_t checkpoint_pages) const {
  if (hybrid()) return KvWorker::Create(client, std::move(pool), &hybrid_model(), checkpoint_pages);
  return KvWorker::Create(client, std::move(pool), &moe_model());
}

absl::StatusOr<GenerationResult> WorkerModel::GenerateCold(absl::Span<const uint32_t> prompt,
                                                           uint32_t max_new_tokens,
                                                           Sampler& sampler, uint32_t block_size,
                                                           DType dtype) const {
  if (hybrid()) {
    return GenerateColdHybrid(hybrid_model(), prompt, max_new_tokens, sampler, block_size, dtype);
  }
  return worker::GenerateCold(moe_model(), prompt, max_new_tokens, sampler, block_size, dtype);
}

}  // namespace kvcache::worker
