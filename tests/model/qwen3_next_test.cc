// The hybrid decoder (Qwen3NextModel) on the tiny checkpoint: logits match an independent float64
// reference; a prefill split at any point, resumed from the saved state bytes and the pool's KV
// (also copied into other blocks), is bit-identical to a cold run; decode after a restore equals
// decode without; and bad requests get exact codes without touching the pool or the state.
#include "model/qwen3_next.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/page_parts.h"
#include "model/ops.h"
#include "tests/testing/scoped_temp_dir.h"
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

constexpr uint32_t kBlockSize = 16;
constexpr uint32_t kPoolBlocks = 24;

const Qwen3NextModel& TinyHybrid() { return testing::TinyHybridModel(); }

std::vector<uint32_t> Iota(uint32_t begin, uint32_t count) {
  std::vector<uint32_t> ids(count);
  for (uint32_t i = 0; i < count; ++i) ids[i] = begin + i;
  return ids;
}

// One sequence's pool blocks, KV view and linear-attention state.
struct Sequence {
  Sequence(const Qwen3NextModel& model, DType dtype, std::vector<uint32_t> block_table)
      : pool(model.KvLayout(kBlockSize, dtype), kPoolBlocks),
        table(std::move(block_table)),
        kv(pool.View(table)),
        state(model.NewState()) {}

  HostPool pool;
  std::vector<uint32_t> table;
  PagedKv kv;
  LinearAttentionState state;
};

std::vector<float> RunTokens(const Qwen3NextModel& model, Sequence& seq,
                             absl::Span<const uint32_t> tokens, uint32_t start) {
  absl::StatusOr<std::vector<float>> logits = model.Forward(tokens, start, seq.kv, seq.state);
  EXPECT_OK(logits);
  return logits.value_or(std::vector<float>{});
}

// KV bytes of the sequence's first `positions` tokens, in sequence order.
std::vector<uint8_t> KvBytes(Sequence& seq, uint32_t positions) {
  std::vector<uint8_t> bytes;
  const uint32_t blocks = (positions + kBlockSize - 1) / kBlockSize;
  for (uint32_t b = 0; b < blocks; ++b) {
    const uint8_t* block = seq.pool.Block(seq.table[b]);
    bytes.insert(bytes.end(), block, block + seq.pool.layout.BlockBytes());
  }
  return bytes;
}

std::vector<double> ReferenceLogits(const std::string& checkpoint,
                                    const std::vector<uint32_t>& prompt) {
  ::kvcache::testing::ScopedTempDir dir;
  const std::string out = dir.File("logits.json");
  const std::string command =
      absl::StrCat(KVCACHE_WORKER_PYTHON, " ", KVCACHE_QWEN3_NEXT_REFERENCE_SCRIPT, " ", checkpoint,
                   " ", out, " ", absl::StrJoin(prompt, ","));
  if (std::system(command.c_str()) != 0) {
    ADD_FAILURE() << "reference failed: " << command;
    return {};
  }
  return nlohmann::json::parse(testing::ReadFile(out)).get<std::vector<double>>();
}

TEST(Qwen3NextModelTest, LoadsTheTinyHybridCheckpoint) {
  const Qwen3NextConfig& config = TinyHybrid().config();
  EXPECT_EQ(config.base.num_hidden_layers, 4u);
  EXPECT_EQ(config.num_linear_attention_layers(), 3u);
  EXPECT_EQ(config.num_full_attention_layers(), 1u);
  EXPECT_EQ(config.layer_types[3], LayerType::kFullAttention);
  EXPECT_EQ(TinyHybrid().KvLayout(kBlockSize, DType::kBFloat16).num_layers, 1u);
}

TEST(Qwen3NextModelTest, MatchesAnIndependentFloat64Reference) {
  const std::vector<uint32_t> prompt = MakePrompt(24, 7);
  for (const char* checkpoint :
       {KVCACHE_TINY_HYBRID_CHECKPOINT_DIR, KVCACHE_TINY_HYBRID_CHECKPOINT_F32_DIR}) {
    absl::StatusOr<Qwen3NextModel> model = Qwen3NextModel::Load(checkpoint);
    ASSERT_OK(model);
    Sequence seq(*model, DType::kFloat32, Iota(0, 2));
    const std::vector<float> logits = RunTokens(*model, seq, prompt, 0);
    const std::vector<double> reference = ReferenceLogits(checkpoint, prompt);
    ASSERT_EQ(reference.size(), logits.size()) << checkpoint;
    double max_error = 0, max_logit = 0;
    for (size_t i = 0; i < logits.size(); ++i) {
      max_error = std::max(max_error, std::abs(logits[i] - reference[i]));
      max_logit = std::max(max_logit, std::abs(reference[i]));
    }
    EXPECT_LT(max_error, 1e-4) << checkpoint;
    EXPECT_GT(max_logit, 0.1) << "degenerate logits";
    std::cout << checkpoint << ": max |logit error| vs float64 = " << max_error << "\n";
  }
}

class HybridDTypeTest : public ::testing::TestWithParam<DType> {};

// A prefill split at m (page-aligned or not), the second part resumed from the state bytes saved
// after m and the KV of [0, m), gives the cold run's logits, KV bytes and final state bit for bit.
TEST_P(HybridDTypeTest, SplitPrefillIsBitIdenticalToOneShot) {
  const Qwen3NextModel& model = TinyHybrid();
  const std::vector<uint32_t> prompt = MakePrompt(80, 1);
  Sequence cold(model, GetParam(), Iota(3, 5));
  const std::vector<float> cold_logits = RunTokens(model, cold, prompt, 0);
  ASSERT_EQ(cold_logits.size(), 256u);
  for (uint32_t m : {16u, 32u, 48u, 64u, 17u, 79u}) {
    Sequence first(model, GetParam(), Iota(3, 5));
    RunTokens(model, first, absl::MakeConstSpan(prompt).first(m), 0);
    std::vector<uint8_t> saved(LinearAttentionState::StateBytes(model.config()));
    ASSERT_OK(first.state.SaveTo(absl::MakeSpan(saved)));

    // Resume in a fresh sequence on other blocks: KV copied byte-wise, state from its bytes.
    Sequence resumed(model, GetParam(), Iota(10, 5));
    for (uint32_t b = 0; b < 5; ++b) {
      std::memcpy(resumed.pool.Block(10 + b), first.pool.Block(3 + b),
                  first.pool.layout.BlockBytes());
    }
    ASSERT_OK(resumed.state.RestoreFrom(saved, m));
    const std::vector<float> logits =
        RunTokens(model, resumed, absl::MakeConstSpan(prompt).subspan(m), m);
    EXPECT_TRUE(BitIdentical(logits, cold_logits)) << "split at " << m;
    EXPECT_TRUE(resumed.state == cold.state) << "split at " << m;
    EXPECT_EQ(KvBytes(resumed, 80), KvBytes(cold, 80)) << "split at " << m;
  }
}

INSTANTIATE_TEST_SUITE_P(PoolDTypes, HybridDTypeTest,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFp8E4M3),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

// Greedy decode after a prefix restored from its page-boundary state equals decode in the
// sequence that never stopped.
TEST(Qwen3NextModelTest, DecodeAfterRestoreEqualsDecodeWithout) {
  const Qwen3NextModel& model = TinyHybrid();
  const std::vector<uint32_t> prompt = MakePrompt(40, 3);
  const auto decode = [&](Sequence& seq, std::vector<float> logits, uint32_t position) {
    std::vector<uint32_t> tokens;
    for (int i = 0; i < 12; ++i) {
      const uint32_t next = TopK(logits.data(), logits.size(), 1)[0];
      tokens.push_back(next);
      logits = RunTokens(model, seq, {next}, position++);
    }
    return std::make_pair(tokens, logits);
  };
  Sequence cold(model, DType::kBFloat16, Iota(0, 4));
  const auto [cold_tokens, cold_last] = decode(cold, RunTokens(model, cold, prompt, 0), 40);

  // The prefix hit: pages [0, 32) with the state saved at 32, then the rest of the prompt.
  std::vector<uint8_t> state_at_32(LinearAttentionState::StateBytes(model.config()));
  Sequence source(model, DType::kBFloat16, Iota(0, 4));
  ASSERT_OK(model
                .ForwardWithCheckpoints(prompt, 0, source.kv, source.state, kBlockSize,
                                        [&](const LinearAttentionState& state) {
                                          if (state.position() != 32) return absl::OkStatus();
                                          return state.SaveTo(absl::MakeSpan(state_at_32));
                                        })
                .status());
  Sequence warm(model, DType::kBFloat16, Iota(8, 4));
  for (uint32_t b = 0; b < 2; ++b) {
    std::memcpy(warm.pool.Block(8 + b), source.pool.Block(b), source.pool.layout.BlockBytes());
  }
  ASSERT_OK(warm.state.RestoreFrom(state_at_32, 32));
  const std::vector<float> warm_logits =
      RunTokens(model, warm, absl::MakeConstSpan(prompt).subspan(32), 32);
  const auto [warm_tokens, warm_last] = decode(warm, warm_logits, 40);
  EXPECT_EQ(warm_tokens, cold_tokens);
  EXPECT_TRUE(BitIdentical(warm_last, cold_last));
  EXPECT_TRUE(warm.state == cold.state);
}

// The state matters: resuming with the KV but a zero state gives other logits.
TEST(Qwen3NextModelTest, AWrongStateChangesTheLogits) {
  const Qwen3NextModel& model = TinyHybrid();
  const std::vector<uint32_t> prompt = MakePrompt(48, 4);
  Sequence cold(model, DType::kFloat32, Iota(0, 3));
  const std::vector<float> cold_logits = RunTokens(model, cold, prompt, 0);
  Sequence wrong(model, DType::kFloat32, Iota(0, 3));
  RunTokens(model, wrong, absl::MakeConstSpan(prompt).first(32), 0);
  wrong.state.Reset();
  wrong.state.set_position(32);
  const std::vector<float> logits =
      RunTokens(model, wrong, absl::MakeConstSpan(prompt).subspan(32), 32);
  double difference = 0;
  for (size_t i = 0; i < logits.size(); ++i) {
    difference = std::max(difference, double{std::abs(logits[i] - cold_logits[i])});
  }
  EXPECT_GT(difference, 1e-2);
}

// ForwardWithCheckpoints hands out the state at every interval boundary, each equal to the state
// of a run that stopped there, and ends as one Forward does.
TEST(Qwen3NextModelTest, CheckpointsAreTheStatesAtEachBoundary) {
  const Qwen3NextModel& model = TinyHybrid();
  const std::vector<uint32_t> prompt = MakePrompt(70, 5);
  Sequence whole(model, DType::kBFloat16, Iota(0, 5));
  std::vector<LinearAttentionState> checkpoints;
  absl::StatusOr<std::vector<float>> logits =
      model.ForwardWithCheckpoints(absl::MakeConstSpan(prompt).subspan(5), 5, whole.kv, whole.state,
                                   32, [&](const LinearAttentionState& state) {
                                     checkpoints.push_back(state);
                                     return absl::OkStatus();
                                   });
  // Starting at 5 needs the first 5 tokens' state and KV first: run them, then the rest.
  ASSERT_THAT(logits.status(),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("state is at position 0, not at start position 5")));
  ASSERT_TRUE(checkpoints.empty());
  RunTokens(model, whole, absl::MakeConstSpan(prompt).first(5), 0);
  logits = model.ForwardWithCheckpoints(absl::MakeConstSpan(prompt).subspan(5), 5, whole.kv,
                                        whole.state, 32, [&](const LinearAttentionState& state) {
                                          checkpoints.push_back(state);
                                          return absl::OkStatus();
                                        });
  ASSERT_OK(logits);
  ASSERT_EQ(checkpoints.size(), 2u);
  for (size_t i = 0; i < checkpoints.size(); ++i) {
    const uint32_t boundary = 32 * (i + 1);
    EXPECT_EQ(checkpoints[i].position(), boundary);
    Sequence stopped(model, DType::kBFloat16, Iota(0, 5));
    RunTokens(model, stopped, absl::MakeConstSpan(prompt).first(boundary), 0);
    EXPECT_TRUE(checkpoints[i] == stopped.state) << boundary;
  }
  Sequence once(model, DType::kBFloat16, Iota(0, 5));
  EXPECT_TRUE(BitIdentical(*logits, RunTokens(model, once, prompt, 0)));
  EXPECT_TRUE(once.state == whole.state);
  EXPECT_THAT(
      model.ForwardWithCheckpoints(prompt, 0, once.kv, once.state, 0,
                                   [](const LinearAttentionState&) { return absl::OkStatus(); }),
      StatusIs(absl::StatusCode::kInvalidArgument));
}

