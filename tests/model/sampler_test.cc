#include "model/sampler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::StatusIs;

std::vector<uint32_t> Draw(Sampler& sampler, const std::vector<float>& logits, int count) {
  std::vector<uint32_t> tokens;
  for (int i = 0; i < count; ++i) {
    absl::StatusOr<uint32_t> token = sampler.Sample(logits);
    EXPECT_OK(token);
    tokens.push_back(token.value_or(0));
  }
  return tokens;
}

TEST(SamplerTest, GreedyIsArgmaxWithLowestIndexOnTies) {
  Sampler greedy = Sampler::Greedy();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(greedy.Sample({0.1f, 3.0f, -1.0f, 3.0f}).value(), 1u);
  EXPECT_EQ(greedy.Sample({nan, -5.0f, -6.0f}).value(), 1u);
  EXPECT_EQ(greedy.Sample({-1.0f}).value(), 0u);
  EXPECT_EQ(Argmax({2.0f, 2.0f, 2.0f}), 0u);
}

TEST(SamplerTest, BadInputIsInvalidArgument) {
  Sampler greedy = Sampler::Greedy();
  EXPECT_THAT(greedy.Sample({}), StatusIs(absl::StatusCode::kInvalidArgument));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_THAT(greedy.Sample({nan, nan}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Sampler::Create({.temperature = -1.0f}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(Sampler::Create({.temperature = std::numeric_limits<float>::infinity()}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(SamplerTest, SameSeedSameTokensDifferentSeedDifferentTokens) {
  const std::vector<float> logits = {0.0f, 0.5f, 1.0f, 0.2f, -0.3f, 0.9f, 0.1f, 0.4f};
  absl::StatusOr<Sampler> a = Sampler::Create({.temperature = 1.0f, .seed = 42});
  absl::StatusOr<Sampler> b = Sampler::Create({.temperature = 1.0f, .seed = 42});
  absl::StatusOr<Sampler> c = Sampler::Create({.temperature = 1.0f, .seed = 43});
  ASSERT_OK(a);
  ASSERT_OK(b);
  ASSERT_OK(c);
  const std::vector<uint32_t> from_a = Draw(*a, logits, 64);
  EXPECT_EQ(from_a, Draw(*b, logits, 64));
  EXPECT_NE(from_a, Draw(*c, logits, 64));
}

TEST(SamplerTest, TopKOneIsGreedyAndTopKRestrictsTheSupport) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.9f, 1.8f, -1.0f};
  absl::StatusOr<Sampler> top1 = Sampler::Create({.temperature = 5.0f, .top_k = 1, .seed = 7});
  ASSERT_OK(top1);
  for (uint32_t token : Draw(*top1, logits, 50)) EXPECT_EQ(token, 1u);
  absl::StatusOr<Sampler> top3 = Sampler::Create({.temperature = 5.0f, .top_k = 3, .seed = 7});
  ASSERT_OK(top3);
  std::vector<int> counts(logits.size());
  for (uint32_t token : Draw(*top3, logits, 600)) ++counts[token];
  EXPECT_EQ(counts[0], 0);
  EXPECT_EQ(counts[4], 0);
  EXPECT_GT(counts[1], 0);
  EXPECT_GT(counts[2], 0);
  EXPECT_GT(counts[3], 0);
}

TEST(SamplerTest, FrequenciesFollowTheSoftmax) {
  // p = softmax([0, ln 3]) = [0.25, 0.75]. Seeded, so the count is fixed; the bound is loose.
  const std::vector<float> logits = {0.0f, std::log(3.0f)};
  absl::StatusOr<Sampler> sampler = Sampler::Create({.temperature = 1.0f, .seed = 1});
  ASSERT_OK(sampler);
  int ones = 0;
  for (uint32_t token : Draw(*sampler, logits, 4000)) ones += token == 1;
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
  // A low temperature sharpens towards the argmax.
  absl::StatusOr<Sampler> cold = Sampler::Create({.temperature = 0.05f, .seed = 1});
  ASSERT_OK(cold);
  ones = 0;
  for (uint32_t token : Draw(*cold, logits, 1000)) ones += token == 1;
  EXPECT_GT(ones, 990);
}

}  // namespace
}  // namespace kvcache::worker
