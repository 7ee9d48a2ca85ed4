// Issue 19's CI test: two kvcache-manager processes — two "nodes", each with its own socket and
// pool — share a real 3-master Redis Cluster as their cluster tier. A kvcache-worker on node A
// computes a prompt; A's mover writes the prompt's blocks to the cluster as they near eviction;
// on node B the same prompt's prefix is a cluster hit, loaded and verified, and a worker there
// generates tokens and logits bit-identical to a cold run. Tenants (bearer tokens of one identity
// file on both nodes) never share a block through the cluster. A Redis master killed mid-run
// costs misses for its keys, counted, never a failed request; once it is back, hits resume.
//
// Both pools have 8 blocks: the mover's offload window (at least 8 blocks) covers the whole
// pool, so every published block is written to the cluster once the worker releases it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "auth/identity_file.h"
#include "redis/redis_cluster.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/integration/worker_runner.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/redis_cluster_suite.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"
#include "tiers/record_codec.h"

namespace kvcache::testing {
namespace {

constexpr uint32_t kBlockSize = 16;
constexpr uint32_t kNewTokens = 12;
// 98 tokens: 6 full blocks cached at most (one prompt token is always computed) and, with the
// 11 decoded positions, 7 blocks in use: they fit an 8-block pool.
constexpr size_t kPromptTokens = 98;
constexpr uint32_t kPromptBlocks = 6;
constexpr uint32_t kPromptCachedTokens = kPromptBlocks * kBlockSize;
constexpr char kPool[] =
    "qwen:model=tiny:layers=3:kv_heads=2:head_dim=16:block_size=16:dtype=bf16:blocks=8";
constexpr absl::Duration kBound = absl::Seconds(20);
constexpr char kTokenX[] = "cluster-test-token-of-tenant-x-0123";
constexpr char kTokenY[] = "cluster-test-token-of-tenant-y-4567";

std::vector<uint32_t> Prompt(uint32_t seed) {
  std::vector<uint32_t> tokens(kPromptTokens);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = (seed * 131 + i * 7 + (i * i) % 13) % 256;
  }
  return tokens;
}

std::string TokenLine(const std::string& name, absl::string_view token, const std::string& tenant) {
  return absl::StrCat("token ", name, " ", TokenDigestText(token), " ", tenant, " worker\n");
}

// One kvcache-manager process and the test's own client of it (an admin by its uid).
struct Node {
  std::string target;
  std::optional<Subprocess> daemon;
  std::unique_ptr<KvCacheClient> observer;
};

class ClusterTierProcessTest : public testing::RedisClusterSuite<> {
 protected:
  static void SetUpTestSuite() {
    const char* bin_dir = std::getenv("KVCACHE_BIN_DIR");
    ASSERT_NE(bin_dir, nullptr) << "KVCACHE_BIN_DIR must name the folder of kvcache-manager";
    StartRedisCluster();
    absl::StatusOr<WorkerRunner> runner =
        WorkerRunner::Create(bin_dir, KVCACHE_TINY_CHECKPOINT_DIR, kBlockSize, kNewTokens);
    ASSERT_OK(runner);
    runner_ = new WorkerRunner(*std::move(runner));
  }
  static void TearDownTestSuite() {
    delete runner_;
    runner_ = nullptr;
    StopRedisCluster();
  }

  void SetUp() override {
    ASSERT_NE(redis_, nullptr);
    ASSERT_NE(runner_, nullptr);
    {
      std::ofstream out(dir_.File("identities"));
      out << "tenant tenant-x\ntenant tenant-y\n"
          << "uid " << getuid() << " tenant-x admin\n"
          << TokenLine("x-worker", kTokenX, "tenant-x")
          << TokenLine("y-worker", kTokenY, "tenant-y");
      std::ofstream(dir_.File("token-x")) << kTokenX << "\n";
      std::ofstream(dir_.File("token-y")) << kTokenY << "\n";
    }
    ASSERT_NO_FATAL_FAILURE(StartNode(a_, "a"));
    ASSERT_NO_FATAL_FAILURE(StartNode(b_, "b"));
  }

  void TearDown() override {
    for (Node* node : {&a_, &b_}) {
      node->observer.reset();
      if (node->daemon.has_value()) {
        EXPECT_OK(StopManager(*node->daemon, kBound));
      }
    }
  }

