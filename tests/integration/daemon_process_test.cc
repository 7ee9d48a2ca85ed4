// End to end across real processes: kvcache-manager as a child process on a Unix socket in a temp
// dir, and kvcache-test-client processes as its clients. Checks that a committed prefix is shared
// across processes on the same physical blocks, that a killed or frozen client's blocks come back
// once its lease runs out, and that SIGTERM stops the daemon cleanly.
//
// Every wait is bounded; conditions the daemon reaches asynchronously are polled for.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "client/kv_cache_client.h"
#include "tests/integration/subprocess.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::DescribeWaitStatus;
using ::kvcache::testing::Subprocess;
using ::testing::ElementsAreArray;

constexpr uint32_t kBlockSize = 16;  // the daemon's default pool layout
constexpr uint32_t kPoolBlocks = 64;
// Bounds, not expectations: generous so that a loaded machine does not fail the test.
constexpr absl::Duration kStartBound = absl::Seconds(20);
constexpr absl::Duration kClientBound = absl::Seconds(20);
constexpr absl::Duration kLeaseBound = absl::Seconds(15);

// One "result ..." line of kvcache-test-client.
struct ClientResult {
  uint64_t session_id = 0;
  uint64_t sequence_id = 0;
  uint32_t num_cached_tokens = 0;
  std::vector<uint32_t> block_ids;
};

std::optional<ClientResult> ParseResult(absl::string_view line) {
  if (!absl::ConsumePrefix(&line, "result ")) return std::nullopt;
  ClientResult result;
  for (absl::string_view field : absl::StrSplit(line, ' ')) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
    bool ok = true;
    if (kv.first == "session") {
      ok = absl::SimpleAtoi(kv.second, &result.session_id);
    } else if (kv.first == "sequence") {
      ok = absl::SimpleAtoi(kv.second, &result.sequence_id);
    } else if (kv.first == "cached") {
      ok = absl::SimpleAtoi(kv.second, &result.num_cached_tokens);
    } else if (kv.first == "blocks") {
      for (absl::string_view id : absl::StrSplit(kv.second, ',', absl::SkipEmpty())) {
        uint32_t block = 0;
        ok = ok && absl::SimpleAtoi(id, &block);
        result.block_ids.push_back(block);
      }
    }
    if (!ok) return std::nullopt;
  }
  return result;
}

std::vector<uint32_t> Prefix(const std::vector<uint32_t>& ids, size_t count) {
  return std::vector<uint32_t>(ids.begin(), ids.begin() + std::min(count, ids.size()));
}

class DaemonProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin_dir = std::getenv("KVCACHE_BIN_DIR");
    ASSERT_NE(bin_dir, nullptr) << "KVCACHE_BIN_DIR must name the folder of kvcache-manager";
    bin_dir_ = bin_dir;
    char dir[] = "/tmp/kvcache_integration.XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_path_ = dir_ + "/kv.sock";
    target_ = "unix://" + socket_path_;
  }

  void TearDown() override {
    observer_.reset();
    if (daemon_.has_value()) StopDaemon();
    std::filesystem::remove_all(dir_);
  }

  // Starts kvcache-manager and a client of the test's own (no session) to watch its stats.
  void StartDaemon() {
    absl::StatusOr<Subprocess> daemon = Subprocess::Start(
        {bin_dir_ + "/kvcache-manager", "--listen=" + target_,
         "--pool=default:blocks=" + std::to_string(kPoolBlocks), "--session_ttl=2s"});
    ASSERT_OK(daemon);
    daemon_.emplace(*std::move(daemon));
    ASSERT_OK(daemon_->ReadLineStartingWith("kvcache-manager: listening on", kStartBound));
    absl::StatusOr<std::unique_ptr<KvCacheClient>> observer = KvCacheClient::Connect(target_);
    ASSERT_OK(observer);
    observer_ = *std::move(observer);
  }

  // SIGTERM, then the daemon must exit 0 within the bound.
  void StopDaemon() {
    ASSERT_OK(daemon_->Signal(SIGTERM));
    absl::StatusOr<int> status = daemon_->Wait(kStartBound);
    ASSERT_OK(status);
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << "kvcache-manager " << DescribeWaitStatus(*status);
    daemon_.reset();
  }

  absl::StatusOr<Subprocess> StartClient(const std::vector<std::string>& args) {
    std::vector<std::string> argv = {bin_dir_ + "/kvcache-test-client", target_};
    argv.insert(argv.end(), args.begin(), args.end());
    return Subprocess::Start(argv);
  }

  // Reads the client's result line; ClientResult{} (and a test failure) if there is none.
  ClientResult ReadResult(Subprocess& client) {
    absl::StatusOr<std::string> line = client.ReadLineStartingWith("result ", kClientBound);
    EXPECT_OK(line);
    if (!line.ok()) return {};
    std::optional<ClientResult> result = ParseResult(*line);
    EXPECT_TRUE(result.has_value()) << "unparsable: " << *line;
    return result.value_or(ClientResult{});
  }

  // Runs a client that exits by itself and expects exit status 0.
  ClientResult RunClient(const std::vector<std::string>& args) {
    absl::StatusOr<Subprocess> client = StartClient(args);
    EXPECT_OK(client);
    if (!client.ok()) return {};
    ClientResult result = ReadResult(*client);
    absl::StatusOr<int> status = client->Wait(kClientBound);
    EXPECT_OK(status);
    if (status.ok()) {
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
          << "kvcache-test-client " << DescribeWaitStatus(*status);
    }
    return result;
  }

  KvCacheClient::PoolStats PoolStats() {
    absl::StatusOr<KvCacheClient::Stats> stats = observer_->GetStats("default");
    EXPECT_OK(stats);
    if (!stats.ok() || stats->pools.empty()) return {};
    return stats->pools[0];
  }

  uint32_t OpenSessions() {
    absl::StatusOr<KvCacheClient::Stats> stats = observer_->GetStats();
    EXPECT_OK(stats);
    return stats.ok() ? stats->open_sessions : 0;
  }

  // Polls until the daemon holds no session and no referenced block; false past the bound.
  bool AwaitAllReleased() {
    const absl::Time deadline = absl::Now() + kLeaseBound;
    while (OpenSessions() != 0 || PoolStats().counts.referenced != 0) {
      if (absl::Now() > deadline) return false;
      absl::SleepFor(absl::Milliseconds(20));
    }
    return true;
  }

  std::string bin_dir_;
  std::string dir_;
  std::string socket_path_;
  std::string target_;
  std::optional<Subprocess> daemon_;
  std::unique_ptr<KvCacheClient> observer_;
};

