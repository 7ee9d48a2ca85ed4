// Issue 31 item 4 against a kvcache-manager process: sessions bound to different compatibility
// manifests never share a block, in tier 1, in the host tier, in the disk tier and after a
// restart from disk; equal manifests share; a session without a manifest keeps its own
// namespace; bad manifests get their exact codes; DescribePool shows the manifests in use.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "client/kv_cache_client.h"
#include "common/compatibility_manifest.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

// The daemon's default layout: 4 layers x 2 x 16 tokens x 2 heads x 64 x fp16.
constexpr uint64_t kBlockBytes = 32768;

// Rank 0 of a 2-way tensor-parallel engine on the pool's layout.
ManifestFields RankZero() {
  return ManifestFields{.model_id = "meta-llama/Llama-3.1-8B-Instruct",
                        .model_config_digest = "rope=llama3:factor=8",
                        .kv_dtype = "fp16",
                        .page_tokens = 16,
                        .parts = {{"kv", kBlockBytes}},
                        .parallel = {.tp_size = 2, .tp_rank = 0}};
}

ManifestFields RankOne() {
  ManifestFields fields = RankZero();
  fields.parallel.tp_rank = 1;
  return fields;
}

ManifestFields OtherRope() {
  ManifestFields fields = RankZero();
  fields.model_config_digest = "rope=llama3:factor=16";
  return fields;
}

std::vector<uint32_t> Prompt(uint32_t seed, size_t tokens) {
  std::vector<uint32_t> prompt(tokens);
  std::iota(prompt.begin(), prompt.end(), seed * 100000);
  return prompt;
}

// Two pools of 16 blocks over a host tier: "hosted"'s, of 32 blocks, keeps every record it gets
// (the ones the mover copies ahead of eviction and those evictions pass down); "tiered"'s, of 8,
// passes each on to its disk tier (tier 2's demotion window is all of it).
class ManifestProcessTest : public DaemonProcessTest {
 protected:
  ManifestProcessTest() {
    pool_name_ = "hosted";
    pool_flag_ = "hosted:blocks=16:host_tier=1MiB,tiered:blocks=16:host_tier=256KiB:disk_tier=" +
                 disk_dir_.path() + "/tiered.tier:4MiB";
  }

  std::unique_ptr<KvCacheClient> Engine(const std::optional<ManifestFields>& manifest) {
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(target_);
    EXPECT_OK(client);
    if (!client.ok()) return nullptr;
    EXPECT_OK((*client)->OpenSession("", "engine", absl::ZeroDuration(), manifest));
    return *std::move(client);
  }

  // Opens, commits every full block and releases: the prompt's full blocks end up evictable.
  void Store(KvCacheClient& engine, const std::vector<uint32_t>& prompt) {
    absl::StatusOr<KvCacheClient::Sequence> sequence = engine.OpenSequence(pool_name_, prompt);
    ASSERT_OK(sequence);
    ASSERT_OK(
        engine.CommitSequence(sequence->sequence_id, prompt.size() / kBlockSize * kBlockSize));
    ASSERT_OK(engine.ReleaseSequence(sequence->sequence_id));
  }

  // OpenSequence's cached tokens (the sequence released at once).
  uint32_t OpenCached(KvCacheClient& engine, const std::vector<uint32_t>& prompt) {
    absl::StatusOr<KvCacheClient::Sequence> sequence = engine.OpenSequence(pool_name_, prompt);
    EXPECT_OK(sequence);
    if (!sequence.ok()) return 0;
    EXPECT_OK(engine.ReleaseSequence(sequence->sequence_id));
    return sequence->num_cached_tokens;
  }

