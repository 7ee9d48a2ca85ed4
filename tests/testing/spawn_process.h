// SpawnTiedProcess: starts a program as a child that the kernel stops when the thread that
// started it exits. The benches and the multi-process tests start kvcache-manager and
// redis-server this way, so a bench killed mid-run or a test killed by ctest's timeout leaves no
// daemon behind holding its shared-memory pools and sockets. posix_spawn has no such option.
#ifndef KVCACHE_TESTS_TESTING_SPAWN_PROCESS_H_
#define KVCACHE_TESTS_TESTING_SPAWN_PROCESS_H_

#include <sys/types.h>

#include <csignal>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace kvcache {

struct SpawnOptions {
  int stdout_fd = -1;  // the child's stdout; -1 inherits this process's
  int stderr_fd = -1;  // likewise
  // Sent to the child when the spawning thread exits. SIGTERM lets a daemon unlink its socket
  // and shared memory on the way out.
  int parent_death_signal = SIGTERM;
};

// Runs argv[0] (a path; no PATH search) with `argv`. INVALID_ARGUMENT for an empty argv;
// INTERNAL naming the program and errno when it cannot be started (not found, not executable).
absl::StatusOr<pid_t> SpawnTiedProcess(const std::vector<std::string>& argv,
                                       const SpawnOptions& options = {});

}  // namespace kvcache

#endif  // KVCACHE_TESTS_TESTING_SPAWN_PROCESS_H_
