// The decoder over a paged pool: prefix-cached and chunked runs are bit-identical to a cold run,
// generation is deterministic, bad requests get exact codes, and the logits match an independent
// float64 reference.
#include "model/qwen3_moe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "model/sampler.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_files.h"
#include "tests/testing/tiny_model.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::StatusIs;
using ::kvcache::worker::testing::BitIdentical;
using ::kvcache::worker::testing::HostPool;
using ::kvcache::worker::testing::MakePrompt;
using ::testing::HasSubstr;

using ::kvcache::worker::testing::TinyModel;

constexpr uint32_t kBlockSize = 16;

std::vector<uint32_t> Iota(uint32_t begin, uint32_t count) {
  std::vector<uint32_t> ids(count);
  for (uint32_t i = 0; i < count; ++i) ids[i] = begin + i;
  return ids;
}

// Cold reference: the whole prompt in one Forward on blocks [first, first + n).
std::vector<float> ColdLogits(const Qwen3MoeModel& model, DType dtype,
                              const std::vector<uint32_t>& prompt) {
  HostPool pool(model.KvLayout(kBlockSize, dtype), 32);
  const std::vector<uint32_t> table = Iota(3, (prompt.size() + kBlockSize - 1) / kBlockSize);
  PagedKv kv = pool.View(table);
  absl::StatusOr<std::vector<float>> logits = model.Forward(prompt, 0, kv);
  EXPECT_OK(logits);
  return logits.value_or(std::vector<float>{});
}

TEST(Qwen3MoeModelTest, LoadsTheTinyCheckpoint) {
  const ModelConfig& config = TinyModel().config();
  EXPECT_EQ(config.hidden_size, 64u);
  EXPECT_EQ(config.num_hidden_layers, 3u);
  EXPECT_EQ(config.num_attention_heads, 4u);
  EXPECT_EQ(config.num_key_value_heads, 2u);
  EXPECT_EQ(config.head_dim, 16u);
  EXPECT_EQ(config.num_experts, 8u);
  EXPECT_EQ(config.num_experts_per_tok, 2u);
  EXPECT_EQ(config.vocab_size, 256u);
  const PoolLayout layout = TinyModel().KvLayout(16, DType::kBFloat16);
  EXPECT_EQ(layout.BlockBytes(), 3u * 2 * 16 * 2 * 16 * 2);
}

class PoolDTypeTest : public ::testing::TestWithParam<DType> {};

// (a) A prompt computed in chunks — its prefix earlier, read back from the pool — gives the
// same logits, bit for bit, as the prompt in one Forward, and writes the same pool bytes.
TEST_P(PoolDTypeTest, ChunkedPrefillIsBitIdenticalToOneShot) {
  const Qwen3MoeModel& model = TinyModel();
  const std::vector<uint32_t> prompt = MakePrompt(80, 1);
  const std::vector<float> cold = ColdLogits(model, GetParam(), prompt);
  ASSERT_EQ(cold.size(), 256u);

  const std::vector<std::vector<size_t>> splits = {{32}, {17, 63}, {16, 32, 48, 64, 79}};
  for (const std::vector<size_t>& split : splits) {
    HostPool pool(model.KvLayout(kBlockSize, GetParam()), 32);
    const std::vector<uint32_t> table = Iota(3, 5);
    PagedKv kv = pool.View(table);
    size_t begin = 0;
    absl::StatusOr<std::vector<float>> logits;
    std::vector<size_t> ends = split;
    ends.push_back(prompt.size());
    for (size_t end : ends) {
      logits = model.Forward(absl::MakeConstSpan(prompt).subspan(begin, end - begin),
                             static_cast<uint32_t>(begin), kv);
      ASSERT_OK(logits);
      begin = end;
    }
    EXPECT_TRUE(BitIdentical(*logits, cold)) << "split at " << absl::StrJoin(split, ",");
  }
}

TEST_P(PoolDTypeTest, TokenByTokenPrefillIsBitIdenticalToOneShot) {
  const Qwen3MoeModel& model = TinyModel();
  const std::vector<uint32_t> prompt = MakePrompt(40, 2);
  HostPool one_shot(model.KvLayout(kBlockSize, GetParam()), 8);
  HostPool stepwise(model.KvLayout(kBlockSize, GetParam()), 8);
  const std::vector<uint32_t> table = {6, 0, 4};
  PagedKv kv_one_shot = one_shot.View(table);
  PagedKv kv_stepwise = stepwise.View(table);
  absl::StatusOr<std::vector<float>> expected = model.Forward(prompt, 0, kv_one_shot);
  ASSERT_OK(expected);
  absl::StatusOr<std::vector<float>> logits;
  for (uint32_t p = 0; p < prompt.size(); ++p) {
    logits = model.Forward(absl::MakeConstSpan(&prompt[p], 1), p, kv_stepwise);
    ASSERT_OK(logits);
  }
  EXPECT_TRUE(BitIdentical(*logits, *expected));
  EXPECT_EQ(one_shot.bytes, stepwise.bytes);  // the pools hold the same KV bytes
}

