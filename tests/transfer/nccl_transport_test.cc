// The nccl BlockTransport (transfer/nccl_transport.h).
//
// NcclTransportTest (label unit, runs anywhere): against an in-process daemon with host pools,
// every way in refuses host memory with FAILED_PRECONDITION naming the shm and stream transports
// — also with no channel, as on a machine (or build) without NCCL or a GPU, which cannot make
// one — and the argument checks.
//
// NcclTransportGpuTest (label gpu; built with CUDA and NCCL; skips with no CUDA device): two
// kvcache-manager processes with --device cuda:0 (a sender and a receiver; this process maps both
// pools through CUDA IPC, which it could not do for pools it exported itself). A source sequence
// is filled with a pattern through the device mapping (cudaMemcpy) and committed, shipped over a
// single-rank NCCL channel, and then: the receiver holds the hashes (Lookup) and the same bytes
// (cudaMemcpy back); a longer prompt sends only its new blocks; an abort at the midway hook
// leaves no hash and no pinned block on the receiver (GetStats); the host transports refuse the
// device pools, and the nccl transport a host source.
#include "transfer/nccl_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/client/daemon_fixture.h"
#include "tests/testing/status_matchers.h"

#if KVCACHE_WITH_NCCL
#include <cuda_runtime_api.h>

#include "common/cuda/cuda_device.h"
#include "common/cuda/cuda_status.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/integration/kv_pattern.h"
#endif

