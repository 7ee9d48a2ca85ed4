// Pools over a real 3-master Redis Cluster (tests/testing/redis_cluster_process.h), on every pool
// memory of tests/testing/pool_memories.h: what one pool's mover sends to the cluster is a hit in
// another pool (another node's daemon) with identical bytes. Under device memory (staged, cuda)
// the copies to the cluster are D2H (into the tier-2 slot, or the copy itself without one) and
// its records come up in H2D batches from a staging buffer of the load's own.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "cache/pool.h"
#include "common/cuda/cuda_device.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/pool_memories.h"
#include "tests/testing/redis_cluster_suite.h"
#include "tests/testing/small_pool_options.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_files.h"
#include "tests/testing/tier_keys.h"

namespace kvcache {
namespace {

using ::kvcache::testing::PoolMemoryKind;
using ::kvcache::testing::Tokens;

constexpr uint32_t kBlockSize = 4;

class PoolClusterTierTest
    : public testing::RedisClusterSuite<::testing::TestWithParam<PoolMemoryKind>> {
 protected:
  // Started by the first test that runs, so that a run whose every case skips (the CUDA ones
  // without a device) starts no cluster.
  static void SetUpTestSuite() {}

  // Each test begins with the suite's cluster empty and every node running.
  void SetUp() override {
    if (GetParam() == PoolMemoryKind::kCuda && !CudaDeviceAvailable()) {
      GTEST_SKIP() << "no CUDA device";
    }
    if (redis_ == nullptr && redis_dir_ == nullptr) StartRedisCluster();
    RedisClusterSuite::SetUp();
    for (int node = 0; node < redis_->size(); ++node) {
      ASSERT_OK(redis_->Resume(node));
      ASSERT_OK(redis_->Cli(node, {"FLUSHALL"}));
    }
  }

  // A node's pool: 8 blocks, a 16-slot tier 2 if `host_tier`, the cluster below (its nodes
  // rested for `retry_down_after` after a failure), its pages of `parts` (a pool spec's
  // value; empty: none declared).
  std::unique_ptr<Pool> MakePool(const std::string& name, bool host_tier,
                                 absl::Duration retry_down_after = absl::Seconds(1),
                                 absl::string_view parts = "",
                                 std::shared_ptr<const TierKeyring> keyring = nullptr) {
    PoolOptions options = testing::SmallPoolOptions(name, 8, kBlockSize);
    options.tier_keyring = std::move(keyring);
    if (options.tier_keyring != nullptr) options.workers = seal_workers_;
    if (host_tier) options.host_tier_bytes = 16 * options.layout.BlockBytes();
    if (!parts.empty()) {
      absl::StatusOr<std::vector<PagePartLayout>> parsed =
          ParsePageParts(parts, options.layout.BlockBytes());
      EXPECT_OK(parsed);
      if (parsed.ok()) options.parts = *std::move(parsed);
    }
    options.cluster_tier = RedisClusterOptions{.seeds = redis_->addresses()};
    options.cluster_tier->io_timeout = absl::Seconds(30);  // only a request's deadline cuts
    options.cluster_tier->retry_down_after = retry_down_after;
    options.testing_manual_offload = true;
    auto memory =
        testing::CreatePoolMemory(GetParam(), options.layout.BlockBytes(), options.num_blocks);
    EXPECT_OK(memory);
    if (!memory.ok()) return nullptr;
    auto pool = Pool::Create(options, 0, *std::move(memory));
    EXPECT_OK(pool);
    return pool.ok() ? *std::move(pool) : nullptr;
  }

  static std::string BlockBytes(const Pool& pool, const std::vector<uint32_t>& tokens, size_t i) {
    std::string bytes(pool.options().layout.BlockBytes(), '\0');
    for (size_t b = 0; b < bytes.size(); ++b) {
      bytes[b] = static_cast<char>(tokens[i * kBlockSize + b % kBlockSize] * 5 + b);
    }
    return bytes;
  }

  // A's copy of `prompt`'s four full blocks, committed with `part_masks` (none: every part),
  // offloaded to the cluster.
  void OffloadPrompt(Pool& a, const std::vector<uint32_t>& prompt,
                     std::vector<uint32_t> part_masks = {}) {
    ASSERT_NO_FATAL_FAILURE(CommitPrompt(a, prompt, std::move(part_masks), OpenMode::kCompute));
    ASSERT_EQ(a.Stats().cluster_tier->stored_blocks, 4u);
  }
  // The node's copy of `prompt`'s four full blocks, opened in `mode` (kPut: computed on the node,
  // never loaded from the cluster), committed with `part_masks` and passed down.
  void CommitPrompt(Pool& node, const std::vector<uint32_t>& prompt,
                    std::vector<uint32_t> part_masks, OpenMode mode) {
    auto opened = node.Open(session_, SequenceSpec{.tokens = prompt}, mode);
    ASSERT_OK(opened);
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_OK(node.WriteBlock(opened->block_ids[i], 0, BlockBytes(node, prompt, i)));
    }
    ASSERT_OK(node.Commit(session_, opened->sequence_id, 4 * kBlockSize, std::move(part_masks)));
    ASSERT_OK(node.Release(session_, opened->sequence_id));
    node.OffloadForTesting();
  }

