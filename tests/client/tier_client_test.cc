// Tier 2 through the real daemon and the C++ client (issue 18): a host pool with a small tier 1
// and a host tier. Blocks put, offloaded by the daemon's mover, evicted by other puts, come back
// on OpenSequence, Lookup and GetBlocks with identical bytes (GetBlocks verifies every block's
// checksum); a corrupted tier-2 record is detected and left to compute; GetStats shows the tier.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/block_hash.h"
#include "tests/client/daemon_fixture.h"

namespace kvcache::testing {
namespace {

constexpr uint32_t kTierPoolBlocks = 8;  // the offload window is all 8
constexpr uint32_t kTierSlots = 16;

class TierClientTest : public DaemonFixture {
 protected:
  TierClientTest() {
    PoolOptions pool = DefaultPoolOptions();
    pool.name = "tiered";
    pool.num_blocks = kTierPoolBlocks;
    pool.host_tier_bytes = uint64_t{kTierSlots} * pool.layout.BlockBytes();
    block_bytes_ = pool.layout.BlockBytes();
    extra_pools_.push_back(pool);
  }

  // Distinct bytes per prompt and block.
  std::string Bytes(const std::vector<uint32_t>& tokens) const {
    std::string bytes((tokens.size() / kBlockSize) * block_bytes_, '\0');
    for (size_t i = 0; i < bytes.size(); ++i) {
      bytes[i] = static_cast<char>(tokens[(i / block_bytes_) * kBlockSize] * 13 + i * 7);
    }
    return bytes;
  }

  KvCacheClient::TierStats HostTier() {
    absl::StatusOr<KvCacheClient::Stats> stats = client_->GetStats("tiered");
    if (!stats.ok() || stats->pools.size() != 1 || stats->pools[0].tiers.size() != 1) return {};
    return stats->pools[0].tiers[0];
  }

  // Puts `tokens`, then waits for the daemon's mover to have stored `stored` blocks in all.
  void PutAndOffload(const std::vector<uint32_t>& tokens, uint64_t stored) {
    absl::StatusOr<KvCacheClient::PutResult> put =
        client_->PutBlocks("tiered", tokens, Bytes(tokens));
    ASSERT_OK(put);
    ASSERT_EQ(put->num_stored, tokens.size() / kBlockSize);
    ASSERT_TRUE(PollUntil([&] { return HostTier().stored_blocks >= stored; }))
        << "the mover stored " << HostTier().stored_blocks << " of " << stored;
  }

  // Opens a session, puts A (four blocks), waits for the mover to store them, then puts eight
  // blocks of another prompt: every block of A leaves tier 1.
  void PutOffloadAndEvict(const std::vector<uint32_t>& a) {
    ASSERT_OK(client_->OpenSession("default", "tier-test"));
    ASSERT_NO_FATAL_FAILURE(PutAndOffload(a, 4));
    const std::vector<uint32_t> b = Tokens(8 * kBlockSize, 5000);
    ASSERT_OK(client_->PutBlocks("tiered", b, Bytes(b)));
  }

  // The chain hashes pool "tiered" computes for `tokens` in tenant "default".
  std::vector<Hash128> Chain(const std::vector<uint32_t>& tokens) {
    absl::StatusOr<Pool*> pool = daemon_->manager().FindPool("tiered");
    EXPECT_OK(pool);
    if (!pool.ok()) return {};
    BlockHasher hasher(HashAlgorithm::kXxh3_128);
    const HashNamespace ns{(*pool)->options().model_id, (*pool)->layout_fingerprint(), "default",
                           ""};
    std::vector<Hash128> chain;
    hasher.ExtendChain(hasher.Root(ns), tokens, kBlockSize, ExtraKeys{}, &chain);
    return chain;
  }