// (b) The prefix's KV computed by another sequence into other physical blocks — shared as is, or
// copied byte-wise to new blocks (resurrection, transfer) — gives the cold run's logits.
TEST_P(PoolDTypeTest, PrefixFromOtherBlocksIsBitIdenticalToCold) {
  const Qwen3MoeModel& model = TinyModel();
  const std::vector<uint32_t> prompt = MakePrompt(80, 3);
  const std::vector<float> cold = ColdLogits(model, GetParam(), prompt);

  HostPool pool(model.KvLayout(kBlockSize, GetParam()), 32);
  // Sequence A: the first two blocks of the prompt, then a different continuation.
  std::vector<uint32_t> a_tokens(prompt.begin(), prompt.begin() + 32);
  const std::vector<uint32_t> other = MakePrompt(20, 99);
  a_tokens.insert(a_tokens.end(), other.begin(), other.end());
  const std::vector<uint32_t> a_table = {9, 3, 20, 21};
  PagedKv a_kv = pool.View(a_table);
  ASSERT_OK(model.Forward(a_tokens, 0, a_kv));

  // Sequence B shares A's full prefix blocks 9 and 3.
  const std::vector<uint32_t> b_table = {9, 3, 11, 30, 2};
  PagedKv b_kv = pool.View(b_table);
  absl::StatusOr<std::vector<float>> shared =
      model.Forward(absl::MakeConstSpan(prompt).subspan(32), 32, b_kv);
  ASSERT_OK(shared);
  EXPECT_TRUE(BitIdentical(*shared, cold));

  // Sequence C gets byte copies of blocks 9 and 3 in blocks 17 and 5.
  pool.CopyBlock(9, 17);
  pool.CopyBlock(3, 5);
  const std::vector<uint32_t> c_table = {17, 5, 25, 26, 27};
  PagedKv c_kv = pool.View(c_table);
  absl::StatusOr<std::vector<float>> copied =
      model.Forward(absl::MakeConstSpan(prompt).subspan(32), 32, c_kv);
  ASSERT_OK(copied);
  EXPECT_TRUE(BitIdentical(*copied, cold));
}

// Decoding after a prefix hit produces the cold run's tokens and logits at every step.
TEST_P(PoolDTypeTest, DecodeAfterPrefixHitMatchesColdGeneration) {
  const Qwen3MoeModel& model = TinyModel();
  const std::vector<uint32_t> prompt = MakePrompt(37, 4);
  constexpr uint32_t kNewTokens = 12;
  const PoolLayout layout = model.KvLayout(kBlockSize, GetParam());

  HostPool cold_pool(layout, 8);
  const std::vector<uint32_t> cold_table = {0, 1, 2, 3};
  Sampler cold_sampler = Sampler::Greedy();
  absl::StatusOr<std::vector<uint32_t>> cold =
      GenerateTokens(model, cold_pool, cold_table, prompt, kNewTokens, cold_sampler);
  ASSERT_OK(cold);

  // Another sequence computed the first 32 tokens into blocks 6 and 2 of a second pool.
  HostPool pool(layout, 8);
  const std::vector<uint32_t> donor_table = {6, 2};
  PagedKv donor = pool.View(donor_table);
  ASSERT_OK(model.Forward(absl::MakeConstSpan(prompt).subspan(0, 32), 0, donor));
  const std::vector<uint32_t> table = {6, 2, 7, 1};
  PagedKv kv = pool.View(table);
  absl::StatusOr<std::vector<float>> logits =
      model.Forward(absl::MakeConstSpan(prompt).subspan(32), 32, kv);
  ASSERT_OK(logits);
  std::vector<uint32_t> tokens;
  for (uint32_t position = prompt.size(); tokens.size() < kNewTokens; ++position) {
    tokens.push_back(Argmax(*logits));
    if (tokens.size() == kNewTokens) break;
    logits = model.Forward(absl::MakeConstSpan(&tokens.back(), 1), position, kv);
    ASSERT_OK(logits);
  }
  EXPECT_EQ(tokens, *cold);
  // The KV of every computed position is byte-identical to the cold pool's.
  for (uint32_t b = 0; b < 4; ++b) {
    EXPECT_EQ(
        std::memcmp(pool.Block(table[b]), cold_pool.Block(cold_table[b]), layout.BlockBytes()), 0)
        << "block " << b;
  }
}