  static TierStatsRow ClusterRow(const Pool& pool) {
    for (const TierStatsRow& row : pool.Stats().tiers) {
      if (row.tier == "cluster") return row;
    }
    ADD_FAILURE() << "no cluster row";
    return {};
  }

  std::shared_ptr<TaskWorkers> seal_workers_ = std::make_shared<TaskWorkers>(2);
  Session session_{1, "uid:1", "tenant-a", "test", absl::Seconds(10)};
};

INSTANTIATE_TEST_SUITE_P(Memories, PoolClusterTierTest, testing::AllPoolMemories(),
                         testing::PoolMemoryName);

// Issue 33: nodes sealing with the same key file share blocks through the cluster, identical;
// a node with another master key, or one that does not seal, finds nothing there.
TEST_P(PoolClusterTierTest, SealedNodesShareOnlyWithTheSameKeys) {
  const auto keyring = [](char fill) {
    return testing::TestTierKeyring({testing::TestTierKey(1, fill)});
  };
  std::unique_ptr<Pool> a = MakePool("node-a", true, absl::Seconds(1), "", keyring(1));
  std::unique_ptr<Pool> b = MakePool("node-b", false, absl::Seconds(1), "", keyring(1));
  std::unique_ptr<Pool> other_key = MakePool("node-c", false, absl::Seconds(1), "", keyring(2));
  std::unique_ptr<Pool> unsealed = MakePool("node-d", false);
  ASSERT_TRUE(a && b && other_key && unsealed);
  const std::vector<uint32_t> prompt = Tokens(700, 17);
  OffloadPrompt(*a, prompt);
  for (Pool* miss : {other_key.get(), unsealed.get()}) {
    auto opened = miss->Open(session_, SequenceSpec{.tokens = prompt}, OpenMode::kCompute);
    ASSERT_OK(opened);
    EXPECT_EQ(opened->num_cluster_tier_tokens, 0u) << miss->options().name;
    ASSERT_OK(miss->Release(session_, opened->sequence_id));
  }
  auto hit = b->Open(session_, SequenceSpec{.tokens = prompt}, OpenMode::kCompute);
  ASSERT_OK(hit);
  EXPECT_EQ(hit->num_cluster_tier_tokens, 16u);
  for (size_t i = 0; i < 4; ++i) {
    std::string bytes(b->options().layout.BlockBytes(), '\0');
    ASSERT_OK(b->ReadBlock(hit->block_ids[i], 0, bytes.size(), bytes.data()));
    EXPECT_EQ(bytes, BlockBytes(*b, prompt, i)) << "block " << i;
  }
  ASSERT_OK(b->Release(session_, hit->sequence_id));
  EXPECT_EQ(ClusterRow(*b).open_failures, 0u);
  EXPECT_OK(b->CheckInvariants());
}

// Pools with and without a tier 2 (one cluster start for both).
TEST_P(PoolClusterTierTest, APrefixOffloadedByOnePoolIsAVerifiedHitInAnother) {
  for (const bool host_tier : {true, false}) {
    SCOPED_TRACE(host_tier ? "with a tier 2" : "without a tier 2");
    std::unique_ptr<Pool> a = MakePool("node-a", host_tier);
    std::unique_ptr<Pool> b = MakePool("node-b", host_tier);
    ASSERT_NE(a, nullptr);
    ASSERT_NE(b, nullptr);
    const std::vector<uint32_t> prompt = Tokens(host_tier ? 100 : 300, 17);  // four full blocks
    auto opened = a->Open(session_, SequenceSpec{.tokens = prompt}, OpenMode::kCompute);
    ASSERT_OK(opened);
    for (size_t i = 0; i < 4; ++i) {
      ASSERT_OK(a->WriteBlock(opened->block_ids[i], 0, BlockBytes(*a, prompt, i)));
    }
    ASSERT_OK(a->Commit(session_, opened->sequence_id, prompt.size()));
    ASSERT_OK(a->Release(session_, opened->sequence_id));
    EXPECT_EQ(a->OffloadForTesting(), host_tier ? 4u : 0u);  // tier 2; the cluster in the batch
    EXPECT_EQ(a->Stats().cluster_tier->stored_blocks, 4u);

    auto hit = b->Open(session_, SequenceSpec{.tokens = prompt}, OpenMode::kCompute);
    ASSERT_OK(hit);
    EXPECT_EQ(hit->num_cached_tokens, 16u);
    EXPECT_EQ(hit->num_cluster_tier_tokens, 16u);
    for (size_t i = 0; i < 4; ++i) {
      std::string bytes(b->options().layout.BlockBytes(), '\0');
      ASSERT_OK(b->ReadBlock(hit->block_ids[i], 0, bytes.size(), bytes.data()));
      EXPECT_EQ(bytes, BlockBytes(*b, prompt, i)) << "block " << i;
    }
    ASSERT_OK(b->Release(session_, hit->sequence_id));
    // Loaded from the cluster: never sent back to it, nor (so far) to tier 2.
    b->OffloadForTesting();
    EXPECT_EQ(b->Stats().cluster_tier->stored_blocks, 0u);
    EXPECT_OK(a->CheckInvariants());
    EXPECT_OK(b->CheckInvariants());
  }
}

// Pages named by keys (DESIGN §13) on a two-part pool: what node A passed down is a hit on node
// B, byte for byte, with each page's parts as A stored them; another manifest misses.
TEST_P(PoolClusterTierTest, PagesPassedDownByOneNodeAreHitsOnAnotherWithTheirParts) {
  const auto make = [&](const std::string& name) {
    return MakePool(name, /*host_tier=*/false, absl::Seconds(1), "kv/96+state/32/trailing1");
  };
  const auto manifest = [](const std::string& config) {
    return *CompatibilityManifest::Create(ManifestFields{.model_id = "model",
                                                         .model_config_digest = config,
                                                         .kv_dtype = "fp32",
                                                         .page_tokens = kBlockSize,
                                                         .parts = {{"kv", 96}, {"state", 32}}});
  };
  std::unique_ptr<Pool> a = make("node-a");
  std::unique_ptr<Pool> b = make("node-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  Session engine{2, "uid:1", "tenant-a", "engine", absl::Seconds(10), manifest("cfg")};
  const std::vector<std::string> keys = {"page-0", "page-1", "page-2"};
  const std::vector<uint32_t> masks = {1, 1, 3};  // kv on each, the state on the last
  const auto page_bytes = [&](size_t i) {
    return std::string(a->options().layout.BlockBytes(), static_cast<char>('a' + i));
  };
  auto reserved = a->ReservePages(engine, keys, masks);
  ASSERT_OK(reserved);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_OK(a->WriteBlock(reserved->block_ids[i], 0, page_bytes(i)));
  }
  ASSERT_OK(a->CommitPages(engine, reserved->sequence_id));
  a->OffloadForTesting();
  ASSERT_EQ(a->Stats().cluster_tier->stored_blocks, 3u);

  auto exists = b->ExistsPages(engine, keys, /*wanted=*/3);
  ASSERT_OK(exists);
  EXPECT_EQ(exists->num_pages, 3u);
  EXPECT_EQ(exists->by_tier.cluster, 3u);
  auto exists_kv = b->ExistsPages(engine, {keys[0], keys[1]}, /*wanted=*/3);
  ASSERT_OK(exists_kv);
  EXPECT_EQ(exists_kv->num_pages, 0u);  // no state at either endpoint
  auto acquired = b->AcquirePages(engine, keys, /*wanted=*/3, 0);
  ASSERT_OK(acquired);
  ASSERT_EQ(acquired->block_ids.size(), 3u);
  EXPECT_EQ(acquired->by_tier.cluster, 3u);
  EXPECT_EQ(acquired->part_masks, masks);
  for (size_t i = 0; i < keys.size(); ++i) {
    std::string bytes(b->options().layout.BlockBytes(), '\0');
    ASSERT_OK(b->ReadBlock(acquired->block_ids[i], 0, bytes.size(), bytes.data()));
    EXPECT_EQ(bytes, page_bytes(i)) << "page " << i;
  }
  ASSERT_OK(b->Release(engine, acquired->sequence_id));
  Session other{3, "uid:1", "tenant-a", "engine", absl::Seconds(10), manifest("cfg-2")};
  std::unique_ptr<Pool> c = make("node-c");
  ASSERT_NE(c, nullptr);
  auto missed = c->AcquirePages(other, keys, 1, 0);
  ASSERT_OK(missed);
  EXPECT_TRUE(missed->block_ids.empty());
  ASSERT_OK(c->Release(other, missed->sequence_id));
  EXPECT_OK(a->CheckInvariants());
  EXPECT_OK(b->CheckInvariants());
  EXPECT_OK(c->CheckInvariants());
}

// Token blocks with parts (DESIGN §13): what node A committed with a state on its third block
// only is, on node B, a hit that ends where every asked part restores (three blocks with the
// state asked for, four without), with A's masks and bytes.
TEST_P(PoolClusterTierTest, TokenBlocksPassedDownKeepTheirPartsAndTheHitRule) {
  const auto make = [&](const std::string& name) {
    return MakePool(name, /*host_tier=*/false, absl::Seconds(1), "kv/96+state/32/trailing1");
  };
  std::unique_ptr<Pool> a = make("node-a");
  std::unique_ptr<Pool> b = make("node-b");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  constexpr uint32_t kKv = 1, kBoth = 3;
  const std::vector<uint32_t> prompt = Tokens(500, 17);  // four full blocks
  ASSERT_NO_FATAL_FAILURE(OffloadPrompt(*a, prompt, {kKv, kKv, kBoth, kKv}));

  const SequenceSpec with_state{.tokens = prompt, .wanted_parts = kBoth};
  auto found = b->Lookup("tenant-a", with_state);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_cached_tokens, 0u);  // Lookup does not ask the cluster
  auto hit = b->Open(session_, with_state, OpenMode::kCompute);
  ASSERT_OK(hit);
  EXPECT_EQ(hit->num_cached_tokens, 12u);
  EXPECT_EQ(hit->num_cluster_tier_tokens, 12u);
  EXPECT_EQ(hit->part_masks, (std::vector<uint32_t>{kKv, kKv, kBoth}));
  for (size_t i = 0; i < 3; ++i) {
    std::string bytes(b->options().layout.BlockBytes(), '\0');
    ASSERT_OK(b->ReadBlock(hit->block_ids[i], 0, bytes.size(), bytes.data()));
    EXPECT_EQ(bytes, BlockBytes(*b, prompt, i)) << "block " << i;
  }
  ASSERT_OK(b->Release(session_, hit->sequence_id));
  // The KV alone restores all four; the fourth comes up from the cluster now.
  auto kv_only =
      b->Open(session_, SequenceSpec{.tokens = prompt, .wanted_parts = kKv}, OpenMode::kCompute);
  ASSERT_OK(kv_only);
  EXPECT_EQ(kv_only->num_cached_tokens, 16u);
  EXPECT_EQ(kv_only->part_masks, (std::vector<uint32_t>{kKv, kKv, kBoth, kKv}));
  ASSERT_OK(b->Release(session_, kv_only->sequence_id));
  EXPECT_OK(a->CheckInvariants());
  EXPECT_OK(b->CheckInvariants());
}