  uint64_t block_bytes_ = 0;
};

TEST_F(TierClientTest, EvictedBlocksComeBackFromTheHostTierWithIdenticalBytes) {
  const std::vector<uint32_t> a = Tokens(4 * kBlockSize, 100);
  ASSERT_NO_FATAL_FAILURE(PutOffloadAndEvict(a));
  KvCacheClient::TierStats tier = HostTier();
  EXPECT_EQ(tier.tier, "host");
  EXPECT_EQ(tier.evicted_from_above, 4u);
  EXPECT_EQ(tier.lost_from_above, 0u);
  EXPECT_EQ(tier.capacity_bytes, kTierSlots * block_bytes_);

  absl::StatusOr<KvCacheClient::LookupResult> lookup = client_->Lookup("tiered", "", a);
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(lookup->cached_tokens_by_tier.host, 4 * kBlockSize);
  EXPECT_EQ(lookup->cached_tokens_by_tier.pool, 0u);

  // A prompt of A plus one token: the whole of A comes up from tier 2.
  std::vector<uint32_t> prompt = a;
  prompt.push_back(7);
  absl::StatusOr<KvCacheClient::Sequence> opened = client_->OpenSequence("tiered", prompt);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(opened->cached_tokens_by_tier.host, 4 * kBlockSize);
  EXPECT_EQ(opened->cached_tokens_by_tier.pool, 0u);
  ASSERT_OK(client_->ReleaseSequence(opened->sequence_id));

  // Published again in tier 1; GetBlocks checks every block's checksum as it streams.
  absl::StatusOr<KvCacheClient::GetResult> got = client_->GetBlocks("tiered", a);
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 4u);
  EXPECT_TRUE(got->bytes == Bytes(a)) << "bytes differ after the round trip through tier 2";
  tier = HostTier();
  EXPECT_EQ(tier.hit_blocks, 4u);
  EXPECT_EQ(tier.verify_failures, 0u);
}

TEST_F(TierClientTest, CorruptedHostTierRecordIsDetectedAndRecomputed) {
  const std::vector<uint32_t> a = Tokens(4 * kBlockSize, 100);
  ASSERT_NO_FATAL_FAILURE(PutOffloadAndEvict(a));
  // Flip a byte of A's third block in tier 2.
  absl::StatusOr<Pool*> pool = daemon_->manager().FindPool("tiered");
  ASSERT_OK(pool);
  const std::vector<Hash128> chain = Chain(a);
  ASSERT_EQ(chain.size(), 4u);
  ASSERT_TRUE((*pool)->host_tier()->CorruptForTesting(chain[2], 1000));

  absl::StatusOr<KvCacheClient::GetResult> got = client_->GetBlocks("tiered", a);
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 2u);  // blocks 0 and 1; the corrupt one and its child are not served
  EXPECT_TRUE(got->bytes == Bytes(a).substr(0, 2 * block_bytes_));
  const KvCacheClient::TierStats tier = HostTier();
  EXPECT_EQ(tier.verify_failures, 1u);
  EXPECT_EQ(tier.load_failures, 1u);
  EXPECT_EQ(tier.hit_blocks, 2u);
  // Computing it again (a put of the missing blocks) stores the good bytes.
  absl::StatusOr<KvCacheClient::PutResult> put = client_->PutBlocks("tiered", a, Bytes(a));
  ASSERT_OK(put);
  EXPECT_EQ(put->num_already_cached, 2u);
  EXPECT_EQ(put->num_stored, 2u);
}

// A router watching the daemon learns where A's blocks went: stored in tier 1 (CPU), stored in
// tier 2 with its medium (CPU_PINNED, chained from A's first block), removed from tier 1 only.
TEST_F(TierClientTest, AWatcherSeesBlocksOffloadedToTier2WithItsMedium) {
  const std::vector<uint32_t> a = Tokens(4 * kBlockSize, 100);
  ASSERT_NO_FATAL_FAILURE(PutOffloadAndEvict(a));
  // A marker put last: once its event is read, every event before it has been.
  const std::vector<uint32_t> marker = Tokens(kBlockSize, 9000);
  ASSERT_OK(client_->PutBlocks("default", marker,
                               std::string(DefaultPoolOptions().layout.BlockBytes(), 'm')));
  const std::vector<Hash128> chain = Chain(a);
  ASSERT_EQ(chain.size(), 4u);
  const auto to_hash = [](const v1::BlockHash& hash) { return Hash128{hash.hi(), hash.lo()}; };

  std::vector<std::pair<std::string, Hash128>> stored, removed;
  std::optional<Hash128> tier2_first_parent = Hash128{};
  bool marker_seen = false;
  std::unique_ptr<EventWatch> everything = client_->WatchEvents({});
  while (!marker_seen) {
    absl::StatusOr<v1::WatchEventsResponse> response = everything->Next();
    ASSERT_OK(response);
    for (const v1::KvEvent& event : response->events()) {
      if (event.has_blocks_stored()) {
        const v1::BlocksStored& blocks = event.blocks_stored();
        if (blocks.pool() == "default") {
          marker_seen = true;
          continue;
        }
        for (const v1::StoredBlock& block : blocks.blocks()) {
          const Hash128 hash = to_hash(block.hash());
          if (blocks.medium() == "CPU_PINNED" && hash == chain[0]) {
            tier2_first_parent = blocks.has_parent_hash()
                                     ? std::optional(to_hash(blocks.parent_hash()))
                                     : std::nullopt;
          }
          stored.emplace_back(blocks.medium(), hash);
        }
      }
      if (event.has_blocks_removed()) {
        for (const v1::BlockHash& hash : event.blocks_removed().hashes()) {
          removed.emplace_back(event.blocks_removed().medium(), to_hash(hash));
        }
      }
    }
  }
  for (const Hash128& hash : chain) {
    EXPECT_THAT(stored, ::testing::Contains(std::pair(std::string("CPU"), hash)));
    EXPECT_THAT(stored, ::testing::Contains(std::pair(std::string("CPU_PINNED"), hash)));
    EXPECT_THAT(removed, ::testing::Contains(std::pair(std::string("CPU"), hash)));
    EXPECT_THAT(removed,
                ::testing::Not(::testing::Contains(std::pair(std::string("CPU_PINNED"), hash))));
  }
  EXPECT_EQ(tier2_first_parent, std::nullopt);  // A's first block starts its prompt
}

}  // namespace
}  // namespace kvcache::testing
