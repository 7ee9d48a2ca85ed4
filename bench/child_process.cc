#include "bench/child_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace kvcache::bench {

absl::StatusOr<ChildProcess> ChildProcess::Start(std::vector<std::string> args,
                                                 const std::function<bool()>& ready) {
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) {
    return absl::InternalError(absl::StrCat("cannot start ", args[0]));
  }
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
