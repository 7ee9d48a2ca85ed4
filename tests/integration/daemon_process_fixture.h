// The fixture of the multi-process integration tests: kvcache-manager as a child process on a
// Unix socket in a temp dir, kvcache-test-client processes as its clients, and an observer
// client of the test's own (no session) that reads the daemon's stats.
//
// Every wait is bounded; conditions the daemon reaches asynchronously are polled for.
#ifndef KVCACHE_TESTS_INTEGRATION_DAEMON_PROCESS_FIXTURE_H_
#define KVCACHE_TESTS_INTEGRATION_DAEMON_PROCESS_FIXTURE_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/kv_cache_client.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/subprocess.h"

namespace kvcache::testing {

// One "result key=value ..." line of kvcache-test-client.
struct ClientResult {
  uint64_t session_id = 0;
  uint64_t sequence_id = 0;
  uint32_t num_cached_tokens = 0;
  std::vector<uint32_t> block_ids;
  std::map<std::string, std::string> fields;  // every key=value, the above included

  // The field's value, "" when absent.
  std::string Field(const std::string& key) const;
  // The field as a number; -1 when absent or not a number.
  int64_t Number(const std::string& key) const;
};

std::optional<ClientResult> ParseResult(absl::string_view line);

// The first `count` ids (all of them if fewer).
std::vector<uint32_t> Prefix(const std::vector<uint32_t>& ids, size_t count);

// kvcache-manager from `bin_dir` with `flags`, once it says it is listening (within
// `bound`). For tests that run more than one daemon; DaemonProcessTest runs one.
absl::StatusOr<Subprocess> StartManager(const std::string& bin_dir,
                                        const std::vector<std::string>& flags,
                                        absl::Duration bound);
// SIGTERM, then the daemon must exit 0 within `bound`: INTERNAL otherwise.
absl::Status StopManager(Subprocess& daemon, absl::Duration bound);

class DaemonProcessTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kBlockSize = 16;  // the daemon's default pool layout
  static constexpr uint32_t kPoolBlocks = 64;
  // Bounds, not expectations: generous so that a loaded machine does not fail the test.
  static constexpr absl::Duration kStartBound = absl::Seconds(20);
  static constexpr absl::Duration kClientBound = absl::Seconds(20);
  static constexpr absl::Duration kLeaseBound = absl::Seconds(15);

  void SetUp() override;
  void TearDown() override;

  // Starts kvcache-manager and the observer client.
  void StartDaemon();
  // SIGTERM, then the daemon must exit 0 within the bound.
  void StopDaemon();
  // SIGKILL (a crash: nothing flushed, no goodbye), then the same command line again.
  void KillAndRestartDaemon();

  absl::StatusOr<Subprocess> StartClient(const std::vector<std::string>& args);
  // Reads the client's result line; ClientResult{} (and a test failure) if there is none.
  ClientResult ReadResult(Subprocess& client);
  // Runs a client that exits by itself and expects exit status 0.
  ClientResult RunClient(const std::vector<std::string>& args);

  KvCacheClient::PoolStats PoolStats();
  // The pool's tier `name` ("host", "disk", "cluster"); a test failure if it has none.
  KvCacheClient::TierStats PoolTier(absl::string_view name);
  uint32_t OpenSessions();
  // Polls until the daemon holds no session and no referenced block; false past the bound.
  bool AwaitAllReleased();

  // The daemon's --pool flag and the pool the stats helpers read; a test may set both (and
  // device_flag_) before StartDaemon.
  std::string pool_flag_ = "default:blocks=" + std::to_string(kPoolBlocks);
  std::string pool_name_ = "default";
  // The daemon's --device flag: "host" (shm pools) or "cuda:N" (device pools over CUDA IPC).
  std::string device_flag_ = "host";
  // More kvcache-manager flags, set before StartDaemon.
  std::vector<std::string> extra_daemon_flags_;
  std::string bin_dir_;
  ScopedTempDir dir_{"kvcache_integration"};  // the socket, and the files a test makes
  std::string socket_path_;
  std::string target_;
  std::optional<Subprocess> daemon_;
  std::unique_ptr<KvCacheClient> observer_;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_INTEGRATION_DAEMON_PROCESS_FIXTURE_H_
