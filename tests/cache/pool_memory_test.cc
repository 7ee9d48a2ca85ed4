// HostPoolMemory::CreateShared: who owns a shared-memory name, what a dead owner left, and the
// pre-faulted pages (issue 29); a batch's checksums.
#include "cache/pool_memory.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kBlockBytes = 64 << 10;
constexpr uint32_t kBlocks = 64;

// A name of this test process's own.
std::string TestShmName(absl::string_view what) {
  return ShmNameFor(absl::StrCat("pool_memory_test.", getpid()), what);
}

ino_t Inode(const std::string& shm_name) {
  struct stat info;
  if (stat(("/dev/shm" + shm_name).c_str(), &info) != 0) return 0;
  return info.st_ino;
}

TEST(ShmNameForTest, IsTheSameForTheSameOwnerAndPoolOnly) {
  EXPECT_EQ(ShmNameFor("unix:///run/kvcache/kv.sock", "default"),
            ShmNameFor("unix:///run/kvcache/kv.sock", "default"));
  EXPECT_NE(ShmNameFor("unix:///run/kvcache/kv.sock", "default"),
            ShmNameFor("unix:///run/other/kv.sock", "default"));
  EXPECT_NE(ShmNameFor("unix:///run/kvcache/kv.sock", "default"),
            ShmNameFor("unix:///run/kvcache/kv.sock", "other"));
  EXPECT_THAT(ShmNameFor("x", std::string(64, 'p')), ::testing::StartsWith("/kvcache."));
  EXPECT_LE(ShmNameFor("x", std::string(64, 'p')).size(), 255u);
}

TEST(HostPoolMemoryTest, ALiveOwnersNameIsRefusedAndLeftAlone) {
  const std::string name = TestShmName("live");
  auto first = HostPoolMemory::CreateShared(name, kBlockBytes, kBlocks);
  ASSERT_OK(first);
  const ino_t inode = Inode(name);
  EXPECT_THAT(HostPoolMemory::CreateShared(name, kBlockBytes, kBlocks),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("live daemon")));
  EXPECT_EQ(Inode(name), inode);
  first->reset();
  EXPECT_EQ(Inode(name), 0u) << "destroying the owner unlinks";
}

// What a SIGKILLed owner leaves: a sized object that nobody holds the lock of.
TEST(HostPoolMemoryTest, ADeadOwnersObjectIsUnlinkedAndCreatedAfresh) {
  const std::string name = TestShmName("stale");
  const int fd = shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(ftruncate(fd, kBlockBytes * kBlocks), 0);
  ASSERT_EQ(pwrite(fd, "stale", 5, 0), 5);
  const ino_t stale_inode = Inode(name);

  auto memory = HostPoolMemory::CreateShared(name, kBlockBytes, kBlocks);
  ASSERT_OK(memory);
  EXPECT_TRUE((*memory)->setup().reclaimed_stale);
  EXPECT_NE(Inode(name), stale_inode);
  EXPECT_EQ((*memory)->Block(0)[0], 0) << "the dead owner's bytes are in the new pool";
  // A process that still maps the old object keeps it: its bytes are its own.
  char byte = 0;
  EXPECT_EQ(pread(fd, &byte, 1, 0), 1);
  EXPECT_EQ(byte, 's');
  close(fd);
}

TEST(HostPoolMemoryTest, EveryPageIsAllocatedBeforeAnyoneTouchesIt) {
  const std::string name = TestShmName("prefault");
  auto memory = HostPoolMemory::CreateShared(name, kBlockBytes, kBlocks);
  ASSERT_OK(memory);
  EXPECT_FALSE((*memory)->setup().reclaimed_stale);
  // Untouched, yet every page is allocated (tmpfs counts them in st_blocks, as du does).
  const uint64_t bytes = kBlockBytes * kBlocks;
  struct stat info;
  ASSERT_EQ(stat(("/dev/shm" + name).c_str(), &info), 0);
  EXPECT_EQ(static_cast<uint64_t>(info.st_blocks) * 512, bytes);
}

TEST(HostPoolMemoryTest, ChecksumsABatchAsEachBlockAlone) {
  auto memory = HostPoolMemory::Create(kBlockBytes, kBlocks);
  ASSERT_OK(memory);
  std::mt19937 rng(11);
  std::string bytes(kBlockBytes, '\0');
  for (const uint32_t block : {3u, 9u, 63u}) {
    for (char& byte : bytes) byte = static_cast<char>(rng());
    ASSERT_OK((*memory)->Write(block, 0, bytes));
  }
  const std::vector<uint32_t> blocks = {63, 3, 9, 3};
  std::vector<uint64_t> checksums(blocks.size());
  ASSERT_OK((*memory)->ChecksumBlocks(blocks, absl::MakeSpan(checksums)));
  for (size_t i = 0; i < blocks.size(); ++i) {
    EXPECT_EQ(checksums[i], BlockChecksum((*memory)->HostBlock(blocks[i]), kBlockBytes)) << i;
  }
  EXPECT_NE(checksums[0], checksums[1]);
  EXPECT_THAT((*memory)->ChecksumBlocks(std::vector<uint32_t>{1, kBlocks},
                                        absl::MakeSpan(checksums).first(2)),
              StatusIs(absl::StatusCode::kOutOfRange));
}

}  // namespace
}  // namespace kvcache
