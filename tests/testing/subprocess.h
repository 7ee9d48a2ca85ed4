// Subprocess: a child process for integration tests, with its stdout on a pipe that the test
// reads line by line under a deadline. Every wait is bounded, so a hung child fails the test
// instead of hanging it. The destructor SIGKILLs and reaps a child still running, so a failed
// test leaves no process behind; and the child is tied to the test's thread
// (tests/testing/spawn_process.h), so a test killed by ctest's timeout leaves none either.
//
// Thread safety: thread-compatible (one test thread drives it).
#ifndef KVCACHE_TESTS_TESTING_SUBPROCESS_H_
#define KVCACHE_TESTS_TESTING_SUBPROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace kvcache::testing {

class Subprocess {
 public:
  // argv[0] is the program's path. stderr is inherited, so the child's errors land in the log.
  static absl::StatusOr<Subprocess> Start(const std::vector<std::string>& argv);

  Subprocess(Subprocess&& other) noexcept;
  Subprocess& operator=(Subprocess&& other) = delete;
  Subprocess(const Subprocess&) = delete;
  ~Subprocess();

  pid_t pid() const { return pid_; }

  // The next stdout line, without its newline. DEADLINE_EXCEEDED after `timeout`; OUT_OF_RANGE
  // at end of output.
  absl::StatusOr<std::string> ReadLine(absl::Duration timeout);
  // Reads lines until one starts with `prefix` and returns it (earlier lines are dropped).
  absl::StatusOr<std::string> ReadLineStartingWith(const std::string& prefix,
                                                   absl::Duration timeout);

  absl::Status Signal(int signal_number);
  // The raw wait status (use WIFEXITED & co.); DEADLINE_EXCEEDED if the child is still running.
  absl::StatusOr<int> Wait(absl::Duration timeout);

 private:
  Subprocess(pid_t pid, int stdout_fd) : pid_(pid), stdout_fd_(stdout_fd) {}

  pid_t pid_ = -1;  // -1 once reaped
  int stdout_fd_ = -1;
  std::string buffer_;  // read but not yet returned
};

// "exited 0", "killed by signal 9", ... for assertion messages.
std::string DescribeWaitStatus(int wait_status);

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_SUBPROCESS_H_
