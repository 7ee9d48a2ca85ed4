#include "model/paged_kv.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "common/float_convert.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

// 2 layers, 2 kv heads, head_dim 4, 4-token blocks: 8 floats per token per layer.
PoolLayout SmallLayout(DType dtype) {
  return PoolLayout{
      .num_layers = 2, .num_kv_heads = 2, .head_dim = 4, .block_size = 4, .dtype = dtype};
}

// A distinct, non-representable-in-bf16 value per (layer, kv, position, element).
float Pattern(uint32_t layer, uint32_t kv, uint64_t position, uint32_t element) {
  return 0.1f * static_cast<float>(layer * 1000 + kv * 500 + position * 10 + element) + 0.0123f;
}

// What the pool holds after writing `value` in `dtype`.
float Stored(DType dtype, float value) {
  switch (dtype) {
    case DType::kFloat32:
      return value;
    case DType::kBFloat16:
      return BFloat16ToFloat(FloatToBFloat16(value));
    case DType::kFloat16:
      return Float16ToFloat(FloatToFloat16(value));
    case DType::kFp8E4M3:
      return Fp8E4M3ToFloat(FloatToFp8E4M3(value));
  }
  return 0;
}

class PagedKvDTypeTest : public ::testing::TestWithParam<DType> {};

TEST_P(PagedKvDTypeTest, RoundTripConvertsThroughThePoolDtype) {
  const PoolLayout layout = SmallLayout(GetParam());
  std::vector<uint8_t> pool(8 * layout.BlockBytes());
  const std::vector<uint32_t> table = {5, 2, 7};  // scattered, not in order
  PagedKv kv(pool.data(), layout, table, 8);
  ASSERT_OK(kv.Validate());
  ASSERT_EQ(kv.capacity_tokens(), 12u);
  const uint32_t elements = kv.token_elements();
  std::vector<float> values(elements), out(elements);
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (uint64_t p = 0; p < 12; ++p) {
      for (uint32_t e = 0; e < elements; ++e) values[e] = Pattern(layer, 0, p, e);
      ASSERT_OK(kv.WriteK(layer, p, values.data()));
      for (uint32_t e = 0; e < elements; ++e) values[e] = -Pattern(layer, 1, p, e);
      ASSERT_OK(kv.WriteV(layer, p, values.data()));
    }
  }
  for (uint32_t layer = 0; layer < 2; ++layer) {
    for (uint64_t p = 0; p < 12; ++p) {
      ASSERT_OK(kv.ReadK(layer, p, out.data()));
      for (uint32_t e = 0; e < elements; ++e) {
        ASSERT_EQ(out[e], Stored(GetParam(), Pattern(layer, 0, p, e))) << layer << " " << p;
      }
      ASSERT_OK(kv.ReadV(layer, p, out.data()));
      for (uint32_t e = 0; e < elements; ++e) {
        ASSERT_EQ(out[e], Stored(GetParam(), -Pattern(layer, 1, p, e))) << layer << " " << p;
      }
    }
  }
  // ReadRange across block boundaries equals per-position reads.
  std::vector<float> range(9 * elements);
  ASSERT_OK(kv.ReadRange(1, 1, 2, 11, range.data()));
  for (uint64_t p = 2; p < 11; ++p) {
    ASSERT_OK(kv.ReadV(1, p, out.data()));
    ASSERT_EQ(std::memcmp(out.data(), &range[(p - 2) * elements], elements * sizeof(float)), 0)
        << p;
  }
}

