// The host transports (transfer/block_transport.h) between two in-process daemons with host pools:
// the shm transport (whose sequence bookkeeping, transfer/in_place_transport.h, the nccl transport
// shares) and the stream transport. Each ships a committed source sequence, then a longer prompt
// (only the new blocks go), and is aborted midway through its hook (no hash and no pinned block
// remain on the receiver); a shipment of a pool with parts keeps each block's part mask. Runs
// everywhere (label unit); the device pools' version is
// tests/transfer/nccl_transport_test.cc.
#include "transfer/block_transport.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cache/pool_spec.h"
#include "server/daemon.h"
#include "tests/testing/grpc_kept_alive.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::worker {
namespace {

using ::kvcache::testing::PollUntil;
using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr char kTenant[] = "default";  // the default identity's tenant
constexpr uint32_t kBlockSize = 16;
constexpr uint32_t kBlocks = 32;
// Pool "parts": a hybrid model's pages, KV on every block and a state on the last of a hit.
constexpr uint32_t kKv = 1;
constexpr uint32_t kBoth = 3;

struct Node {
  std::unique_ptr<Daemon> daemon;
  std::unique_ptr<KvCacheClient> client;
};

class BlockTransportTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ::kvcache::testing::KeepGrpcInitialized();
    ASSERT_NO_FATAL_FAILURE(StartNode("sender", &sender_));
    ASSERT_NO_FATAL_FAILURE(StartNode("receiver", &receiver_));
    absl::StatusOr<KvCacheClient::PoolDescription> described = sender_.client->DescribePool("p");
    ASSERT_OK(described);
    absl::StatusOr<std::unique_ptr<MappedPool>> source = MappedPool::Map(*described);
    ASSERT_OK(source);
    source_ = *std::move(source);
    described = sender_.client->DescribePool("parts");
    ASSERT_OK(described);
    source = MappedPool::Map(*described);
    ASSERT_OK(source);
    parts_source_ = *std::move(source);
  }

  void TearDown() override {
    for (Node* node : {&sender_, &receiver_}) {
      node->client.reset();
      if (node->daemon != nullptr) {
        for (Pool* pool : node->daemon->manager().pools()) {
          EXPECT_OK(pool->CheckInvariants());
        }
      }
      node->daemon.reset();
    }
  }

  void StartNode(const std::string& name, Node* node) {
    DaemonOptions options;
    options.listen = "unix://" + dir_.File(name + ".sock");
    PoolOptions pool = DefaultPoolOptions();
    pool.name = "p";
    pool.num_blocks = kBlocks;
    options.pools.push_back(pool);
    pool.name = "parts";
    pool.parts = *ParsePageParts("kv/28K+state/4K/trailing1", pool.layout.BlockBytes());
    options.pools.push_back(pool);
    absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options);
    ASSERT_OK(daemon);
    node->daemon = *std::move(daemon);
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(options.listen);
    ASSERT_OK(client);
    node->client = *std::move(client);
    ASSERT_OK(node->client->OpenSession(kTenant, name));
  }

  absl::StatusOr<std::unique_ptr<BlockTransport>> MakeTransport(const std::string& pool = "p") {
    if (GetParam() == "shm") return MakeShmTransport(receiver_.client.get(), pool);
    return MakeStreamTransport(receiver_.client.get(), kTenant, pool);
  }

  static std::vector<uint32_t> Prompt(uint32_t length, uint32_t first = 100) {
    std::vector<uint32_t> tokens(length);
    for (uint32_t i = 0; i < length; ++i) tokens[i] = first + i;
    return tokens;
  }

  // The bytes the source writes into the block of prompt position `block`: a function of the
  // block's first token, so a block in the wrong place shows.
  std::string Pattern(const std::vector<uint32_t>& prompt, uint32_t block) const {
    std::string bytes(source_->block_bytes(), '\0');
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>(prompt[block * kBlockSize] * 31 + i * 7 + block);
    }
    return bytes;
  }

  // Opens the prompt on the sender, writes every full block's pattern and commits: the sequence
  // that a prefill worker holds while it ships.
  // In pool "parts" (`masks` given): each full block committed with its mask.
  KvCacheClient::Sequence Source(const std::vector<uint32_t>& prompt,
                                 absl::Span<const uint32_t> masks = {}) {
    const bool parts = !masks.empty();
    const MappedPool& mapped = parts ? *parts_source_ : *source_;
    absl::StatusOr<KvCacheClient::Sequence> sequence =
        sender_.client->OpenSequence(mapped.name(), prompt);
    EXPECT_OK(sequence);
    if (!sequence.ok()) return {};
    for (uint32_t b = sequence->num_cached_tokens / kBlockSize; b < prompt.size() / kBlockSize;
         ++b) {
      const std::string bytes = Pattern(prompt, b);
      std::memcpy(mapped.Block(sequence->block_ids[b]), bytes.data(), bytes.size());
    }
    EXPECT_OK(sender_.client->CommitSequence(
        sequence->sequence_id, prompt.size(),
        parts ? masks.first(prompt.size() / kBlockSize) : absl::Span<const uint32_t>()));
    return *sequence;
  }

  absl::StatusOr<ShipmentStats> Ship(BlockTransport& transport, const std::vector<uint32_t>& prompt,
                                     const KvCacheClient::Sequence& source) {
    return transport.Ship(
        Shipment{.tokens = prompt, .source = source_.get(), .source_blocks = source.block_ids});
  }

  uint32_t ReceiverCached(const std::vector<uint32_t>& prompt) {
    absl::StatusOr<KvCacheClient::LookupResult> lookup =
        receiver_.client->Lookup("p", kTenant, prompt);
    EXPECT_OK(lookup);
    return lookup.ok() ? lookup->num_cached_tokens : 0;
  }

  KvCacheClient::PoolStats ReceiverStats() {
    absl::StatusOr<KvCacheClient::Stats> stats = receiver_.client->GetStats("p");
    EXPECT_OK(stats);
    return stats.ok() && !stats->pools.empty() ? stats->pools[0] : KvCacheClient::PoolStats{};
  }

  // The receiver's bytes of the prompt's cached full blocks, through its daemon's memory.
  void ExpectReceiverHolds(const std::vector<uint32_t>& prompt, uint32_t blocks) {
    std::vector<uint32_t> probe = prompt;
    probe.push_back(7);  // one more token, so every full block can be a hit
    absl::StatusOr<KvCacheClient::Sequence> hit = receiver_.client->OpenSequence("p", probe);
    ASSERT_OK(hit);
    ASSERT_EQ(hit->num_cached_tokens, blocks * kBlockSize);
    Pool* pool = *receiver_.daemon->manager().FindPool("p");
    for (uint32_t b = 0; b < blocks; ++b) {
      std::string bytes(source_->block_bytes(), '\0');
      ASSERT_OK(pool->memory().Read(hit->block_ids[b], 0, bytes.size(), bytes.data()));
      EXPECT_EQ(bytes, Pattern(prompt, b)) << "block " << b;
    }
    ASSERT_OK(receiver_.client->ReleaseSequence(hit->sequence_id));
  }

  ScopedTempDir dir_{"kvcache_block_transport_test"};  // the daemons' sockets
  Node sender_;
  Node receiver_;
  std::unique_ptr<MappedPool> source_;
  std::unique_ptr<MappedPool> parts_source_;  // the sender's pool "parts"
};

