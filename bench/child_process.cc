#include "bench/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/testing/spawn_process.h"

namespace kvcache::bench {

std::string SiblingBinary(const std::string& name) {
  std::string self(4096, '\0');
  const ssize_t n = readlink("/proc/self/exe", self.data(), self.size() - 1);
  self.resize(n > 0 ? n : 0);
  return self.substr(0, self.rfind('/') + 1) + name;
}

absl::StatusOr<ChildProcess> ChildProcess::Start(std::vector<std::string> args,
                                                 const std::function<bool()>& ready,
                                                 const std::string& log_path) {
  const int log_fd = open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (log_fd < 0) return absl::InternalError(absl::StrCat("cannot open ", log_path));
  absl::StatusOr<pid_t> pid =
      SpawnTiedProcess(args, SpawnOptions{.stdout_fd = log_fd, .stderr_fd = log_fd});
  close(log_fd);
  if (!pid.ok()) return pid.status();
  ChildProcess child(*pid);
  // Generous: a daemon pre-faulting its pool on a loaded 2-core machine (CI, a build beside it)
  // takes seconds; this bounds a child that never starts, it times nothing.
  const absl::Time give_up = absl::Now() + absl::Seconds(60);
  while (!ready()) {
    if (absl::Now() > give_up) {
      return absl::UnavailableError(absl::StrCat(args[0], " did not become ready in 60 s"));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  return child;
}

ChildProcess::~ChildProcess() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  waitpid(pid_, nullptr, 0);
}

}  // namespace kvcache::bench