TEST_F(DaemonProcessTest, CommittedPrefixIsSharedAcrossProcessesOnTheSameBlocks) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  // 3 full blocks and a partial one.
  const std::string num_tokens = std::to_string(3 * kBlockSize + 8);
  const ClientResult a = RunClient({"compute-and-commit", "default", num_tokens, "1000"});
  ASSERT_EQ(a.block_ids.size(), 4u);
  EXPECT_EQ(a.num_cached_tokens, 0u);
  // A closed its session on exit: its committed blocks stay findable but unreferenced.
  EXPECT_EQ(OpenSessions(), 0u);
  EXPECT_EQ(PoolStats().counts.referenced, 0u);
  EXPECT_EQ(PoolStats().counts.evictable, 3u);

  const ClientResult b = RunClient({"open-and-report", "default", num_tokens, "1000"});
  EXPECT_NE(b.session_id, a.session_id);
  EXPECT_EQ(b.num_cached_tokens, 3 * kBlockSize);
  ASSERT_EQ(b.block_ids.size(), 4u);
  EXPECT_THAT(Prefix(b.block_ids, 3), ElementsAreArray(Prefix(a.block_ids, 3)));

  // A prompt of exactly the 3 cached blocks hits only 2: one token is always left to compute.
  const ClientResult c =
      RunClient({"open-and-report", "default", std::to_string(3 * kBlockSize), "1000"});
  EXPECT_EQ(c.num_cached_tokens, 2 * kBlockSize);
  EXPECT_THAT(Prefix(c.block_ids, 2), ElementsAreArray(Prefix(a.block_ids, 2)));

  // A different prompt hits nothing.
  const ClientResult d = RunClient({"open-and-report", "default", num_tokens, "7000"});
  EXPECT_EQ(d.num_cached_tokens, 0u);

  const KvCacheClient::PoolStats stats = PoolStats();
  EXPECT_EQ(stats.hit_blocks, 5u);
  EXPECT_EQ(stats.published_blocks, 3u);
  EXPECT_EQ(stats.counts.referenced, 0u);
  EXPECT_EQ(stats.counts.free + stats.counts.evictable, kPoolBlocks);
}

TEST_F(DaemonProcessTest, KilledClientsBlocksReturnWhenItsLeaseEnds) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  absl::StatusOr<Subprocess> client =
      StartClient({"hold-and-hang", "default", std::to_string(2 * kBlockSize + 8), "2000", "300"});
  ASSERT_OK(client);
  const ClientResult held = ReadResult(*client);
  ASSERT_EQ(held.block_ids.size(), 3u);
  EXPECT_EQ(OpenSessions(), 1u);
  EXPECT_EQ(PoolStats().counts.referenced, 3u);

  ASSERT_OK(client->Signal(SIGKILL));
  absl::StatusOr<int> status = client->Wait(kClientBound);
  ASSERT_OK(status);
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
  EXPECT_TRUE(AwaitAllReleased()) << "referenced=" << PoolStats().counts.referenced
                                  << " open_sessions=" << OpenSessions();
  EXPECT_EQ(PoolStats().open_sequences, 0u);
}

TEST_F(DaemonProcessTest, FrozenClientLosesItsLease) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  absl::StatusOr<Subprocess> client =
      StartClient({"hold-and-hang", "default", std::to_string(2 * kBlockSize), "3000", "300"});
  ASSERT_OK(client);
  ASSERT_EQ(ReadResult(*client).block_ids.size(), 2u);
  EXPECT_EQ(PoolStats().counts.referenced, 2u);

  // Alive but silent: no keep-alives while stopped.
  ASSERT_OK(client->Signal(SIGSTOP));
  EXPECT_TRUE(AwaitAllReleased()) << "referenced=" << PoolStats().counts.referenced
                                  << " open_sessions=" << OpenSessions();
  ASSERT_OK(client->Signal(SIGKILL));
  ASSERT_OK(client->Wait(kClientBound));
}

TEST_F(DaemonProcessTest, SigtermExitsZeroAndRemovesTheSocket) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  struct stat info;
  ASSERT_EQ(lstat(socket_path_.c_str(), &info), 0);
  EXPECT_TRUE(S_ISSOCK(info.st_mode));
  EXPECT_EQ(info.st_mode & 0777, 0600u) << "the socket must be owner-only";

  // A client holding a session does not keep the daemon from stopping.
  absl::StatusOr<Subprocess> client =
      StartClient({"hold-and-hang", "default", std::to_string(kBlockSize), "4000", "1000"});
  ASSERT_OK(client);
  ASSERT_EQ(ReadResult(*client).block_ids.size(), 1u);

  observer_.reset();
  ASSERT_NO_FATAL_FAILURE(StopDaemon());
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(socket_path_)))
      << socket_path_ << " was left behind";
}

}  // namespace
}  // namespace kvcache