  // Stores `prompt` (at most 8 blocks) and a filler, waits until the mover has copied the oldest
  // 8 evictable blocks (the prompt's first) to `tier`, then evicts all of tier 1 with a prompt as
  // large as the pool.
  void StoreBelowTierOne(KvCacheClient& engine, const std::vector<uint32_t>& prompt,
                         absl::string_view tier) {
    ASSERT_NO_FATAL_FAILURE(Store(engine, prompt));
    ASSERT_NO_FATAL_FAILURE(Store(engine, Prompt(2, 10 * kBlockSize + 1)));
    ASSERT_TRUE(PollUntil([&] { return PoolTier(tier).stored_blocks >= 8; }));
    absl::StatusOr<KvCacheClient::Sequence> flood =
        engine.OpenSequence(pool_name_, Prompt(3, 15 * kBlockSize + 1));
    ASSERT_OK(flood);
    ASSERT_OK(engine.ReleaseSequence(flood->sequence_id));
  }

  KvCacheClient::LookupResult Lookup(const std::vector<uint32_t>& prompt,
                                     const std::optional<ManifestFields>& manifest) {
    absl::StatusOr<KvCacheClient::LookupResult> lookup =
        observer_->Lookup(pool_name_, "", prompt, "", {}, manifest);
    EXPECT_OK(lookup);
    return lookup.ok() ? *lookup : KvCacheClient::LookupResult{};
  }

  // Sessions of every other namespace: rank 1's, another RoPE digest's and no manifest's.
  std::vector<std::unique_ptr<KvCacheClient>> Strangers() {
    std::vector<std::unique_ptr<KvCacheClient>> strangers;
    for (const std::optional<ManifestFields>& manifest :
         {std::optional(RankOne()), std::optional(OtherRope()), std::optional<ManifestFields>()}) {
      strangers.push_back(Engine(manifest));
    }
    return strangers;
  }

  // Every other namespace misses `prompt`, by Lookup and by OpenSequence.
  void ExpectStrangersMiss(const std::vector<uint32_t>& prompt,
                           const std::vector<std::unique_ptr<KvCacheClient>>& strangers) {
    EXPECT_EQ(Lookup(prompt, RankOne()).num_cached_tokens, 0u);
    EXPECT_EQ(Lookup(prompt, OtherRope()).num_cached_tokens, 0u);
    EXPECT_EQ(Lookup(prompt, std::nullopt).num_cached_tokens, 0u);
    for (const std::unique_ptr<KvCacheClient>& stranger : strangers) {
      EXPECT_EQ(OpenCached(*stranger, prompt), 0u);
    }
  }

  ScopedTempDir disk_dir_{"kvcache_manifest_disk"};
};

TEST_F(ManifestProcessTest, ADifferentManifestNeverHitsInAnyTierAlsoAfterARestart) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::vector<uint32_t> prompt = Prompt(1, 3 * kBlockSize + 1);  // 3 full blocks
  auto rank_zero = Engine(RankZero());
  auto strangers = Strangers();
  ASSERT_NO_FATAL_FAILURE(Store(*rank_zero, prompt));

  // Tier 1.
  EXPECT_EQ(Lookup(prompt, RankZero()).cached_tokens_by_tier.pool, 48u);
  ExpectStrangersMiss(prompt, strangers);
  EXPECT_EQ(OpenCached(*rank_zero, prompt), 48u);
  auto rank_zero_again = Engine(RankZero());  // an equal manifest shares the blocks
  EXPECT_EQ(OpenCached(*rank_zero_again, prompt), 48u);

  // Tier 2.
  ASSERT_NO_FATAL_FAILURE(StoreBelowTierOne(*rank_zero, prompt, "host"));
  const KvCacheClient::LookupResult in_host = Lookup(prompt, RankZero());
  EXPECT_EQ(in_host.cached_tokens_by_tier.pool, 0u);
  EXPECT_EQ(in_host.cached_tokens_by_tier.host, 48u);
  ExpectStrangersMiss(prompt, strangers);
  EXPECT_EQ(PoolTier("host").hit_blocks, 0u);
  EXPECT_EQ(OpenCached(*rank_zero, prompt), 48u);
  EXPECT_EQ(PoolTier("host").hit_blocks, 3u);

  // The disk tier, on the pool whose tier 2 passes every record down.
  pool_name_ = "tiered";
  ASSERT_NO_FATAL_FAILURE(StoreBelowTierOne(*rank_zero, prompt, "disk"));
  const KvCacheClient::LookupResult on_disk = Lookup(prompt, RankZero());
  // Below tier 1 (whether tier 2 still holds a copy of a record it passed down is its own
  // business); the restart below leaves the disk alone to serve it.
  EXPECT_EQ(on_disk.cached_tokens_by_tier.pool, 0u);
  EXPECT_EQ(on_disk.cached_tokens_by_tier.host + on_disk.cached_tokens_by_tier.disk, 48u);
  ExpectStrangersMiss(prompt, strangers);
  EXPECT_EQ(PoolTier("disk").hit_blocks + PoolTier("host").hit_blocks, 0u);

  // A restart from disk: only the disk tier holds the prompt.
  rank_zero.reset();
  rank_zero_again.reset();
  strangers.clear();
  ASSERT_NO_FATAL_FAILURE(KillAndRestartDaemon());
  ASSERT_GE(PoolTier("disk").restored_records, 3u);
  EXPECT_EQ(Lookup(prompt, RankZero()).cached_tokens_by_tier.disk, 48u);
  strangers = Strangers();
  ExpectStrangersMiss(prompt, strangers);
  EXPECT_EQ(PoolTier("disk").hit_blocks, 0u);
  rank_zero = Engine(RankZero());
  EXPECT_EQ(OpenCached(*rank_zero, prompt), 48u);
  EXPECT_EQ(PoolTier("disk").hit_blocks, 3u);
}

