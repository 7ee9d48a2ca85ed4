#include "tiers/block_record.h"

#include <gtest/gtest.h>

namespace kvcache {
namespace {

BlockRecordIdentity Record() {
  return BlockRecordIdentity{.hash = {1, 2},
                             .parent_hash = {3, 4},
                             .namespace_digest = 5,
                             .extras_digest = 6,
                             .prefix_digest = 12,
                             .tokens = {7, 8, 9, 10},
                             .checksum = 11};
}

TEST(RecordMismatchTest, NamesTheFirstFieldThatDiffers) {
  EXPECT_EQ(RecordMismatch(Record(), Record()), "");
  BlockRecordIdentity other = Record();
  other.prefix_digest = 0;  // another prefix whose chain hash collides with ours one block up
  EXPECT_EQ(RecordMismatch(other, Record()), "prefix");
  other.tokens[3] = 0;
  EXPECT_EQ(RecordMismatch(other, Record()), "tokens");
  other.extras_digest = 0;
  EXPECT_EQ(RecordMismatch(other, Record()), "extra_keys");
  other.namespace_digest = 0;
  EXPECT_EQ(RecordMismatch(other, Record()), "namespace");
  other.parent_hash = {};
  EXPECT_EQ(RecordMismatch(other, Record()), "parent_hash");
  other.hash = {};
  EXPECT_EQ(RecordMismatch(other, Record()), "hash");
}

TEST(RecordMismatchTest, LeavesTheChecksumToTheBytes) {
  BlockRecordIdentity other = Record();
  other.checksum = 0;
  EXPECT_EQ(RecordMismatch(other, Record()), "");
}

}  // namespace
}  // namespace kvcache