// The pool layout of issue 34: pages of [kv | state] as HybridPagePartsSpec declares. A prefill
// writes each page's KV and, at its last token, the state into the page's state part; a hit on
// the first e pages, copied page by page to other blocks, restores the state from page e - 1 and
// continues bit-identically to the cold run.
TEST(Qwen3NextModelTest, PagesOfKvAndStateResumeBitIdentically) {
  const Qwen3NextModel& model = TinyHybrid();
  const DType dtype = DType::kBFloat16;
  absl::StatusOr<std::vector<PagePartLayout>> parts =
      ParsePageParts(HybridPagePartsSpec(model.config(), kBlockSize, dtype),
                     HybridKvBytesPerPage(model.config(), kBlockSize, dtype) +
                         LinearAttentionState::StateBytes(model.config()));
  ASSERT_OK(parts);
  const PagePartLayout& state_part = (*parts)[1];
  const uint64_t page_bytes = state_part.offset + state_part.bytes;
  const PoolLayout layout = model.KvLayout(kBlockSize, dtype);
  std::vector<uint8_t> pool(kPoolBlocks * page_bytes, 0);
  const std::vector<uint32_t> prompt = MakePrompt(75, 9);

  const std::vector<uint32_t> source_table = Iota(0, 5);
  PagedKv source_kv(pool.data(), layout, source_table, kPoolBlocks, page_bytes);
  LinearAttentionState source_state = model.NewState();
  absl::StatusOr<std::vector<float>> cold = model.ForwardWithCheckpoints(
      prompt, 0, source_kv, source_state, kBlockSize, [&](const LinearAttentionState& state) {
        const uint32_t page = source_table[state.position() / kBlockSize - 1];
        return state.SaveTo(
            absl::MakeSpan(pool.data() + page * page_bytes + state_part.offset, state_part.bytes));
      });
  ASSERT_OK(cold);

  for (uint32_t hit_pages : {1u, 2u, 4u}) {
    const std::vector<uint32_t> table = Iota(10, 5);
    for (uint32_t p = 0; p < hit_pages; ++p) {
      std::memcpy(pool.data() + table[p] * page_bytes, pool.data() + source_table[p] * page_bytes,
                  page_bytes);
    }
    PagedKv kv(pool.data(), layout, table, kPoolBlocks, page_bytes);
    LinearAttentionState state = model.NewState();
    const uint32_t hit = hit_pages * kBlockSize;
    ASSERT_OK(state.RestoreFrom(
        absl::MakeConstSpan(pool.data() + table[hit_pages - 1] * page_bytes + state_part.offset,
                            state_part.bytes),
        hit));
    absl::StatusOr<std::vector<float>> warm =
        model.Forward(absl::MakeConstSpan(prompt).subspan(hit), hit, kv, state);
    ASSERT_OK(warm);
    EXPECT_TRUE(BitIdentical(*warm, *cold)) << hit_pages << " pages hit";
    EXPECT_TRUE(state == source_state) << hit_pages << " pages hit";
  }
}

TEST(Qwen3NextModelTest, BadRequestsChangeNothing) {
  const Qwen3NextModel& model = TinyHybrid();
  Sequence seq(model, DType::kBFloat16, Iota(0, 2));
  RunTokens(model, seq, MakePrompt(8, 6), 0);
  const LinearAttentionState before = seq.state;
  const std::vector<uint8_t> pool_before = seq.pool.bytes;

  EXPECT_THAT(model.Forward({1, 2}, 4, seq.kv, seq.state),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("state is at position 8, not at start position 4")));
  EXPECT_THAT(model.Forward({1, 256}, 8, seq.kv, seq.state),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("token 256 at index 1")));
  EXPECT_THAT(model.Forward({}, 8, seq.kv, seq.state),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(model.Forward(MakePrompt(30, 1), 8, seq.kv, seq.state),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("32 token slots")));
  // A pool laid out for another model (every layer as if full attention).
  PoolLayout other = seq.pool.layout;
  other.num_layers = 4;
  HostPool other_pool(other, 2);
  const std::vector<uint32_t> table = Iota(0, 2);
  PagedKv other_kv = other_pool.View(table);
  EXPECT_THAT(model.Forward({1}, 8, other_kv, seq.state),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(seq.state == before);
  EXPECT_EQ(seq.pool.bytes, pool_before);
}

}  // namespace
}  // namespace kvcache::worker
