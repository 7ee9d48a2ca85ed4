#include "tiers/record_codec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/testing/status_matchers.h"
#include "tests/tiers/test_blocks.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

RecordHeader Header() {
  return RecordHeader{
      .pool = {.model_id = "qwen3-moe", .layout_fingerprint = 0x1234, .block_bytes = 8192},
      .block = {.hash = {1, 2},
                .parent_hash = {3, 4},
                .namespace_digest = 5,
                .extras_digest = 6,
                .prefix_digest = 13,
                .tokens = {7, 8, 9, 10},
                .checksum = 11},
      .sequence = 12};
}

std::string Encode(const RecordHeader& header) {
  std::string bytes(RecordHeaderSlotBytes(header.block.tokens.size()), '\0');
  EXPECT_OK(EncodeRecordHeader(header, absl::MakeSpan(bytes)));
  return bytes;
}

TEST(RecordCodecTest, RoundTripsEveryField) {
  RecordHeader header = Header();
  header.pool.hash_algorithm = HashAlgorithm::kSha256;
  header.pool.model_id = std::string(kMaxRecordModelIdBytes, 'm');
  auto decoded = DecodeRecordHeader(Encode(header));
  ASSERT_OK(decoded);
  EXPECT_EQ(*decoded, header);
}

TEST(RecordCodecTest, SizesAreFixedPerTokenCountAndAligned) {
  EXPECT_EQ(RecordHeaderBytes(16), 440u);
  EXPECT_EQ(RecordHeaderSlotBytes(16), 4096u);
  EXPECT_EQ(RecordHeaderSlotBytes(1000), 8192u);
  RecordHeader short_id = Header();
  short_id.pool.model_id = "m";
  std::string a(RecordHeaderBytes(4), '\0'), b(RecordHeaderBytes(4), '\0');
  ASSERT_OK(EncodeRecordHeader(short_id, absl::MakeSpan(a)));
  ASSERT_OK(EncodeRecordHeader(Header(), absl::MakeSpan(b)));
  EXPECT_EQ(a.size(), b.size());
}

// The disk tier zeroes only the page past the header: the encoder writes every byte up to
// RecordHeaderBytes itself, the model id's padding included, whatever the buffer held.
TEST(RecordCodecTest, WritesEveryByteOfTheHeaderWhateverTheBufferHeld) {
  RecordHeader header = Header();
  header.pool.model_id = "m";
  std::string dirty(RecordHeaderBytes(4), '\xa5');
  ASSERT_OK(EncodeRecordHeader(header.pool, header.block, header.sequence, absl::MakeSpan(dirty)));
  EXPECT_EQ(dirty, Encode(header).substr(0, RecordHeaderBytes(4)));
}

TEST(RecordCodecTest, EveryCorruptedByteIsDataLoss) {
  const RecordHeader header = Header();
  const std::string bytes = Encode(header);
  // Every byte of the header proper: magic, version, counts, model id and its padding, every
  // identity field, the sequence, the tokens and the checksum itself.
  for (uint64_t i = 0; i < RecordHeaderBytes(header.block.tokens.size()); ++i) {
    for (int bit : {0, 7}) {
      std::string corrupted = bytes;
      corrupted[i] = static_cast<char>(corrupted[i] ^ (1 << bit));
      EXPECT_THAT(DecodeRecordHeader(corrupted), StatusIs(absl::StatusCode::kDataLoss))
          << "byte " << i << " bit " << bit;
    }
  }
}

TEST(RecordCodecTest, TornHeaderIsDataLoss) {
  const RecordHeader header = Header();
  std::string bytes = Encode(header);
  // A write that stopped at a sector boundary inside the header: the rest is what was there.
  std::string torn = bytes.substr(0, 256) + std::string(bytes.size() - 256, '\0');
  EXPECT_THAT(DecodeRecordHeader(torn), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(DecodeRecordHeader(bytes.substr(0, RecordHeaderBytes(4) - 1)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("truncated")));
  EXPECT_THAT(DecodeRecordHeader(bytes.substr(0, 10)), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(RecordCodecTest, PaddingAfterTheHeaderIsIgnored) {
  std::string bytes = Encode(Header());
  bytes.back() = 'x';
  EXPECT_OK(DecodeRecordHeader(bytes));
}

TEST(RecordCodecTest, EmptySlotIsNotFound) {
  EXPECT_THAT(DecodeRecordHeader(std::string(4096, '\0')), StatusIs(absl::StatusCode::kNotFound));
}

TEST(RecordCodecTest, UnknownVersionIsDataLoss) {
  std::string bytes = Encode(Header());
  bytes[8] = 3;
  EXPECT_THAT(DecodeRecordHeader(bytes),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("version 3")));
  // Version 1's number on a version-2 header: its checksum is not where version 1 keeps it.
  bytes[8] = 1;
  EXPECT_THAT(DecodeRecordHeader(bytes),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("version 1")));
}

// A record written before the prefix digest existed is intact but cannot be verified against a
// whole prefix: refused as such, not as damage. Damaged, it is damage.
TEST(RecordCodecTest, VersionOneRecordIsFailedPrecondition) {
  const std::string old = testing::Version1RecordHeader(Header());
  ASSERT_FALSE(old.empty());
  EXPECT_THAT(DecodeRecordHeader(old),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("prefix digest")));
  std::string torn = old;
  torn[300] ^= 1;
  EXPECT_THAT(DecodeRecordHeader(torn), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(RecordCodecTest, RefusesWhatItCannotEncode) {
  RecordHeader header = Header();
  std::string small(RecordHeaderBytes(4) - 1, '\0');
  EXPECT_THAT(EncodeRecordHeader(header, absl::MakeSpan(small)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  header.pool.model_id = std::string(kMaxRecordModelIdBytes + 1, 'm');
  std::string bytes(8192, '\0');
  EXPECT_THAT(EncodeRecordHeader(header, absl::MakeSpan(bytes)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("model id")));
}

TEST(RecordCodecTest, PoolMismatchNamesTheForeignField) {
  const PoolIdentity pool = Header().pool;
  EXPECT_EQ(PoolMismatch(pool, pool), "");
  PoolIdentity other = pool;
  other.block_bytes = 1;
  EXPECT_EQ(PoolMismatch(other, pool), "block_bytes");
  other.hash_algorithm = HashAlgorithm::kSha256;
  EXPECT_EQ(PoolMismatch(other, pool), "hash_algorithm");
  other.layout_fingerprint = 1;
  EXPECT_EQ(PoolMismatch(other, pool), "layout_fingerprint");
  other.model_id = "llama";
  EXPECT_EQ(PoolMismatch(other, pool), "model_id");
}

}  // namespace
}  // namespace kvcache
