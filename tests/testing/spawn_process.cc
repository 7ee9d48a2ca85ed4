#include "tests/testing/spawn_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

// In the forked child of a possibly multithreaded parent: async-signal-safe calls only. Reports
// errno on `error_fd` and exits when the program cannot be started.
[[noreturn]] void ExecChild(char* const* argv, const SpawnOptions& options, pid_t parent,
                            int error_fd) {
  int error = 0;
  if (prctl(PR_SET_PDEATHSIG, options.parent_death_signal) != 0) {
    error = errno;
  } else if (getppid() != parent) {
    error = ESRCH;  // the parent died before the signal was armed
  } else if (options.stdout_fd >= 0 && dup2(options.stdout_fd, STDOUT_FILENO) < 0) {
    error = errno;
  } else if (options.stderr_fd >= 0 && dup2(options.stderr_fd, STDERR_FILENO) < 0) {
    error = errno;
  } else {
    execv(argv[0], argv);
    error = errno;
  }
  (void)!write(error_fd, &error, sizeof(error));
  _exit(127);
}

}  // namespace

absl::StatusOr<pid_t> SpawnTiedProcess(const std::vector<std::string>& argv,
                                       const SpawnOptions& options) {
  if (argv.empty()) return absl::InvalidArgumentError("SpawnTiedProcess: empty argv");
  std::vector<char*> args;
  for (const std::string& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  // The child writes errno here if exec fails; a successful exec closes it (close-on-exec), so
  // the read below returns 0 bytes once the program runs.
  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) ExecChild(args.data(), options, parent, error_pipe[1]);
  const int fork_errno = errno;
  close(error_pipe[1]);
  if (pid < 0) {
    close(error_pipe[0]);
    return absl::InternalError(absl::StrCat("fork for ", argv[0], ": ", std::strerror(fork_errno)));
  }
  int child_error = 0;
  ssize_t n;
  do {
    n = read(error_pipe[0], &child_error, sizeof(child_error));
  } while (n < 0 && errno == EINTR);
  close(error_pipe[0]);
  if (n > 0) {
    waitpid(pid, nullptr, 0);
    return absl::InternalError(
        absl::StrCat("cannot start ", argv[0], ": ", std::strerror(child_error)));
  }
  return pid;
}

}  // namespace kvcache