// Superseding through the cluster (DESIGN §13): node C's copy of the prompt with the state on
// its last block replaces the KV-only copy node A sent (a value's name does not depend on its
// parts), its blocks with no more parts than the cluster's are kept back, and node D's KV-only
// copy sent later never overwrites the richer one: node B still hits all four with the state.
TEST_P(PoolClusterTierTest, ARicherCopySupersedesTheClustersAndAPoorerOneNeverDoes) {
  const auto make = [&](const std::string& name) {
    return MakePool(name, /*host_tier=*/false, absl::Seconds(1), "kv/96+state/32/trailing1");
  };
  std::unique_ptr<Pool> a = make("node-a");
  std::unique_ptr<Pool> b = make("node-b");
  std::unique_ptr<Pool> c = make("node-c");
  std::unique_ptr<Pool> d = make("node-d");
  ASSERT_TRUE(a && b && c && d);
  constexpr uint32_t kKv = 1, kBoth = 3;
  const std::vector<uint32_t> prompt = Tokens(800, 17);  // four full blocks
  const auto send = [&](Pool& node, std::vector<uint32_t> part_masks) {
    CommitPrompt(node, prompt, std::move(part_masks), OpenMode::kPut);
  };
  const SequenceSpec with_state{.tokens = prompt, .wanted_parts = kBoth};
  ASSERT_NO_FATAL_FAILURE(send(*a, {kKv, kKv, kKv, kKv}));
  EXPECT_EQ(a->Stats().cluster_tier->stored_blocks, 4u);

  ASSERT_NO_FATAL_FAILURE(send(*c, {kKv, kKv, kKv, kBoth}));
  EXPECT_EQ(c->Stats().cluster_tier->stored_blocks, 1u);  // the block with the state
  EXPECT_EQ(c->Stats().cluster_tier->poorer_kept_back, 3u);

  ASSERT_NO_FATAL_FAILURE(send(*d, {kKv, kKv, kKv, kKv}));
  EXPECT_EQ(d->Stats().cluster_tier->stored_blocks, 0u);
  EXPECT_EQ(d->Stats().cluster_tier->poorer_kept_back, 4u);

  auto hit = b->Open(session_, with_state, OpenMode::kCompute);
  ASSERT_OK(hit);
  EXPECT_EQ(hit->num_cached_tokens, 16u);
  EXPECT_EQ(hit->num_cluster_tier_tokens, 16u);
  EXPECT_EQ(hit->part_masks, (std::vector<uint32_t>{kKv, kKv, kKv, kBoth}));
  for (size_t i = 0; i < 4; ++i) {
    std::string bytes(b->options().layout.BlockBytes(), '\0');
    ASSERT_OK(b->ReadBlock(hit->block_ids[i], 0, bytes.size(), bytes.data()));
    EXPECT_EQ(bytes, BlockBytes(*b, prompt, i)) << "block " << i;
  }
  ASSERT_OK(b->Release(session_, hit->sequence_id));
  for (Pool* node : {a.get(), b.get(), c.get(), d.get()}) EXPECT_OK(node->CheckInvariants());
}