TEST_F(ManifestProcessTest, BadManifestsGetTheirExactCodes) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(target_);
  ASSERT_OK(client);
  ManifestFields empty_model = RankZero();
  empty_model.model_id.clear();
  ManifestFields bad_rank = RankZero();
  bad_rank.parallel.tp_rank = 2;
  ManifestFields long_digest = RankZero();
  long_digest.model_config_digest = std::string(65, 'd');
  ManifestFields bad_dtype = RankZero();
  bad_dtype.kv_dtype = "int3";
  for (const ManifestFields& bad : {empty_model, bad_rank, long_digest, bad_dtype}) {
    EXPECT_THAT((*client)->OpenSession("", "engine", absl::ZeroDuration(), bad),
                StatusIs(absl::StatusCode::kInvalidArgument));
  }
  EXPECT_EQ(OpenSessions(), 0u);  // nothing opened
  EXPECT_THAT(observer_->Lookup(pool_name_, "", Prompt(1, 33), "", {}, bad_rank),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::HasSubstr("tp_rank 2 is not below tp_size 2")));

  // Valid, but not this pool's layout: the session opens; each call naming the pool is refused.
  ManifestFields long_pages = RankZero();
  long_pages.page_tokens = 32;
  ASSERT_OK((*client)->OpenSession("", "engine", absl::ZeroDuration(), long_pages));
  EXPECT_THAT((*client)->OpenSequence(pool_name_, Prompt(1, 33)),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "the manifest has page_tokens 32 but pool 'hosted' has block_size 16"));
  ManifestFields bf16 = RankZero();
  bf16.kv_dtype = "bf16";
  EXPECT_THAT(observer_->Lookup(pool_name_, "", Prompt(1, 33), "", {}, bf16),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       "the manifest has kv_dtype bf16 but pool 'hosted' has dtype fp16"));
  ManifestFields wide = RankZero();
  wide.parts = {{"k", kBlockBytes}, {"v", kBlockBytes}};
  EXPECT_THAT(observer_->Lookup(pool_name_, "", Prompt(1, 33), "", {}, wide),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::HasSubstr(
                           "parts summing to 65536 but pool 'hosted' has block_bytes 32768")));
  EXPECT_EQ(PoolStats().counts.referenced, 0u);  // nothing held
}

