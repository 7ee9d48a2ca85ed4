// ClusterTier against a real 3-master Redis Cluster: chains stored and loaded verified, a prefix
// ending at the first block that is missing, corrupt, foreign or of another tenant, values split
// to fit jemalloc's size classes, and a master down.
#include "tiers/cluster_tier.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/redis_cluster_process.h"
#include "tests/testing/redis_cluster_suite.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/tiers/cluster_test_chains.h"
#include "tests/tiers/test_blocks.h"
#include "tiers/record_codec.h"

namespace kvcache {
namespace {

using ::kvcache::testing::PollUntil;
using ::kvcache::testing::StatusIs;

using ::kvcache::testing::Chain;
using ::kvcache::testing::MakeChain;

constexpr uint32_t kTokensPerBlock = testing::kChainTokensPerBlock;
constexpr uint64_t kBlockBytes = testing::kChainBlockBytes;

TEST(SizeClassTest, RoundsDownToJemallocClasses) {
  EXPECT_EQ(SizeClassAtMost(100), 96u);
  EXPECT_EQ(SizeClassAtMost(1000), 896u);
  EXPECT_EQ(SizeClassAtMost(32768), 32768u);
  EXPECT_EQ(SizeClassAtMost(32768 + 432), 32768u);
  EXPECT_EQ(SizeClassAtMost(40959), 32768u);
  EXPECT_EQ(SizeClassAtMost(40960), 40960u);
  EXPECT_EQ(SizeClassAtMost(1 << 20), 1u << 20);
  EXPECT_EQ(SizeClassAtMost((1 << 20) + (1 << 18) - 1), 1u << 20);
}

PoolIdentity Pool(const std::string& model = "test-model") {
  return PoolIdentity{.model_id = model,
                      .layout_fingerprint = 0x1234,
                      .hash_algorithm = HashAlgorithm::kXxh3_128,
                      .block_bytes = kBlockBytes};
}

// One cluster for the suite; tests use namespaces of their own, and one that kills a master
// restarts it.
class ClusterTierTest : public testing::RedisClusterSuite<> {
 protected:
  void SetUp() override {
    RedisClusterSuite::SetUp();
    tier_ = MakeTier(Pool(), true);
  }
  void TearDown() override { tier_.reset(); }

  std::unique_ptr<ClusterTier> MakeTier(const PoolIdentity& pool, bool fit_size_classes) {
    ClusterTierOptions options;
    options.redis.seeds = {redis_->address(0)};
    options.redis.retry_down_after = absl::Milliseconds(200);
    options.pool = pool;
    options.tokens_per_block = kTokensPerBlock;
    options.fit_size_classes = fit_size_classes;
    absl::StatusOr<std::unique_ptr<ClusterTier>> tier = ClusterTier::Create(options);
    EXPECT_OK(tier);
    return tier.ok() ? *std::move(tier) : nullptr;
  }

  void Store(ClusterTier& tier, const Chain& chain, std::vector<int> skip = {}) {
    std::vector<ClusterTier::Record> records;
    for (size_t i = 0; i < chain.identities.size(); ++i) {
      if (std::find(skip.begin(), skip.end(), static_cast<int>(i)) != skip.end()) continue;
      records.push_back({chain.identities[i], chain.bytes[i]});
    }
    for (const absl::Status& status : tier.Store(records)) ASSERT_OK(status);
  }

  static size_t Load(ClusterTier& tier, const std::vector<BlockRecordIdentity>& expected,
                     const Chain& chain) {
    return testing::LoadChecked(tier, expected, chain);
  }

