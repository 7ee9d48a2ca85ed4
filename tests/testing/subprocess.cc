#include "tests/testing/subprocess.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/spawn_process.h"

namespace kvcache::testing {

absl::StatusOr<Subprocess> Subprocess::Start(const std::vector<std::string>& argv) {
  int pipe_fds[2];
  // Close-on-exec, so no other child inherits this pipe and keeps it open past our child's exit.
  if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
    return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(errno)));
  }
  absl::StatusOr<pid_t> pid = SpawnTiedProcess(argv, SpawnOptions{.stdout_fd = pipe_fds[1]});
  close(pipe_fds[1]);
  if (!pid.ok()) {
    close(pipe_fds[0]);
    return pid.status();
  }
  return Subprocess(*pid, pipe_fds[0]);
}

Subprocess::Subprocess(Subprocess&& other) noexcept
    : pid_(other.pid_), stdout_fd_(other.stdout_fd_), buffer_(std::move(other.buffer_)) {
  other.pid_ = -1;
  other.stdout_fd_ = -1;
}

Subprocess::~Subprocess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  if (stdout_fd_ >= 0) close(stdout_fd_);
}

absl::StatusOr<std::string> Subprocess::ReadLine(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    const size_t newline = buffer_.find('\n');
    if (newline != std::string::npos) {
      std::string line = buffer_.substr(0, newline);
      buffer_.erase(0, newline + 1);
      return line;
    }
    const absl::Duration left = deadline - absl::Now();
    if (left <= absl::ZeroDuration()) {
      return absl::DeadlineExceededError(absl::StrCat("no complete line from pid ", pid_,
                                                      " within ", absl::FormatDuration(timeout),
                                                      "; partial output: '", buffer_, "'"));
    }
    pollfd poll_fd{.fd = stdout_fd_, .events = POLLIN, .revents = 0};
    const int ready = poll(&poll_fd, 1, static_cast<int>(absl::ToInt64Milliseconds(left)) + 1);
    if (ready < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("poll: ", std::strerror(errno)));
    }
    if (ready <= 0) continue;
    char chunk[4096];
    const ssize_t n = read(stdout_fd_, chunk, sizeof(chunk));
    if (n < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("read: ", std::strerror(errno)));
    }
    if (n == 0) {
      return absl::OutOfRangeError(
          absl::StrCat("pid ", pid_, " closed its output; partial output: '", buffer_, "'"));
    }
    if (n > 0) buffer_.append(chunk, static_cast<size_t>(n));
  }
}

absl::StatusOr<std::string> Subprocess::ReadLineStartingWith(const std::string& prefix,
                                                             absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    absl::StatusOr<std::string> line = ReadLine(deadline - absl::Now());
    if (!line.ok() || absl::StartsWith(*line, prefix)) return line;
  }
}

absl::Status Subprocess::Signal(int signal_number) {
  if (pid_ <= 0) return absl::FailedPreconditionError("the process has been reaped");
  if (kill(pid_, signal_number) != 0) {
    return absl::InternalError(absl::StrCat("kill: ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Subprocess::Wait(absl::Duration timeout) {
  if (pid_ <= 0) return absl::FailedPreconditionError("the process has been reaped");
  const absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status = 0;
    const pid_t done = waitpid(pid_, &status, WNOHANG);
    if (done == pid_) {
      pid_ = -1;
      return status;
    }
    if (done < 0 && errno != EINTR) {
      return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
    }
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid_, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(5));
  }
}

std::string DescribeWaitStatus(int wait_status) {
  if (WIFEXITED(wait_status)) return absl::StrCat("exited ", WEXITSTATUS(wait_status));
  if (WIFSIGNALED(wait_status)) return absl::StrCat("killed by signal ", WTERMSIG(wait_status));
  return absl::StrCat("wait status ", wait_status);
}

}  // namespace kvcache::testing
