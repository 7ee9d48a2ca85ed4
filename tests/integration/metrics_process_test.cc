// Prometheus /metrics of a real kvcache-manager process, scraped over HTTP while client processes
// work against it: prefix-cache hits and queries, resurrections, evictions and their residency,
// bytes put and got, sessions closed and expired (a client killed), RPCs by method and code; and
// kvcache_build_info and the process_* families; and the exposition passes `promtool check
// metrics`.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

// GET http://127.0.0.1:PORT/metrics; the whole response, headers included, or "" on any failure.
std::string ScrapeResponse(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  int port = 0;
  if (colon == std::string::npos || !absl::SimpleAtoi(host_port.substr(colon + 1), &port)) {
    return "";
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &address.sin_addr);
  std::string response;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if (write(fd, request.data(), request.size()) == static_cast<ssize_t>(request.size())) {
      char buffer[65536];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
    }
  }
  close(fd);
  return response;
}

// GET http://127.0.0.1:PORT/metrics; the body, or "" on any failure.
std::string Scrape(const std::string& host_port) {
  const std::string response = ScrapeResponse(host_port);
  const size_t body = response.find("\r\n\r\n");
  return body == std::string::npos ? "" : response.substr(body + 4);
}

// The value of the sample `series` (name and labels exactly as exposed); -1 when absent.
double Sample(const std::string& exposition, const std::string& series) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (!absl::StartsWith(line, series) || line.size() <= series.size() ||
        line[series.size()] != ' ') {
      continue;
    }
    double value = -1;
    if (absl::SimpleAtod(line.substr(series.size() + 1), &value)) return value;
  }
  return -1;
}

class MetricsProcessTest : public DaemonProcessTest {
 protected:
  void SetUp() override {
    DaemonProcessTest::SetUp();
    extra_daemon_flags_ = {"--metrics_listen=127.0.0.1:0"};
    // A second pool with a host tier and a disk tier, so the tier families are exposed and
    // checked too.
    pool_flag_ += ",tiered:blocks=8:host_tier=1MiB:disk_tier=" + dir_.File("tiered.tier") + ":1MiB";
  }

  void StartWithMetrics() {
    ASSERT_NO_FATAL_FAILURE(StartDaemon());
    absl::StatusOr<std::string> line =
        daemon_->ReadLineStartingWith("  metrics on http://", kStartBound);
    ASSERT_OK(line);
    std::string address = line->substr(std::string("  metrics on http://").size());
    address = address.substr(0, address.find('/'));
    metrics_address_ = address;
  }

  double Now(const std::string& series) { return Sample(Scrape(metrics_address_), series); }

  std::string metrics_address_;
};

// Regression (issue 29, item 9): the Content-Type left out the text format's version.
TEST_F(MetricsProcessTest, TheContentTypeNamesTheTextFormatVersion) {
  StartWithMetrics();
  const std::string response = ScrapeResponse(metrics_address_);
  const std::string head = response.substr(0, response.find("\r\n\r\n"));
  EXPECT_TRUE(absl::StartsWith(head, "HTTP/1.1 200 OK\r\n")) << head;
  const std::vector<std::string> headers = absl::StrSplit(head, "\r\n");
  EXPECT_THAT(headers,
              ::testing::Contains("Content-Type: text/plain; version=0.0.4; charset=utf-8"))
      << head;
  EXPECT_THAT(response, ::testing::HasSubstr("kvcache_blocks_capacity{pool=\"default\"} "));
}

// Issue 33: a sealed disk tier's records that do not open, per tenant: a series for every tenant
// of the pool from the start (0), none for a pool without sealed tiers.
TEST_F(MetricsProcessTest, SealedTiersExposeTheirOpenFailuresPerTenant) {
  const std::string key_file = dir_.File("tier.key");
  std::ofstream(key_file) << "1:" << std::string(64, 'c') << "\n";
  ASSERT_EQ(chmod(key_file.c_str(), 0600), 0);
  extra_daemon_flags_.push_back("--tier_key_file=" + key_file);
  StartWithMetrics();
  RunClient({"write-kv", "tiered", "40", "7000"});  // tenant default uses the pool
  const std::string exposition = Scrape(metrics_address_);
  EXPECT_THAT(exposition, ::testing::HasSubstr("# TYPE kvcache_tier_open_failures_total counter"));
  EXPECT_EQ(
      Sample(exposition,
             R"(kvcache_tier_open_failures_total{pool="tiered",tier="disk",tenant="default"})"),
      0);
  EXPECT_FALSE(absl::StrContains(exposition, R"(kvcache_tier_open_failures_total{pool="default")"));
}

TEST_F(MetricsProcessTest, ValuesMoveWithARealWorkloadAndPromtoolAcceptsTheExposition) {
  StartWithMetrics();
  const std::string tenant = R"(pool="default",tenant="default")";
  const std::string before = Scrape(metrics_address_);
  ASSERT_FALSE(before.empty());
  EXPECT_EQ(Sample(before, "kvcache_blocks_capacity{pool=\"default\"}"), kPoolBlocks);
  EXPECT_EQ(Sample(before, "kvcache_usage_ratio{pool=\"default\"}"), 0);
  EXPECT_EQ(Sample(before, R"(kvcache_tier_capacity_bytes{pool="tiered",tier="host"})"), 1 << 20);
  EXPECT_EQ(Sample(before, R"(kvcache_tier_stored_blocks_total{pool="tiered",tier="host"})"), 0);
  EXPECT_EQ(Sample(before, R"(kvcache_tier_lost_evictions_total{pool="tiered",tier="disk"})"), 0);
  EXPECT_EQ(Sample(before, R"(kvcache_tier_superseded_total{pool="tiered",tier="host"})"), 0);
  EXPECT_EQ(Sample(before, R"(kvcache_tier_poorer_kept_back_total{pool="tiered",tier="disk"})"), 0);
  // 1 MiB of slots of a 4 KiB header and a 32 KiB block.
  EXPECT_EQ(Sample(before, R"(kvcache_tier_capacity_bytes{pool="tiered",tier="disk"})"),
            (1 << 20) / (36 << 10) * (36 << 10));
  EXPECT_EQ(Sample(before, R"(kvcache_disk_tier_restored_records{pool="tiered"})"), 0);
  EXPECT_EQ(Sample(before, R"(kvcache_disk_tier_write_errors_total{pool="tiered"})"), 0);
  EXPECT_EQ(Sample(before, R"(kvcache_tier_load_seconds_count{pool="tiered",tier="disk"})"), 0);
  // The version, and the process families every Prometheus client library exports.
  EXPECT_TRUE(absl::StrContains(
      before, "kvcache_build_info{version=\"" KVCACHE_PROJECT_VERSION "\",revision=\""))
      << before;
  EXPECT_GT(Sample(before, "process_start_time_seconds"), 1.7e9);
  EXPECT_GT(Sample(before, "process_resident_memory_bytes"), 1 << 20);
  EXPECT_GE(Sample(before, "process_virtual_memory_bytes"), 1 << 20);
  EXPECT_GE(Sample(before, "process_cpu_seconds_total"), 0);
  EXPECT_GE(Sample(before, "process_open_fds"), 3);
  EXPECT_GE(Sample(before, "process_max_fds"), 3);

  // Two full blocks computed, then hit: 32 of the second prompt's 40 tokens, both resurrected.
  RunClient({"compute-and-commit", "default", "40", "1000"});
  RunClient({"open-and-report", "default", "40", "1000"});
  std::string now = Scrape(metrics_address_);
  EXPECT_EQ(Sample(now, "kvcache_prefix_cache_queries_total{" + tenant + "}"), 80);
  EXPECT_EQ(Sample(now, "kvcache_prefix_cache_hits_total{" + tenant + "}"), 32);
  EXPECT_EQ(Sample(now, "kvcache_resurrected_blocks_total{" + tenant + "}"), 2);
  EXPECT_EQ(Sample(now, "kvcache_published_blocks_total{" + tenant + "}"), 2);
  EXPECT_EQ(Sample(now, "kvcache_sessions_closed_total{tenant=\"default\"}"), 2);
  EXPECT_EQ(Sample(now, R"(kvcache_rpc_requests_total{method="OpenSequence",code="OK"})"), 2);
  EXPECT_GE(Sample(now, R"(kvcache_rpc_duration_seconds_count{method="OpenSequence"})"), 2);
  EXPECT_GE(Sample(now, "kvcache_kv_events_published_total"), 2);  // cleared + stored

  // A prompt that needs every block evicts the two cached ones.
  RunClient(
      {"compute-and-commit", "default", std::to_string(kPoolBlocks * kBlockSize - 1), "50000"});
  now = Scrape(metrics_address_);
  EXPECT_EQ(Sample(now, "kvcache_evicted_blocks_total{" + tenant + "}"), 2);
  EXPECT_EQ(Sample(now, "kvcache_block_lifetime_seconds_count{pool=\"default\"}"), 2);
  EXPECT_EQ(Sample(now, "kvcache_block_idle_before_evict_seconds_count{pool=\"default\"}"), 2);

  // Bytes through the data streams.
  RunClient({"put-kv", "default", "48", "7000"});
  RunClient({"get-kv", "default", "48", "7000"});
  now = Scrape(metrics_address_);
  const double block_bytes = 32768;  // the default layout's
  EXPECT_EQ(Sample(now, R"(kvcache_transfer_bytes_total{pool="default",direction="put"})"),
            3 * block_bytes);
  EXPECT_EQ(Sample(now, R"(kvcache_transfer_bytes_total{pool="default",direction="get"})"),
            3 * block_bytes);

  // A client killed while holding a lease: its session expires, and the gauge drops back.
  absl::StatusOr<Subprocess> holder = StartClient({"hold-and-hang", "default", "20", "900", "400"});
  ASSERT_OK(holder);
  ReadResult(*holder);
  EXPECT_EQ(Now("kvcache_sessions_open{tenant=\"default\"}"), 1);
  ASSERT_OK(holder->Signal(SIGKILL));
  EXPECT_TRUE(
      PollUntil([&] { return Now("kvcache_sessions_expired_total{tenant=\"default\"}") == 1; }));
  EXPECT_EQ(Now("kvcache_sessions_open{tenant=\"default\"}"), 0);

  // An error is counted under its code.
  absl::StatusOr<Subprocess> lost = StartClient({"open-and-report", "no-such-pool", "20", "1"});
  ASSERT_OK(lost);
  ASSERT_OK(lost->Wait(kClientBound).status());
  EXPECT_EQ(Now(R"(kvcache_rpc_requests_total{method="OpenSequence",code="NOT_FOUND"})"), 1);

  // The exposition as Prometheus' own checker reads it.
  const std::string path = dir_.File("scrape.txt");
  std::ofstream(path) << Scrape(metrics_address_);
  const std::string command =
      "promtool check metrics < " + path + " > " + dir_.File("promtool.txt") + " 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream report(dir_.File("promtool.txt"));
  const std::string findings((std::istreambuf_iterator<char>(report)),
                             std::istreambuf_iterator<char>());
  EXPECT_EQ(status, 0) << findings;
  EXPECT_EQ(findings, "");
  // Every family of ours has HELP, and every counter's name ends in _total.
  const std::string final_scrape = Scrape(metrics_address_);
  int families = 0;
  for (absl::string_view line : absl::StrSplit(final_scrape, '\n')) {
    if (!absl::StartsWith(line, "# TYPE kvcache_")) continue;
    const std::vector<std::string> words = absl::StrSplit(line, ' ');
    ASSERT_EQ(words.size(), 4u) << line;
    const std::string& name = words[2];
    EXPECT_TRUE(absl::StrContains(final_scrape, "# HELP " + name + " ")) << name;
    if (words[3] == "counter") {
      EXPECT_TRUE(absl::EndsWith(name, "_total")) << name;
    }
    ++families;
  }
  EXPECT_GE(families, 25);
  StopDaemon();
}

}  // namespace
}  // namespace kvcache::testing
