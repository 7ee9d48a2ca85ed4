// InProcessDaemon: a Daemon started in this process on a Unix socket in a temp dir, and a client
// of it with an open session — for tests of code that talks to a daemon (the worker). Stop checks
// every pool's invariants. The test target links kvcache::server.
// Thread-safety: for one test thread.
#ifndef KVCACHE_TESTS_TESTING_IN_PROCESS_DAEMON_H_
#define KVCACHE_TESTS_TESTING_IN_PROCESS_DAEMON_H_

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "client/kv_cache_client.h"
#include "server/daemon.h"
#include "tests/testing/grpc_kept_alive.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {

class InProcessDaemon {
 public:
  // Starts the daemon with `pools` and opens the client's session as `client_name`; a test
  // failure on error (call under ASSERT_NO_FATAL_FAILURE).
  void Start(std::vector<PoolOptions> pools, const std::string& client_name) {
    KeepGrpcInitialized();
    DaemonOptions options;
    options.listen = "unix://" + dir_.File("kv.sock");
    options.pools = std::move(pools);
    absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options);
    ASSERT_OK(daemon);
    daemon_ = *std::move(daemon);
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(options.listen);
    ASSERT_OK(client);
    client_ = *std::move(client);
    ASSERT_OK(client_->OpenSession("", client_name));
  }

  // Drops the client, checks every pool's invariants and stops the daemon.
  void Stop() {
    client_.reset();
    if (daemon_ == nullptr) return;
    for (Pool* pool : daemon_->manager().pools()) EXPECT_OK(pool->CheckInvariants());
    daemon_.reset();
  }

  KvCacheClient* client() const { return client_.get(); }

 private:
  ScopedTempDir dir_{"kvcache_in_process_daemon"};  // for the socket
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<KvCacheClient> client_;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_IN_PROCESS_DAEMON_H_
