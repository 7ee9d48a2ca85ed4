#include "common/rpc/malloc_tuning.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include <gtest/gtest.h>

namespace kvcache {
namespace {

// Keeps the compiler from pairing up and eliding the malloc and free under test.
void* volatile escaped_buffer = nullptr;

TEST(MallocTuningTest, ReceiveSizedBuffersComeFromTheHeapAndStayThere) {
#if defined(__GLIBC__)
  ASSERT_TRUE(TuneMallocForBlockStreams());
  constexpr size_t kBufferBytes = 4 << 20;  // a received chunk; glibc's default maps it afresh
  const struct mallinfo2 before = mallinfo2();
  escaped_buffer = std::malloc(kBufferBytes);
  ASSERT_NE(escaped_buffer, nullptr);
  std::memset(escaped_buffer, 1, kBufferBytes);
  const struct mallinfo2 held = mallinfo2();
  EXPECT_EQ(held.hblkhd, before.hblkhd) << "the buffer was mapped, not taken from the heap";
  EXPECT_GE(held.arena, before.arena + kBufferBytes);
  std::free(escaped_buffer);
  const struct mallinfo2 after = mallinfo2();
  EXPECT_EQ(after.arena, held.arena) << "free gave the heap's top back to the kernel";
#else
  EXPECT_FALSE(TuneMallocForBlockStreams());
#endif
}

}  // namespace
}  // namespace kvcache
