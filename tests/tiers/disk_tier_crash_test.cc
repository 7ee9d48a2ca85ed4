// kill -9 during heavy offload must not lead to wrong bytes after restart (issue 18): a child
// process (disk_tier_crash_child) stores blocks as fast as it can and is SIGKILLed at a random
// point; the file is reopened and every record it indexes must load with exactly the bytes that
// were written, and every record the child saw durable must be there.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"
#include "tests/tiers/test_blocks.h"
#include "tiers/disk_tier.h"

namespace kvcache {
namespace {

constexpr uint64_t kSlots = 2048;

TEST(DiskTierCrashTest, KillNineLeavesNoWrongBytes) {
  const char* bin_dir = std::getenv("KVCACHE_BIN_DIR");
  ASSERT_NE(bin_dir, nullptr) << "KVCACHE_BIN_DIR must name the folder of disk_tier_crash_child";
  testing::ScopedTempDir dir;
  const std::string path = dir.File("pool.kvt");
  const unsigned seed = std::random_device{}();
  std::mt19937 rng(seed);

  for (int round = 0; round < 3; ++round) {
    // Each round kills the child at another point; later rounds start from the previous file.
    // The kill comes once this many more records are durable, with the child still storing.
    const uint64_t kill_after = std::uniform_int_distribution<uint64_t>(1, kSlots / 4)(rng);
    SCOPED_TRACE(::testing::Message() << "seed " << seed << " round " << round << " kill after "
                                      << kill_after << " more durable");
    auto child = testing::Subprocess::Start(
        {std::string(bin_dir) + "/disk_tier_crash_child", path, std::to_string(kSlots)});
    ASSERT_OK(child);
    uint64_t durable = 0;
    uint64_t first = kSlots;  // the first durable count the child reports
    while (durable < first + kill_after) {
      auto line = child->ReadLine(absl::Seconds(60));
      ASSERT_OK(line);
      if (*line == "done") break;
      if (absl::StartsWith(*line, "durable ")) {
        ASSERT_TRUE(absl::SimpleAtoi(line->substr(8), &durable)) << *line;
        first = std::min(first, durable);
      }
    }
    ASSERT_OK(child->Signal(SIGKILL));
    auto status = child->Wait(absl::Seconds(60));
    ASSERT_OK(status);
    EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL)
        << testing::DescribeWaitStatus(*status);

    auto tier = DiskTier::Open(testing::TestTierOptions(path, kSlots));
    ASSERT_OK(tier);
    const DiskTierStats stats = (*tier)->stats();
    EXPECT_GE(stats.restart_records, durable);
    EXPECT_EQ(stats.restart_foreign + stats.restart_old_format + stats.restart_duplicates, 0u);
    uint64_t found = 0;
    std::string out(testing::kTestBlockBytes, '\0');
    for (uint64_t i = 0; i < kSlots; ++i) {
      if (!(*tier)->Find(testing::TestHash(i)).ok()) {
        EXPECT_GE(i, durable) << "durable record " << i << " lost";
        continue;
      }
      ++found;
      ASSERT_OK((*tier)->Load(testing::TestIdentity(i), absl::MakeSpan(out))) << i;
      ASSERT_EQ(out, testing::TestBytes(testing::TestHash(i))) << i;
    }
    EXPECT_EQ(found, stats.restart_records);
    std::printf("round %d: killed after %llu durable; restart indexed %llu, torn %llu, scan %s\n",
                round, static_cast<unsigned long long>(durable),
                static_cast<unsigned long long>(stats.restart_records),
                static_cast<unsigned long long>(stats.restart_torn),
                absl::FormatDuration(stats.restart_scan_time).c_str());
  }
}

}  // namespace
}  // namespace kvcache