// PutBlocks and GetBlocks run under a transfer session of their own, which must carry the
// lease's manifest: bytes put by rank 0 are got by rank 0 only.
TEST_F(ManifestProcessTest, DataStreamsKeepTheSessionsManifest) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const std::vector<uint32_t> prompt = Prompt(4, 2 * kBlockSize);
  std::string bytes(2 * kBlockBytes, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<char>(i * 7 + 3);
  auto rank_zero = Engine(RankZero());
  absl::StatusOr<KvCacheClient::PutResult> put = rank_zero->PutBlocks(pool_name_, prompt, bytes);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_stored, 2u);

  EXPECT_EQ(Lookup(prompt, RankZero()).num_cached_tokens, 32u);
  auto strangers = Strangers();
  for (const std::unique_ptr<KvCacheClient>& stranger : strangers) {
    absl::StatusOr<KvCacheClient::GetResult> got = stranger->GetBlocks(pool_name_, prompt);
    ASSERT_OK(got);
    EXPECT_EQ(got->num_blocks, 0u);
  }
  auto rank_zero_again = Engine(RankZero());
  absl::StatusOr<KvCacheClient::GetResult> got = rank_zero_again->GetBlocks(pool_name_, prompt);
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 2u);
  EXPECT_EQ(got->bytes, bytes);

  ManifestFields long_pages = RankZero();
  long_pages.page_tokens = 32;
  auto misfit = Engine(long_pages);
  EXPECT_THAT(misfit->PutBlocks(pool_name_, prompt, bytes),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("page_tokens")));
  EXPECT_THAT(misfit->GetBlocks(pool_name_, prompt),
              StatusIs(absl::StatusCode::kFailedPrecondition, ::testing::HasSubstr("page_tokens")));
}

TEST_F(ManifestProcessTest, DescribePoolShowsTheManifestsInUse) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  auto first = Engine(RankZero());
  auto second = Engine(RankZero());
  auto other = Engine(RankOne());
  auto plain = Engine(std::nullopt);
  ManifestFields long_pages = RankZero();
  long_pages.page_tokens = 32;
  auto misfit = Engine(long_pages);  // does not fit the pool: not in use on it

  absl::StatusOr<KvCacheClient::PoolDescription> description = observer_->DescribePool(pool_name_);
  ASSERT_OK(description);
  ASSERT_EQ(description->manifests.size(), 2u);
  const auto zero = CompatibilityManifest::Create(RankZero());
  const auto one = CompatibilityManifest::Create(RankOne());
  ASSERT_OK(zero);
  ASSERT_OK(one);
  // The pool hashes with xxh3_128 (the default).
  const std::string zero_digest = (*zero)->Digest(HashAlgorithm::kXxh3_128).ToHex();
  const std::string one_digest = (*one)->Digest(HashAlgorithm::kXxh3_128).ToHex();
  for (const KvCacheClient::ManifestInUse& use : description->manifests) {
    EXPECT_EQ(use.tenant, "default");
    EXPECT_EQ(use.manifest.model_id, "meta-llama/Llama-3.1-8B-Instruct");
    EXPECT_EQ(use.manifest.page_tokens, 16u);
    EXPECT_EQ(use.manifest.parallel.tp_size, 2u);
    if (use.digest == zero_digest) {
      EXPECT_EQ(use.sessions, 2u);
      EXPECT_EQ(use.manifest.parallel.tp_rank, 0u);
    } else {
      EXPECT_EQ(use.digest, one_digest);
      EXPECT_EQ(use.sessions, 1u);
      EXPECT_EQ(use.manifest.parallel.tp_rank, 1u);
    }
  }
  second.reset();  // closes its session
  ASSERT_TRUE(PollUntil([&] {
    absl::StatusOr<KvCacheClient::PoolDescription> now = observer_->DescribePool(pool_name_);
    return now.ok() && now->manifests.size() == 2 &&
           now->manifests[now->manifests[0].digest == zero_digest ? 0 : 1].sessions == 1;
  }));
}

}  // namespace
}  // namespace kvcache::testing
