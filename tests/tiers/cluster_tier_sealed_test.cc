// ClusterTier sealed (ClusterTierOptions::keyring) against a real 3-master Redis Cluster: values
// and their names hold nothing in the clear, a byte flipped anywhere or a value moved under
// another block's or tenant's name is a miss counted for the tenant, a rotated key's values stay
// readable, and sealed and unsealed daemons never see each other's values.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "tests/testing/redis_cluster_suite.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_keys.h"
#include "tests/tiers/cluster_test_chains.h"
#include "tiers/cluster_tier.h"

namespace kvcache {
namespace {

using ::testing::StartsWith;

using ::kvcache::testing::Chain;

constexpr uint32_t kTokensPerBlock = testing::kChainTokensPerBlock;
constexpr uint64_t kBlockBytes = testing::kChainBlockBytes;

PoolIdentity Pool() {
  return PoolIdentity{.model_id = "sealed-model",
                      .layout_fingerprint = 0x5678,
                      .hash_algorithm = HashAlgorithm::kXxh3_128,
                      .block_bytes = kBlockBytes};
}

TierMasterKey Key(uint32_t id, char fill) { return testing::TestTierKey(id, fill); }
std::shared_ptr<const TierKeyring> Keyring(std::vector<TierMasterKey> keys) {
  return testing::TestTierKeyring(std::move(keys));
}

// A chain of tenant acme's.
Chain MakeChain(int blocks, uint64_t ns) { return testing::MakeChain(blocks, ns, "acme"); }

class SealedClusterTierTest : public testing::RedisClusterSuite<> {
 protected:
  std::unique_ptr<ClusterTier> MakeTier(std::shared_ptr<const TierKeyring> keyring) {
    ClusterTierOptions options;
    options.redis.seeds = {redis_->address(0)};
    options.pool = Pool();
    options.tokens_per_block = kTokensPerBlock;
    options.keyring = std::move(keyring);
    options.seal_workers = workers_;
    absl::StatusOr<std::unique_ptr<ClusterTier>> tier = ClusterTier::Create(options);
    EXPECT_OK(tier);
    return tier.ok() ? *std::move(tier) : nullptr;
  }

  static void Store(ClusterTier& tier, const Chain& chain, size_t first = 0,
                    size_t end = SIZE_MAX) {
    std::vector<ClusterTier::Record> records;
    for (size_t i = first; i < std::min(end, chain.identities.size()); ++i) {
      records.push_back({chain.identities[i], chain.bytes[i]});
    }
    for (const absl::Status& status : tier.Store(records)) ASSERT_OK(status);
  }

  static size_t Load(ClusterTier& tier, const std::vector<BlockRecordIdentity>& expected,
                     const Chain& chain) {
    return testing::LoadChecked(tier, expected, chain);
  }

  static std::string Get(ClusterTier& tier, const std::string& key) {
    auto values = tier.redis().Get(std::vector<std::string>{key});
    EXPECT_OK(values[0]);
    return values[0].ok() ? *values[0] : "";
  }
  static void Set(ClusterTier& tier, const std::string& key, const std::string& value) {
    for (const absl::Status& status : tier.redis().Set({{key, value}})) ASSERT_OK(status);
  }

