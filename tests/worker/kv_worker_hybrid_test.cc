// KvWorker with the hybrid model (Qwen3-Next: linear-attention state + full-attention KV) over an
// in-process daemon's host pool of [kv | state] pages (worker/hybrid_pages.h, DESIGN §5); label
// unit.
//
// The proof of issue 34's item 2 and 3 in one process: a hit restores the KV up to the endpoint
// and the state saved in the endpoint's page, and generation at 0, 50 and 90% cached, and on
// blocks committed during decode, is bit-identical to the cold reference (GenerateColdHybrid: the
// prompt in one Forward, no daemon). A page committed without its state is no endpoint; a worker
// saving the state every second page hits only at even pages; a pool whose pages do not hold the
// model's is FAILED_PRECONDITION.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cache/pool_spec.h"
#include "client/kv_cache_client.h"
#include "tests/testing/in_process_daemon.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tiny_model.h"
#include "worker/generation.h"
#include "worker/hybrid_pages.h"
#include "worker/kv_worker.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::StatusIs;
using ::kvcache::worker::testing::MakePrompt;
using ::kvcache::worker::testing::TinyHybridModel;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint32_t kBlockSize = 16;
constexpr uint32_t kNewTokens = 20;

HybridPoolGeometry TinyGeometry() {
  return HybridPoolGeometryFor(TinyHybridModel().config(), kBlockSize, DType::kBFloat16);
}

// A daemon with host pools: "hybrid", laid out as HybridPoolGeometryFor says; "kv_only", the
// model's KV layout without a state part; "short_state", a state part too small.
class KvWorkerHybridTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const HybridPoolGeometry geometry = TinyGeometry();
    const PoolLayout& kv = geometry.kv_layout;
    std::vector<PoolOptions> pools;
    for (const std::string& spec :
         {"hybrid:model=tiny-next" + geometry.SpecFields() + ":blocks=64",
          absl::StrCat("kv_only:model=tiny-next:layers=", kv.num_layers, ":kv_heads=",
                       kv.num_kv_heads, ":head_dim=", kv.head_dim, ":block_size=16:dtype=bf16"),
          absl::StrCat("short_state:model=tiny-next:layers=", kv.num_layers + 1,
                       ":kv_heads=", kv.num_kv_heads, ":head_dim=", kv.head_dim,
                       ":block_size=16:dtype=bf16:parts=kv/", geometry.kv_bytes, "+state/",
                       geometry.kv_bytes, "/trailing1")}) {
      absl::StatusOr<PoolOptions> pool = ParsePoolSpec(spec);
      ASSERT_OK(pool);
      pools.push_back(*pool);
    }
    ASSERT_NO_FATAL_FAILURE(daemon_.Start(std::move(pools), "kv_worker_hybrid_test"));
    client_ = daemon_.client();
  }
  void TearDown() override { daemon_.Stop(); }

  std::unique_ptr<KvWorker> Worker(uint32_t checkpoint_pages = 1) {
    absl::StatusOr<std::unique_ptr<KvWorker>> worker =
        KvWorker::Create(client_, "hybrid", &TinyHybridModel(), checkpoint_pages);
    EXPECT_OK(worker);
    return worker.ok() ? *std::move(worker) : nullptr;
  }

  // Generates from `prompt` with `worker`, expects `cached` tokens from the cache and the cold
  // reference's tokens and logits bit for bit; returns the generated tokens.
  std::vector<uint32_t> ExpectCold(KvWorker& worker, const std::vector<uint32_t>& prompt,
                                   uint32_t cached) {
    Sampler sampler = Sampler::Greedy();
    absl::StatusOr<GenerationResult> run = worker.Generate(prompt, kNewTokens, sampler);
    EXPECT_OK(run);
    if (!run.ok()) return {};
    EXPECT_EQ(run->cached_tokens, cached);
    Sampler cold_sampler = Sampler::Greedy();
    absl::StatusOr<GenerationResult> cold = GenerateColdHybrid(
        TinyHybridModel(), prompt, kNewTokens, cold_sampler, kBlockSize, DType::kBFloat16);
    EXPECT_OK(cold);
    if (!cold.ok()) return {};
    EXPECT_EQ(run->tokens, cold->tokens) << cached << " cached";
    EXPECT_EQ(run->logits_digest, cold->logits_digest) << cached << " cached";
    return run->tokens;
  }

  ::kvcache::testing::InProcessDaemon daemon_;
  KvCacheClient* client_ = nullptr;
};

