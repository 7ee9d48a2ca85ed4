// Every binary's --help lists its own flags with their defaults: a new user's first contact. And
// every binary's --version says which release it is (project(VERSION) in CMakeLists.txt), where
// Abseil's default printed only "Debug build (NDEBUG not #defined)".
// (Abseil's default lists only flags of a file named after the program; ours are in *_main.cc,
// so --help used to print "No flags matched"; common/command_line.h.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"

namespace kvcache {
namespace {

using ::kvcache::testing::Subprocess;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// Everything `binary FLAG` prints on stdout, and checks it exits as Abseil's --help does.
std::string HelpOf(const std::string& binary, const std::string& flag = "--help") {
  const char* bin_dir = std::getenv("KVCACHE_BIN_DIR");
  EXPECT_NE(bin_dir, nullptr);
  if (bin_dir == nullptr) return "";
  absl::StatusOr<Subprocess> child = Subprocess::Start({std::string(bin_dir) + "/" + binary, flag});
  EXPECT_OK(child);
  if (!child.ok()) return "";
  std::string text;
  for (absl::StatusOr<std::string> line = child->ReadLine(absl::Seconds(30)); line.ok();
       line = child->ReadLine(absl::Seconds(30))) {
    text += *line + "\n";
  }
  absl::StatusOr<int> wait_status = child->Wait(absl::Seconds(30));
  EXPECT_OK(wait_status);
  if (wait_status.ok()) {
    EXPECT_TRUE(WIFEXITED(*wait_status)) << testing::DescribeWaitStatus(*wait_status);
  }
  return text;
}

TEST(HelpTest, ManagerListsItsFlagsWithDefaults) {
  EXPECT_THAT(HelpOf("kvcache-manager"),
              AllOf(HasSubstr("KV-cache manager daemon"), Not(HasSubstr("No flags matched")),
                    HasSubstr("-listen"), HasSubstr("-pool"), HasSubstr("-session_ttl"),
                    HasSubstr("default: 10s"), HasSubstr("-device"), HasSubstr("default: \"host\""),
                    HasSubstr("-insecure"), HasSubstr("-tier_key_file")));
}

TEST(HelpTest, ManagerRefusesANonPositiveClusterTierTimeout) {
  EXPECT_THAT(HelpOf("kvcache-manager"),
              AllOf(HasSubstr("-cluster_tier_timeout"), HasSubstr("default: 500ms"),
                    HasSubstr("-cluster_tier_retry_after")));
  const char* bin_dir = std::getenv("KVCACHE_BIN_DIR");
  ASSERT_NE(bin_dir, nullptr);
  absl::StatusOr<Subprocess> child =
      Subprocess::Start({std::string(bin_dir) + "/kvcache-manager",
                         "--cluster_tier=redis://127.0.0.1:9", "--cluster_tier_timeout=0s"});
  ASSERT_OK(child);
  absl::StatusOr<int> wait_status = child->Wait(absl::Seconds(30));
  ASSERT_OK(wait_status);
  EXPECT_TRUE(WIFEXITED(*wait_status) && WEXITSTATUS(*wait_status) == 2)
      << testing::DescribeWaitStatus(*wait_status);
}

TEST(HelpTest, WorkerListsItsFlagsWithDefaults) {
  EXPECT_THAT(HelpOf("kvcache-worker"),
              AllOf(Not(HasSubstr("No flags matched")), HasSubstr("-checkpoint"),
                    HasSubstr("-max_new_tokens"), HasSubstr("default: 16"), HasSubstr("-role"),
                    HasSubstr("-transport"), HasSubstr("default: \"stream\"")));
}

TEST(HelpTest, PrefillDecodeDriverListsItsFlagsWithDefaults) {
  EXPECT_THAT(HelpOf("kvcache-pd"),
              AllOf(Not(HasSubstr("No flags matched")), HasSubstr("-prefill_target"),
                    HasSubstr("-decode_target"), HasSubstr("-requests"), HasSubstr("default: 8"),
                    HasSubstr("-transport"), HasSubstr("default: \"shm\"")));
}

TEST(HelpTest, DemoListsItsFlagsWithDefaults) {
  EXPECT_THAT(HelpOf("kvcache-demo"),
              AllOf(Not(HasSubstr("No flags matched")), HasSubstr("-target"), HasSubstr("-pool"),
                    HasSubstr("default: \"default\"")));
}

// kvcachectl answers --help itself: its commands, exit codes and JSON conventions, then its
// flags, and exits 0 (Abseil's --help exits 1, which kvcachectl keeps for a daemon's error).
TEST(HelpTest, KvcachectlListsCommandsExitCodesAndFlags) {
  const std::string help = absl::StrJoin(
      absl::StrSplit(HelpOf("kvcachectl"), absl::ByAnyChar(" \n"), absl::SkipEmpty()), " ");
  EXPECT_THAT(help, AllOf(HasSubstr("usage: kvcachectl [flags] COMMAND"), HasSubstr("pools"),
                          HasSubstr("stats"), HasSubstr("sessions"), HasSubstr("lookup"),
                          HasSubstr("events"), HasSubstr("health"), HasSubstr("exit codes"),
                          HasSubstr("3 cannot reach the daemon"), HasSubstr("hex digits"),
                          HasSubstr("-target"), HasSubstr("-json"), HasSubstr("-timeout"),
                          HasSubstr("(default: 5s)"), HasSubstr("-follow"), HasSubstr("-from"),
                          HasSubstr("-epoch"), HasSubstr("-tokens_file"), HasSubstr("-service")));

  const char* bin_dir = std::getenv("KVCACHE_BIN_DIR");
  ASSERT_NE(bin_dir, nullptr);
  absl::StatusOr<Subprocess> child =
      Subprocess::Start({std::string(bin_dir) + "/kvcachectl", "--help"});
  ASSERT_OK(child);
  while (child->ReadLine(absl::Seconds(30)).ok()) {
  }
  absl::StatusOr<int> wait_status = child->Wait(absl::Seconds(30));
  ASSERT_OK(wait_status);
  EXPECT_TRUE(WIFEXITED(*wait_status) && WEXITSTATUS(*wait_status) == 0)
      << testing::DescribeWaitStatus(*wait_status);
}

// The clients' shared flags (client/client_flags.cc, listed as a *_flags.cc file) show in every
// tool's --help, and the tenant defaults to the caller's own.
TEST(HelpTest, ClientToolsListTheCredentialFlags) {
  for (const char* binary : {"kvcache-demo", "kvcache-worker", "kvcache-pd", "kvcachectl"}) {
    // One line, single spaces: --help wraps descriptions where their length says.
    const std::string help = absl::StrJoin(
        absl::StrSplit(HelpOf(binary), absl::ByAnyChar(" \n"), absl::SkipEmpty()), " ");
    EXPECT_THAT(
        help, AllOf(HasSubstr("-token_file"), HasSubstr("KVCACHE_TOKEN"), HasSubstr("-tls_ca"),
                    HasSubstr("-tls_cert"), HasSubstr("-tls_key"), HasSubstr("-tls_server_name"),
                    HasSubstr("-tenant"), HasSubstr("empty: the tenant of this caller's identity")))
        << binary;
  }
}

TEST(VersionTest, EveryBinaryPrintsItsNameAndTheProjectVersion) {
  for (const char* binary :
       {"kvcache-manager", "kvcache-worker", "kvcache-pd", "kvcache-demo", "kvcachectl"}) {
    const std::string version = HelpOf(binary, "--version");
    // "NAME 0.1.0", then " (REVISION)" when built in a git checkout.
    EXPECT_TRUE(absl::StartsWith(version, absl::StrCat(binary, " ", KVCACHE_PROJECT_VERSION)))
        << binary << ": " << version;
    EXPECT_EQ(std::count(version.begin(), version.end(), '\n'), 1) << version;
    EXPECT_THAT(version, Not(HasSubstr("build"))) << binary;
  }
}

}  // namespace
}  // namespace kvcache
