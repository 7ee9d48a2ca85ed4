#include "common/float_convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kvcache {
namespace {

TEST(BFloat16Test, WideningIsExactAndNarrowingRoundsToNearestEven) {
  EXPECT_EQ(BFloat16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties go to the even mantissa (1.0).
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6: rounds up to even.
  EXPECT_EQ(FloatToBFloat16(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  // Just above the halfway point rounds up.
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8) + std::ldexp(1.0f, -20)), 0x3f81);
  EXPECT_EQ(FloatToBFloat16(-2.0f), 0xc000);
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(std::nanf("")))));
  EXPECT_EQ(FloatToBFloat16(std::numeric_limits<float>::infinity()), 0x7f80);
}

TEST(BFloat16Test, EveryFiniteValueRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = BFloat16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToBFloat16(value), bits) << std::hex << bits;
  }
}

TEST(Float16Test, KnownValues) {
  EXPECT_EQ(Float16ToFloat(0x3c00), 1.0f);
  EXPECT_EQ(Float16ToFloat(0xc000), -2.0f);
  EXPECT_EQ(Float16ToFloat(0x7bff), 65504.0f);
  EXPECT_EQ(Float16ToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(Float16ToFloat(0x0400), std::ldexp(1.0f, -14));  // smallest normal
  EXPECT_TRUE(std::isinf(Float16ToFloat(0x7c00)));
  EXPECT_TRUE(std::isnan(Float16ToFloat(0x7e00)));
  EXPECT_EQ(FloatToFloat16(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToFloat16(65519.0f), 0x7bff);  // below the halfway point to 65536
  EXPECT_EQ(FloatToFloat16(65520.0f), 0x7c00);  // halfway: ties to even, which is inf
  EXPECT_EQ(FloatToFloat16(1e9f), 0x7c00);
  EXPECT_EQ(FloatToFloat16(-1e9f), 0xfc00);
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -25)), 0x0000);         // tie to even: zero
  EXPECT_EQ(FloatToFloat16(1.5f * std::ldexp(1.0f, -25)), 0x0001);  // above the tie
  EXPECT_EQ(FloatToFloat16(3 * std::ldexp(1.0f, -25)), 0x0002);     // 1.5 units: tie to even 2
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -30)), 0x0000);
  EXPECT_EQ(FloatToFloat16(-0.0f), 0x8000);
  // 1 + 2^-11 is halfway between 1 and the next half: ties to even (1.0).
  EXPECT_EQ(FloatToFloat16(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToFloat16(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  // Rounding up out of the subnormal range gives the smallest normal.
  EXPECT_EQ(FloatToFloat16(std::ldexp(1.0f, -14) - std::ldexp(1.0f, -26)), 0x0400);
  EXPECT_TRUE(std::isnan(Float16ToFloat(FloatToFloat16(std::nanf("")))));
}

TEST(Float16Test, EveryValueRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xffff; ++bits) {
    const float value = Float16ToFloat(static_cast<uint16_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToFloat16(value), bits) << std::hex << bits;
  }
}

TEST(Float16Test, NarrowingPicksTheNearestNeighbour) {
  // Midpoints between consecutive positive halves and points just off them.
  for (uint32_t bits = 0; bits < 0x7bff; ++bits) {
    const float low = Float16ToFloat(static_cast<uint16_t>(bits));
    const float high = Float16ToFloat(static_cast<uint16_t>(bits + 1));
    const float mid = low + (high - low) / 2;  // exact in fp32
    ASSERT_EQ(FloatToFloat16(mid), (bits % 2 == 0) ? bits : bits + 1) << std::hex << bits;
    ASSERT_EQ(FloatToFloat16(std::nextafter(mid, 0.0f)), bits) << std::hex << bits;
    ASSERT_EQ(FloatToFloat16(std::nextafter(mid, 1e6f)), bits + 1) << std::hex << bits;
  }
}

TEST(Fp8E4M3Test, KnownValuesAndSaturation) {
  EXPECT_EQ(Fp8E4M3ToFloat(0x38), 1.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x7e), 448.0f);
  EXPECT_EQ(Fp8E4M3ToFloat(0x01), std::ldexp(1.0f, -9));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0x7f)));
  EXPECT_TRUE(std::isnan(Fp8E4M3ToFloat(0xff)));
  EXPECT_EQ(FloatToFp8E4M3(1.0f), 0x38);
  EXPECT_EQ(FloatToFp8E4M3(1000.0f), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(-1000.0f), 0xfe);
  EXPECT_EQ(FloatToFp8E4M3(std::numeric_limits<float>::infinity()), 0x7e);
  EXPECT_EQ(FloatToFp8E4M3(std::ldexp(1.0f, -10)), 0x00);         // tie to even: zero
  EXPECT_EQ(FloatToFp8E4M3(1.5f * std::ldexp(1.0f, -10)), 0x01);  // above the tie
  EXPECT_EQ(FloatToFp8E4M3(1.0625f), 0x38);                       // tie between 1 and 1.125
  EXPECT_EQ(FloatToFp8E4M3(1.1875f), 0x3a);                       // tie between 1.125 and 1.25
  EXPECT_EQ(FloatToFp8E4M3(std::nanf("")), 0x7f);
}

TEST(Fp8E4M3Test, EveryValueRoundTrips) {
  for (uint32_t bits = 0; bits <= 0xff; ++bits) {
    const float value = Fp8E4M3ToFloat(static_cast<uint8_t>(bits));
    if (std::isnan(value)) continue;
    ASSERT_EQ(FloatToFp8E4M3(value), bits) << std::hex << bits;
  }
}

}  // namespace
}  // namespace kvcache