TEST_P(BlockTransportTest, ShipsTheFullBlocksAndThenOnlyTheNewOnes) {
  absl::StatusOr<std::unique_ptr<BlockTransport>> transport = MakeTransport();
  ASSERT_OK(transport);
  EXPECT_EQ((*transport)->name(), GetParam());

  const std::vector<uint32_t> prompt = Prompt(3 * kBlockSize + 5);
  const KvCacheClient::Sequence source = Source(prompt);
  absl::StatusOr<ShipmentStats> shipped = Ship(**transport, prompt, source);
  ASSERT_OK(shipped);
  EXPECT_EQ(shipped->blocks_sent, 3u);
  EXPECT_EQ(shipped->blocks_already_there, 0u);
  EXPECT_EQ(shipped->bytes_sent, 3 * source_->block_bytes());
  EXPECT_EQ(ReceiverCached(prompt), 3 * kBlockSize);
  ASSERT_NO_FATAL_FAILURE(ExpectReceiverHolds(prompt, 3));
  ASSERT_OK(sender_.client->ReleaseSequence(source.sequence_id));

  // The conversation goes on: the receiver holds the first three blocks.
  const std::vector<uint32_t> longer = Prompt(6 * kBlockSize + 1);
  const KvCacheClient::Sequence longer_source = Source(longer);
  shipped = Ship(**transport, longer, longer_source);
  ASSERT_OK(shipped);
  EXPECT_EQ(shipped->blocks_already_there, 3u);
  EXPECT_EQ(shipped->blocks_sent, 3u);
  EXPECT_EQ(shipped->bytes_sent, 3 * source_->block_bytes());
  ASSERT_NO_FATAL_FAILURE(ExpectReceiverHolds(longer, 6));
  ASSERT_OK(sender_.client->ReleaseSequence(longer_source.sequence_id));
  EXPECT_EQ(ReceiverStats().counts.referenced, 0u);
}

