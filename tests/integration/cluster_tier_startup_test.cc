// kvcache-manager's start against a real 3-master Redis Cluster that wants a password: the
// start-up line says how many masters were reached and how many of the 16384 slots they cover
// (a warning when short); a wrong or missing password stops the start with a message naming the
// node and the error's class, never the password; a password file others can read is refused.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/redis_cluster_suite.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/spawn_process.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

constexpr char kPassword[] = "cluster-startup-right-password";
constexpr char kWrongPassword[] = "cluster-startup-wrong-password";
constexpr char kPool[] =
    "qwen:model=tiny:layers=3:kv_heads=2:head_dim=16:block_size=16:dtype=bf16:blocks=8";
constexpr absl::Duration kBound = absl::Seconds(20);

// How a daemon that was meant not to start ended: its exit code and all it wrote.
struct Ended {
  int exit_code = -1;  // -1: still running at the bound (killed), or killed by a signal
  std::string output;  // stdout and stderr
};

class ClusterTierStartupTest : public testing::RedisClusterSuite<> {
 protected:
  static void SetUpTestSuite() {
    StartRedisCluster(3, {"--requirepass", kPassword, "--masterauth", kPassword});
  }

  // A password file holding `password`, with `mode`.
  std::string PasswordFile(const std::string& password, mode_t mode) {
    const std::string path = dir_.File("redis-password");
    std::ofstream(path) << password << "\n";
    EXPECT_EQ(chmod(path.c_str(), mode), 0);
    return path;
  }

  std::vector<std::string> Flags(const std::string& password_file) {
    std::vector<std::string> flags = {
        "--listen=unix://" + dir_.File("kv.sock"), std::string("--pool=") + kPool,
        "--cluster_tier=redis://" + absl::StrJoin(redis_->addresses(), ",redis://")};
    if (!password_file.empty()) flags.push_back("--cluster_tier_password_file=" + password_file);
    return flags;
  }

