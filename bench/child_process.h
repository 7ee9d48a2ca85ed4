// ChildProcess: a server the benchmarks start beside themselves (redis-server, kvcache-manager),
// so each side of a comparison runs as it is deployed: in its own process. Bench-only code.
#ifndef KVCACHE_BENCH_CHILD_PROCESS_H_
#define KVCACHE_BENCH_CHILD_PROCESS_H_

#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvcache::bench {

// The path of `name` in this benchmark's own folder (build/bin holds the daemon and the benches).
std::string SiblingBinary(const std::string& name);

class ChildProcess {
 public:
  // Starts argv[0] with `args`, its stdout and stderr appended to `log_path` (the tables stay
  // readable), and polls `ready` every 20 ms until it returns true (a connection accepted, say).
  // UNAVAILABLE, the child killed, when it does not within 10 s.
  static absl::StatusOr<ChildProcess> Start(std::vector<std::string> args,
                                            const std::function<bool()>& ready,
                                            const std::string& log_path);
  ChildProcess(ChildProcess&& other) noexcept : pid_(other.pid_) { other.pid_ = -1; }
  ChildProcess& operator=(ChildProcess&&) = delete;
  ChildProcess(const ChildProcess&) = delete;
  // SIGTERM, then waits for the child.
  ~ChildProcess();

 private:
  explicit ChildProcess(pid_t pid) : pid_(pid) {}
  pid_t pid_;
};

}  // namespace kvcache::bench

#endif  // KVCACHE_BENCH_CHILD_PROCESS_H_
