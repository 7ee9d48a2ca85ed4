#include "common/streaming_copy.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <string>

namespace kvcache {
namespace {

constexpr size_t kGuard = 128;
constexpr char kGuardByte = '\x7e';

std::string RandomBytes(size_t size, uint32_t seed) {
  std::mt19937 random(seed);
  std::string bytes(size, '\0');
  for (char& byte : bytes) {
    byte = static_cast<char>(random());
    if (byte == kGuardByte) byte = 0;  // so the guards show exactly where the copy wrote
  }
  return bytes;
}

// Copies `size` bytes from `source_offset` in a random buffer to `destination_offset` in a
// guarded one; the copy must equal memcpy's and leave every byte around it alone.
void ExpectCopies(size_t size, size_t source_offset, size_t destination_offset) {
  SCOPED_TRACE(testing::Message() << "size " << size << ", source offset " << source_offset
                                  << ", destination offset " << destination_offset);
  const std::string source = RandomBytes(source_offset + size, static_cast<uint32_t>(size));
  std::string destination(kGuard + destination_offset + size + kGuard, kGuardByte);
  char* to = destination.data() + kGuard + destination_offset;
  StreamingCopy(to, source.data() + source_offset, size);
  EXPECT_EQ(std::string(to, size), source.substr(source_offset, size));
  EXPECT_EQ(destination.find_first_not_of(kGuardByte),
            size == 0 ? std::string::npos : kGuard + destination_offset);
  EXPECT_EQ(destination.find_last_not_of(kGuardByte),
            size == 0 ? std::string::npos : kGuard + destination_offset + size - 1);
}

TEST(StreamingCopyTest, EqualsMemcpyForEverySizeAroundTheLineAndItsThreshold) {
  for (size_t size = 0; size <= 600; ++size) ExpectCopies(size, size % 7, size % 13);
}

TEST(StreamingCopyTest, EqualsMemcpyAtEveryAlignment) {
  for (size_t source_offset = 0; source_offset < 64; source_offset += 3) {
    for (size_t destination_offset = 0; destination_offset < 64; ++destination_offset) {
      ExpectCopies(4096 + 17, source_offset, destination_offset);
    }
  }
}

TEST(StreamingCopyTest, CopiesMegabytes) {
  ExpectCopies(kStreamingCopyMinTotalBytes + 12345, 5, 33);
}

}  // namespace
}  // namespace kvcache
