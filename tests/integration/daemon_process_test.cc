// End to end across real processes (tests/integration/daemon_process_fixture.h): a committed
// prefix is shared across processes on the same physical blocks, a killed or frozen client's
// blocks come back once its lease runs out, and SIGTERM stops the daemon cleanly.
#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <xxhash.h>

#include <filesystem>
#include <numeric>
#include <string>
#include <vector>

#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::ClientResult;
using ::kvcache::testing::DaemonProcessTest;
using ::kvcache::testing::Prefix;
using ::kvcache::testing::StatusIs;
using ::kvcache::testing::Subprocess;
using ::testing::AllOf;
using ::testing::Contains;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

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

// Regression (issue 29, item 6): --tcp_listen with --insecure served plaintext TCP beside the
// socket without the warning --listen HOST:PORT --insecure prints.
TEST_F(DaemonProcessTest, PlaintextTcpListenPrintsTheWarning) {
  extra_daemon_flags_ = {"--tcp_listen=127.0.0.1:0", "--insecure"};
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  absl::StatusOr<std::string> tcp = daemon_->ReadLineStartingWith("  also on TCP ", kStartBound);
  ASSERT_OK(tcp);
  const std::string tcp_address = tcp->substr(std::string("  also on TCP ").size());
  observer_.reset();
  ASSERT_OK(testing::StopManager(*daemon_, kStartBound));
  // Everything the daemon printed after that line, up to its exit.
  std::vector<std::string> lines;
  for (absl::StatusOr<std::string> line = daemon_->ReadLine(kStartBound); line.ok();
       line = daemon_->ReadLine(kStartBound)) {
    lines.push_back(*line);
  }
  daemon_.reset();
  EXPECT_THAT(lines, Contains(AllOf(HasSubstr("WARNING: plaintext TCP"), HasSubstr(tcp_address))));
}

// Graceful drain (issue 17): on SIGTERM health goes NOT_SERVING and new sessions are refused
// with UNAVAILABLE while the open ones are served; a put stream in flight when the drain period
// ends still completes within --drain_timeout; then the daemon exits 0.
TEST_F(DaemonProcessTest, SigtermDrainsInFlightStreamsRefusesNewSessionsAndExitsZero) {
  extra_daemon_flags_ = {"--drain_period=2s", "--drain_timeout=60s"};
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  auto stub =
      v1::KvCache::NewStub(grpc::CreateChannel(target_, grpc::InsecureChannelCredentials()));
  auto open_session = [&]() -> absl::StatusOr<uint64_t> {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::OpenSessionRequest request;
    request.set_ttl_ms(60000);  // longer than the test: the lease is not what ends the put
    v1::OpenSessionResponse response;
    RETURN_IF_ERROR(FromGrpcStatus(stub->OpenSession(&context, request, &response)));
    return response.session_id();
  };
  absl::StatusOr<uint64_t> session = open_session();
  ASSERT_OK(session);

  // A put of two blocks, one of them sent before SIGTERM.
  absl::StatusOr<KvCacheClient::PoolDescription> pool = observer_->DescribePool("default");
  ASSERT_OK(pool);
  const uint64_t block_bytes = pool->pool.block_bytes;
  std::vector<uint32_t> tokens(2 * kBlockSize);
  std::iota(tokens.begin(), tokens.end(), 9000);
  const std::string bytes(2 * block_bytes, 'k');
  v1::PutBlocksRequest request;
  v1::PutBlocksHeader* header = request.mutable_header();
  header->set_session_id(*session);
  header->set_pool("default");
  header->mutable_tokens()->Add(tokens.begin(), tokens.end());
  for (int block = 0; block < 2; ++block) {
    header->add_block_checksums(XXH3_64bits_withSeed(bytes.data(), block_bytes, 0));
  }
  grpc::ClientContext put_context;
  v1::PutBlocksResponse put_response;
  auto writer = stub->PutBlocks(&put_context, &put_response);
  ASSERT_TRUE(writer->Write(request));
  request.Clear();
  request.set_data(bytes.substr(0, block_bytes));
  ASSERT_TRUE(writer->Write(request));

  ASSERT_OK(daemon_->Signal(SIGTERM));
  ASSERT_OK(daemon_->ReadLineStartingWith("kvcache-manager: signal", kStartBound));
  EXPECT_THAT(open_session(),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("draining")));
  // The open session is still served during the drain period.
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    v1::OpenSequenceRequest open;
    open.set_session_id(*session);
    open.set_pool("default");
    open.mutable_tokens()->Add(tokens.begin(), tokens.end());
    v1::OpenSequenceResponse opened;
    EXPECT_OK(FromGrpcStatus(stub->OpenSequence(&context, open, &opened)));
  }

  // The drain period is over and the server shuts down; the put in flight may still finish.
  ASSERT_OK(daemon_->ReadLineStartingWith("kvcache-manager: shutting down", kStartBound));
  request.set_data(bytes.substr(block_bytes));
  ASSERT_TRUE(writer->Write(request));
  writer->WritesDone();
  ASSERT_OK(FromGrpcStatus(writer->Finish()));
  EXPECT_EQ(put_response.num_stored(), 2);

  observer_.reset();
  absl::StatusOr<int> status = daemon_->Wait(kStartBound);
  ASSERT_OK(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
      << "kvcache-manager " << ::kvcache::testing::DescribeWaitStatus(*status);
  daemon_.reset();
}

}  // namespace
}  // namespace kvcache
