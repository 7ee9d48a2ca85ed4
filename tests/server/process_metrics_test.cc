// kvcache_build_info and the process_* families (server/process_metrics.h): /proc/PID/stat read
// as proc(5) lays it out, and this test process's own figures plausible.
#include "server/process_metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ctime>
#include <string>
#include <vector>

#include "common/version.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::Contains;

TEST(ParseProcStatTest, CountsFieldsAfterTheNamesLastParenthesis) {
  // pid, "(name)" holding a space and a ')', then fields 3..24 (utime 14 = 250, stime 15 = 50,
  // starttime 22 = 1000, vsize 23 = 4096000, rss 24 = 300 pages).
  const std::string stat =
      "4242 (kv (a) b) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 50 0 0 20 0 9 0 1000 4096000 300 "
      "18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 3 0 0 0 0 0";
  absl::StatusOr<ProcessStats> stats = ParseProcStat(stat, 100, 4096, 1700000000);
  ASSERT_OK(stats);
  EXPECT_DOUBLE_EQ(stats->cpu_seconds, 3.0);
  EXPECT_DOUBLE_EQ(stats->start_time_seconds, 1700000010.0);
  EXPECT_DOUBLE_EQ(stats->virtual_bytes, 4096000);
  EXPECT_DOUBLE_EQ(stats->resident_bytes, 300 * 4096.0);
}

TEST(ParseProcStatTest, RefusesWhatIsNoStatLine) {
  EXPECT_THAT(ParseProcStat("garbage", 100, 4096, 0), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParseProcStat("1 (x) S 1 2", 100, 4096, 0),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(ProcessStatsTest, ThisProcessLooksLikeItself) {
  absl::StatusOr<ProcessStats> stats = ReadProcessStats();
  ASSERT_OK(stats);
  const double now = static_cast<double>(std::time(nullptr));
  EXPECT_LE(stats->start_time_seconds, now + 1);
  EXPECT_GT(stats->start_time_seconds, now - 3600);  // this test started within the hour
  EXPECT_GT(stats->resident_bytes, 1 << 20);
  EXPECT_GE(stats->virtual_bytes, stats->resident_bytes);
  EXPECT_GE(stats->cpu_seconds, 0);
  EXPECT_GE(stats->open_fds, 3);  // stdin, stdout, stderr
  EXPECT_GE(stats->max_fds, stats->open_fds);
}

TEST(ProcessFamiliesTest, BuildInfoThenTheProcessFamilies) {
  const std::vector<prometheus::MetricFamily> families = ProcessFamilies();
  std::vector<std::string> names;
  for (const prometheus::MetricFamily& family : families) {
    names.push_back(family.name);
    EXPECT_FALSE(family.help.empty()) << family.name;
    EXPECT_EQ(family.metric.size(), 1u) << family.name;
  }
  ASSERT_FALSE(families.empty());
  EXPECT_EQ(families[0].name, "kvcache_build_info");
  EXPECT_EQ(families[0].metric[0].gauge.value, 1);
  ASSERT_EQ(families[0].metric[0].label.size(), 2u);
  EXPECT_EQ(families[0].metric[0].label[0].name, "version");
  EXPECT_EQ(families[0].metric[0].label[0].value, Version());
  for (const char* name :
       {"process_cpu_seconds_total", "process_resident_memory_bytes", "process_start_time_seconds",
        "process_open_fds", "process_max_fds", "process_virtual_memory_bytes"}) {
    EXPECT_THAT(names, Contains(name));
  }
}

}  // namespace
}  // namespace kvcache
