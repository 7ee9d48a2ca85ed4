// End to end across real processes (tests/integration/daemon_process_fixture.h): a committed
// prefix is shared across processes on the same physical blocks, a killed or frozen client's
// blocks come back once its lease runs out, and SIGTERM stops the daemon cleanly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include <filesystem>
#include <string>

#include "tests/integration/daemon_process_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::ClientResult;
using ::kvcache::testing::DaemonProcessTest;
using ::kvcache::testing::Prefix;
using ::kvcache::testing::Subprocess;
using ::testing::ElementsAreArray;

TEST_F(DaemonProcessTest, CommittedPrefixIsSharedAcrossProcessesOnTheSameBlocks) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  // 3 full blocks and a partial one.
  const std::string num_tokens = std::to_string(3 * kBlockSize + 8);
  const ClientResult a = RunClient({"compute-and-commit", "default", num_tokens, "1000"});
  ASSERT_EQ(a.block_ids.size(), 4u);
  EXPECT_EQ(a.num_cached_tokens, 0u);
  // A closed its session on exit: its committed blocks stay findable but unreferenced.
  EXPECT_EQ(OpenSessions(), 0u);
  EXPECT_EQ(PoolStats().counts.referenced, 0u);
  EXPECT_EQ(PoolStats().counts.evictable, 3u);

  const ClientResult b = RunClient({"open-and-report", "default", num_tokens, "1000"});
  EXPECT_NE(b.session_id, a.session_id);
  EXPECT_EQ(b.num_cached_tokens, 3 * kBlockSize);
  ASSERT_EQ(b.block_ids.size(), 4u);
  EXPECT_THAT(Prefix(b.block_ids, 3), ElementsAreArray(Prefix(a.block_ids, 3)));

  // A prompt of exactly the 3 cached blocks hits only 2: one token is always left to compute.
  const ClientResult c =
      RunClient({"open-and-report", "default", std::to_string(3 * kBlockSize), "1000"});
  EXPECT_EQ(c.num_cached_tokens, 2 * kBlockSize);
  EXPECT_THAT(Prefix(c.block_ids, 2), ElementsAreArray(Prefix(a.block_ids, 2)));

  // A different prompt hits nothing.
  const ClientResult d = RunClient({"open-and-report", "default", num_tokens, "7000"});
  EXPECT_EQ(d.num_cached_tokens, 0u);

  const KvCacheClient::PoolStats stats = PoolStats();
  EXPECT_EQ(stats.hit_blocks, 5u);
  EXPECT_EQ(stats.published_blocks, 3u);
  EXPECT_EQ(stats.counts.referenced, 0u);
  EXPECT_EQ(stats.counts.free + stats.counts.evictable, kPoolBlocks);
}

TEST_F(DaemonProcessTest, KilledClientsBlocksReturnWhenItsLeaseEnds) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  absl::StatusOr<Subprocess> client =
      StartClient({"hold-and-hang", "default", std::to_string(2 * kBlockSize + 8), "2000", "300"});
  ASSERT_OK(client);
  const ClientResult held = ReadResult(*client);
  ASSERT_EQ(held.block_ids.size(), 3u);
  EXPECT_EQ(OpenSessions(), 1u);
  EXPECT_EQ(PoolStats().counts.referenced, 3u);

  ASSERT_OK(client->Signal(SIGKILL));
  absl::StatusOr<int> status = client->Wait(kClientBound);
  ASSERT_OK(status);
  EXPECT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
  EXPECT_TRUE(AwaitAllReleased()) << "referenced=" << PoolStats().counts.referenced
                                  << " open_sessions=" << OpenSessions();
  EXPECT_EQ(PoolStats().open_sequences, 0u);
}

TEST_F(DaemonProcessTest, FrozenClientLosesItsLease) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  absl::StatusOr<Subprocess> client =
      StartClient({"hold-and-hang", "default", std::to_string(2 * kBlockSize), "3000", "300"});
  ASSERT_OK(client);
  ASSERT_EQ(ReadResult(*client).block_ids.size(), 2u);
  EXPECT_EQ(PoolStats().counts.referenced, 2u);

  // Alive but silent: no keep-alives while stopped.
  ASSERT_OK(client->Signal(SIGSTOP));
  EXPECT_TRUE(AwaitAllReleased()) << "referenced=" << PoolStats().counts.referenced
                                  << " open_sessions=" << OpenSessions();
  ASSERT_OK(client->Signal(SIGKILL));
  ASSERT_OK(client->Wait(kClientBound));
}

TEST_F(DaemonProcessTest, SigtermExitsZeroAndRemovesTheSocket) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  struct stat info;
  ASSERT_EQ(lstat(socket_path_.c_str(), &info), 0);
  EXPECT_TRUE(S_ISSOCK(info.st_mode));
  EXPECT_EQ(info.st_mode & 0777, 0600u) << "the socket must be owner-only";

  // A client holding a session does not keep the daemon from stopping.
  absl::StatusOr<Subprocess> client =
      StartClient({"hold-and-hang", "default", std::to_string(kBlockSize), "4000", "1000"});
  ASSERT_OK(client);
  ASSERT_EQ(ReadResult(*client).block_ids.size(), 1u);

  observer_.reset();
  ASSERT_NO_FATAL_FAILURE(StopDaemon());
  EXPECT_FALSE(std::filesystem::exists(std::filesystem::symlink_status(socket_path_)))
      << socket_path_ << " was left behind";
}

}  // namespace
}  // namespace kvcache
