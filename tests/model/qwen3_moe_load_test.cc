// Loading checkpoints: clear errors for missing or mis-shaped tensors, tied embeddings, and the
// determinism of scripts/make_tiny_checkpoint.py.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "model/qwen3_moe.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_files.h"
#include "tests/testing/tiny_model.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::kvcache::worker::testing::ReadFile;
using ::kvcache::worker::testing::WriteFile;
using ::testing::AllOf;
using ::testing::HasSubstr;

// A checkpoint directory with the tiny weights and an edited config.
class EditedCheckpoint {
 public:
  explicit EditedCheckpoint(const std::function<void(nlohmann::json&)>& edit) {
    const std::string source = testing::TinyCheckpointDir();
    nlohmann::json config = nlohmann::json::parse(ReadFile(source + "/config.json"));
    edit(config);
    WriteFile(dir_.File("config.json"), config.dump(2));
    std::filesystem::copy_file(source + "/model.safetensors", dir_.File("model.safetensors"));
  }
  const std::string& path() const { return dir_.path(); }
  std::string File(const std::string& name) const { return dir_.File(name); }

 private:
  ScopedTempDir dir_;
};

TEST(Qwen3MoeLoadTest, MissingFilesAreNotFound) {
  ScopedTempDir dir;
  EXPECT_THAT(Qwen3MoeModel::Load(dir.path()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("config.json")));
  WriteFile(dir.File("config.json"),
            ReadFile(std::string(testing::TinyCheckpointDir()) + "/config.json"));
  EXPECT_THAT(Qwen3MoeModel::Load(dir.path()),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("model.safetensors")));
}

TEST(Qwen3MoeLoadTest, MissingTensorIsNotFoundAndNamed) {
  // A fourth layer the file does not have.
  EditedCheckpoint checkpoint([](nlohmann::json& config) { config["num_hidden_layers"] = 4; });
  EXPECT_THAT(Qwen3MoeModel::Load(checkpoint.path()),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("no tensor \"model.layers.3.input_layernorm.weight\"")));
}

TEST(Qwen3MoeLoadTest, MisShapedTensorIsInvalidArgumentAndNamed) {
  EditedCheckpoint checkpoint([](nlohmann::json& config) { config["vocab_size"] = 300; });
  EXPECT_THAT(Qwen3MoeModel::Load(checkpoint.path()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("\"model.embed_tokens.weight\""),
                             HasSubstr("has shape [256, 64]"), HasSubstr("expected [300, 64]"))));
  EditedCheckpoint experts([](nlohmann::json& config) { config["moe_intermediate_size"] = 48; });
  EXPECT_THAT(
      Qwen3MoeModel::Load(experts.path()),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("\"model.layers.0.mlp.experts.0.gate_proj.weight\" has shape [32, 64], "
                         "expected [48, 64]")));
}

TEST(Qwen3MoeLoadTest, BadConfigAndCorruptFileAreInvalidArgument) {
  EditedCheckpoint checkpoint([](nlohmann::json& config) { config["num_key_value_heads"] = 3; });
  EXPECT_THAT(Qwen3MoeModel::Load(checkpoint.path()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("num_key_value_heads")));
  EditedCheckpoint corrupt([](nlohmann::json&) {});
  const std::string bytes = ReadFile(corrupt.File("model.safetensors"));
  WriteFile(corrupt.File("model.safetensors"), bytes.substr(0, bytes.size() - 100));
  EXPECT_THAT(Qwen3MoeModel::Load(corrupt.path()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceed")));
}

TEST(Qwen3MoeLoadTest, TiedEmbeddingsUseTheEmbeddingAsLmHead) {
  EditedCheckpoint checkpoint([](nlohmann::json& config) { config["tie_word_embeddings"] = true; });
  absl::StatusOr<Qwen3MoeModel> tied = Qwen3MoeModel::Load(checkpoint.path());
  ASSERT_OK(tied);
  absl::StatusOr<Qwen3MoeModel> untied = Qwen3MoeModel::Load(testing::TinyCheckpointDir());
  ASSERT_OK(untied);
  const std::vector<uint32_t> prompt = testing::MakePrompt(5, 1);
  testing::HostPool tied_pool(tied->KvLayout(16, DType::kFloat32), 1);
  testing::HostPool untied_pool(untied->KvLayout(16, DType::kFloat32), 1);
  const std::vector<uint32_t> table = {0};
  PagedKv tied_kv = tied_pool.View(table);
  PagedKv untied_kv = untied_pool.View(table);
  absl::StatusOr<std::vector<float>> a = tied->Forward(prompt, 0, tied_kv);
  absl::StatusOr<std::vector<float>> b = untied->Forward(prompt, 0, untied_kv);
  ASSERT_OK(a);
  ASSERT_OK(b);
  EXPECT_NE(*a, *b);                              // a different head...
  EXPECT_EQ(tied_pool.bytes, untied_pool.bytes);  // ...over the same body
}

int RunScript(const std::string& out_dir, const std::string& args) {
  return std::system(absl::StrCat(KVCACHE_WORKER_PYTHON, " ", KVCACHE_TINY_CHECKPOINT_SCRIPT, " ",
                                  out_dir, " ", args)
                         .c_str());
}

TEST(Qwen3MoeLoadTest, CheckpointScriptIsDeterministic) {
  ScopedTempDir dir;
  ASSERT_EQ(RunScript(dir.File("bf16"), "--dtype bf16 --seed 0"), 0);
  ASSERT_EQ(RunScript(dir.File("f32"), "--dtype f32 --seed 0"), 0);
  ASSERT_EQ(RunScript(dir.File("seed1"), "--dtype bf16 --seed 1"), 0);
  const std::string built = testing::TinyCheckpointDir();
  const std::string built_f32 = testing::TinyCheckpointF32Dir();
  EXPECT_EQ(ReadFile(dir.File("bf16/model.safetensors")), ReadFile(built + "/model.safetensors"));
  EXPECT_EQ(ReadFile(dir.File("bf16/config.json")), ReadFile(built + "/config.json"));
  EXPECT_EQ(ReadFile(dir.File("f32/model.safetensors")),
            ReadFile(built_f32 + "/model.safetensors"));
  EXPECT_NE(ReadFile(dir.File("seed1/model.safetensors")), ReadFile(built + "/model.safetensors"));
  // Every dtype the script writes loads.
  ASSERT_EQ(RunScript(dir.File("f16"), "--dtype f16 --seed 0 --layers 1"), 0);
  absl::StatusOr<Qwen3MoeModel> f16 = Qwen3MoeModel::Load(dir.File("f16"));
  ASSERT_OK(f16);
  EXPECT_EQ(f16->config().num_hidden_layers, 1u);
}

}  // namespace
}  // namespace kvcache::worker
