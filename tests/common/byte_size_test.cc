#include "common/byte_size.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;

TEST(ByteSizeTest, TakesBinarySuffixesAndRejectsText) {
  EXPECT_EQ(*ParseByteSize("64"), 64);
  EXPECT_EQ(*ParseByteSize("2k"), 2048);
  EXPECT_EQ(*ParseByteSize("3MiB"), 3u << 20);
  EXPECT_EQ(*ParseByteSize("1G"), 1u << 30);
  EXPECT_EQ(*ParseByteSize("2TiB"), uint64_t{2} << 40);  // a disk tier's size
  EXPECT_EQ(*ParseByteSize("1t"), uint64_t{1} << 40);
  EXPECT_THAT(ParseByteSize("16777216T"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseByteSize("lots"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvcache
