// kvcache-manager with --tier_key_file (issue 33): a key file missing, unreadable, open to others
// or malformed stops the start with the reason; the start-up line says which tiers are sealed;
// KV written through the pool comes back from the sealed disk tier after a kill -9, and a byte
// changed there is a miss GetStats counts for the tenant; a restart with another master key
// serves nothing from disk and says so once; SIGHUP rereads the file, and
// new records are sealed with the new key while the old ones still load.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/spawn_process.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kKey1[] = "1:6b65792d6f6e652d6f662d7468652d7365616c65642d74696572732d74657374";
constexpr char kKey1Hex[] = "6b65792d6f6e652d6f662d7468652d7365616c65642d74696572732d74657374";
constexpr char kOtherKey1[] = "1:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
constexpr char kKey2[] = "2:fedcba9876543210fedcba9876543210fedcba9876543210fedcba9876543210";
// The default layout's 32 KiB blocks: a slot is a 4 KiB head page and the block.
constexpr uint64_t kSlotBytes = 4096 + (32 << 10);

class SealedTiersProcessTest : public DaemonProcessTest {
 protected:
  void SetUp() override {
    DaemonProcessTest::SetUp();
    pool_flag_ = "default:blocks=16:host_tier=256KiB:disk_tier=" + DiskPath() + ":4MiB";
    extra_daemon_flags_ = {"--tier_key_file=" + KeyPath()};
  }

  std::string DiskPath() const { return dir_.File("default.tier"); }
  std::string KeyPath() const { return dir_.File("tier.key"); }

  void WriteKeyFile(const std::string& text, mode_t mode = 0600) {
    std::ofstream(KeyPath()) << text;
    ASSERT_EQ(chmod(KeyPath().c_str(), mode), 0);
  }

  // The daemon's start-up lines after "listening on" (StartDaemon read that one), up to the
  // first quiet moment.
  std::vector<std::string> StartupLines() { return LinesFor(absl::Seconds(1)); }
  std::vector<std::string> LinesFor(absl::Duration quiet) {
    std::vector<std::string> lines;
    for (absl::StatusOr<std::string> line = daemon_->ReadLine(quiet); line.ok();
         line = daemon_->ReadLine(quiet)) {
      lines.push_back(*line);
    }
    return lines;
  }

  // kvcache-manager with this fixture's flags to its exit (a start that fails): its exit code
  // and everything it wrote.
  std::pair<int, std::string> RunToExit() {
    std::vector<std::string> argv = {bin_dir_ + "/kvcache-manager", "--listen=" + target_,
                                     "--pool=" + pool_flag_};
    argv.insert(argv.end(), extra_daemon_flags_.begin(), extra_daemon_flags_.end());
    const std::string log = dir_.File("manager.log");
    const int fd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    EXPECT_GE(fd, 0);
    absl::StatusOr<pid_t> pid =
        SpawnTiedProcess(argv, SpawnOptions{.stdout_fd = fd, .stderr_fd = fd});
    close(fd);
    EXPECT_OK(pid);
    if (!pid.ok()) return {-1, ""};
    int status = 0;
    const absl::Time deadline = absl::Now() + kStartBound;
    while (waitpid(*pid, &status, WNOHANG) == 0) {
      if (absl::Now() > deadline) {
        kill(*pid, SIGKILL);
        waitpid(*pid, &status, 0);
        ADD_FAILURE() << "kvcache-manager still running";
        return {-1, ""};
      }
      absl::SleepFor(absl::Milliseconds(20));
    }
    std::ifstream in(log);
    std::stringstream text;
    text << in.rdbuf();
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, text.str()};
  }

  // A 98-token prompt (6 full blocks) written through the pool, then fillers until the disk
  // tier holds at least `records` records.
  void WriteAndPushToDisk(const std::string& first_token, uint64_t records) {
    const ClientResult written = RunClient({"write-kv", "default", "98", first_token});
    ASSERT_EQ(written.Number("written"), 98);
    for (int filler = 0; filler < 4 && PoolTier("disk").stored_blocks < records; ++filler) {
      RunClient(
          {"write-kv", "default", std::to_string(16 * 11), std::to_string(50000 + 1000 * filler)});
      PollUntil([&] { return PoolTier("disk").stored_blocks >= records; });
    }
    ASSERT_GE(PoolTier("disk").stored_blocks, records);
  }

  // Flips the first KV byte of the disk file's slots [0, count).
  void FlipKvBytes(uint64_t count) {
    const int fd = open(DiskPath().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    for (uint64_t slot = 0; slot < count; ++slot) {
      char byte = 0;
      const off_t offset = static_cast<off_t>(slot * kSlotBytes + 4096);
      ASSERT_EQ(pread(fd, &byte, 1, offset), 1);
      byte ^= 0x01;
      ASSERT_EQ(pwrite(fd, &byte, 1, offset), 1);
    }
    close(fd);
  }

  // The key ids of the disk file's written slots (tiers/record_seal.h: bytes 8-11 of a head).
  std::multiset<uint32_t> KeyIdsOnDisk() {
    std::ifstream in(DiskPath(), std::ios::binary);
    std::stringstream bytes_in;
    bytes_in << in.rdbuf();
    const std::string bytes = bytes_in.str();
    std::multiset<uint32_t> ids;
    for (uint64_t at = 0; at + kSlotBytes <= bytes.size(); at += kSlotBytes) {
      if (bytes.compare(at, 7, "KVCSEAL") != 0) continue;
      uint32_t id = 0;
      for (int b = 0; b < 4; ++b)
        id |= uint32_t{static_cast<unsigned char>(bytes[at + 8 + b])} << (8 * b);
      ids.insert(id);
    }
    return ids;
  }
};

TEST_F(SealedTiersProcessTest, AKeyFileMissingUnreadableOpenToOthersOrMalformedStopsTheStart) {
  // Missing.
  auto [code, output] = RunToExit();
  EXPECT_EQ(code, 2);
  EXPECT_THAT(output, AllOf(HasSubstr("--tier_key_file"), HasSubstr("tier.key"),
                            HasSubstr("No such file")));
  // Open to others.
  WriteKeyFile(absl::StrCat(kKey1, "\n"), 0644);
  std::tie(code, output) = RunToExit();
  EXPECT_EQ(code, 2);
  EXPECT_THAT(output, AllOf(HasSubstr("tier.key is open to others"), HasSubstr("chmod 600"),
                            Not(HasSubstr(kKey1Hex))));
  // Unreadable (root reads any file: a directory stands in).
  extra_daemon_flags_ = {"--tier_key_file=" + dir_.path()};
  std::tie(code, output) = RunToExit();
  EXPECT_EQ(code, 2);
  EXPECT_THAT(output, HasSubstr("not a regular file"));
  // Malformed, the key never echoed.
  extra_daemon_flags_ = {"--tier_key_file=" + KeyPath()};
  WriteKeyFile(absl::StrCat(kKey1, "0\n"));
  std::tie(code, output) = RunToExit();
  EXPECT_EQ(code, 2);
  EXPECT_THAT(output, AllOf(HasSubstr("line 1"), Not(HasSubstr(kKey1Hex))));
}

TEST_F(SealedTiersProcessTest, SealedDiskKvSurvivesAKillAndAnotherKeyServesNothingSayingSoOnce) {
  WriteKeyFile(absl::StrCat(kKey1, "\n"));
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::vector<std::string> startup = StartupLines();
  EXPECT_THAT(startup, ::testing::Contains(AllOf(
                           HasSubstr("sealed (AES-256-GCM, a key per tenant): disk tier of pool "
                                     "'default'"),
                           HasSubstr("sealing with key 1 (1 key)"), Not(HasSubstr(kKey1Hex)))));
  WriteAndPushToDisk("1000", 6);
  const uint64_t stored = PoolTier("disk").stored_blocks;
  EXPECT_EQ(KeyIdsOnDisk().count(1), stored);

  // kill -9 and the same key file: the prompt comes back from disk, byte for byte.
  KillAndRestartDaemon();
  LinesFor(absl::Seconds(1));
  EXPECT_EQ(PoolTier("disk").restored_records, stored);
  EXPECT_EQ(PoolTier("disk").restore_skipped, 0u);
  const ClientResult restored = RunClient({"read-kv", "default", "98", "1000"});
  EXPECT_EQ(restored.num_cached_tokens, 96u);
  EXPECT_EQ(restored.Number("mismatched_blocks"), 0);
  EXPECT_GE(PoolTier("disk").hit_blocks, 1u);
  EXPECT_EQ(PoolTier("disk").open_failures, 0u);

  // A byte changed in every record's KV: the prompt's six records, read in one batch, do not
  // open, misses GetStats counts for the tenant; the prompt is computed again, never served.
  KillAndRestartDaemon();
  LinesFor(absl::Seconds(1));
  FlipKvBytes(stored);
  const ClientResult changed = RunClient({"read-kv", "default", "98", "1000"});
  EXPECT_EQ(changed.num_cached_tokens, 0u);
  EXPECT_EQ(PoolTier("disk").open_failures, 6u);
  EXPECT_EQ(PoolTier("disk").hit_blocks, 0u);

  // Another master key under the same id: nothing from disk, said once at the start.
  observer_.reset();
  ASSERT_OK(daemon_->Signal(SIGKILL));
  ASSERT_OK(daemon_->Wait(kStartBound));
  WriteKeyFile(absl::StrCat(kOtherKey1, "\n"));
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  std::vector<std::string> lines = StartupLines();
  EXPECT_EQ(PoolTier("disk").restored_records, 0u);
  EXPECT_GE(PoolTier("disk").restore_skipped, stored);
  const ClientResult nothing = RunClient({"read-kv", "default", "98", "1000"});
  EXPECT_EQ(nothing.num_cached_tokens, 0u);
  const std::vector<std::string> later = LinesFor(absl::Milliseconds(300));
  lines.insert(lines.end(), later.begin(), later.end());
  int warnings = 0;
  for (const std::string& line : lines) {
    warnings += absl::StrContains(line, "sealed records do not open with --tier_key_file");
  }
  EXPECT_EQ(warnings, 1) << absl::StrJoin(lines, "\n");
}

TEST_F(SealedTiersProcessTest, SighupRotatesTheKeysOldRecordsStillLoad) {
  WriteKeyFile(absl::StrCat(kKey1, "\n"));
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  StartupLines();
  WriteAndPushToDisk("1000", 6);
  const uint64_t old_records = PoolTier("disk").stored_blocks;

  WriteKeyFile(absl::StrCat(kKey2, "\n", kKey1, "\n"));
  ASSERT_OK(daemon_->Signal(SIGHUP));
  absl::StatusOr<std::string> reloaded =
      daemon_->ReadLineStartingWith("kvcache-manager: reloaded " + KeyPath(), kStartBound);
  ASSERT_OK(reloaded);
  EXPECT_THAT(*reloaded, AllOf(HasSubstr("sealing with key 2 (2 keys)"), Not(HasSubstr("fedcba"))));
  WriteAndPushToDisk("2000", old_records + 6);
  const std::multiset<uint32_t> ids = KeyIdsOnDisk();
  EXPECT_GE(ids.count(2), 1u);
  EXPECT_GE(ids.count(1), 1u);

  // A file others may read is refused on SIGHUP too; the keys stay.
  WriteKeyFile(absl::StrCat(kKey2, "\n"), 0644);
  ASSERT_OK(daemon_->Signal(SIGHUP));
  absl::StatusOr<std::string> refused =
      daemon_->ReadLineStartingWith("kvcache-manager: SIGHUP: --tier_key_file", kStartBound);
  ASSERT_OK(refused);
  EXPECT_THAT(*refused, AllOf(HasSubstr("open to others"), HasSubstr("previous tier keys stay")));

  // Restarted with both keys: the first prompt (sealed with key 1) still loads.
  WriteKeyFile(absl::StrCat(kKey2, "\n", kKey1, "\n"));
  KillAndRestartDaemon();
  EXPECT_EQ(PoolTier("disk").restore_skipped, 0u);
  const ClientResult first = RunClient({"read-kv", "default", "98", "1000"});
  EXPECT_EQ(first.num_cached_tokens, 96u);
  EXPECT_EQ(first.Number("mismatched_blocks"), 0);
}

TEST_F(SealedTiersProcessTest, WithoutAKeyFileTheStartupLineSaysTheTiersAreUnsealed) {
  extra_daemon_flags_.clear();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  EXPECT_THAT(StartupLines(),
              ::testing::Contains(AllOf(HasSubstr("unsealed: disk tier of pool 'default'"),
                                        HasSubstr("--tier_key_file"))));
}

}  // namespace
}  // namespace kvcache::testing
