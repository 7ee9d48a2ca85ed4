#include "tests/testing/spawn_process.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <thread>

#include "tests/testing/poll_until.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::PollUntil;
using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

TEST(SpawnTiedProcessTest, ChildWritesToTheGivenStdout) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  absl::StatusOr<pid_t> pid =
      SpawnTiedProcess({"/bin/echo", "spawned"}, SpawnOptions{.stdout_fd = pipe_fds[1]});
  close(pipe_fds[1]);
  ASSERT_OK(pid);
  std::string output(64, '\0');
  const ssize_t n = read(pipe_fds[0], output.data(), output.size());
  close(pipe_fds[0]);
  ASSERT_GT(n, 0);
  output.resize(n);
  EXPECT_EQ(output, "spawned\n");
  int status = 0;
  ASSERT_EQ(waitpid(*pid, &status, 0), *pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(SpawnTiedProcessTest, MissingProgramIsAnErrorNotAChild) {
  EXPECT_THAT(SpawnTiedProcess({"/nonexistent/kvcache-manager"}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("No such file")));
  EXPECT_THAT(SpawnTiedProcess({}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(waitpid(-1, nullptr, WNOHANG), -1) << "a failed start left a child to reap";
}

TEST(SpawnTiedProcessTest, ChildGetsTheSignalWhenTheSpawningThreadExits) {
  absl::StatusOr<pid_t> pid;
  std::thread spawner([&pid] { pid = SpawnTiedProcess({"/bin/sleep", "60"}); });
  spawner.join();
  ASSERT_OK(pid);
  int status = 0;
  EXPECT_TRUE(PollUntil([&] { return waitpid(*pid, &status, WNOHANG) == *pid; }))
      << "the child outlived the thread that started it";
  if (status == 0) {
    kill(*pid, SIGKILL);
    waitpid(*pid, &status, 0);
  }
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGTERM);
}

}  // namespace
}  // namespace kvcache
