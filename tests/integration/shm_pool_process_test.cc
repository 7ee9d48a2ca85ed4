// A pool's shared memory across daemon processes (issue 29): a SIGKILLed daemon's pool object is
// reclaimed by the next start on the same address and nobody else's is touched; the daemon, not
// the first worker to write, allocates (and is charged for) the pool's pages.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>

#include "tests/integration/daemon_process_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::DaemonProcessTest;
using ::kvcache::testing::StartManager;
using ::kvcache::testing::StopManager;
using ::kvcache::testing::Subprocess;

// The inode of shared-memory object `shm_name`, or 0 when there is none.
ino_t ShmInode(const std::string& shm_name) {
  struct stat info;
  if (stat(("/dev/shm" + shm_name).c_str(), &info) != 0) return 0;
  return info.st_ino;
}

std::string ShmNameOf(KvCacheClient& client, const std::string& pool) {
  absl::StatusOr<KvCacheClient::PoolDescription> description = client.DescribePool(pool);
  EXPECT_OK(description);
  if (!description.ok()) return "";
  EXPECT_EQ(description->pool.mapping.kind, KvCacheClient::PoolMapping::Kind::kShm);
  return description->pool.mapping.shm_name;
}

class ShmPoolProcessTest : public DaemonProcessTest {
 protected:
  std::string ShmName() { return ShmNameOf(*observer_, pool_name_); }
};

TEST_F(ShmPoolProcessTest, KilledDaemonsPoolIsReclaimedByItsRestart) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string killed_name = ShmName();
  const ino_t killed_inode = ShmInode(killed_name);
  ASSERT_NE(killed_inode, 0u) << killed_name;

  ASSERT_NO_FATAL_FAILURE(KillAndRestartDaemon());
  const std::string restarted_name = ShmName();
  const ino_t restarted_inode = ShmInode(restarted_name);
  ASSERT_NE(restarted_inode, 0u) << restarted_name;
  // One object, the new daemon's: the killed one's is gone, not left beside it.
  EXPECT_EQ(restarted_name, killed_name) << "the same daemon start names its pool the same";
  EXPECT_NE(restarted_inode, killed_inode) << "the killed daemon's pool was reused, not replaced";
  if (restarted_name != killed_name) {
    EXPECT_EQ(ShmInode(killed_name), 0u) << killed_name << " was left behind";
  }

  StopDaemon();
  EXPECT_EQ(ShmInode(restarted_name), 0u) << "a clean stop unlinks";
}

TEST_F(ShmPoolProcessTest, DaemonsSideBySideKeepTheirPoolsAcrossOnesRestart) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string other_target = "unix://" + dir_.File("other.sock");
  absl::StatusOr<Subprocess> other = StartManager(
      bin_dir_, {"--listen=" + other_target, "--pool=" + pool_flag_, "--device=host"}, kStartBound);
  ASSERT_OK(other);
  absl::StatusOr<std::unique_ptr<KvCacheClient>> other_client =
      KvCacheClient::Connect(other_target);
  ASSERT_OK(other_client);
  const std::string other_name = ShmNameOf(**other_client, pool_name_);
  const ino_t other_inode = ShmInode(other_name);
  const std::string killed_name = ShmName();
  ASSERT_NE(other_name, killed_name) << "daemons on different addresses share a pool name";
  ASSERT_NE(other_inode, 0u);

  ASSERT_NO_FATAL_FAILURE(KillAndRestartDaemon());
  EXPECT_EQ(ShmName(), killed_name);
  EXPECT_EQ(ShmNameOf(**other_client, pool_name_), other_name);
  EXPECT_EQ(ShmInode(other_name), other_inode) << "the other daemon's pool was touched";

  other_client->reset();
  EXPECT_OK(StopManager(*other, kStartBound));
  EXPECT_EQ(ShmInode(other_name), 0u);
  EXPECT_NE(ShmInode(killed_name), 0u) << "the restarted daemon's pool went with the other's";
}

TEST_F(ShmPoolProcessTest, SecondDaemonOnTheSameAddressRefusesAndLeavesTheFirstAlone) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::string name = ShmName();
  const ino_t inode = ShmInode(name);
  absl::StatusOr<Subprocess> second =
      Subprocess::Start({bin_dir_ + "/kvcache-manager", "--listen=" + target_,
                         "--pool=" + pool_flag_, "--device=host"});
  ASSERT_OK(second);
  absl::StatusOr<int> status = second->Wait(kStartBound);
  ASSERT_OK(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0) << "the second daemon started";

  EXPECT_EQ(ShmInode(name), inode);
  struct stat socket_info;
  EXPECT_EQ(stat(socket_path_.c_str(), &socket_info), 0) << "the first daemon's socket is gone";
  EXPECT_OK(observer_->Ping());
}

// The daemon allocates every page of its pool at start (issue 29, item 2): a worker that writes
// the pool then pays for none of it, and the daemon's memory budget is the one that must hold it.
TEST_F(ShmPoolProcessTest, DaemonHoldsItsWholePoolRightAfterStart) {
  pool_flag_ = "default:blocks=1024";  // 32 MiB with the default layout
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  absl::StatusOr<KvCacheClient::PoolDescription> description = observer_->DescribePool(pool_name_);
  ASSERT_OK(description);
  const uint64_t pool_bytes = description->pool.mapping.size_bytes;
  ASSERT_GE(pool_bytes, 16u << 20);
  // Every page is allocated in the object (tmpfs counts them in st_blocks, as du does), though
  // no process but the daemon has touched it: the daemon allocated them, and tmpfs charged them
  // to its cgroup.
  struct stat info;
  ASSERT_EQ(stat(("/dev/shm" + description->pool.mapping.shm_name).c_str(), &info), 0);
  EXPECT_EQ(static_cast<uint64_t>(info.st_blocks) * 512, pool_bytes);
}

}  // namespace
}  // namespace kvcache
