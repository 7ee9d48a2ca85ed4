// The soak's figures survive the trip through a client's printed lines and merge across clients:
// a percentile from the histogram is within one bucket of the true value, and the driver
// refuses a line it cannot read instead of counting it as zero.
#include "tests/integration/soak_stats.h"

#include <gtest/gtest.h>

#include "absl/status/status.h"

namespace kvcache::testing {
namespace {

TEST(LatencyHistogramTest, PercentileIsTheUpperBoundOfTheQuantilesBucket) {
  LatencyHistogram histogram;
  EXPECT_EQ(histogram.PercentileMicros(0.5), 0);
  for (int i = 0; i < 99; ++i) histogram.Record(absl::Microseconds(100));
  histogram.Record(absl::Milliseconds(10));
  // 100 us falls in [2^(53/8), 2^(54/8)) = [98.7, 107.6) us; 10 ms in [9741, 10623) us.
  EXPECT_NEAR(histogram.PercentileMicros(0.5), 107.6, 0.1);
  EXPECT_NEAR(histogram.PercentileMicros(0.99), 107.6, 0.1);
  EXPECT_NEAR(histogram.PercentileMicros(1.0), 10623.0, 1);
  EXPECT_EQ(histogram.count(), 100u);
}

TEST(LatencyHistogramTest, RoundTripsThroughTextAndMerges) {
  LatencyHistogram a, b;
  a.Record(absl::Microseconds(3));
  b.Record(absl::Seconds(2));
  b.Record(absl::Seconds(2));
  std::optional<LatencyHistogram> parsed = LatencyHistogram::Parse(b.ToString());
  ASSERT_TRUE(parsed.has_value());
  a.Merge(*parsed);
  EXPECT_EQ(a.count(), 3u);
  EXPECT_NEAR(a.PercentileMicros(0.34), 2.0e6 * 1.09, 0.1e6);
  EXPECT_LT(a.PercentileMicros(0.33), 4);
  EXPECT_FALSE(LatencyHistogram::Parse("5:1,x").has_value());
  EXPECT_FALSE(LatencyHistogram::Parse("100000:1").has_value());
}

TEST(SoakStatsTest, ClientLinesMergeIntoTheDriversTotals) {
  SoakStats client;
  client.calls["open"].Count(absl::OkStatus(), absl::Microseconds(50));
  client.calls["open"].Count(absl::ResourceExhaustedError("full"), absl::Microseconds(50));
  client.calls["put"].Count(absl::AbortedError("lease"), absl::Microseconds(50));
  client.calls["put"].Count(absl::DeadlineExceededError("slow"), absl::Microseconds(50));
  client.calls["get"].Count(absl::InvalidArgumentError("bug"), absl::Microseconds(50));
  client.verified_blocks = 7;
  client.checksum_failures = 1;
  client.sessions = 2;

  SoakStats driver;
  for (int copies = 0; copies < 2; ++copies) {
    std::string lines = client.ToLines();
    size_t begin = 0;
    for (size_t end; (end = lines.find('\n', begin)) != std::string::npos; begin = end + 1) {
      ASSERT_TRUE(driver.ParseLine(lines.substr(begin, end - begin))) << lines;
    }
  }
  EXPECT_EQ(driver.calls["open"].ok, 2u);
  EXPECT_EQ(driver.calls["open"].exhausted, 2u);
  EXPECT_EQ(driver.calls["put"].lost, 2u);
  EXPECT_EQ(driver.calls["put"].timeout, 2u);
  EXPECT_EQ(driver.calls["get"].unexpected, 2u);
  EXPECT_EQ(driver.calls["open"].latency.count(), 2u);
  EXPECT_EQ(driver.TotalOk(), 2u);
  EXPECT_EQ(driver.TotalUnexpected(), 2u);
  EXPECT_EQ(driver.verified_blocks, 14u);
  EXPECT_EQ(driver.checksum_failures, 2u);
  EXPECT_EQ(driver.sessions, 4u);

  EXPECT_FALSE(driver.ParseLine("soak-call open ok=1"));
  EXPECT_FALSE(
      driver.ParseLine("soak-call open ok=2 exhausted=0 lost=0 timeout=0 unexpected=0 "
                       "hist=5:1"));  // two successes, one latency
  EXPECT_FALSE(driver.ParseLine("soak-counters verified_blocks=1"));
  EXPECT_FALSE(driver.ParseLine("something else"));
}

}  // namespace
}  // namespace kvcache::testing