TEST_P(BlockTransportTest, AbortAtTheMidwayHookLeavesNoHashAndNoPin) {
  absl::StatusOr<std::unique_ptr<BlockTransport>> transport = MakeTransport();
  ASSERT_OK(transport);
  const std::vector<uint32_t> prompt = Prompt(4 * kBlockSize + 3);
  const KvCacheClient::Sequence source = Source(prompt);
  int calls = 0;
  (*transport)->set_midway_hook([&]() -> absl::Status {
    ++calls;
    return absl::AbortedError("test aborts the shipment");
  });
  EXPECT_THAT(Ship(**transport, prompt, source),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("test aborts")));
  EXPECT_EQ(calls, 1);
  EXPECT_EQ(ReceiverCached(prompt), 0u);
  // The client has its status before the receiving daemon has run the cancelled put's cleanup.
  EXPECT_TRUE(PollUntil([&] { return ReceiverStats().open_sequences == 0; }));
  const KvCacheClient::PoolStats stats = ReceiverStats();
  EXPECT_EQ(stats.counts.referenced, 0u);
  EXPECT_EQ(stats.published_blocks, 0u);
  EXPECT_EQ(stats.open_sequences, 0u);

  // The same shipment then goes through whole.
  (*transport)->set_midway_hook(nullptr);
  absl::StatusOr<ShipmentStats> shipped = Ship(**transport, prompt, source);
  ASSERT_OK(shipped);
  EXPECT_EQ(shipped->blocks_sent, 4u);
  ASSERT_NO_FATAL_FAILURE(ExpectReceiverHolds(prompt, 4));
}

