#include "model/ops.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kvcache::worker {
namespace {

using ::testing::ElementsAre;
using ::testing::FloatNear;
using ::testing::Pointwise;

constexpr float kTol = 1e-6f;

TEST(OpsTest, DotMatchesTheSumForEveryTailLength) {
  for (size_t n = 0; n <= 19; ++n) {
    std::vector<float> a(n), b(n);
    double expected = 0;
    for (size_t i = 0; i < n; ++i) {
      a[i] = 0.5f * static_cast<float>(i) - 2.0f;  // small integers and halves: sums are exact
      b[i] = static_cast<float>(i % 3) - 1.0f;
      expected += double{a[i]} * b[i];
    }
    EXPECT_EQ(Dot(a.data(), b.data(), n), static_cast<float>(expected)) << n;
  }
}

TEST(OpsTest, MatVecUsesRowMajorOutByIn) {
  // w = [[1, 2, 3], [4, 5, 6]] ([out = 2, in = 3]), x = [1, 0, -1].
  const float w[] = {1, 2, 3, 4, 5, 6};
  const float x[] = {1, 0, -1};
  float out[2];
  MatVec(w, x, 2, 3, out);
  EXPECT_THAT(out, ElementsAre(-2.0f, -2.0f));
}

TEST(OpsTest, RmsNormMatchesHandComputation) {
  // mean(x^2) = (1 + 4 + 9 + 16) / 4 = 7.5; 1 / sqrt(7.5) = 0.36514837.
  const float x[] = {1, 2, 3, 4};
  const float weight[] = {1, 1, 2, 0.5f};
  float out[4];
  RmsNorm(x, weight, 4, 0.0f, out);
  EXPECT_THAT(out,
              Pointwise(FloatNear(kTol), {0.36514837f, 0.73029674f, 2.19089023f, 0.73029674f}));
  // eps enters under the root: mean 7.5 + eps 0.5 = 8 → 1 / sqrt(8).
  RmsNorm(x, weight, 4, 0.5f, out);
  EXPECT_NEAR(out[0], 1.0 / std::sqrt(8.0), kTol);
  // In place is allowed.
  float y[] = {3, 4};
  const float ones[] = {1, 1};
  RmsNorm(y, ones, 2, 0.0f, y);  // rms = sqrt(12.5)
  EXPECT_THAT(y, Pointwise(FloatNear(kTol), {0.84852814f, 1.13137085f}));
}

TEST(OpsTest, RopeRotatesHalvesWithHuggingFaceFrequencies) {
  // head_dim 4, theta 10000: inv_freq = [1, 10000^(-1/2)] = [1, 0.01].
  const std::vector<double> inv_freq = RopeInverseFrequencies(4, 10000.0);
  ASSERT_EQ(inv_freq.size(), 2u);
  EXPECT_DOUBLE_EQ(inv_freq[0], 1.0);
  EXPECT_DOUBLE_EQ(inv_freq[1], 0.01);
  float cos[2], sin[2];
  RopeCosSin(0, inv_freq, cos, sin);
  float x0[] = {1, 2, 3, 4};
  ApplyRope(x0, 4, cos, sin);
  EXPECT_THAT(x0, ElementsAre(1, 2, 3, 4));  // position 0 is the identity

  RopeCosSin(1, inv_freq, cos, sin);
  float x[] = {1, 2, 3, 4};
  ApplyRope(x, 4, cos, sin);
  // Pairs (x[0], x[2]) rotate by 1 rad and (x[1], x[3]) by 0.01 rad:
  //   x'[0] = 1 cos 1 - 3 sin 1, x'[2] = 3 cos 1 + 1 sin 1, same for (2, 4) at 0.01.
  EXPECT_THAT(
      x, Pointwise(FloatNear(kTol), {static_cast<float>(std::cos(1.0) - 3 * std::sin(1.0)),
                                     static_cast<float>(2 * std::cos(0.01) - 4 * std::sin(0.01)),
                                     static_cast<float>(3 * std::cos(1.0) + std::sin(1.0)),
                                     static_cast<float>(4 * std::cos(0.01) + 2 * std::sin(0.01))}));
  // A rotation keeps the norm.
  EXPECT_NEAR(x[0] * x[0] + x[1] * x[1] + x[2] * x[2] + x[3] * x[3], 30.0f, 1e-4);
}

TEST(OpsTest, RopeAtLargePositionsStaysAccurate) {
  const std::vector<double> inv_freq = RopeInverseFrequencies(16, 10000.0);
  float cos[8], sin[8];
  RopeCosSin(4095, inv_freq, cos, sin);
  for (int i = 0; i < 8; ++i) {
    const double angle = 4095.0 * std::pow(10000.0, -2.0 * i / 16);
    EXPECT_NEAR(cos[i], std::cos(angle), 1e-7) << i;
    EXPECT_NEAR(sin[i], std::sin(angle), 1e-7) << i;
  }
}

TEST(OpsTest, SoftmaxMatchesHandComputationAndIsStable) {
  float x[] = {1, 2, 3};
  Softmax(x, 3);
  EXPECT_THAT(x, Pointwise(FloatNear(kTol), {0.09003057f, 0.24472847f, 0.66524096f}));
  float big[] = {1000, 1000, -1000};
  Softmax(big, 3);
  EXPECT_THAT(big, ElementsAre(0.5f, 0.5f, 0.0f));
  float one[] = {-7};
  Softmax(one, 1);
  EXPECT_THAT(one, ElementsAre(1.0f));
}

TEST(OpsTest, SwiGluIsSiluOfGateTimesUp) {
  // silu(1) = 1 / (1 + e^-1) = 0.7310586; silu(-2) = -2 / (1 + e^2) = -0.2384058; silu(0) = 0.
  EXPECT_NEAR(Silu(1.0f), 0.7310586f, kTol);
  EXPECT_NEAR(Silu(-2.0f), -0.2384058f, kTol);
  EXPECT_EQ(Silu(0.0f), 0.0f);
  EXPECT_NEAR(Silu(-100.0f), 0.0f, 1e-30f);
  EXPECT_EQ(Silu(-1000.0f), 0.0f);  // exp overflows to inf: -1000 / inf
  const float gate[] = {1, -2, 0};
  const float up[] = {2, 3, 5};
  float out[3];
  SwiGlu(gate, up, 3, out);
  EXPECT_THAT(out, Pointwise(FloatNear(kTol), {1.4621172f, -0.7152175f, 0.0f}));
}

TEST(OpsTest, TopKPrefersLargerThenLowerIndexAndPutsNanLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float x[] = {0.1f, 0.5f, nan, 0.5f, 0.3f, 0.9f};
  EXPECT_THAT(TopK(x, 6, 3), ElementsAre(5, 1, 3));
  EXPECT_THAT(TopK(x, 6, 6), ElementsAre(5, 1, 3, 4, 0, 2));
  EXPECT_THAT(TopK(x, 6, 0), ElementsAre());
}

}  // namespace
}  // namespace kvcache::worker