namespace kvcache::worker {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

// What every refusal of host memory says: the transports that do move it.
auto NamesTheHostTransports() {
  return AllOf(HasSubstr("host memory"), HasSubstr("shm"), HasSubstr("stream"));
}

class NcclTransportTest : public kvcache::testing::DaemonFixture {
 protected:
  void SetUp() override {
    DaemonFixture::SetUp();
    ASSERT_OK(client_->OpenSession("", "prefill"));
  }
};

TEST_F(NcclTransportTest, HostReceivingPoolIsFailedPreconditionEvenWithoutAChannel) {
  EXPECT_THAT(MakeNcclTransport(client_.get(), "default", /*channel=*/nullptr),
              StatusIs(absl::StatusCode::kFailedPrecondition, NamesTheHostTransports()));
}

TEST_F(NcclTransportTest, HostSourcePoolIsFailedPreconditionBeforeAnyChannel) {
  absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool("default");
  ASSERT_OK(described);
  absl::StatusOr<std::unique_ptr<MappedPool>> source = MappedPool::Map(*described);
  ASSERT_OK(source);
  ASSERT_FALSE((*source)->is_device());
  EXPECT_THAT(MakeSingleGpuNcclTransport(client_.get(), **source, client_.get(), "default"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(NamesTheHostTransports(), HasSubstr("sender's pool"))));
}

TEST_F(NcclTransportTest, ArgumentErrors) {
  EXPECT_THAT(MakeNcclTransport(nullptr, "default", nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(MakeNcclTransport(client_.get(), "no-such-pool", nullptr),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(NcclTransportTest, FreshRendezvousKeysDifferAndFitTheDaemonsLimit) {
  const std::string first = FreshRendezvousKey("kvcache/nccl-transport");
  const std::string second = FreshRendezvousKey("kvcache/nccl-transport");
  EXPECT_NE(first, second);
  EXPECT_TRUE(absl::StartsWith(first, "kvcache/nccl-transport/"));
  EXPECT_LE(first.size(), 256u);
  // The key is usable: this session can publish under it.
  EXPECT_OK(client_->PublishRendezvous(first, "value"));
}

#if KVCACHE_WITH_NCCL

using ::kvcache::testing::ExpectedBlockBytes;
using ::kvcache::testing::Subprocess;

// The caller's own tenant: a daemon without an identity file puts each local uid in "default".
constexpr char kTenant[] = "default";

absl::Status CudaCopy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind) {
  return CudaStatus(cudaMemcpy(to, from, bytes, kind), "cudaMemcpy");
}

class NcclTransportGpuTest : public kvcache::testing::DaemonProcessTest {
 protected:
  void SetUp() override {
    DaemonProcessTest::SetUp();
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
    device_flag_ = "cuda:0";
    ASSERT_NO_FATAL_FAILURE(StartDaemon());  // the sender's daemon (prefill node)
    receiver_target_ = "unix://" + dir_.File("receiver.sock");
    absl::StatusOr<Subprocess> receiver_daemon =
        Subprocess::Start({bin_dir_ + "/kvcache-manager", "--listen=" + receiver_target_,
                           "--pool=" + pool_flag_, "--device=cuda:0", "--session_ttl=2s"});
    ASSERT_OK(receiver_daemon);
    receiver_daemon_.emplace(*std::move(receiver_daemon));
    ASSERT_OK(receiver_daemon_->ReadLineStartingWith("kvcache-manager: listening on", kStartBound));

    sender_ = Connect(target_);
    receiver_ = Connect(receiver_target_);
    ASSERT_NE(sender_, nullptr);
    ASSERT_NE(receiver_, nullptr);
    source_ = Map(*sender_);
    receiving_ = Map(*receiver_);
    ASSERT_NE(source_, nullptr);
    ASSERT_NE(receiving_, nullptr);
    ASSERT_TRUE(source_->is_device());
    ASSERT_TRUE(receiving_->is_device());

    absl::StatusOr<std::unique_ptr<NcclChannel>> channel =
        NcclChannel::Connect(sender_.get(), FreshRendezvousKey("test/nccl-transport"), 0, 1,
                             source_->device(), absl::Seconds(60));
    ASSERT_OK(channel);
    channel_ = *std::move(channel);
    ASSERT_OK(channel_->Warm(0, absl::Seconds(60)));
  }

  void TearDown() override {
    // Mappings and the channel go before the daemons free the memory behind them.
    transport_.reset();
    channel_.reset();
    source_.reset();
    receiving_.reset();
    sender_.reset();
    receiver_.reset();
    if (receiver_daemon_.has_value()) {
      ASSERT_OK(receiver_daemon_->Signal(SIGTERM));
      absl::StatusOr<int> status = receiver_daemon_->Wait(kStartBound);
      ASSERT_OK(status);
      EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
    }
    DaemonProcessTest::TearDown();
  }

  std::unique_ptr<KvCacheClient> Connect(const std::string& target) {
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(target);
    EXPECT_OK(client);
    if (!client.ok()) return nullptr;
    EXPECT_OK((*client)->OpenSession(kTenant, "nccl_transport_test"));
    return *std::move(client);
  }

  static std::unique_ptr<MappedPool> Map(KvCacheClient& client) {
    absl::StatusOr<KvCacheClient::PoolDescription> described = client.DescribePool("default");
    EXPECT_OK(described);
    if (!described.ok()) return nullptr;
    absl::StatusOr<std::unique_ptr<MappedPool>> mapped = MappedPool::Map(*described);
    EXPECT_OK(mapped);
    return mapped.ok() ? *std::move(mapped) : nullptr;
  }

  static std::vector<uint32_t> Prompt(uint32_t length) {
    std::vector<uint32_t> tokens(length);
    for (uint32_t i = 0; i < length; ++i) tokens[i] = 500 + 3 * i;
    return tokens;
  }

  // Opens the prompt on the sender, cudaMemcpy's the pattern of each uncached full block into
  // the device mapping, synchronizes the device and commits.
  KvCacheClient::Sequence Source(const std::vector<uint32_t>& prompt) {
    absl::StatusOr<KvCacheClient::Sequence> sequence = sender_->OpenSequence("default", prompt);
    EXPECT_OK(sequence);
    if (!sequence.ok()) return {};
    for (uint32_t b = sequence->num_cached_tokens / kBlockSize; b < prompt.size() / kBlockSize;
         ++b) {
      const std::string bytes = ExpectedBlockBytes(source_->layout(), prompt, b);
      EXPECT_OK(CudaCopy(source_->Block(sequence->block_ids[b]), bytes.data(), bytes.size(),
                         cudaMemcpyHostToDevice));
    }
    // A copy from pageable memory may return before its DMA lands; the transport's stream does
    // not wait for this one either. Synchronized before the commit, as the contract asks.
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_OK(sender_->CommitSequence(sequence->sequence_id, prompt.size()));
    return *sequence;
  }

  void MakeTransport() {
    absl::StatusOr<std::unique_ptr<BlockTransport>> transport =
        MakeNcclTransport(receiver_.get(), "default", channel_.get());
    ASSERT_OK(transport);
    transport_ = *std::move(transport);
  }

  absl::StatusOr<ShipmentStats> Ship(const std::vector<uint32_t>& prompt,
                                     const KvCacheClient::Sequence& source) {
    return transport_->Ship(
        Shipment{.tokens = prompt, .source = source_.get(), .source_blocks = source.block_ids});
  }

  uint32_t ReceiverCached(const std::vector<uint32_t>& prompt) {
    absl::StatusOr<KvCacheClient::LookupResult> lookup =
        receiver_->Lookup("default", kTenant, prompt);
    EXPECT_OK(lookup);
    return lookup.ok() ? lookup->num_cached_tokens : 0;
  }

  KvCacheClient::PoolStats ReceiverStats() {
    absl::StatusOr<KvCacheClient::Stats> stats = receiver_->GetStats("default");
    EXPECT_OK(stats);
    return stats.ok() && !stats->pools.empty() ? stats->pools[0] : KvCacheClient::PoolStats{};
  }

  // Opens the prompt (and one more token) on the receiver, expects `blocks` full blocks as a hit
  // and their bytes, copied back from the device, to be the pattern.
  void ExpectReceiverHolds(const std::vector<uint32_t>& prompt, uint32_t blocks) {
    std::vector<uint32_t> probe = prompt;
    probe.push_back(1);
    absl::StatusOr<KvCacheClient::Sequence> hit = receiver_->OpenSequence("default", probe);
    ASSERT_OK(hit);
    ASSERT_EQ(hit->num_cached_tokens, blocks * kBlockSize);
    for (uint32_t b = 0; b < blocks; ++b) {
      std::string bytes(receiving_->block_bytes(), '\0');
      ASSERT_OK(CudaCopy(bytes.data(), receiving_->Block(hit->block_ids[b]), bytes.size(),
                         cudaMemcpyDeviceToHost));
      EXPECT_TRUE(bytes == ExpectedBlockBytes(receiving_->layout(), prompt, b)) << "block " << b;
    }
    ASSERT_OK(receiver_->ReleaseSequence(hit->sequence_id));
  }

  std::string receiver_target_;
  std::optional<Subprocess> receiver_daemon_;
  std::unique_ptr<KvCacheClient> sender_;
  std::unique_ptr<KvCacheClient> receiver_;
  std::unique_ptr<MappedPool> source_;
  std::unique_ptr<MappedPool> receiving_;
  std::unique_ptr<NcclChannel> channel_;
  std::unique_ptr<BlockTransport> transport_;
};

TEST_F(NcclTransportGpuTest, ShipsDeviceBlocksThatTheReceiverThenHolds) {
  ASSERT_NO_FATAL_FAILURE(MakeTransport());
  EXPECT_EQ(transport_->name(), "nccl");
  const std::vector<uint32_t> prompt = Prompt(5 * kBlockSize + 3);
  const KvCacheClient::Sequence source = Source(prompt);
  absl::StatusOr<ShipmentStats> shipped = Ship(prompt, source);
  ASSERT_OK(shipped);
  EXPECT_EQ(shipped->blocks_sent, 5u);
  EXPECT_EQ(shipped->blocks_already_there, 0u);
  EXPECT_EQ(shipped->bytes_sent, 5 * source_->block_bytes());
  EXPECT_EQ(ReceiverCached(prompt), 5 * kBlockSize);  // the hashes are registered
  ASSERT_NO_FATAL_FAILURE(ExpectReceiverHolds(prompt, 5));
  EXPECT_EQ(ReceiverStats().counts.referenced, 0u);  // and nothing stays pinned
  ASSERT_OK(sender_->ReleaseSequence(source.sequence_id));
}

TEST_F(NcclTransportGpuTest, LongerPromptSendsOnlyTheNewBlocks) {
  ASSERT_NO_FATAL_FAILURE(MakeTransport());
  const std::vector<uint32_t> longer = Prompt(7 * kBlockSize + 2);
  const std::vector<uint32_t> prompt(longer.begin(), longer.begin() + 3 * kBlockSize + 9);
  const KvCacheClient::Sequence first = Source(prompt);
  ASSERT_OK(Ship(prompt, first));
  ASSERT_OK(sender_->ReleaseSequence(first.sequence_id));

  const KvCacheClient::Sequence second = Source(longer);
  absl::StatusOr<ShipmentStats> shipped = Ship(longer, second);
  ASSERT_OK(shipped);
  EXPECT_EQ(shipped->blocks_already_there, 3u);
  EXPECT_EQ(shipped->blocks_sent, 4u);
  EXPECT_EQ(shipped->bytes_sent, 4 * source_->block_bytes());
  ASSERT_NO_FATAL_FAILURE(ExpectReceiverHolds(longer, 7));
  ASSERT_OK(sender_->ReleaseSequence(second.sequence_id));
}

TEST_F(NcclTransportGpuTest, AbortAtTheMidwayHookLeavesNoHashAndNoPin) {
  ASSERT_NO_FATAL_FAILURE(MakeTransport());
  const std::vector<uint32_t> prompt = Prompt(6 * kBlockSize + 1);
  const KvCacheClient::Sequence source = Source(prompt);
  transport_->set_midway_hook([] { return absl::AbortedError("test aborts midway"); });
  EXPECT_THAT(Ship(prompt, source), StatusIs(absl::StatusCode::kAborted, HasSubstr("midway")));
  EXPECT_EQ(ReceiverCached(prompt), 0u);
  KvCacheClient::PoolStats stats = ReceiverStats();
  EXPECT_EQ(stats.counts.referenced, 0u);
  EXPECT_EQ(stats.published_blocks, 0u);
  EXPECT_EQ(stats.open_sequences, 0u);

  // The channel is still good (the abort was the transport's, not NCCL's): the retry ships all.
  transport_->set_midway_hook(nullptr);
  absl::StatusOr<ShipmentStats> shipped = Ship(prompt, source);
  ASSERT_OK(shipped);
  EXPECT_EQ(shipped->blocks_sent, 6u);
  ASSERT_NO_FATAL_FAILURE(ExpectReceiverHolds(prompt, 6));
  ASSERT_OK(sender_->ReleaseSequence(source.sequence_id));
}

TEST_F(NcclTransportGpuTest, SingleGpuFactoryConnectsItsOwnChannel) {
  absl::StatusOr<std::unique_ptr<BlockTransport>> transport =
      MakeSingleGpuNcclTransport(sender_.get(), *source_, receiver_.get(), "default");
  ASSERT_OK(transport);
  const std::vector<uint32_t> prompt = Prompt(2 * kBlockSize + 1);
  const KvCacheClient::Sequence source = Source(prompt);
  absl::StatusOr<ShipmentStats> shipped =
      (*transport)
          ->Ship(Shipment{
              .tokens = prompt, .source = source_.get(), .source_blocks = source.block_ids});
  ASSERT_OK(shipped);
  EXPECT_EQ(shipped->blocks_sent, 2u);
  ASSERT_NO_FATAL_FAILURE(ExpectReceiverHolds(prompt, 2));
  ASSERT_OK(sender_->ReleaseSequence(source.sequence_id));
}

TEST_F(NcclTransportGpuTest, HostTransportsRefuseDevicePoolsAndNcclAHostSource) {
  EXPECT_THAT(MakeShmTransport(receiver_.get(), "default"),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("nccl")));
  const std::vector<uint32_t> prompt = Prompt(2 * kBlockSize);
  const std::vector<uint32_t> blocks = {0, 1};
  std::unique_ptr<BlockTransport> stream = MakeStreamTransport(receiver_.get(), kTenant, "default");
  EXPECT_THAT(
      stream->Ship(Shipment{.tokens = prompt, .source = source_.get(), .source_blocks = blocks}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("nccl")));

  // A host pool of a third daemon as the source.
  const std::string host_target = "unix://" + dir_.File("host.sock");
  absl::StatusOr<Subprocess> host_daemon =
      Subprocess::Start({bin_dir_ + "/kvcache-manager", "--listen=" + host_target,
                         "--pool=" + pool_flag_, "--device=host", "--session_ttl=2s"});
  ASSERT_OK(host_daemon);
  ASSERT_OK(host_daemon->ReadLineStartingWith("kvcache-manager: listening on", kStartBound));
  {
    std::unique_ptr<KvCacheClient> host_client = Connect(host_target);
    ASSERT_NE(host_client, nullptr);
    std::unique_ptr<MappedPool> host_pool = Map(*host_client);
    ASSERT_NE(host_pool, nullptr);
    ASSERT_NO_FATAL_FAILURE(MakeTransport());
    EXPECT_THAT(transport_->Ship(
                    Shipment{.tokens = prompt, .source = host_pool.get(), .source_blocks = blocks}),
                StatusIs(absl::StatusCode::kFailedPrecondition, NamesTheHostTransports()));
    EXPECT_THAT(MakeNcclTransport(host_client.get(), "default", channel_.get()),
                StatusIs(absl::StatusCode::kFailedPrecondition, NamesTheHostTransports()));
  }
  ASSERT_OK(host_daemon->Signal(SIGTERM));
  ASSERT_OK(host_daemon->Wait(kStartBound).status());
  EXPECT_EQ(ReceiverStats().published_blocks, 0u);
}

#endif  // KVCACHE_WITH_NCCL

}  // namespace
}  // namespace kvcache::worker