  std::shared_ptr<const TierKeyring> keys_ = Keyring({Key(1, 'a')});
  std::shared_ptr<TaskWorkers> workers_ = std::make_shared<TaskWorkers>(2);
};

TEST_F(SealedClusterTierTest, ValuesAndNamesRoundTripAndHoldNothingInTheClear) {
  std::unique_ptr<ClusterTier> tier = MakeTier(keys_);
  EXPECT_TRUE(tier->sealed());
  EXPECT_LT(tier->HeadDataBytes(), kBlockBytes);  // still split to fit a size class
  const Chain chain = MakeChain(6, 301);
  Store(*tier, chain);
  EXPECT_EQ(Load(*tier, chain.identities, chain), 6u);
  // Another node with the same key file reads it.
  EXPECT_EQ(Load(*MakeTier(keys_), chain.identities, chain), 6u);

  const std::string key = tier->KeyOf(chain.identities[2]);
  EXPECT_THAT(key, StartsWith("kvcs1:{"));
  EXPECT_NE(key, MakeTier(nullptr)->KeyOf(chain.identities[2]));  // a keyed name
  const std::string value = Get(*tier, key) + Get(*tier, key + ":t");
  EXPECT_EQ(value.size(), SealedHeadBytes(kTokensPerBlock) + kBlockBytes);
  const std::string& bytes = chain.bytes[2];
  for (size_t at = 0; at + 16 <= bytes.size(); at += 1021) {
    ASSERT_FALSE(absl::StrContains(value, bytes.substr(at, 16))) << at;
  }
  const std::vector<uint32_t>& tokens = chain.identities[2].tokens;
  EXPECT_FALSE(absl::StrContains(
      value, absl::string_view(reinterpret_cast<const char*>(tokens.data()), 16)));
  EXPECT_FALSE(absl::StrContains(value, "sealed-model"));
  EXPECT_FALSE(absl::StrContains(value, "acme"));
}

TEST_F(SealedClusterTierTest, AByteFlippedAnywhereIsAMissCountedForTheTenant) {
  std::unique_ptr<ClusterTier> tier = MakeTier(keys_);
  const Chain chain = MakeChain(6, 302);
  const uint64_t head_bytes = SealedHeadBytes(kTokensPerBlock);
  // Block 5's tail, 4's bytes in its head, 3's body tag, 2's sealed header, 1's preamble.
  const std::vector<std::pair<int, uint64_t>> flips = {
      {5, head_bytes + tier->HeadDataBytes() + 100},
      {4, head_bytes + 10},
      {3, head_bytes - 1},
      {2, 400},
      {1, 13}};
  Store(*tier, chain);
  uint64_t unopened = 0;
  for (const auto& [block, offset] : flips) {
    const std::string key = tier->KeyOf(chain.identities[block]);
    std::string head = Get(*tier, key);
    std::string tail = Get(*tier, key + ":t");
    if (offset < head.size()) {
      head[offset] ^= 0x01;
      Set(*tier, key, head);
    } else {
      tail[offset - head.size()] ^= 0x01;
      Set(*tier, key + ":t", tail);
    }
    EXPECT_EQ(Load(*tier, chain.identities, chain), static_cast<size_t>(block)) << block;
    EXPECT_EQ(tier->counters().unopened, ++unopened);
  }
  EXPECT_EQ(tier->open_failures().Of("acme"), unopened);
  EXPECT_EQ(tier->counters().corrupt, 0u);
}

TEST_F(SealedClusterTierTest, AValueMovedUnderAnotherBlocksOrTenantsNameIsAMiss) {
  std::unique_ptr<ClusterTier> tier = MakeTier(keys_);
  const Chain chain = MakeChain(3, 303);
  Store(*tier, chain);
  // Block 0's values under block 2's name: they open with acme's key, but not as block 2.
  const std::string from = tier->KeyOf(chain.identities[0]);
  const std::string to = tier->KeyOf(chain.identities[2]);
  Set(*tier, to, Get(*tier, from));
  Set(*tier, to + ":t", Get(*tier, from + ":t"));
  EXPECT_EQ(Load(*tier, chain.identities, chain), 2u);
  EXPECT_EQ(tier->counters().unopened + tier->counters().mismatched, 1u);

  // Tenant globex asks for the very same blocks: another name (absent) ...
  std::vector<BlockRecordIdentity> as_globex = chain.identities;
  for (BlockRecordIdentity& identity : as_globex) identity.tenant = "globex";
  EXPECT_NE(tier->KeyOf(as_globex[0]), from);
  EXPECT_EQ(Load(*tier, as_globex, chain), 0u);
  EXPECT_EQ(tier->counters().absent, 1u);
  // ... and acme's values copied under globex's name do not open for globex.
  const std::string globex = tier->KeyOf(as_globex[0]);
  Set(*tier, globex, Get(*tier, from));
  Set(*tier, globex + ":t", Get(*tier, from + ":t"));
  EXPECT_EQ(Load(*tier, as_globex, chain), 0u);
  EXPECT_EQ(tier->open_failures().Of("globex"), 1u);
  EXPECT_TRUE(tier->ProbePrefix(as_globex, absl::InfiniteFuture()).empty());
  EXPECT_EQ(tier->open_failures().Of("globex"), 2u);
}

TEST_F(SealedClusterTierTest, RotationKeepsOldValuesReadableAndNamesNewOnesWithTheNewKey) {
  const Chain chain = MakeChain(8, 304);
  Store(*MakeTier(keys_), chain, 0, 4);  // blocks 0-3 under key 1
  std::unique_ptr<ClusterTier> rotated = MakeTier(Keyring({Key(2, 'b'), Key(1, 'a')}));
  Store(*rotated, chain, 4, 6);          // blocks 4-5 under key 2
  Store(*MakeTier(keys_), chain, 6, 8);  // 6-7 under key 1 again: a prefix that alternates
  EXPECT_EQ(Load(*rotated, chain.identities, chain), 8u);
  EXPECT_EQ(rotated->ProbePrefix(chain.identities, absl::InfiniteFuture()).size(), 8u);
  EXPECT_EQ(rotated->counters().absent, 0u);

  // Key 1 removed: its values are under names nobody asks for.
  std::unique_ptr<ClusterTier> removed = MakeTier(Keyring({Key(2, 'b')}));
  EXPECT_EQ(Load(*removed, chain.identities, chain), 0u);
  std::vector<BlockRecordIdentity> from_four(chain.identities.begin() + 4, chain.identities.end());
  Chain from_four_bytes;
  from_four_bytes.bytes.assign(chain.bytes.begin() + 4, chain.bytes.end());
  EXPECT_EQ(Load(*removed, from_four, from_four_bytes), 2u);
}

TEST_F(SealedClusterTierTest, SealedAndUnsealedDaemonsNeverSeeEachOthersValues) {
  std::unique_ptr<ClusterTier> sealed = MakeTier(keys_);
  std::unique_ptr<ClusterTier> unsealed = MakeTier(nullptr);
  const Chain plain = MakeChain(3, 305);
  Store(*unsealed, plain);
  EXPECT_EQ(Load(*sealed, plain.identities, plain), 0u);
  EXPECT_EQ(sealed->counters().absent, 1u);
  const Chain secret = MakeChain(3, 306);
  Store(*sealed, secret);
  EXPECT_EQ(Load(*unsealed, secret.identities, secret), 0u);
  EXPECT_EQ(unsealed->counters().absent, 1u);
  // An unsealed value put under a sealed name does not open either.
  const std::string name = sealed->KeyOf(plain.identities[0]);
  Set(*sealed, name, Get(*unsealed, unsealed->KeyOf(plain.identities[0])));
  EXPECT_EQ(Load(*sealed, plain.identities, plain), 0u);
  EXPECT_EQ(sealed->counters().unopened, 1u);
}

}  // namespace
}  // namespace kvcache