// Regression (issue 29): without a tier 2, a put evicting blocks the mover had not sent yet lost
// them. The evicting request copies them and the mover sends them (a request never waits on the
// network): another node then hits them.
TEST_P(PoolClusterTierTest, BlocksEvictedBeforeTheMoverSentThemStillReachTheCluster) {
  std::unique_ptr<Pool> a = MakePool("node-a", /*host_tier=*/false);
  std::unique_ptr<Pool> b = MakePool("node-b", /*host_tier=*/false);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const auto put = [&](const std::vector<uint32_t>& tokens) {
    auto opened = a->Open(session_, SequenceSpec{.tokens = tokens}, OpenMode::kPut);
    ASSERT_OK(opened);
    for (size_t i = 0; i < opened->block_ids.size(); ++i) {
      ASSERT_OK(a->WriteBlock(opened->block_ids[i], 0, BlockBytes(*a, tokens, i)));
    }
    ASSERT_OK(a->Commit(session_, opened->sequence_id, tokens.size()));
    ASSERT_OK(a->Release(session_, opened->sequence_id));
  };
  const std::vector<uint32_t> first = Tokens(700, 32);  // the whole pool
  put(first);
  put(Tokens(900, 32));  // evicts all of `first`, which the mover has not sent
  EXPECT_EQ(a->Stats().cluster_tier->stored_blocks, 0u);
  a->OffloadForTesting();  // the mover sends what the put passed down (and the put's own)
  EXPECT_EQ(a->Stats().cluster_tier->stored_blocks, 16u);
  EXPECT_EQ(a->Stats().cluster_tier->backlog_dropped, 0u);

  auto hit = b->Open(session_, SequenceSpec{.tokens = first}, OpenMode::kCompute);
  ASSERT_OK(hit);
  EXPECT_EQ(hit->num_cluster_tier_tokens, 28u);  // capped: the last token is computed
  for (size_t i = 0; i < 7; ++i) {
    std::string bytes(b->options().layout.BlockBytes(), '\0');
    ASSERT_OK(b->ReadBlock(hit->block_ids[i], 0, bytes.size(), bytes.data()));
    EXPECT_EQ(bytes, BlockBytes(*b, first, i)) << "block " << i;
  }
  EXPECT_OK(a->CheckInvariants());
  EXPECT_OK(b->CheckInvariants());
}

