// RedisClusterProcess: a real Redis Cluster for tests (Debian redis-server 7.0): `masters`
// redis-server processes in cluster mode on free loopback ports, joined by
// `redis-cli --cluster create`, each with its nodes.conf in the test's directory, no persistence
// and cluster-require-full-coverage off (so a dead master costs only its own slots, which is
// how a cache cluster should run). Nodes can be killed and restarted on their port (they rejoin
// with their slots, empty). redis-cli runs any command against a node.
//
// Every wait is bounded; the processes die with the object (and with the test, see Subprocess).
//
// Thread safety: thread-compatible.
#ifndef KVCACHE_TESTS_TESTING_REDIS_CLUSTER_PROCESS_H_
#define KVCACHE_TESTS_TESTING_REDIS_CLUSTER_PROCESS_H_

#include <signal.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "tests/testing/subprocess.h"

namespace kvcache::testing {

// Runs a command to its end (bounded) and returns its stdout; INTERNAL if it exits non-zero.
absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv,
                                       absl::Duration timeout = absl::Seconds(30));

class RedisClusterProcess {
 public:
  // `extra_config`: more redis-server arguments for every node ("--requirepass", "x", ...).
  static absl::StatusOr<std::unique_ptr<RedisClusterProcess>> Start(
      const std::string& dir, int masters = 3, std::vector<std::string> extra_config = {});

  int size() const { return static_cast<int>(ports_.size()); }
  int port(int node) const { return ports_[node]; }
  std::string address(int node) const;  // "127.0.0.1:PORT"
  std::vector<std::string> addresses() const;

  // redis-cli -p PORT ARGS... (with the password given at Start, if any); its output.
  absl::StatusOr<std::string> Cli(int node, const std::vector<std::string>& args) const;
  // The node that serves `slot` (by CLUSTER SLOTS on node 0), and a node's id.
  absl::StatusOr<int> NodeOfSlot(int slot) const;
  absl::StatusOr<std::string> NodeId(int node) const;

  absl::Status Kill(int node);
  // SIGSTOP / SIGCONT: a node that stops answering without closing its connections.
  absl::Status Pause(int node) { return Signal(node, SIGSTOP); }
  absl::Status Resume(int node) { return Signal(node, SIGCONT); }
  // Starts a killed node again on its port; waits until every live node says cluster_state:ok.
  absl::Status Restart(int node);
  absl::Status AwaitClusterOk() const;

 private:
  RedisClusterProcess(std::string dir, std::vector<std::string> extra_config)
      : dir_(std::move(dir)), extra_config_(std::move(extra_config)) {}
  absl::Status StartNode(int node);
  absl::Status Signal(int node, int signal_number);

  std::string dir_;
  std::vector<std::string> extra_config_;
  std::string password_;
  std::vector<int> ports_;
  std::vector<std::optional<Subprocess>> processes_;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_REDIS_CLUSTER_PROCESS_H_
