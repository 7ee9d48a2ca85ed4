#include "common/block_checksum.h"

#include <xxhash.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace kvcache {
namespace {

using ::testing::HasSubstr;

constexpr uint64_t kBlockBytes = 64;

std::string Pattern(size_t size) {
  std::string bytes(size, '\0');
  for (size_t i = 0; i < size; ++i) bytes[i] = static_cast<char>(i * 31 + 5);
  return bytes;
}

std::vector<uint64_t> ChecksumsOf(const std::string& bytes) {
  std::vector<uint64_t> checksums;
  for (size_t offset = 0; offset < bytes.size(); offset += kBlockBytes) {
    checksums.push_back(BlockChecksum(bytes.data() + offset, kBlockBytes));
  }
  return checksums;
}

// Whichever XXH3 build runs here (AVX2 or the library's), the values are the library's.
TEST(BlockChecksumTest, EqualsTheLibrarysXxh3OneShotAndStreamed) {
  const std::string bytes = Pattern(5000);
  xxh3::Stream stream;
  for (size_t size : {0, 1, 3, 16, 17, 128, 129, 240, 241, 1024, 1025, 4999, 5000}) {
    const uint64_t expected = XXH3_64bits_withSeed(bytes.data(), size, 0);
    EXPECT_EQ(BlockChecksum(bytes.data(), size), expected) << size;
    for (size_t offset = 0; offset < size; offset += 7) {
      stream.Update(bytes.data() + offset, std::min<size_t>(7, size - offset));
    }
    EXPECT_EQ(stream.DigestAndReset(), expected) << size;
  }
}

// The copy that checksums what it copies gives the library's XXH3 and memcpy's bytes at every
// size around XXH3's thresholds (240 bytes: short inputs; 1 KiB: a block of stripes; 64 bytes:
// a stripe, the tail copied apart), at aligned and unaligned ends, with either kind of store.
// The form whose copy is the caller's (a device pool's): pieces of at most 16 KiB, in order,
// covering every byte once, and the library's XXH3 of them.
TEST(BlockChecksumTest, ChecksumWhileTheCallerCopiesEqualsTheLibrarysXxh3) {
  const std::string bytes = Pattern((100 << 10) + 7);
  for (const size_t size : {0, 1, 240, 241, 1025, 16 << 10, (16 << 10) + 1, (100 << 10) + 7}) {
    std::string copy(size, '\0');
    uint64_t next = 0;
    const uint64_t checksum =
        ChecksumWhileCopying(bytes.data(), size, [&](uint64_t offset, uint64_t length) {
          EXPECT_EQ(offset, next);
          EXPECT_LE(length, uint64_t{16} << 10);
          copy.replace(offset, length, bytes.data() + offset, length);
          next = offset + length;
        });
    EXPECT_EQ(next, size);
    EXPECT_EQ(checksum, XXH3_64bits_withSeed(bytes.data(), size, 0)) << size;
    EXPECT_EQ(copy, bytes.substr(0, size)) << size;
  }
}

TEST(BlockChecksumTest, ChecksumWhileCopyingEqualsMemcpyAndTheLibrarysXxh3) {
  const std::string bytes = Pattern((1 << 20) + 200);
  std::vector<size_t> sizes = {0,    1,         63,       64,        240,    241,  255,
                               256,  1023,      1024,     1025,      1088,   2047, 2048,
                               2049, 4096 + 65, 32 << 10, 256 << 10, 1 << 20};
  for (size_t size = 241; size < 1400; size += 37) sizes.push_back(size);
  for (const CopyStores stores : {CopyStores::kCached, CopyStores::kStreaming}) {
    for (const size_t size : sizes) {
      for (const size_t source_offset : {0, 3, 32}) {
        for (const size_t destination_offset : {0, 1, 32}) {
          std::vector<char> destination(size + 64, '\x5a');
          const char* source = bytes.data() + source_offset;
          const uint64_t checksum =
              ChecksumWhileCopying(destination.data() + destination_offset, source, size, stores);
          const std::string where =
              absl::StrCat(size, " bytes from +", source_offset, " to +", destination_offset,
                           " streaming ", stores == CopyStores::kStreaming);
          EXPECT_EQ(checksum, XXH3_64bits_withSeed(source, size, 0)) << where;
          EXPECT_EQ(absl::string_view(destination.data() + destination_offset, size),
                    absl::string_view(source, size))
              << where;
          // Nothing written past either end.
          EXPECT_EQ(std::string(destination.data(), destination_offset),
                    std::string(destination_offset, '\x5a'))
              << where;
          EXPECT_EQ(std::string(destination.data() + destination_offset + size,
                                destination.size() - destination_offset - size),
                    std::string(destination.size() - destination_offset - size, '\x5a'))
              << where;
        }
      }
    }
  }
}

// Fed in pieces of every shape (shorter than a stripe, straddling stripes and XXH3's 1 KiB blocks,
// ending on the last stripe), CopyingHash copies each piece and gives the library's XXH3 of the
// whole, with the AVX2 code where the CPU has it and with the code of CPUs without it.
TEST(BlockChecksumTest, CopyingHashInPiecesEqualsTheLibrarysXxh3) {
  const std::string bytes = Pattern(300 << 10);
  std::mt19937 random(7);
  for (const bool baseline : {false, true}) {
    xxh3::CopyingHash::UseBaselineCodeForTesting(baseline);
    for (const size_t size : {0, 5, 240, 241, 300, 1024, 1025, 1088, 5000, 65536, 300 << 10}) {
      for (int trial = 0; trial < 20; ++trial) {
        std::string copy(size, '\0');
        xxh3::CopyingHash hash(size);
        size_t offset = 0;
        std::vector<size_t> pieces;
        while (offset < size) {
          // Mostly short pieces, so that stripes straddle; now and then a long run of stripes.
          const size_t most = trial % 4 == 0 ? size : (trial % 2 == 0 ? 200 : 70);
          const size_t piece =
              std::min(size - offset, std::uniform_int_distribution<size_t>(1, most)(random));
          hash.Copy(copy.data() + offset, bytes.data() + offset, piece, trial % 3 == 0);
          pieces.push_back(piece);
          offset += piece;
        }
        EXPECT_EQ(hash.fed(), size);
        EXPECT_EQ(hash.Finish(), XXH3_64bits_withSeed(bytes.data(), size, 0))
            << size << " bytes in " << pieces.size() << " pieces, baseline " << baseline;
        EXPECT_EQ(copy, bytes.substr(0, size)) << size << " bytes, baseline " << baseline;
      }
    }
  }
  xxh3::CopyingHash::UseBaselineCodeForTesting(false);
}

TEST(BlockStreamVerifierTest, RebuildsTheBlocksFromPiecesOfAnySize) {
  const std::string bytes = Pattern(5 * kBlockBytes);
  for (size_t piece_size : {1, 7, 63, 64, 65, 200, 320}) {
    BlockStreamVerifier verifier(kBlockBytes, ChecksumsOf(bytes), /*first_block=*/3);
    std::string rebuilt(bytes.size(), '\0');
    for (size_t offset = 0; offset < bytes.size(); offset += piece_size) {
      const absl::string_view piece = absl::string_view(bytes).substr(offset, piece_size);
      ASSERT_TRUE(verifier
                      .Feed(piece,
                            [&](uint32_t block, uint64_t block_offset, absl::string_view part) {
                              EXPECT_GE(block, 3u);
                              EXPECT_LE(block_offset + part.size(), kBlockBytes);
                              rebuilt.replace((block - 3) * kBlockBytes + block_offset, part.size(),
                                              part.data(), part.size());
                              return absl::OkStatus();
                            })
                      .ok());
    }
    EXPECT_EQ(verifier.received_bytes(), verifier.expected_bytes());
    EXPECT_EQ(rebuilt, bytes) << "pieces of " << piece_size;
  }
}

TEST(BlockStreamVerifierTest, CacheSizedPiecesRebuildTheBlocksInSmallPieces) {
  constexpr uint64_t kLargeBlockBytes = 100 << 10;  // more than a cache-sized piece
  const std::string bytes = Pattern(3 * kLargeBlockBytes);
  std::vector<uint64_t> checksums;
  for (int i = 0; i < 3; ++i) {
    checksums.push_back(BlockChecksum(bytes.data() + i * kLargeBlockBytes, kLargeBlockBytes));
  }
  BlockStreamVerifier verifier(kLargeBlockBytes, checksums);
  std::string rebuilt;
  size_t largest_part = 0;
  ASSERT_TRUE(verifier
                  .Feed(
                      bytes,
                      [&](uint32_t block, uint64_t block_offset, absl::string_view part) {
                        EXPECT_EQ(block * kLargeBlockBytes + block_offset, rebuilt.size());
                        largest_part = std::max(largest_part, part.size());
                        rebuilt.append(part.data(), part.size());
                        return absl::OkStatus();
                      },
                      BlockStreamVerifier::Pieces::kCacheSized)
                  .ok());
  EXPECT_EQ(rebuilt, bytes);
  EXPECT_LE(largest_part, size_t{16 << 10});
}

// FeedInto copies the blocks that have a target itself (cached or streaming stores) and hands the
// others to the sink, from pieces of any size, blocks of 1 KiB + 1 byte (XXH3's stripes and
// blocks straddled), and checks each against its checksum.
TEST(BlockStreamVerifierTest, FeedIntoCopiesTargetedBlocksAndSinksTheRest) {
  constexpr uint64_t kOddBlockBytes = 1025;
  const std::string bytes = Pattern(6 * kOddBlockBytes);
  std::vector<uint64_t> checksums;
  for (int i = 0; i < 6; ++i) {
    checksums.push_back(BlockChecksum(bytes.data() + i * kOddBlockBytes, kOddBlockBytes));
  }
  for (size_t piece_size : {1, 63, 64, 100, 1025, 3000, 6 * 1025}) {
    BlockStreamVerifier verifier(kOddBlockBytes, checksums, /*first_block=*/2);
    std::string copied(bytes.size(), '\0');
    std::string sunk(bytes.size(), '\0');
    std::vector<uint32_t> asked;
    const auto targets = [&](uint32_t block) {
      asked.push_back(block);
      if (block % 3 == 0) return BlockStreamVerifier::CopyTarget{};  // blocks 3 and 6: the sink
      return BlockStreamVerifier::CopyTarget{
          .bytes = copied.data() + (block - 2) * kOddBlockBytes,
          .stores = block % 2 == 0 ? CopyStores::kStreaming : CopyStores::kCached};
    };
    const auto sink = [&](uint32_t block, uint64_t offset, absl::string_view piece) {
      EXPECT_EQ(block % 3, 0u);
      sunk.replace((block - 2) * kOddBlockBytes + offset, piece.size(), piece.data(), piece.size());
      return absl::OkStatus();
    };
    for (size_t offset = 0; offset < bytes.size(); offset += piece_size) {
      ASSERT_TRUE(
          verifier.FeedInto(absl::string_view(bytes).substr(offset, piece_size), targets, sink)
              .ok())
          << "pieces of " << piece_size;
    }
    EXPECT_EQ(asked, (std::vector<uint32_t>{2, 3, 4, 5, 6, 7}));
    for (uint32_t block = 2; block < 8; ++block) {
      const std::string& where = block % 3 == 0 ? sunk : copied;
      EXPECT_EQ(where.substr((block - 2) * kOddBlockBytes, kOddBlockBytes),
                bytes.substr((block - 2) * kOddBlockBytes, kOddBlockBytes))
          << "block " << block << ", pieces of " << piece_size;
    }
  }
}

TEST(BlockStreamVerifierTest, FeedIntoNamesACopiedBlockWhoseChecksumDiffers) {
  std::string bytes = Pattern(3 * 4096);
  std::vector<uint64_t> checksums;
  for (int i = 0; i < 3; ++i) checksums.push_back(BlockChecksum(bytes.data() + i * 4096, 4096));
  bytes[4096 + 4000] ^= 1;
  std::string copied(bytes.size(), '\0');
  BlockStreamVerifier verifier(4096, checksums);
  const absl::Status status = verifier.FeedInto(
      bytes,
      [&](uint32_t block) {
        return BlockStreamVerifier::CopyTarget{.bytes = copied.data() + block * 4096};
      },
      [](uint32_t, uint64_t, absl::string_view) { return absl::InternalError("not called"); });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("block 1 of 3 has checksum"));
  EXPECT_EQ(verifier.received_bytes(), 2 * 4096);
}

