// The cluster tier through two real daemons — two "nodes", each with its own pool and socket —
// sharing a real 3-master Redis Cluster (issue 19): blocks a client puts on node A leave A's
// pool for the cluster (the mover writes them there ahead of eviction), and the same prompt
// opened on node B is a cluster hit: loaded into B's pool, verified, published, and read back
// with GetBlocks byte for byte. A corrupted value is a miss, counted; a daemon whose cluster is
// unreachable starts and serves, all misses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cache/pool_spec.h"
#include "client/kv_cache_client.h"
#include "server/daemon.h"
#include "tests/testing/grpc_kept_alive.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/redis_cluster_suite.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

constexpr uint32_t kBlockSize = 16;  // DefaultPoolOptions'
constexpr uint32_t kPoolBlocks = 8;  // the offload window covers the whole pool
constexpr uint32_t kPromptBlocks = 4;

// One daemon ("node") with a pool "tiered" whose cluster tier is `seeds`.
struct Node {
  ScopedTempDir dir{"kvcache-node"};  // for the socket; outlives the daemon
  std::unique_ptr<Daemon> daemon;
  std::unique_ptr<KvCacheClient> client;
};

class ClusterTierClientTest : public testing::RedisClusterSuite<> {
 protected:
  static void SetUpTestSuite() {
    KeepGrpcInitialized();
    StartRedisCluster();
  }

  void TearDown() override {
    for (Node* node : {&a_, &b_}) {
      node->client.reset();
      if (node->daemon != nullptr) {
        for (Pool* pool : node->daemon->manager().pools()) EXPECT_OK(pool->CheckInvariants());
        node->daemon.reset();
      }
    }
  }

  void StartNode(Node& node, std::vector<std::string> seeds) {
    DaemonOptions options;
    options.listen = "unix://" + node.dir.File("kv.sock");
    PoolOptions pool = DefaultPoolOptions();
    pool.name = "tiered";
    pool.num_blocks = kPoolBlocks;
    pool.cluster_tier = RedisClusterOptions{.seeds = std::move(seeds)};
    pool.cluster_tier->retry_down_after = absl::Milliseconds(200);
    block_bytes_ = pool.layout.BlockBytes();
    options.pools.push_back(pool);
    absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options);
    ASSERT_OK(daemon);
    node.daemon = *std::move(daemon);
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(options.listen);
    ASSERT_OK(client);
    node.client = *std::move(client);
    ASSERT_OK(node.client->OpenSession("default", "cluster-test"));
  }

  std::vector<uint32_t> Prompt(uint32_t first, uint32_t blocks) const {
    std::vector<uint32_t> tokens(blocks * kBlockSize);
    for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = first + i;
    return tokens;
  }
  // Printable bytes (redis-cli shows them as they are), distinct per block.
  std::string Bytes(const std::vector<uint32_t>& tokens) const {
    std::string bytes((tokens.size() / kBlockSize) * block_bytes_, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) {
      const uint64_t block = i / block_bytes_;
      bytes[i] = static_cast<char>('a' + (tokens[block * kBlockSize] + block * 3 + i * 7) % 26);
    }
    return bytes;
  }

  KvCacheClient::TierStats ClusterStats(Node& node) {
    absl::StatusOr<KvCacheClient::Stats> stats = node.client->GetStats("tiered");
    if (!stats.ok() || stats->pools.size() != 1) return {};
    for (const auto& tier : stats->pools[0].tiers) {
      if (tier.tier == "cluster") return tier;
    }
    return {};
  }

  // Puts `tokens` on node A and waits until A's mover has written `stored` blocks in all to the
  // cluster (the pool is small, so its free blocks are below the offload window at once).
  void PutOnA(const std::vector<uint32_t>& tokens, uint64_t stored) {
    absl::StatusOr<KvCacheClient::PutResult> put =
        a_.client->PutBlocks("tiered", tokens, Bytes(tokens));
    ASSERT_OK(put);
    ASSERT_TRUE(PollUntil([&] { return ClusterStats(a_).stored_blocks >= stored; }))
        << "node A's mover wrote " << ClusterStats(a_).stored_blocks << " of " << stored;
  }

  uint64_t block_bytes_ = 0;
  Node a_;
  Node b_;
};

