#include "common/pool_layout.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;

TEST(PoolLayoutTest, BlockBytesFollowTheBlockMajorFormula) {
  const PoolLayout layout{.num_layers = 48,
                          .num_kv_heads = 4,
                          .head_dim = 128,
                          .block_size = 16,
                          .dtype = DType::kBFloat16};
  EXPECT_EQ(layout.TokenBytes(), 4 * 128 * 2);
  EXPECT_EQ(layout.BlockBytes(), 48ull * 2 * 16 * 4 * 128 * 2);
  EXPECT_EQ(layout.KvOffset(0, 0), 0);
  EXPECT_EQ(layout.KvOffset(0, 1), 16 * layout.TokenBytes());
  EXPECT_EQ(layout.KvOffset(1, 0), 2 * 16 * layout.TokenBytes());
  EXPECT_EQ(layout.KvOffset(47, 1) + 16 * layout.TokenBytes(), layout.BlockBytes());
}

TEST(PoolLayoutTest, FingerprintDependsOnEveryField) {
  const PoolLayout base{.num_layers = 2, .num_kv_heads = 2, .head_dim = 8, .block_size = 16};
  PoolLayout other = base;
  other.dtype = DType::kBFloat16;  // same byte size, different layout
  EXPECT_NE(base.Fingerprint(), other.Fingerprint());
  other = base;
  other.block_size = 32;
  EXPECT_NE(base.Fingerprint(), other.Fingerprint());
  EXPECT_EQ(base.Fingerprint(), PoolLayout(base).Fingerprint());
}

TEST(PoolLayoutTest, ValidateRejectsZeroAndHugeShapes) {
  EXPECT_OK((PoolLayout{.num_layers = 1, .num_kv_heads = 1, .head_dim = 1}).Validate());
  EXPECT_THAT((PoolLayout{.num_layers = 0, .num_kv_heads = 1, .head_dim = 1}).Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((PoolLayout{.num_layers = 4096,
                          .num_kv_heads = 64,
                          .head_dim = 1024,
                          .block_size = 64,
                          .dtype = DType::kFloat32})
                  .Validate(),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PoolLayoutTest, ParsesDTypeNames) {
  EXPECT_EQ(*ParseDType("bf16"), DType::kBFloat16);
  EXPECT_EQ(*ParseDType("Float32"), DType::kFloat32);
  EXPECT_EQ(DTypeBytes(*ParseDType("fp8")), 1);
  EXPECT_THAT(ParseDType("int3"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvcache
