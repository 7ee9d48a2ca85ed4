#include "tests/integration/daemon_process_fixture.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {

std::string ClientResult::Field(const std::string& key) const {
  auto it = fields.find(key);
  return it == fields.end() ? "" : it->second;
}

int64_t ClientResult::Number(const std::string& key) const {
  int64_t value = -1;
  return absl::SimpleAtoi(Field(key), &value) ? value : -1;
}

std::optional<ClientResult> ParseResult(absl::string_view line) {
  if (!absl::ConsumePrefix(&line, "result ")) return std::nullopt;
  ClientResult result;
  for (absl::string_view field : absl::StrSplit(line, ' ', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> kv = absl::StrSplit(field, '=');
    result.fields[std::string(kv.first)] = std::string(kv.second);
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

absl::StatusOr<Subprocess> StartManager(const std::string& bin_dir,
                                        const std::vector<std::string>& flags,
                                        absl::Duration bound) {
  std::vector<std::string> argv = {bin_dir + "/kvcache-manager"};
  argv.insert(argv.end(), flags.begin(), flags.end());
  ASSIGN_OR_RETURN(Subprocess daemon, Subprocess::Start(argv));
  RETURN_IF_ERROR(daemon.ReadLineStartingWith("kvcache-manager: listening on", bound).status());
  return daemon;
}

absl::Status StopManager(Subprocess& daemon, absl::Duration bound) {
  RETURN_IF_ERROR(daemon.Signal(SIGTERM));
  ASSIGN_OR_RETURN(const int status, daemon.Wait(bound));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    return absl::InternalError("kvcache-manager " + DescribeWaitStatus(status));
  }
  return absl::OkStatus();
}

void DaemonProcessTest::SetUp() {
  const char* bin_dir = std::getenv("KVCACHE_BIN_DIR");
  ASSERT_NE(bin_dir, nullptr) << "KVCACHE_BIN_DIR must name the folder of kvcache-manager";
  bin_dir_ = bin_dir;
  socket_path_ = dir_.File("kv.sock");
  target_ = "unix://" + socket_path_;
}

void DaemonProcessTest::TearDown() {
  observer_.reset();
  if (daemon_.has_value()) StopDaemon();
}

void DaemonProcessTest::StartDaemon() {
  std::vector<std::string> flags = {"--listen=" + target_, "--pool=" + pool_flag_,
                                    "--device=" + device_flag_, "--session_ttl=2s"};
  flags.insert(flags.end(), extra_daemon_flags_.begin(), extra_daemon_flags_.end());
  absl::StatusOr<Subprocess> daemon = StartManager(bin_dir_, flags, kStartBound);
  ASSERT_OK(daemon);
  daemon_.emplace(*std::move(daemon));
  absl::StatusOr<std::unique_ptr<KvCacheClient>> observer = KvCacheClient::Connect(target_);
  ASSERT_OK(observer);
  observer_ = *std::move(observer);
}

void DaemonProcessTest::StopDaemon() {
  EXPECT_OK(StopManager(*daemon_, kStartBound));
  daemon_.reset();
}

void DaemonProcessTest::KillAndRestartDaemon() {
  observer_.reset();
  ASSERT_OK(daemon_->Signal(SIGKILL));
  ASSERT_OK(daemon_->Wait(kStartBound));
  daemon_.reset();
  StartDaemon();
}

absl::StatusOr<Subprocess> DaemonProcessTest::StartClient(const std::vector<std::string>& args) {
  std::vector<std::string> argv = {bin_dir_ + "/kvcache-test-client", target_};
  argv.insert(argv.end(), args.begin(), args.end());
  return Subprocess::Start(argv);
}

ClientResult DaemonProcessTest::ReadResult(Subprocess& client) {
  absl::StatusOr<std::string> line = client.ReadLineStartingWith("result ", kClientBound);
  EXPECT_OK(line);
  if (!line.ok()) return {};
  std::optional<ClientResult> result = ParseResult(*line);
  EXPECT_TRUE(result.has_value()) << "unparsable: " << *line;
  return result.value_or(ClientResult{});
}

ClientResult DaemonProcessTest::RunClient(const std::vector<std::string>& args) {
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

KvCacheClient::PoolStats DaemonProcessTest::PoolStats() {
  absl::StatusOr<KvCacheClient::Stats> stats = observer_->GetStats(pool_name_);
  EXPECT_OK(stats);
  if (!stats.ok() || stats->pools.empty()) return {};
  return stats->pools[0];
}

KvCacheClient::TierStats DaemonProcessTest::PoolTier(absl::string_view name) {
  for (const KvCacheClient::TierStats& tier : PoolStats().tiers) {
    if (tier.tier == name) return tier;
  }
  ADD_FAILURE() << "no tier " << name << " in pool " << pool_name_;
  return {};
}

uint32_t DaemonProcessTest::OpenSessions() {
  absl::StatusOr<KvCacheClient::Stats> stats = observer_->GetStats();
  EXPECT_OK(stats);
  return stats.ok() ? stats->open_sessions : 0;
}

bool DaemonProcessTest::AwaitAllReleased() {
  const absl::Time deadline = absl::Now() + kLeaseBound;
  while (OpenSessions() != 0 || PoolStats().counts.referenced != 0) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Milliseconds(20));
  }
  return true;
}

}  // namespace kvcache::testing
