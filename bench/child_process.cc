#include "bench/child_process.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

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
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return absl::InternalError(absl::StrCat("cannot start ", args[0]));
  ChildProcess child(pid);
  const absl::Time give_up = absl::Now() + absl::Seconds(10);
  while (!ready()) {
    if (absl::Now() > give_up) {
      return absl::UnavailableError(absl::StrCat(args[0], " did not become ready in 10 s"));
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