TEST(BlockStreamVerifierTest, NamesTheFirstBlockWhoseChecksumDiffers) {
  std::string bytes = Pattern(4 * kBlockBytes);
  const std::vector<uint64_t> checksums = ChecksumsOf(bytes);
  bytes[2 * kBlockBytes + 10] ^= 1;
  BlockStreamVerifier verifier(kBlockBytes, checksums, /*first_block=*/1);
  const absl::Status status =
      verifier.Feed(bytes, [](uint32_t, uint64_t, absl::string_view) { return absl::OkStatus(); });
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("block 3 of 5 has checksum"));
  EXPECT_EQ(verifier.received_bytes(), 3 * kBlockBytes);
}

TEST(BlockStreamVerifierTest, StopsAtTheSinksError) {
  const std::string bytes = Pattern(2 * kBlockBytes);
  BlockStreamVerifier verifier(kBlockBytes, ChecksumsOf(bytes));
  const absl::Status status = verifier.Feed(bytes, [](uint32_t block, uint64_t, absl::string_view) {
    return block == 1 ? absl::OutOfRangeError("no room") : absl::OkStatus();
  });
  EXPECT_EQ(status, absl::OutOfRangeError("no room"));
  EXPECT_EQ(verifier.received_bytes(), kBlockBytes);
}

}  // namespace
}  // namespace kvcache