TEST_P(BlockTransportTest, AShipmentKeepsEachBlocksPartMask) {
  absl::StatusOr<std::unique_ptr<BlockTransport>> transport = MakeTransport("parts");
  ASSERT_OK(transport);
  // A state saved every second page, as a prefill worker with --state_every_pages=2 commits.
  const std::vector<uint32_t> masks = {kKv, kBoth, kKv, kBoth, kKv, kBoth, kKv};
  const std::vector<uint32_t> prompt = Prompt(5 * kBlockSize + 3);
  const KvCacheClient::Sequence source = Source(prompt, masks);
  const auto ship = [&](const std::vector<uint32_t>& tokens, const KvCacheClient::Sequence& from,
                        absl::Span<const uint32_t> part_masks) {
    return (*transport)
        ->Ship(Shipment{.tokens = tokens,
                        .source = parts_source_.get(),
                        .source_blocks = from.block_ids,
                        .part_masks = part_masks});
  };
  absl::StatusOr<ShipmentStats> shipped = ship(prompt, source, masks);
  ASSERT_OK(shipped);
  EXPECT_EQ(shipped->blocks_sent, 5u);
  const auto receiver_lookup = [&](const std::vector<uint32_t>& tokens,
                                   absl::Span<const std::string> parts) {
    absl::StatusOr<KvCacheClient::LookupResult> found =
        receiver_.client->Lookup("parts", kTenant, tokens, "", {}, std::nullopt, parts);
    EXPECT_OK(found);
    return found.ok() ? *found : KvCacheClient::LookupResult{};
  };
  // Every part: the hit ends at block 3, the last with a state; KV alone reaches every block.
  EXPECT_THAT(receiver_lookup(prompt, {}).part_masks, ElementsAre(kKv, kBoth, kKv, kBoth));
  const std::vector<std::string> kv = {"kv"};
  EXPECT_THAT(receiver_lookup(prompt, kv).part_masks, ElementsAre(kKv, kBoth, kKv, kBoth, kKv));
  ASSERT_OK(sender_.client->ReleaseSequence(source.sequence_id));

  // The conversation goes on: the blocks up to the receiver's hit are not sent again.
  const std::vector<uint32_t> longer = Prompt(7 * kBlockSize + 1);
  const KvCacheClient::Sequence longer_source = Source(longer, masks);
  shipped = ship(longer, longer_source, masks);
  ASSERT_OK(shipped);
  EXPECT_EQ(shipped->blocks_already_there, 4u);
  EXPECT_EQ(shipped->blocks_sent, 3u);
  EXPECT_THAT(receiver_lookup(longer, {}).part_masks,
              ElementsAre(kKv, kBoth, kKv, kBoth, kKv, kBoth));
  EXPECT_THAT(receiver_lookup(longer, kv).part_masks,
              ElementsAre(kKv, kBoth, kKv, kBoth, kKv, kBoth, kKv));

  // Masks the receiver's pool cannot hold: refused there, nothing published and nothing held.
  const std::vector<uint32_t> other = Prompt(2 * kBlockSize, 5000);
  const KvCacheClient::Sequence other_source = Source(other, masks);
  const std::vector<uint32_t> past_the_parts = {kKv, 4};
  EXPECT_THAT(ship(other, other_source, past_the_parts),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 1 has part mask 0x4 but the pool has 2 part(s)")));
  const std::vector<uint32_t> too_few = {kKv};
  EXPECT_THAT(ship(other, other_source, too_few),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 part masks for 2")));
  EXPECT_EQ(receiver_lookup(other, kv).num_cached_blocks, 0u);
  const auto receiver_referenced = [&] {
    absl::StatusOr<KvCacheClient::PoolDescription> described =
        receiver_.client->DescribePool("parts");
    EXPECT_OK(described);
    return described.ok() ? described->counts.referenced : 0;
  };
  EXPECT_TRUE(PollUntil([&] { return receiver_referenced() == 0; }));
  ASSERT_OK(sender_.client->ReleaseSequence(longer_source.sequence_id));
  ASSERT_OK(sender_.client->ReleaseSequence(other_source.sequence_id));
}

TEST_P(BlockTransportTest, MalformedShipmentsAreRejectedBeforeAnyByteMoves) {
  absl::StatusOr<std::unique_ptr<BlockTransport>> transport = MakeTransport();
  ASSERT_OK(transport);
  const std::vector<uint32_t> prompt = Prompt(2 * kBlockSize);
  const std::vector<uint32_t> one_block = {0};
  const std::vector<uint32_t> past_the_pool = {0, kBlocks};
  EXPECT_THAT((*transport)->Ship(Shipment{.tokens = prompt}),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      (*transport)
          ->Ship(Shipment{.tokens = prompt, .source = source_.get(), .source_blocks = one_block}),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((*transport)
                  ->Ship(Shipment{
                      .tokens = prompt, .source = source_.get(), .source_blocks = past_the_pool}),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_EQ(ReceiverStats().published_blocks, 0u);
}

INSTANTIATE_TEST_SUITE_P(Transports, BlockTransportTest, ::testing::Values("shm", "stream"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           return info.param;
                         });

// The shm transport's mapping belongs to the receiver's epoch: after a restart it refuses to
// write through the old mapping.
TEST(ShmTransportRestartTest, ReceiverRestartedSinceMappingIsFailedPrecondition) {
  ScopedTempDir dir("kvcache_block_transport_test");
  DaemonOptions options;
  options.listen = "unix://" + dir.File("receiver.sock");
  PoolOptions pool = DefaultPoolOptions();
  pool.name = "p";
  pool.num_blocks = kBlocks;
  options.pools.push_back(pool);
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options);
  ASSERT_OK(daemon);
  absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(options.listen);
  ASSERT_OK(client);
  ASSERT_OK((*client)->OpenSession(kTenant, "prefill"));
  absl::StatusOr<KvCacheClient::PoolDescription> described = (*client)->DescribePool("p");
  ASSERT_OK(described);
  absl::StatusOr<std::unique_ptr<MappedPool>> source = MappedPool::Map(*described);
  ASSERT_OK(source);
  absl::StatusOr<std::unique_ptr<BlockTransport>> transport = MakeShmTransport(client->get(), "p");
  ASSERT_OK(transport);

  daemon->reset();
  daemon = Daemon::Start(options);
  ASSERT_OK(daemon);
  // The restart is noticed by the next session call; a new session is of the new epoch.
  (void)(*client)->Ping();
  const std::vector<uint32_t> prompt(2 * kBlockSize, 5);
  const std::vector<uint32_t> blocks = {0, 1};
  absl::Status reopened = absl::UnavailableError("not tried");
  for (int attempt = 0; attempt < 100 && !reopened.ok(); ++attempt) {
    (void)(*client)->OpenSequence("p", prompt);  // FAILED_PRECONDITION: the epoch changed
    reopened = (*client)->OpenSession(kTenant, "prefill").status();
    if (!reopened.ok()) absl::SleepFor(absl::Milliseconds(20));
  }
  ASSERT_OK(reopened);
  EXPECT_THAT(
      (*transport)
          ->Ship(Shipment{.tokens = prompt, .source = source->get(), .source_blocks = blocks}),
      StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("restarted")));
  transport->reset();
  source->reset();
  client->reset();
  daemon->reset();
}

}  // namespace
}  // namespace kvcache::worker