TEST(HybridPoolGeometryTest, PadsTheStateToWholeLayerBlocks) {
  const HybridPoolGeometry geometry = TinyGeometry();
  const uint64_t layer_block = geometry.kv_bytes / geometry.kv_layout.num_layers;
  EXPECT_EQ(geometry.state_bytes, LinearAttentionState::StateBytes(TinyHybridModel().config()));
  EXPECT_GE(geometry.state_part_bytes, geometry.state_bytes);
  EXPECT_LT(geometry.state_part_bytes - geometry.state_bytes, layer_block);
  EXPECT_EQ(geometry.pool_layout.BlockBytes(), geometry.kv_bytes + geometry.state_part_bytes);
  absl::StatusOr<PoolOptions> pool = ParsePoolSpec("p" + geometry.SpecFields());
  ASSERT_OK(pool);
  ASSERT_EQ(pool->parts.size(), 2u);
  EXPECT_EQ(pool->parts[1].offset, geometry.kv_bytes);
}

TEST_F(KvWorkerHybridTest, ReuseAtZeroFiftyAndNinetyPercentIsBitIdenticalToCold) {
  std::unique_ptr<KvWorker> worker = Worker();
  ASSERT_NE(worker, nullptr);
  EXPECT_TRUE(worker->hybrid());
  EXPECT_FALSE(worker->on_device());
  const std::vector<uint32_t> prompt = MakePrompt(160, 11);  // 10 pages
  // 0%: nothing cached.
  ExpectCold(*worker, std::vector<uint32_t>(prompt.begin(), prompt.begin() + 80), 0);
  // 50%: the first 5 pages, with the state after token 80.
  const std::vector<uint32_t> ninety(prompt.begin(), prompt.begin() + 144);
  ExpectCold(*worker, prompt, 80);
  // 90%: 9 of 10 pages (a prompt sharing 144 tokens with one already committed).
  std::vector<uint32_t> other = ninety;
  other.resize(160, 7);
  ExpectCold(*worker, other, 144);
}

// Decode commits the pages it fills with their states: the next turn hits its own answer.
TEST_F(KvWorkerHybridTest, PagesFilledDuringDecodeAreHitsWithTheirState) {
  std::unique_ptr<KvWorker> worker = Worker();
  ASSERT_NE(worker, nullptr);
  const std::vector<uint32_t> prompt = MakePrompt(40, 3);
  const std::vector<uint32_t> answer = ExpectCold(*worker, prompt, 0);  // positions up to 59
  std::vector<uint32_t> next = prompt;
  next.insert(next.end(), answer.begin(), answer.end() - 1);
  next.push_back(5);  // 60 tokens, 48 of them in full pages
  ExpectCold(*worker, next, 48);
}

// An endpoint whose page lacks the state is not a hit there: pages committed with a state only
// every 4th page hit at page 4, not at page 5; a worker saving every 2nd page hits at even pages.
TEST_F(KvWorkerHybridTest, AHitEndsOnlyAtAPageHoldingTheState) {
  const std::vector<uint32_t> prompt = MakePrompt(96, 21);  // 6 pages
  std::unique_ptr<KvWorker> every_fourth = Worker(4);
  ASSERT_NE(every_fourth, nullptr);
  ExpectCold(*every_fourth, std::vector<uint32_t>(prompt.begin(), prompt.begin() + 88), 0);
  // Pages 0..4 are committed, the state only on page 3: the hit ends at 64, and from there the
  // every-page worker recomputes pages 4 and 5 with their states.
  std::unique_ptr<KvWorker> every_page = Worker();
  ASSERT_NE(every_page, nullptr);
  ExpectCold(*every_page, prompt, 64);
  ExpectCold(*every_page, prompt, 80);

  const std::vector<uint32_t> other = MakePrompt(120, 22);  // 7 full pages, 8 blocks
  std::unique_ptr<KvWorker> every_second = Worker(2);
  ASSERT_NE(every_second, nullptr);
  ExpectCold(*every_second, std::vector<uint32_t>(other.begin(), other.begin() + 90), 0);
  ExpectCold(*every_second, other, 64);  // 5 pages committed, states on pages 1 and 3
}

TEST_F(KvWorkerHybridTest, APoolWithoutTheModelsPagesIsFailedPrecondition) {
  EXPECT_THAT(KvWorker::Create(client_, "kv_only", &TinyHybridModel()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("'kv_only'"), HasSubstr("\"state\""),
                             HasSubstr(TinyGeometry().parts))));
  EXPECT_THAT(KvWorker::Create(client_, "short_state", &TinyHybridModel()),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr(absl::StrCat("at least ", TinyGeometry().state_bytes))));
  EXPECT_THAT(KvWorker::Create(client_, "hybrid", &TinyHybridModel(), 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // The Qwen3-MoE model on the hybrid pool: another layout.
  EXPECT_THAT(KvWorker::Create(client_, "hybrid", &testing::TinyModel()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("laid out for")));
}

}  // namespace
}  // namespace kvcache::worker