// Issue 31: what one node passed down for a session bound to a compatibility manifest is a hit on
// another node for sessions of an equal manifest only, never for another TP rank's or for a
// session without one.
TEST_P(PoolClusterTierTest, ARecordInTheClusterIsAHitForItsOwnManifestOnly) {
  std::unique_ptr<Pool> a = MakePool("node-a", false);
  std::unique_ptr<Pool> b = MakePool("node-b", false);
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const PoolLayout& layout = a->options().layout;
  ManifestFields fields{.model_id = "m",
                        .model_config_digest = "rope",
                        .kv_dtype = std::string(DTypeName(layout.dtype)),
                        .page_tokens = layout.block_size,
                        .parts = {{"kv", layout.BlockBytes()}},
                        .parallel = {.tp_size = 2, .tp_rank = 0}};
  auto rank_zero = CompatibilityManifest::Create(fields);
  fields.parallel.tp_rank = 1;
  auto rank_one = CompatibilityManifest::Create(fields);
  ASSERT_OK(rank_zero);
  ASSERT_OK(rank_one);
  const Session writer{2, "uid:1", "tenant-a", "test", absl::Seconds(10), *rank_zero};
  const Session same{3, "uid:1", "tenant-a", "test", absl::Seconds(10), *rank_zero};
  const Session other{4, "uid:1", "tenant-a", "test", absl::Seconds(10), *rank_one};

  const std::vector<uint32_t> prompt = Tokens(500, 17);  // four full blocks
  auto opened = a->Open(writer, SequenceSpec{.tokens = prompt}, OpenMode::kCompute);
  ASSERT_OK(opened);
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_OK(a->WriteBlock(opened->block_ids[i], 0, BlockBytes(*a, prompt, i)));
  }
  ASSERT_OK(a->Commit(writer, opened->sequence_id, prompt.size()));
  ASSERT_OK(a->Release(writer, opened->sequence_id));
  a->OffloadForTesting();
  ASSERT_EQ(a->Stats().cluster_tier->stored_blocks, 4u);

  for (const Session* stranger : {&other, static_cast<const Session*>(&session_)}) {
    auto miss = b->Open(*stranger, SequenceSpec{.tokens = prompt}, OpenMode::kCompute);
    ASSERT_OK(miss);
    EXPECT_EQ(miss->num_cached_tokens, 0u);
    ASSERT_OK(b->Release(*stranger, miss->sequence_id));
  }
  EXPECT_EQ(ClusterRow(*b).hit_blocks, 0u);
  auto hit = b->Open(same, SequenceSpec{.tokens = prompt}, OpenMode::kCompute);
  ASSERT_OK(hit);
  EXPECT_EQ(hit->num_cluster_tier_tokens, 16u);
  for (size_t i = 0; i < 4; ++i) {
    std::string bytes(b->options().layout.BlockBytes(), '\0');
    ASSERT_OK(b->ReadBlock(hit->block_ids[i], 0, bytes.size(), bytes.data()));
    EXPECT_EQ(bytes, BlockBytes(*b, prompt, i)) << "block " << i;
  }
  ASSERT_OK(b->Release(same, hit->sequence_id));
  EXPECT_OK(b->CheckInvariants());
}