TEST_F(ClusterTierClientTest, APrefixPutOnOneNodeIsAHitOnAnother) {
  ASSERT_NO_FATAL_FAILURE(StartNode(a_, {redis_->address(0)}));
  ASSERT_NO_FATAL_FAILURE(StartNode(b_, {redis_->address(1)}));
  const std::vector<uint32_t> prompt = Prompt(1000, kPromptBlocks);
  ASSERT_NO_FATAL_FAILURE(PutOnA(prompt, kPromptBlocks));
  // A's router learns that A shared the prompt: EXTERNAL stores, live only (not in a snapshot,
  // since the cluster's evictions are never seen).
  KvEventLog& a_events = a_.daemon->manager().events();
  size_t external_blocks = 0;
  for (const auto& event : a_events.Read(a_events.first_sequence(), 1 << 20).events) {
    if (event->medium == "EXTERNAL") external_blocks += event->blocks.size();
  }
  EXPECT_EQ(external_blocks, kPromptBlocks);
  for (const KvEvent& event : a_events.TakeSnapshot(KvEventFilter{}).events) {
    EXPECT_NE(event.medium, "EXTERNAL");
  }

  // Node B never saw the prompt: its open loads the prefix from the cluster (one token is left
  // to compute, so the last full block is loaded too only when the prompt is longer).
  std::vector<uint32_t> longer = prompt;
  longer.push_back(7);
  absl::StatusOr<KvCacheClient::Sequence> opened = b_.client->OpenSequence("tiered", longer);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, kPromptBlocks * kBlockSize);
  EXPECT_EQ(opened->cached_tokens_by_tier.cluster, kPromptBlocks * kBlockSize);
  EXPECT_EQ(opened->cached_tokens_by_tier.pool, 0u);
  ASSERT_OK(b_.client->ReleaseSequence(opened->sequence_id));
  EXPECT_EQ(ClusterStats(b_).hit_blocks, kPromptBlocks);

  // Published in B's pool: a read there returns A's bytes, each block checked by its checksum.
  absl::StatusOr<KvCacheClient::GetResult> got = b_.client->GetBlocks("tiered", prompt);
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, kPromptBlocks);
  EXPECT_TRUE(got->bytes == Bytes(prompt));
  // A second open on B hits its own pool now.
  opened = b_.client->OpenSequence("tiered", longer);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->cached_tokens_by_tier.pool, kPromptBlocks * kBlockSize);
  EXPECT_EQ(opened->cached_tokens_by_tier.cluster, 0u);
  ASSERT_OK(b_.client->ReleaseSequence(opened->sequence_id));
}

TEST_F(ClusterTierClientTest, ACorruptedValueIsAMissCountedAndComputed) {
  // Only this test's records in the cluster, so its third block's value is found by its bytes.
  for (int node = 0; node < redis_->size(); ++node) ASSERT_OK(redis_->Cli(node, {"FLUSHALL"}));
  ASSERT_NO_FATAL_FAILURE(StartNode(a_, {redis_->address(0)}));
  ASSERT_NO_FATAL_FAILURE(StartNode(b_, {redis_->address(2)}));
  const std::vector<uint32_t> prompt = Prompt(5000, kPromptBlocks);
  ASSERT_NO_FATAL_FAILURE(PutOnA(prompt, kPromptBlocks));
  // A record of a 32 KiB block is two values (tiers/cluster_tier.h); the tail holds the block's
  // last bytes. Garble the third block's.
  const std::string third = Bytes(prompt).substr(2 * block_bytes_, block_bytes_);
  int corrupted = 0;
  for (int node = 0; node < redis_->size(); ++node) {
    absl::StatusOr<std::string> listed = redis_->Cli(node, {"--scan", "--pattern", "kvc2:*:t"});
    ASSERT_OK(listed);
    for (absl::string_view key : absl::StrSplit(*listed, '\n', absl::SkipEmpty())) {
      absl::StatusOr<std::string> value = redis_->Cli(node, {"GET", std::string(key)});
      ASSERT_OK(value);
      const absl::string_view tail = absl::StripTrailingAsciiWhitespace(*value);
      if (tail.size() < 16 || !absl::EndsWith(third, tail)) continue;
      ASSERT_OK(redis_->Cli(node, {"SETRANGE", std::string(key), "3", "XYZ"}));
      ++corrupted;
    }
  }
  ASSERT_EQ(corrupted, 1);
  std::vector<uint32_t> longer = prompt;
  longer.push_back(7);
  absl::StatusOr<KvCacheClient::Sequence> opened = b_.client->OpenSequence("tiered", longer);
  ASSERT_OK(opened);
  // Blocks 0 and 1 load; block 2 fails its checksum, so it and block 3 are computed.
  EXPECT_EQ(opened->cached_tokens_by_tier.cluster, 2 * kBlockSize);
  EXPECT_EQ(opened->num_cached_tokens, 2 * kBlockSize);
  EXPECT_EQ(ClusterStats(b_).verify_failures, 1u);
  ASSERT_OK(b_.client->ReleaseSequence(opened->sequence_id));
}

TEST_F(ClusterTierClientTest, ANodeWhoseClusterIsUnreachableStartsAndServes) {
  ASSERT_NO_FATAL_FAILURE(StartNode(a_, {"127.0.0.1:1"}));
  const std::vector<uint32_t> prompt = Prompt(9000, kPromptBlocks);
  ASSERT_OK(a_.client->PutBlocks("tiered", prompt, Bytes(prompt)));
  std::vector<uint32_t> other = Prompt(9500, kPromptBlocks + 1);
  absl::StatusOr<KvCacheClient::Sequence> opened = a_.client->OpenSequence("tiered", other);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 0u);
  ASSERT_OK(a_.client->ReleaseSequence(opened->sequence_id));
  EXPECT_EQ(ClusterStats(a_).stored_blocks, 0u);
  EXPECT_GE(ClusterStats(a_).load_failures, 1u);  // the misses, counted as unavailable
}

}  // namespace
}  // namespace kvcache::testing