INSTANTIATE_TEST_SUITE_P(AllDtypes, PagedKvDTypeTest,
                         ::testing::Values(DType::kFloat32, DType::kBFloat16, DType::kFloat16,
                                           DType::kFp8E4M3),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST(PagedKvTest, BytesLandAtTheBlockMajorAddress) {
  const PoolLayout layout = SmallLayout(DType::kFloat32);
  std::vector<uint8_t> pool(8 * layout.BlockBytes(), 0);
  const std::vector<uint32_t> table = {6, 1, 3};
  PagedKv kv(pool.data(), layout, table);
  std::vector<float> values(kv.token_elements());
  for (uint32_t e = 0; e < values.size(); ++e) values[e] = 100.0f + e;
  // Position 5 → table[1] = block 1, slot 1. Layer 1 V.
  ASSERT_OK(kv.WriteV(1, 5, values.data()));
  // Block 1 starts at BlockBytes; layer 1 V at (1 * 2 + 1) * 4 tokens * 32 bytes = 384; slot 1 +32.
  const uint64_t offset = 1 * layout.BlockBytes() + 384 + 32;
  ASSERT_EQ(layout.KvOffset(1, 1), 384u);
  std::vector<float> raw(values.size());
  std::memcpy(raw.data(), pool.data() + offset, raw.size() * sizeof(float));
  EXPECT_EQ(raw, values);
  // Nothing else was touched.
  for (size_t i = 0; i < pool.size(); ++i) {
    if (i < offset || i >= offset + layout.TokenBytes()) {
      ASSERT_EQ(pool[i], 0) << i;
    }
  }
}

TEST(PagedKvTest, OnlyTheAddressedSlotChanges) {
  const PoolLayout layout = SmallLayout(DType::kBFloat16);
  std::vector<uint8_t> pool(8 * layout.BlockBytes(), 0xAB);
  const std::vector<uint8_t> before = pool;
  const std::vector<uint32_t> table = {4, 0};
  PagedKv kv(pool.data(), layout, table);
  const std::vector<float> values(kv.token_elements(), 1.0f);
  ASSERT_OK(kv.WriteK(0, 6, values.data()));  // block 0, slot 2, layer 0 K
  const uint64_t begin = 0 * layout.BlockBytes() + layout.KvOffset(0, 0) + 2 * layout.TokenBytes();
  for (size_t i = 0; i < pool.size(); ++i) {
    if (i >= begin && i < begin + layout.TokenBytes()) {
      ASSERT_EQ(pool[i], (i - begin) % 2 == 0 ? 0x80 : 0x3f) << i;  // bf16 1.0 = 0x3f80, LE
    } else {
      ASSERT_EQ(pool[i], before[i]) << i;
    }
  }
}

TEST(PagedKvTest, AccessOutsideTheTableOrLayersIsRefused) {
  const PoolLayout layout = SmallLayout(DType::kFloat32);
  std::vector<uint8_t> pool(4 * layout.BlockBytes());
  const std::vector<uint32_t> table = {0, 1};
  PagedKv kv(pool.data(), layout, table, 4);
  std::vector<float> values(kv.token_elements());
  EXPECT_THAT(kv.WriteK(0, 8, values.data()),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("position 8")));
  EXPECT_THAT(kv.ReadV(0, 100, values.data()), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(kv.ReadRange(0, 0, 0, 9, values.data()), StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_THAT(kv.WriteV(2, 0, values.data()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layer 2")));
  EXPECT_OK(kv.ReadRange(0, 0, 3, 3, values.data()));  // empty range
}

// In a pool whose pages carry more than the KV (page parts), block b starts at b * stride and the
// KV part is the page's first bytes.
TEST(PagedKvTest, APageStrideSpacesTheBlocks) {
  const PoolLayout layout = SmallLayout(DType::kFloat32);
  const uint64_t stride = layout.BlockBytes() + 100;
  std::vector<uint8_t> pool(3 * stride, 0);
  const std::vector<uint32_t> table = {2};
  PagedKv kv(pool.data(), layout, table, 3, stride);
  ASSERT_OK(kv.Validate());
  std::vector<float> values(kv.token_elements(), 7.0f);
  ASSERT_OK(kv.WriteK(0, 1, values.data()));
  const uint64_t offset = 2 * stride + layout.KvOffset(0, 0) + layout.TokenBytes();
  std::vector<float> raw(values.size());
  std::memcpy(raw.data(), pool.data() + offset, raw.size() * sizeof(float));
  EXPECT_EQ(raw, values);
  std::vector<float> back(values.size());
  ASSERT_OK(kv.ReadRange(0, 0, 1, 2, back.data()));
  EXPECT_EQ(back, values);
  EXPECT_THAT(PagedKv(pool.data(), layout, table, 3, layout.BlockBytes() - 1).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page stride")));
}

TEST(PagedKvTest, ValidateChecksBlockIdsAndLayout) {
  const PoolLayout layout = SmallLayout(DType::kFloat32);
  std::vector<uint8_t> pool(4 * layout.BlockBytes());
  const std::vector<uint32_t> table = {0, 4};
  EXPECT_THAT(PagedKv(pool.data(), layout, table, 4).Validate(),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("block 4")));
  EXPECT_OK(PagedKv(pool.data(), layout, table).Validate());  // pool size unknown
  EXPECT_THAT(PagedKv(nullptr, layout, table).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  PoolLayout bad = layout;
  bad.head_dim = 0;
  EXPECT_THAT(PagedKv(pool.data(), bad, table).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PagedKvTest, ModelShapeMismatchIsFailedPrecondition) {
  const PoolLayout layout = SmallLayout(DType::kFloat32);
  std::vector<uint8_t> pool(layout.BlockBytes());
  const std::vector<uint32_t> table = {0};
  PagedKv kv(pool.data(), layout, table);
  EXPECT_OK(kv.CheckModelShape(2, 2, 4));
  EXPECT_THAT(kv.CheckModelShape(3, 2, 4),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       HasSubstr("does not match the model (layers=3")));
  EXPECT_THAT(kv.CheckModelShape(2, 4, 4), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(kv.CheckModelShape(2, 2, 8), StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace kvcache::worker