// Negative control for the tests above: attention really consumes the pool contents, so the
// bit-identity they show is not vacuous.
TEST(Qwen3MoeModelTest, AttentionReadsKvFromThePool) {
  const Qwen3MoeModel& model = TinyModel();
  const std::vector<uint32_t> prompt = MakePrompt(40, 9);
  EXPECT_FALSE(BitIdentical(ColdLogits(model, DType::kFloat32, prompt),
                            ColdLogits(model, DType::kBFloat16, prompt)));

  HostPool pool(model.KvLayout(kBlockSize, DType::kBFloat16), 4);
  const std::vector<uint32_t> table = {2, 0, 3};
  PagedKv kv = pool.View(table);
  ASSERT_OK(model.Forward(absl::MakeConstSpan(prompt).subspan(0, 32), 0, kv));
  const std::vector<uint8_t> clean = pool.bytes;
  const auto continuation = [&] {
    absl::StatusOr<std::vector<float>> logits =
        model.Forward(absl::MakeConstSpan(prompt).subspan(32), 32, kv);
    EXPECT_OK(logits);
    return logits.value_or(std::vector<float>{});
  };
  const std::vector<float> expected = continuation();
  // Perturb one element of the cached V of position 3, layer 1.
  std::vector<float> v(kv.token_elements());
  ASSERT_OK(kv.ReadV(1, 3, v.data()));
  v[5] += 0.5f;
  ASSERT_OK(kv.WriteV(1, 3, v.data()));
  EXPECT_FALSE(BitIdentical(continuation(), expected));
  std::copy(clean.begin(), clean.end(), pool.bytes.begin());  // same buffer, clean bytes
  EXPECT_TRUE(BitIdentical(continuation(), expected));
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, PoolDTypeTest,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                           DType::kFp8E4M3),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// (c) Greedy generation is deterministic and not stuck on one token.
TEST(Qwen3MoeModelTest, GreedyGenerationIsDeterministicAndVaried) {
  const Qwen3MoeModel& model = TinyModel();
  const PoolLayout layout = model.KvLayout(kBlockSize, DType::kBFloat16);
  const std::vector<uint32_t> prompt = MakePrompt(20, 5);
  std::vector<std::vector<uint32_t>> runs;
  for (int run = 0; run < 2; ++run) {
    HostPool pool(layout, 4);
    const std::vector<uint32_t> table = {3, 1, 2};
    Sampler sampler = Sampler::Greedy();
    absl::StatusOr<std::vector<uint32_t>> tokens =
        GenerateTokens(model, pool, table, prompt, 24, sampler);
    ASSERT_OK(tokens);
    ASSERT_EQ(tokens->size(), 24u);
    runs.push_back(*tokens);
  }
  EXPECT_EQ(runs[0], runs[1]);
  const std::set<uint32_t> distinct(runs[0].begin(), runs[0].end());
  EXPECT_GE(distinct.size(), 6u) << absl::StrJoin(runs[0], " ");
}