  // kvcache-manager with `flags`, its stdout and stderr both into Logged().
  absl::StatusOr<pid_t> SpawnManager(const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {std::string(std::getenv("KVCACHE_BIN_DIR")) +
                                     "/kvcache-manager"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    const int fd = open(Log().c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return absl::InternalError("cannot create " + Log());
    absl::StatusOr<pid_t> pid =
        SpawnTiedProcess(argv, SpawnOptions{.stdout_fd = fd, .stderr_fd = fd});
    close(fd);
    return pid;
  }
  std::string Log() const { return dir_.File("manager.log"); }
  std::string Logged() const {
    std::ifstream in(Log());
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }

  // Runs kvcache-manager with `flags` to its exit, within the bound (killed past it).
  Ended RunToExit(const std::vector<std::string>& flags) {
    absl::StatusOr<pid_t> pid = SpawnManager(flags);
    EXPECT_OK(pid);
    Ended ended;
    if (!pid.ok()) return ended;
    int status = 0;
    const absl::Time deadline = absl::Now() + kBound;
    while (waitpid(*pid, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(*pid, SIGKILL);
        waitpid(*pid, &status, 0);
        ADD_FAILURE() << "kvcache-manager still running after " << kBound;
        break;
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    if (WIFEXITED(status)) ended.exit_code = WEXITSTATUS(status);
    ended.output = Logged();
    return ended;
  }

  ScopedTempDir dir_{"kvcache-cluster-startup-daemon"};
};

TEST_F(ClusterTierStartupTest, SaysEveryMasterReachedAndEverySlotCovered) {
  absl::StatusOr<Subprocess> daemon =
      StartManager(std::getenv("KVCACHE_BIN_DIR"), Flags(PasswordFile(kPassword, 0600)), kBound);
  ASSERT_OK(daemon);
  absl::StatusOr<std::string> line = daemon->ReadLineStartingWith("  cluster tier:", kBound);
  ASSERT_OK(line);
  EXPECT_EQ(*line, "  cluster tier: 3 of 3 masters reached, 16384 of 16384 slots covered");
  EXPECT_OK(StopManager(*daemon, kBound));
}

// A master down is no reason not to start (its slots are misses), but the line says so.
TEST_F(ClusterTierStartupTest, AMasterDownIsAWarningWithTheSlotsCovered) {
  ASSERT_OK(redis_->Kill(1));
  absl::StatusOr<Subprocess> daemon =
      StartManager(std::getenv("KVCACHE_BIN_DIR"), Flags(PasswordFile(kPassword, 0400)), kBound);
  ASSERT_OK(daemon);
  absl::StatusOr<std::string> line =
      daemon->ReadLineStartingWith("  WARNING: cluster tier:", kBound);
  ASSERT_OK(line);
  EXPECT_THAT(*line, AllOf(StartsWith("  WARNING: cluster tier: 2 of 3 masters reached, "),
                           Not(HasSubstr("16384 of 16384")), HasSubstr(redis_->address(1)),
                           HasSubstr("misses")));
  EXPECT_OK(StopManager(*daemon, kBound));
  ASSERT_OK(redis_->Restart(1));
}

TEST_F(ClusterTierStartupTest, AWrongPasswordStopsTheStartNamingTheNodeNeverThePassword) {
  const Ended ended = RunToExit(Flags(PasswordFile(kWrongPassword, 0600)));
  EXPECT_EQ(ended.exit_code, 1) << ended.output;
  EXPECT_THAT(ended.output,
              AllOf(HasSubstr("kvcache-manager: --cluster_tier: Redis refused the credentials"),
                    HasSubstr(absl::StrCat("Redis node ", redis_->address(0),
                                           ": refused the configured credentials (WRONGPASS)")),
                    HasSubstr("check --cluster_tier_password_file"), Not(HasSubstr(kWrongPassword)),
                    Not(HasSubstr(kPassword)), Not(HasSubstr("listening on"))));
}

TEST_F(ClusterTierStartupTest, NoPasswordWhereOneIsWantedStopsTheStart) {
  const Ended ended = RunToExit(Flags(""));
  EXPECT_EQ(ended.exit_code, 1) << ended.output;
  EXPECT_THAT(ended.output, AllOf(HasSubstr("wants a password and none is configured (NOAUTH)"),
                                  Not(HasSubstr("listening on"))));
}

TEST_F(ClusterTierStartupTest, APasswordFileOthersCanReadIsRefused) {
  const std::string path = PasswordFile(kPassword, 0644);
  const Ended ended = RunToExit(Flags(path));
  EXPECT_EQ(ended.exit_code, 2) << ended.output;
  EXPECT_THAT(ended.output,
              AllOf(HasSubstr(absl::StrCat("kvcache-manager: --cluster_tier_password_file: ", path,
                                           " is open to others (mode 0644)")),
                    Not(HasSubstr(kPassword))));
}

// The password changed in Redis after the daemon started (rotated there first): the first
// request that reaches the cluster is refused on every node, and each node's refusal is logged
// once on stderr, naming the node, however often the daemon tries again (here at every request:
// no rest), and never the password.
TEST_F(ClusterTierStartupTest, APasswordRefusedLaterIsLoggedOncePerNode) {
  std::vector<std::string> flags = Flags(PasswordFile(kPassword, 0600));
  flags.push_back("--cluster_tier_retry_after=0s");
  absl::StatusOr<pid_t> pid = SpawnManager(flags);
  ASSERT_OK(pid);
  ASSERT_TRUE(PollUntil([&] { return absl::StrContains(Logged(), "listening on"); })) << Logged();
  for (int node = 0; node < redis_->size(); ++node) {
    ASSERT_OK(redis_->Cli(node, {"CONFIG", "SET", "requirepass", kWrongPassword}));
  }
  for (int request = 0; request < 3; ++request) {
    absl::StatusOr<std::string> report =
        RunCommand({std::string(std::getenv("KVCACHE_BIN_DIR")) + "/kvcache-test-client",
                    "unix://" + dir_.File("kv.sock"), "open-and-report", "qwen", "40",
                    absl::StrCat(1000 * (request + 1))});
    EXPECT_OK(report);
    EXPECT_THAT(report.value_or(""), HasSubstr("cached=0"));
  }
  kill(*pid, SIGTERM);
  int status = 0;
  waitpid(*pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << DescribeWaitStatus(status);
  for (int node = 0; node < redis_->size(); ++node) {
    ASSERT_OK(RunCommand({"/usr/bin/redis-cli", "-p", absl::StrCat(redis_->port(node)),
                          "--no-auth-warning", "-a", kWrongPassword, "CONFIG", "SET", "requirepass",
                          kPassword}));
  }
  const std::string output = Logged();
  for (int node = 0; node < redis_->size(); ++node) {
    const std::string line =
        absl::StrCat("kvcache-manager: cluster tier: Redis node ", redis_->address(node),
                     " refused the configured credentials (WRONGPASS); check "
                     "--cluster_tier_password_file\n");
    size_t count = 0;
    for (size_t at = output.find(line); at != std::string::npos; at = output.find(line, at + 1)) {
      ++count;
    }
    EXPECT_EQ(count, 1u) << output;
  }
  EXPECT_THAT(output, AllOf(Not(HasSubstr(kPassword)), Not(HasSubstr(kWrongPassword))));
}

}  // namespace
}  // namespace kvcache::testing
