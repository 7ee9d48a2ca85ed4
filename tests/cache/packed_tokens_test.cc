// PackedTokens: round trips of tokens of every width, widening with live slots kept, exact
// comparison, copies into resident stores.
#include "cache/packed_tokens.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <memory>
#include <random>
#include <vector>

namespace kvcache {
namespace {

constexpr uint32_t kSlots = 5;
constexpr uint32_t kTokensPerSlot = 16;

bool AllLive(uint32_t) { return true; }

std::vector<uint32_t> Get(const PackedTokens& packed, uint32_t slot) {
  std::vector<uint32_t> tokens(packed.tokens_per_slot());
  packed.CopyTo(slot, tokens.data());
  return tokens;
}

// 16 tokens of exactly `width` bits (the top one set), the largest first.
std::vector<uint32_t> TokensOfWidth(uint32_t width, uint32_t seed) {
  std::mt19937 random(seed);
  const uint64_t top = uint64_t{1} << (width - 1);
  std::vector<uint32_t> tokens(kTokensPerSlot);
  for (uint32_t& token : tokens) token = static_cast<uint32_t>(top | (random() & (top - 1)));
  tokens[0] = static_cast<uint32_t>((top << 1) - 1);
  return tokens;
}

TEST(PackedTokensTest, StartsAtTheInitialWidth) {
  PackedTokens packed(kSlots, kTokensPerSlot);
  EXPECT_EQ(packed.width(), PackedTokens::kInitialWidth);
  EXPECT_EQ(packed.slot_bytes(), kTokensPerSlot * PackedTokens::kInitialWidth / 8);
}

// Block sizes of whole groups of 8 tokens, of groups and a rest, and of a rest only.
class PackedTokensSizeTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(PackedTokensSizeTest, RoundTripsEveryWidthInEverySlot) {
  const uint32_t tokens_per_slot = GetParam();
  for (uint32_t width = 1; width <= 32; ++width) {
    PackedTokens packed(kSlots, tokens_per_slot);
    std::vector<std::vector<uint32_t>> stored;
    for (uint32_t slot = 0; slot < kSlots; ++slot) {
      stored.push_back(TokensOfWidth(width, width * 100 + slot));
      stored.back().resize(tokens_per_slot, 1);
      packed.Store(slot, stored.back(), AllLive);
    }
    EXPECT_EQ(packed.width(), width <= 18 ? 18u : width <= 24 ? 24u : 32u);
    // Neighbouring slots share bytes at odd widths: every slot must read back intact.
    for (uint32_t slot = 0; slot < kSlots; ++slot) {
      EXPECT_EQ(Get(packed, slot), stored[slot]) << "width " << width << " slot " << slot;
      EXPECT_TRUE(packed.Equals(slot, stored[slot]));
      std::vector<uint32_t> other = stored[slot];
      other.back() ^= 1;
      EXPECT_FALSE(packed.Equals(slot, other)) << "width " << width << " slot " << slot;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BlockSizes, PackedTokensSizeTest, ::testing::Values(16u, 11u, 3u));

TEST(PackedTokensTest, KeepsTheLargestToken) {
  PackedTokens packed(kSlots, kTokensPerSlot);
  std::vector<uint32_t> tokens(kTokensPerSlot, std::numeric_limits<uint32_t>::max());
  tokens[3] = 0;
  packed.Store(kSlots - 1, tokens, AllLive);
  EXPECT_EQ(packed.width(), 32u);
  EXPECT_EQ(Get(packed, kSlots - 1), tokens);
}

TEST(PackedTokensTest, WideningRepacksLiveSlotsOnly) {
  PackedTokens packed(kSlots, kTokensPerSlot);
  const std::vector<uint32_t> small = TokensOfWidth(10, 1);
  const std::vector<uint32_t> dead = TokensOfWidth(12, 2);
  packed.Store(0, small, AllLive);
  packed.Store(1, dead, AllLive);
  packed.Store(4, small, AllLive);
  const std::vector<uint32_t> wide = TokensOfWidth(27, 3);
  packed.Store(2, wide, [](uint32_t slot) { return slot != 1; });
  EXPECT_EQ(packed.width(), 32u);
  EXPECT_EQ(Get(packed, 0), small);
  EXPECT_EQ(Get(packed, 2), wide);
  EXPECT_EQ(Get(packed, 4), small);
  EXPECT_FALSE(packed.Equals(1, dead));  // not carried over: it was not live
}

TEST(PackedTokensTest, WidensInStepsKeepingEverySlot) {
  PackedTokens packed(kSlots, kTokensPerSlot);
  const std::vector<uint32_t> a = TokensOfWidth(18, 1), b = TokensOfWidth(20, 2),
                              c = TokensOfWidth(30, 3);
  packed.Store(0, a, AllLive);
  packed.Store(1, b, AllLive);
  EXPECT_EQ(packed.width(), 24u);
  packed.Store(2, c, AllLive);
  EXPECT_EQ(packed.width(), 32u);
  EXPECT_EQ(Get(packed, 0), a);
  EXPECT_EQ(Get(packed, 1), b);
  EXPECT_EQ(Get(packed, 2), c);
}

// A resident store of the same slots and width takes a copy of every slot; one of another width
// (the source widened since it was made) takes nothing, and a clone serves instead.
TEST(PackedTokensTest, CopiesIntoAResidentStoreOfItsWidthOnly) {
  PackedTokens packed(kSlots, kTokensPerSlot);
  const std::vector<uint32_t> a = TokensOfWidth(18, 1), b = TokensOfWidth(17, 2);
  packed.Store(0, a, AllLive);
  packed.Store(kSlots - 1, b, AllLive);
  std::unique_ptr<PackedTokens> copy =
      PackedTokens::Resident(kSlots, kTokensPerSlot, packed.width());
  ASSERT_EQ(copy->width(), packed.width());
  ASSERT_TRUE(packed.CopyInto(*copy));
  EXPECT_EQ(Get(*copy, 0), a);
  EXPECT_EQ(Get(*copy, kSlots - 1), b);
  EXPECT_EQ(Get(*copy, 1), std::vector<uint32_t>(kTokensPerSlot, 0));

  const std::vector<uint32_t> wide = TokensOfWidth(30, 3);
  packed.Store(1, wide, AllLive);  // widens the source to 32 bits
  std::unique_ptr<PackedTokens> narrow = PackedTokens::Resident(kSlots, kTokensPerSlot, 18);
  EXPECT_FALSE(packed.CopyInto(*narrow));
  EXPECT_EQ(Get(*narrow, 0), std::vector<uint32_t>(kTokensPerSlot, 0));  // untouched
  EXPECT_FALSE(packed.CopyInto(*PackedTokens::Resident(kSlots + 1, kTokensPerSlot, 32)));
  std::unique_ptr<PackedTokens> wide_copy = PackedTokens::Resident(kSlots, kTokensPerSlot, 32);
  ASSERT_TRUE(packed.CopyInto(*wide_copy));
  EXPECT_EQ(Get(*wide_copy, 1), wide);
  EXPECT_EQ(Get(*wide_copy, kSlots - 1), b);
}

TEST(PackedTokensTest, OverwritingASlotLeavesItsNeighboursAlone) {
  PackedTokens packed(3, 3);  // 3 tokens of 18 bits: slots end mid-byte
  const std::vector<uint32_t> a{1, 2, 3}, b{(1u << 18) - 1, 0, (1u << 18) - 1}, c{7, 8, 9};
  packed.Store(0, a, AllLive);
  packed.Store(1, b, AllLive);
  packed.Store(2, c, AllLive);
  packed.Store(1, a, AllLive);
  EXPECT_EQ(Get(packed, 0), a);
  EXPECT_EQ(Get(packed, 1), a);
  EXPECT_EQ(Get(packed, 2), c);
}

TEST(PackedTokensTest, ComparesEveryTokenExactly) {
  PackedTokens packed(kSlots, kTokensPerSlot);
  const std::vector<uint32_t> tokens = TokensOfWidth(17, 4);
  packed.Store(2, tokens, AllLive);
  EXPECT_TRUE(packed.Equals(2, tokens));
  for (uint32_t i = 0; i < kTokensPerSlot; ++i) {
    std::vector<uint32_t> other = tokens;
    other[i] ^= 1;
    EXPECT_FALSE(packed.Equals(2, other)) << "token " << i;
    // The same low bits as the stored token, with a bit above the store's width set.
    other = tokens;
    other[i] |= 1u << 31;
    EXPECT_FALSE(packed.Equals(2, other)) << "wide token " << i;
  }
  EXPECT_FALSE(packed.Equals(2, absl::MakeConstSpan(tokens).subspan(1)));
}

}  // namespace
}  // namespace kvcache