  std::unique_ptr<ClusterTier> tier_;
};

TEST_F(ClusterTierTest, StoresAndLoadsAChainVerified) {
  EXPECT_LT(tier_->HeadDataBytes(), kBlockBytes);  // a 32 KiB block plus its header is split
  const Chain chain = MakeChain(8, 77);
  Store(*tier_, chain);
  EXPECT_EQ(Load(*tier_, chain.identities, chain), 8u);
  EXPECT_EQ(tier_->counters().loaded, 8u);
  EXPECT_EQ(tier_->counters().stored, 8u);
  // Another daemon (node B) with its own client reads what this one wrote.
  std::unique_ptr<ClusterTier> other_node = MakeTier(Pool(), true);
  EXPECT_EQ(Load(*other_node, chain.identities, chain), 8u);
}

TEST_F(ClusterTierTest, WithoutSplittingTheSameRoundTrip) {
  std::unique_ptr<ClusterTier> whole = MakeTier(Pool(), false);
  EXPECT_EQ(whole->HeadDataBytes(), kBlockBytes);
  const Chain chain = MakeChain(4, 5);
  Store(*whole, chain);
  EXPECT_EQ(Load(*whole, chain.identities, chain), 4u);
}

TEST_F(ClusterTierTest, APrefixEndsAtTheFirstMissingBlock) {
  const Chain chain = MakeChain(8, 78);
  Store(*tier_, chain, /*skip=*/{4});
  EXPECT_EQ(Load(*tier_, chain.identities, chain), 4u);
  EXPECT_EQ(tier_->counters().absent, 1u);
}

TEST_F(ClusterTierTest, CorruptTruncatedOrHalfMissingValuesAreMisses) {
  const Chain chain = MakeChain(6, 79);
  Store(*tier_, chain);
  const auto key = [&](int block) { return tier_->KeyOf(chain.identities[block]); };
  const auto node_of = [&](const std::string& k) {
    absl::StatusOr<int> node = redis_->NodeOfSlot(RedisCluster::KeySlot(k));
    EXPECT_OK(node);
    return node.ok() ? *node : 0;
  };
  // A flipped byte in block 4's tail (its bytes).
  const std::string tail4 = key(4) + ":t";
  ASSERT_OK(redis_->Cli(node_of(tail4), {"SETRANGE", tail4, "10", "X"}));
  EXPECT_EQ(Load(*tier_, chain.identities, chain), 4u);
  EXPECT_EQ(tier_->counters().corrupt, 1u);
  // Block 3's header garbled.
  ASSERT_OK(redis_->Cli(node_of(key(3)), {"SETRANGE", key(3), "20", "garbage"}));
  EXPECT_EQ(Load(*tier_, chain.identities, chain), 3u);
  // Block 2's head truncated.
  ASSERT_OK(redis_->Cli(node_of(key(2)), {"SET", key(2), "short"}));
  EXPECT_EQ(Load(*tier_, chain.identities, chain), 2u);
  // Block 1's tail gone (evicted alone).
  ASSERT_OK(redis_->Cli(node_of(key(1) + ":t"), {"DEL", key(1) + ":t"}));
  EXPECT_EQ(Load(*tier_, chain.identities, chain), 1u);
  EXPECT_EQ(tier_->counters().corrupt, 3u);
  EXPECT_EQ(tier_->counters().absent, 1u);
}

TEST_F(ClusterTierTest, AForeignOrCollidingRecordUnderTheKeyIsNeverServed) {
  const Chain chain = MakeChain(3, 80);
  Store(*tier_, chain);
  // Under block 1's key, a record of another model (same layout and shape).
  std::unique_ptr<ClusterTier> foreign = MakeTier(Pool("another-model"), true);
  std::string head(RecordHeaderBytes(kTokensPerBlock) + tier_->HeadDataBytes(), 'z');
  ASSERT_OK(
      EncodeRecordHeader(RecordHeader{.pool = Pool("another-model"), .block = chain.identities[1]},
                         absl::MakeSpan(head.data(), RecordHeaderBytes(kTokensPerBlock))));
  for (const absl::Status& status :
       tier_->redis().Set({{tier_->KeyOf(chain.identities[1]), head}})) {
    ASSERT_OK(status);
  }
  EXPECT_EQ(Load(*tier_, chain.identities, chain), 1u);
  EXPECT_EQ(tier_->counters().foreign, 1u);
  // Under block 2's key, a record of another block (as a hash collision would put there).
  ASSERT_OK(EncodeRecordHeader(RecordHeader{.pool = Pool(), .block = chain.identities[0]},
                               absl::MakeSpan(head.data(), RecordHeaderBytes(kTokensPerBlock))));
  for (const absl::Status& status :
       tier_->redis().Set({{tier_->KeyOf(chain.identities[2]), head}})) {
    ASSERT_OK(status);
  }
  std::vector<BlockRecordIdentity> from_two = {chain.identities[2]};
  Chain tail_chain;
  tail_chain.bytes = {chain.bytes[2]};
  EXPECT_EQ(Load(*tier_, from_two, tail_chain), 0u);
  EXPECT_EQ(tier_->counters().mismatched, 1u);
}

// Another prompt's block 1 whose block 0 collided with ours: chain hash, parent hash and tokens
// are ours, only the prefix digest differs. It has a key of its own, and its record is refused
// even under ours.
TEST_F(ClusterTierTest, AnotherPrefixUnderACollidingChainHashIsNeverServed) {
  const Chain chain = MakeChain(2, 85);
  Store(*tier_, chain);
  std::vector<BlockRecordIdentity> theirs = {chain.identities[1]};
  theirs[0].prefix_digest ^= 1;
  EXPECT_NE(tier_->KeyOf(theirs[0]), tier_->KeyOf(chain.identities[1]));
  Chain their_bytes;
  their_bytes.bytes = {chain.bytes[1]};
  EXPECT_EQ(Load(*tier_, theirs, their_bytes), 0u);
  EXPECT_EQ(tier_->counters().absent, 1u);
  std::string head(RecordHeaderBytes(kTokensPerBlock) + tier_->HeadDataBytes(), 'z');
  ASSERT_OK(EncodeRecordHeader(RecordHeader{.pool = Pool(), .block = chain.identities[1]},
                               absl::MakeSpan(head.data(), RecordHeaderBytes(kTokensPerBlock))));
  for (const absl::Status& status : tier_->redis().Set({{tier_->KeyOf(theirs[0]), head}})) {
    ASSERT_OK(status);
  }
  EXPECT_EQ(Load(*tier_, theirs, their_bytes), 0u);
  EXPECT_EQ(tier_->counters().mismatched, 1u);
  // A value of record format 1 (written before the prefix digest) under our own key is foreign.
  const std::string old =
      testing::Version1RecordHeader(RecordHeader{.pool = Pool(), .block = chain.identities[0]});
  ASSERT_FALSE(old.empty());
  const std::string old_value = old.substr(0, RecordHeaderBytes(kTokensPerBlock) - 8) +
                                chain.bytes[0].substr(0, tier_->HeadDataBytes());
  for (const absl::Status& status :
       tier_->redis().Set({{tier_->KeyOf(chain.identities[0]), old_value}})) {
    ASSERT_OK(status);
  }
  EXPECT_EQ(Load(*tier_, chain.identities, chain), 0u);
  EXPECT_EQ(tier_->counters().foreign, 1u);
}

TEST_F(ClusterTierTest, TenantsNeverShareBlocksThroughTheCluster) {
  const Chain tenant_a = MakeChain(4, /*ns=*/1001);
  Store(*tier_, tenant_a);
  // Tenant B asks for the very same chain hashes and tokens under its own namespace.
  std::vector<BlockRecordIdentity> as_b = tenant_a.identities;
  for (BlockRecordIdentity& identity : as_b) identity.namespace_digest = 2002;
  EXPECT_NE(tier_->KeyOf(as_b[0]), tier_->KeyOf(tenant_a.identities[0]));
  EXPECT_EQ(Load(*tier_, as_b, tenant_a), 0u);
  EXPECT_EQ(tier_->counters().absent, 1u);
}

TEST_F(ClusterTierTest, AMasterDownCostsItsBlocksAsMisses) {
  const Chain chain = MakeChain(12, 81);
  Store(*tier_, chain);
  absl::StatusOr<int> first_owner =
      redis_->NodeOfSlot(RedisCluster::KeySlot(tier_->KeyOf(chain.identities[0])));
  ASSERT_OK(first_owner);
  ASSERT_OK(redis_->Kill(*first_owner));
  EXPECT_EQ(Load(*tier_, chain.identities, chain), 0u);
  EXPECT_EQ(tier_->counters().unavailable, 1u);
  // Stores to the dead master fail, the others go on.
  const Chain more = MakeChain(12, 82);
  std::vector<ClusterTier::Record> records;
  for (size_t i = 0; i < more.identities.size(); ++i) {
    records.push_back({more.identities[i], more.bytes[i]});
  }
  size_t stored = 0;
  for (const absl::Status& status : tier_->Store(records)) stored += status.ok() ? 1 : 0;
  EXPECT_GT(stored, 0u);
  EXPECT_LT(stored, records.size());
  ASSERT_OK(redis_->Restart(*first_owner));
}

// A hung master (SIGSTOP) under opens with a max_load_ms: the first open's blocks on it are cut
// by its deadline, not waited for over io_timeout (30 s here, so a load that ignored the deadline
// would take 30 s and count `unavailable`), and the node is rested; the opens that follow within
// the rest skip it (misses counted `unavailable`, its commands `skipped`) rather than each paying
// the deadline again, and so does a write through. After SIGCONT and the rest it serves again.
TEST_F(ClusterTierTest, AHungMasterCostsOneDeadlineThenIsSkippedUntilItServesAgain) {
  ClusterTierOptions options;
  options.redis.seeds = {redis_->address(0)};
  options.redis.io_timeout = absl::Seconds(30);
  options.redis.retry_down_after = absl::Seconds(5);
  options.pool = Pool();
  options.tokens_per_block = kTokensPerBlock;
  absl::StatusOr<std::unique_ptr<ClusterTier>> tier = ClusterTier::Create(options);
  ASSERT_OK(tier);
  const Chain chain = MakeChain(12, 91);
  Store(**tier, chain);
  absl::StatusOr<int> first_owner =
      redis_->NodeOfSlot(RedisCluster::KeySlot((*tier)->KeyOf(chain.identities[0])));
  ASSERT_OK(first_owner);
  ASSERT_OK(redis_->Pause(*first_owner));
  std::vector<std::string> out(chain.identities.size(), std::string(kBlockBytes, '\0'));
  std::vector<uint8_t*> pointers;
  for (std::string& block : out) pointers.push_back(reinterpret_cast<uint8_t*>(block.data()));
  const auto open = [&] {
    return (*tier)->LoadPrefix(chain.identities, pointers, absl::Now() + absl::Seconds(1));
  };
  // What a failure shows, so that it says which step went another way.
  const auto counts = [&] {
    const ClusterTierCounters store = (*tier)->counters();
    const RedisClusterCounters redis = (*tier)->redis().counters();
    return absl::StrCat("past_deadline=", store.past_deadline, " unavailable=", store.unavailable,
                        " node_failures=", redis.node_failures, " skipped=", redis.skipped,
                        " slot_refreshes=", redis.slot_refreshes);
  };
  EXPECT_EQ(open(), 0u);
  EXPECT_EQ((*tier)->counters().past_deadline, 1u) << counts();
  EXPECT_EQ((*tier)->counters().unavailable, 0u) << counts();
  EXPECT_EQ((*tier)->redis().counters().node_failures, 1u) << counts();
  for (int following = 1; following <= 4; ++following) {
    EXPECT_EQ(open(), 0u);
    EXPECT_EQ((*tier)->counters().past_deadline, 1u) << counts();
    EXPECT_EQ((*tier)->counters().unavailable, static_cast<uint64_t>(following)) << counts();
  }
  const uint64_t skipped_loading = (*tier)->redis().counters().skipped;
  EXPECT_GE(skipped_loading, 4u * 2);  // a split record's head and tail, at least, each time
  // The write-through skips it as well: its records fail at once, the others are stored.
  const Chain more = MakeChain(12, 92);
  std::vector<ClusterTier::Record> records;
  for (size_t i = 0; i < more.identities.size(); ++i) {
    records.push_back({more.identities[i], more.bytes[i]});
  }
  size_t stored = 0;
  for (const absl::Status& status : (*tier)->Store(records)) stored += status.ok() ? 1 : 0;
  EXPECT_GT(stored, 0u);
  EXPECT_LT(stored, records.size());
  EXPECT_GT((*tier)->redis().counters().skipped, skipped_loading) << counts();
  EXPECT_EQ((*tier)->redis().counters().node_failures, 1u) << counts();

  ASSERT_OK(redis_->Resume(*first_owner));
  EXPECT_TRUE(PollUntil([&] { return Load(**tier, chain.identities, chain) == 12; }))
      << "the node did not serve again after its rest: " << counts();
  // Its probe found it answering.
  EXPECT_EQ((*tier)->redis().counters().node_failures, 1u) << counts();
  ASSERT_OK(redis_->AwaitClusterOk());
}

// A record's head and tail go out in one pipeline per node (tail first), so the head can be
// taken while its tail is refused. Here an ACL user may write heads only (keys ending in '}'):
// every tail gets NOPERM, the record fails, and the heads that were taken are deleted again, so
// no reader finds a head naming bytes that are not there.
TEST_F(ClusterTierTest, AHeadWhoseTailWasRefusedIsNotLeftBehind) {
  for (int node = 0; node < redis_->size(); ++node) {
    ASSERT_OK(redis_->Cli(
        node, {"ACL", "SETUSER", "heads-only", "on", ">heads-secret", "~kvc2:*}", "+@all"}));
  }
  ClusterTierOptions options;
  options.redis.seeds = {redis_->address(0)};
  options.redis.username = "heads-only";
  options.redis.password = "heads-secret";
  options.pool = Pool();
  options.tokens_per_block = kTokensPerBlock;
  absl::StatusOr<std::unique_ptr<ClusterTier>> heads_only = ClusterTier::Create(options);
  ASSERT_OK(heads_only);
  ASSERT_LT((*heads_only)->HeadDataBytes(), kBlockBytes);
  const Chain chain = MakeChain(4, 84);
  std::vector<ClusterTier::Record> records;
  for (size_t i = 0; i < chain.identities.size(); ++i) {
    records.push_back({chain.identities[i], chain.bytes[i]});
  }
  for (const absl::Status& status : (*heads_only)->Store(records)) {
    EXPECT_THAT(status, StatusIs(absl::StatusCode::kInternal));
  }
  EXPECT_EQ((*heads_only)->counters().store_failures, 4u);
  EXPECT_EQ((*heads_only)->counters().stored, 0u);
  for (const BlockRecordIdentity& identity : chain.identities) {
    const std::string key = tier_->KeyOf(identity);
    absl::StatusOr<int> node = redis_->NodeOfSlot(RedisCluster::KeySlot(key));
    ASSERT_OK(node);
    absl::StatusOr<std::string> exists = redis_->Cli(*node, {"EXISTS", key});
    ASSERT_OK(exists);
    EXPECT_EQ(absl::StripAsciiWhitespace(*exists), "0") << key;
  }
  EXPECT_EQ(Load(*tier_, chain.identities, chain), 0u);
  EXPECT_EQ(tier_->counters().absent, 1u);
  for (int node = 0; node < redis_->size(); ++node) {
    ASSERT_OK(redis_->Cli(node, {"ACL", "DELUSER", "heads-only"}));
  }
}

}  // namespace
}  // namespace kvcache