  void StartNode(Node& node, const std::string& name) {
    node.target = "unix://" + dir_.File(name + ".sock");
    absl::StatusOr<Subprocess> daemon =
        StartManager(std::getenv("KVCACHE_BIN_DIR"),
                     {"--listen=" + node.target, std::string("--pool=") + kPool,
                      "--identities=" + dir_.File("identities"),
                      "--cluster_tier=redis://" + absl::StrJoin(redis_->addresses(), ",redis://")},
                     kBound);
    ASSERT_OK(daemon);
    node.daemon.emplace(*std::move(daemon));
    absl::StatusOr<std::unique_ptr<KvCacheClient>> observer = KvCacheClient::Connect(node.target);
    ASSERT_OK(observer);
    node.observer = *std::move(observer);
  }

  // A worker on `node` generating from `prompt`, as the uid's tenant (tenant-x) or with a token.
  ClientResult RunWorker(Node& node, const std::vector<uint32_t>& prompt,
                         const std::string& token_file = "") {
    std::vector<std::string> argv = runner_->Argv(node.target, "qwen", prompt);
    if (!token_file.empty()) argv.push_back("--token_file=" + dir_.File(token_file));
    return runner_->Run(argv, kBound);
  }

  KvCacheClient::TierStats Cluster(Node& node) {
    absl::StatusOr<KvCacheClient::Stats> stats = node.observer->GetStats("qwen");
    EXPECT_OK(stats);
    if (!stats.ok() || stats->pools.size() != 1) return {};
    for (const KvCacheClient::TierStats& tier : stats->pools[0].tiers) {
      if (tier.tier == "cluster") return tier;
    }
    ADD_FAILURE() << "no cluster tier in the stats";
    return {};
  }

  // Polls until `node`'s mover has sent `copies` blocks to the cluster in all, taken or not.
  bool AwaitCopiesSent(Node& node, uint64_t copies) {
    return PollUntil([&] {
      const KvCacheClient::TierStats tier = Cluster(node);
      return tier.stored_blocks + tier.store_failures >= copies;
    });
  }

  // For each of the prompt's blocks, the Redis node holding its record, read back from the
  // cluster itself: each node's keys, each record header decoded. -1 for a block with none.
  std::vector<int> RecordOwners(const std::vector<uint32_t>& prompt) {
    std::vector<int> owners(kPromptBlocks, -1);
    absl::StatusOr<std::unique_ptr<RedisCluster>> redis =
        RedisCluster::Create(RedisClusterOptions{.seeds = redis_->addresses()});
    EXPECT_OK(redis);
    if (!redis.ok()) return owners;
    for (int node = 0; node < redis_->size(); ++node) {
      absl::StatusOr<std::string> listed = redis_->Cli(node, {"--scan", "--pattern", "kvc2:*"});
      EXPECT_OK(listed);
      if (!listed.ok()) continue;
      std::vector<std::string> heads;
      for (absl::string_view key : absl::StrSplit(*listed, '\n', absl::SkipEmpty())) {
        if (!absl::EndsWith(key, ":t")) heads.emplace_back(key);  // tails hold bytes only
      }
      for (const absl::StatusOr<std::string>& value : (*redis)->Get(heads)) {
        if (!value.ok()) continue;
        absl::StatusOr<RecordHeader> header = DecodeRecordHeader(*value);
        if (!header.ok()) continue;
        for (uint32_t block = 0; block < kPromptBlocks; ++block) {
          const auto first = prompt.begin() + block * kBlockSize;
          if (std::equal(first, first + kBlockSize, header->block.tokens.begin(),
                         header->block.tokens.end())) {
            owners[block] = node;
          }
        }
      }
    }
    return owners;
  }

  static WorkerRunner* runner_;
  ScopedTempDir dir_{"kvcache-cluster-nodes"};  // sockets, identities, tokens
  Node a_;
  Node b_;
};

WorkerRunner* ClusterTierProcessTest::runner_ = nullptr;

TEST_F(ClusterTierProcessTest, APromptComputedOnNodeAIsAClusterHitOnNodeBIdenticalToAColdRun) {
  const std::vector<uint32_t> prompt = Prompt(1);
  const ClientResult on_a = RunWorker(a_, prompt);
  EXPECT_EQ(on_a.num_cached_tokens, 0u);
  runner_->ExpectMatchesCold(on_a, prompt);
  ASSERT_TRUE(AwaitCopiesSent(a_, kPromptBlocks));
  EXPECT_EQ(Cluster(a_).stored_blocks, kPromptBlocks);

  // Node B never saw the prompt: its 6 full blocks come from the cluster, verified, and the
  // worker computes the last 2 prompt tokens and decodes over them.
  const ClientResult on_b = RunWorker(b_, prompt);
  EXPECT_EQ(on_b.num_cached_tokens, kPromptCachedTokens);
  EXPECT_EQ(on_b.Number("cached_cluster"), kPromptCachedTokens);
  EXPECT_EQ(on_b.Number("cached_host"), 0);
  runner_->ExpectMatchesCold(on_b, prompt);
  const KvCacheClient::TierStats b_tier = Cluster(b_);
  EXPECT_EQ(b_tier.hit_blocks, kPromptBlocks);
  EXPECT_EQ(b_tier.load_failures, 0u);
  EXPECT_EQ(b_tier.verify_failures, 0u);

  // Published on B: the next run there hits B's own pool.
  const ClientResult again = RunWorker(b_, prompt);
  EXPECT_EQ(again.num_cached_tokens, kPromptCachedTokens);
  EXPECT_EQ(again.Number("cached_cluster"), 0);
  runner_->ExpectMatchesCold(again, prompt);
}

// Regression: a block a node loaded from the cluster was written back to the cluster by that
// node's mover — the same value under the same key, a second write of every shared block per node
// that hits it. Loaded blocks are now marked as in the cluster when published
// (BlockPool::IsInCluster).
TEST_F(ClusterTierProcessTest, ABlockLoadedFromTheClusterIsNotWrittenBack) {
  const std::vector<uint32_t> prompt = Prompt(5);
  runner_->ExpectMatchesCold(RunWorker(a_, prompt), prompt);
  ASSERT_TRUE(AwaitCopiesSent(a_, kPromptBlocks));
  const ClientResult on_b = RunWorker(b_, prompt);
  ASSERT_EQ(on_b.Number("cached_cluster"), kPromptCachedTokens);
  // Another prompt computed on B: its own blocks are B's to send. Once they are all in the
  // cluster, B's mover has passed over the loaded ones (they were older in B's LRU).
  const std::vector<uint32_t> other = Prompt(6);
  runner_->ExpectMatchesCold(RunWorker(b_, other), other);
  ASSERT_TRUE(PollUntil([&] {
    const std::vector<int> owners = RecordOwners(other);
    return std::find(owners.begin(), owners.end(), -1) == owners.end();
  }));
  ASSERT_TRUE(AwaitCopiesSent(b_, kPromptBlocks));
  const KvCacheClient::TierStats b_tier = Cluster(b_);
  EXPECT_EQ(b_tier.stored_blocks + b_tier.store_failures, kPromptBlocks)
      << "node B wrote back blocks it had loaded from the cluster";
}

TEST_F(ClusterTierProcessTest, TenantsNeverShareABlockThroughTheCluster) {
  const std::vector<uint32_t> prompt = Prompt(2);
  runner_->ExpectMatchesCold(RunWorker(a_, prompt, "token-x"), prompt);
  ASSERT_TRUE(AwaitCopiesSent(a_, kPromptBlocks));
  EXPECT_EQ(Cluster(a_).stored_blocks, kPromptBlocks);

  // Tenant Y asks node B for the very prompt tenant X put in the cluster: nothing of X's is
  // found (its keys are X's namespace), so Y computes it all.
  const ClientResult y_on_b = RunWorker(b_, prompt, "token-y");
  EXPECT_EQ(y_on_b.num_cached_tokens, 0u);
  EXPECT_EQ(y_on_b.Number("cached_cluster"), 0);
  runner_->ExpectMatchesCold(y_on_b, prompt);
  EXPECT_EQ(Cluster(b_).hit_blocks, 0u);

  // Tenant X on node B hits X's blocks in the cluster (Y's, now in B's pool, are not X's either).
  const ClientResult x_on_b = RunWorker(b_, prompt, "token-x");
  EXPECT_EQ(x_on_b.num_cached_tokens, kPromptCachedTokens);
  EXPECT_EQ(x_on_b.Number("cached_cluster"), kPromptCachedTokens);
  runner_->ExpectMatchesCold(x_on_b, prompt);
  EXPECT_EQ(Cluster(b_).hit_blocks, kPromptBlocks);
}

TEST_F(ClusterTierProcessTest, AKilledMasterCostsMissesForItsKeysAndHitsResumeWhenItIsBack) {
  // Only this test's records in the cluster, so that where each lives can be read back.
  for (int node = 0; node < redis_->size(); ++node) ASSERT_OK(redis_->Cli(node, {"FLUSHALL"}));
  const std::vector<uint32_t> prompt = Prompt(3);
  runner_->ExpectMatchesCold(RunWorker(a_, prompt), prompt);
  ASSERT_TRUE(AwaitCopiesSent(a_, kPromptBlocks));
  ASSERT_EQ(Cluster(a_).stored_blocks, kPromptBlocks);
  const std::vector<int> owners = RecordOwners(prompt);
  ASSERT_THAT(owners, ::testing::Not(::testing::Contains(-1)));
  // The victim: the master whose first record of the prompt comes last, so that B loads the
  // blocks before it (from the live masters) and computes the rest.
  int victim = -1;
  uint32_t victims_first = 0;
  for (int node = 0; node < redis_->size(); ++node) {
    const auto first = std::find(owners.begin(), owners.end(), node);
    if (first == owners.end()) continue;
    const uint32_t block = static_cast<uint32_t>(first - owners.begin());
    if (victim == -1 || block > victims_first) {
      victim = node;
      victims_first = block;
    }
  }
  ASSERT_NE(victim, -1);
  ASSERT_OK(redis_->Kill(victim));

  // B: the blocks before the victim's first load; that one is a miss, counted; the worker's
  // request succeeds and its output is the cold run's.
  const ClientResult on_b = RunWorker(b_, prompt);
  EXPECT_EQ(on_b.Number("cached_cluster"), victims_first * kBlockSize);
  EXPECT_EQ(on_b.num_cached_tokens, victims_first * kBlockSize);
  runner_->ExpectMatchesCold(on_b, prompt);
  EXPECT_EQ(Cluster(b_).load_failures, 1u);
  EXPECT_EQ(Cluster(b_).hit_blocks, victims_first);
  // A goes on too: its mover's copies to the dead master fail, each counted, none retried.
  const uint64_t a_sent = Cluster(a_).stored_blocks + Cluster(a_).store_failures;
  const std::vector<uint32_t> during = Prompt(4);
  runner_->ExpectMatchesCold(RunWorker(a_, during), during);
  ASSERT_TRUE(AwaitCopiesSent(a_, a_sent + kPromptBlocks));

  // The master comes back on its port, empty. Each try is a new prompt computed on A, sent to the
  // cluster, and run on B; hits have resumed when B loads all of a prompt one of whose records
  // is on the master that came back. A client that saw the master fail rests it for a while
  // (RedisClusterOptions::retry_down_after) and its first use of the old connection fails,
  // so the first tries may miss; they are bounded.
  ASSERT_OK(redis_->Restart(victim));
  bool resumed = false;
  int tries = 0;
  for (uint32_t seed = 10; seed < 30 && !resumed; ++seed) {
    ++tries;
    const std::vector<uint32_t> next = Prompt(seed);
    const KvCacheClient::TierStats before = Cluster(a_);
    runner_->ExpectMatchesCold(RunWorker(a_, next), next);
    ASSERT_TRUE(AwaitCopiesSent(a_, before.stored_blocks + before.store_failures + kPromptBlocks));
    const ClientResult hit = RunWorker(b_, next);
    runner_->ExpectMatchesCold(hit, next);
    const std::vector<int> next_owners = RecordOwners(next);
    resumed = hit.Number("cached_cluster") == kPromptCachedTokens &&
              std::find(next_owners.begin(), next_owners.end(), victim) != next_owners.end();
  }
  EXPECT_TRUE(resumed);
  std::printf(
      "cluster tier: master %d killed (first record: block %u); hits resumed after %d "
      "prompt(s); A's copies refused: %llu\n",
      victim, victims_first, tries, static_cast<unsigned long long>(Cluster(a_).store_failures));
}

}  // namespace
}  // namespace kvcache::testing