// The whole cluster hangs (every master SIGSTOPped) under opens with a max_load_ms: the first open
// pays its budget (the load is cut by its deadline: deadline_blocks) and rests the nodes it
// waited on; the opens that follow within the rest skip them — misses, counted in the cluster
// row's skipped_commands, never another deadline. After SIGCONT and the rest the prefix is a
// cluster hit again.
TEST_P(PoolClusterTierTest, AHungClusterCostsOneOpenItsBudgetThenIsSkippedUntilItAnswers) {
  std::unique_ptr<Pool> a = MakePool("node-a", false);
  std::unique_ptr<Pool> b = MakePool("node-b", false, absl::Seconds(5));
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  const std::vector<uint32_t> prompt = Tokens(400, 17);  // four full blocks
  ASSERT_NO_FATAL_FAILURE(OffloadPrompt(*a, prompt));
  const auto open = [&] {
    auto opened =
        b->Open(session_, SequenceSpec{.tokens = prompt, .max_load_ms = 1000}, OpenMode::kCompute);
    EXPECT_OK(opened);
    if (!opened.ok()) return uint32_t{0};
    EXPECT_OK(b->Release(session_, opened->sequence_id));
    return opened->num_cluster_tier_tokens;
  };
  // B's client has read the slot map (a prompt of its own, a miss everywhere), as a running
  // daemon's has.
  auto other = b->Open(session_, SequenceSpec{.tokens = Tokens(900, 17)}, OpenMode::kCompute);
  ASSERT_OK(other);
  ASSERT_OK(b->Release(session_, other->sequence_id));
  for (int node = 0; node < redis_->size(); ++node) ASSERT_OK(redis_->Pause(node));
  EXPECT_EQ(open(), 0u);
  const TierStatsRow first = ClusterRow(*b);
  EXPECT_EQ(first.deadline_blocks, 1u);
  EXPECT_GE(first.node_failures, 1u);
  EXPECT_EQ(first.skipped_commands, 0u);
  for (int following = 0; following < 4; ++following) EXPECT_EQ(open(), 0u);
  const TierStatsRow after = ClusterRow(*b);
  EXPECT_EQ(after.deadline_blocks, 1u);  // no open waited on a rested node again
  EXPECT_GE(after.skipped_commands, 4u);
  EXPECT_EQ(after.hit_blocks, 0u);

  for (int node = 0; node < redis_->size(); ++node) ASSERT_OK(redis_->Resume(node));
  // The rest ends 5 s after the first failure; on a loaded machine (the sanitizers' run beside
  // the fuzzers) the opens after it took up to 3.4 s more, and once more than the 10 s a
  // PollUntil waits by default.
  EXPECT_TRUE(testing::PollUntil([&] { return open() == 16; }, absl::Seconds(30)))
      << "the cluster did not serve again after its rest";
  EXPECT_OK(b->CheckInvariants());
}

}  // namespace
}  // namespace kvcache