TEST(Qwen3MoeModelTest, SeededSamplingGenerationIsDeterministic) {
  const Qwen3MoeModel& model = TinyModel();
  const PoolLayout layout = model.KvLayout(kBlockSize, DType::kFloat32);
  const std::vector<uint32_t> prompt = MakePrompt(10, 6);
  std::vector<std::vector<uint32_t>> runs;
  for (uint64_t seed : {11u, 11u, 12u}) {
    HostPool pool(layout, 2);
    const std::vector<uint32_t> table = {1, 0};
    absl::StatusOr<Sampler> sampler =
        Sampler::Create({.temperature = 1.0f, .top_k = 50, .seed = seed});
    ASSERT_OK(sampler);
    absl::StatusOr<std::vector<uint32_t>> tokens =
        GenerateTokens(model, pool, table, prompt, 16, *sampler);
    ASSERT_OK(tokens);
    runs.push_back(*tokens);
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_NE(runs[0], runs[2]);
}

// (d) Bad requests: exact codes, and the pool is left untouched.
TEST(Qwen3MoeModelTest, BadRequestsGetExactCodesAndWriteNothing) {
  const Qwen3MoeModel& model = TinyModel();
  HostPool pool(model.KvLayout(kBlockSize, DType::kBFloat16), 4);
  const std::vector<uint8_t> before = pool.bytes;
  const std::vector<uint32_t> table = {0, 1};
  PagedKv kv = pool.View(table);

  EXPECT_THAT(model.Forward({}, 0, kv),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least one token")));
  const std::vector<uint32_t> bad_token = {1, 2, 256, 3};
  EXPECT_THAT(model.Forward(bad_token, 0, kv),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("token 256 at index 2 is outside the vocabulary of 256")));
  const std::vector<uint32_t> three = {1, 2, 3};
  EXPECT_THAT(model.Forward(three, 4094, kv),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("max_position_embeddings 4096")));
  EXPECT_THAT(model.Forward(three, 0xfffffffe, kv),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("max_position_embeddings")));
  EXPECT_THAT(model.Forward(three, 30, kv),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("32 token slots")));

  const std::vector<uint32_t> outside_pool = {0, 4};
  PagedKv bad_block = pool.View(outside_pool);
  EXPECT_THAT(model.Forward(three, 0, bad_block),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("block 4")));

  HostPool other(PoolLayout{.num_layers = 2,
                            .num_kv_heads = 2,
                            .head_dim = 16,
                            .block_size = 16,
                            .dtype = DType::kBFloat16},
                 2);
  PagedKv wrong_layout = other.View(table);
  EXPECT_THAT(model.Forward(three, 0, wrong_layout),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("does not match")));
  EXPECT_EQ(pool.bytes, before);

  Sampler sampler = Sampler::Greedy();
  EXPECT_THAT(GenerateTokens(model, pool, table, three, 31, sampler),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("needs 33 KV slots")));
  EXPECT_THAT(GenerateTokens(model, pool, table, {}, 1, sampler),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(pool.bytes, before);
}

// Runs tests/model/qwen3_moe_reference.py (float64, whole prompt at once, Hugging Face's
// formulation) and returns its logits.
std::vector<double> ReferenceLogits(const std::string& checkpoint,
                                    const std::vector<uint32_t>& prompt) {
  ::kvcache::testing::ScopedTempDir dir;
  const std::string out = dir.File("logits.json");
  const std::string command =
      absl::StrCat(KVCACHE_WORKER_PYTHON, " ", KVCACHE_QWEN3_REFERENCE_SCRIPT, " ", checkpoint, " ",
                   out, " ", absl::StrJoin(prompt, ","));
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << "reference failed: " << command;
    return {};
  }
  return nlohmann::json::parse(testing::ReadFile(out)).get<std::vector<double>>();
}

TEST(Qwen3MoeModelTest, MatchesAnIndependentFloat64Reference) {
  const std::vector<uint32_t> prompt = MakePrompt(24, 7);
  for (const char* checkpoint : {testing::TinyCheckpointDir(), testing::TinyCheckpointF32Dir()}) {
    absl::StatusOr<Qwen3MoeModel> model = Qwen3MoeModel::Load(checkpoint);
    ASSERT_OK(model);
    const std::vector<float> logits = ColdLogits(*model, DType::kFloat32, prompt);
    const std::vector<double> reference = ReferenceLogits(checkpoint, prompt);
    ASSERT_EQ(reference.size(), logits.size()) << checkpoint;
    double max_error = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      max_error = std::max(max_error, std::abs(logits[i] - reference[i]));
    }
    EXPECT_LT(max_error, 1e-5) << checkpoint;
    std::cout << checkpoint << ": max |logit error| vs float64 = " << max_error << "\n";
  }
}

TEST(Qwen3MoeModelTest, Prefill512Tokens) {
  const Qwen3MoeModel& model = TinyModel();
  HostPool pool(model.KvLayout(kBlockSize, DType::kBFloat16), 32);
  const std::vector<uint32_t> table = Iota(0, 32);
  PagedKv kv = pool.View(table);
  const std::vector<uint32_t> prompt = MakePrompt(512, 8);
  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::vector<float>> logits = model.Forward(prompt, 0, kv);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_OK(logits);
  for (float value : *logits) ASSERT_TRUE(std::isfinite(value));
  std::cout << "512-token prefill: " << seconds * 1e3 << " ms\n";  // informational, never gated
}

}  // namespace
}  // namespace kvcache::worker
