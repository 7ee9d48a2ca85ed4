// The C++ client's token calls with parts (issue 31) against a real daemon on a Unix socket: a
// pool "hybrid" of "kv" on every block and a one-block trailing "state", with a host tier moved
// by hand. A commit names each block's parts; OpenSequence and Lookup restore the parts asked
// for and answer each hit block's mask, through tier 2 too; bad input is INVALID_ARGUMENT over
// the wire, publishing and holding nothing; a pool without parts answers as before.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/client/daemon_fixture.h"

namespace kvcache::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr char kPool[] = "hybrid";
constexpr uint32_t kPoolBlocks = 8;
constexpr uint32_t kKv = 1;
constexpr uint32_t kState = 2;
constexpr uint32_t kBoth = kKv | kState;
const std::vector<std::string> kKvAndState = {"kv", "state"};
const std::vector<std::string> kKvOnly = {"kv"};

class TokenPartsClientTest : public DaemonFixture {
 protected:
  TokenPartsClientTest() {
    PoolOptions pool = DefaultPoolOptions();
    pool.name = kPool;
    pool.num_blocks = kPoolBlocks;
    pool.parts = *ParsePageParts("kv/28K+state/4K/trailing1", pool.layout.BlockBytes());
    pool.host_tier_bytes = 16 * pool.layout.BlockBytes();
    pool.testing_manual_offload = true;
    extra_pools_.push_back(pool);
  }

  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(DaemonFixture::SetUp());
    ASSERT_OK(client_->OpenSession("default", "token-parts-test"));
  }

  // `blocks` full blocks and one token more, so an open may hit every block.
  static std::vector<uint32_t> Prompt(size_t blocks, uint32_t first) {
    return Tokens(blocks * kBlockSize + 1, first);
  }

  // Opens the prompt, commits its full blocks with `masks` and releases it.
  void Store(const std::vector<uint32_t>& prompt, const std::vector<uint32_t>& masks,
             const std::string& pool = kPool) {
    absl::StatusOr<KvCacheClient::Sequence> opened = client_->OpenSequence(pool, prompt);
    ASSERT_OK(opened);
    const uint32_t full = static_cast<uint32_t>(prompt.size() / kBlockSize * kBlockSize);
    ASSERT_OK(client_->CommitSequence(opened->sequence_id, full, masks));
    ASSERT_OK(client_->ReleaseSequence(opened->sequence_id));
  }

  uint32_t Referenced(const std::string& pool = kPool) {
    absl::StatusOr<KvCacheClient::PoolDescription> description = client_->DescribePool(pool);
    EXPECT_OK(description);
    return description.ok() ? description->counts.referenced : 0;
  }
};

TEST_F(TokenPartsClientTest, TheHitEndsWhereEveryAskedPartRestores) {
  const std::vector<uint32_t> prompt = Prompt(6, 100);
  ASSERT_NO_FATAL_FAILURE(Store(prompt, {kKv, kKv, kKv, kBoth, kKv, kKv}));

  absl::StatusOr<KvCacheClient::LookupResult> both =
      client_->Lookup(kPool, "", prompt, "", {}, std::nullopt, kKvAndState);
  ASSERT_OK(both);
  EXPECT_EQ(both->num_cached_tokens, 4 * kBlockSize);
  EXPECT_THAT(both->part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  absl::StatusOr<KvCacheClient::LookupResult> kv =
      client_->Lookup(kPool, "", prompt, "", {}, std::nullopt, kKvOnly);
  ASSERT_OK(kv);
  EXPECT_EQ(kv->num_cached_tokens, 6 * kBlockSize);

  absl::StatusOr<KvCacheClient::Sequence> opened =
      client_->OpenSequence(kPool, prompt, "", {}, 0, kKvAndState);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 4 * kBlockSize);
  EXPECT_THAT(opened->part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  EXPECT_EQ(opened->block_ids.size(), 7u);
  ASSERT_OK(client_->ReleaseSequence(opened->sequence_id));

  // The defaults: every part.
  absl::StatusOr<KvCacheClient::Sequence> plain = client_->OpenSequence(kPool, prompt);
  ASSERT_OK(plain);
  EXPECT_EQ(plain->num_cached_tokens, 4 * kBlockSize);
  ASSERT_OK(client_->ReleaseSequence(plain->sequence_id));
  EXPECT_EQ(Referenced(), 0u);
}

TEST_F(TokenPartsClientTest, MasksComeBackFromTierTwo) {
  const std::vector<uint32_t> prompt = Prompt(3, 100);
  ASSERT_NO_FATAL_FAILURE(Store(prompt, {kKv, kBoth, kKv}));
  (*daemon_->manager().FindPool(kPool))->OffloadForTesting();
  ASSERT_NO_FATAL_FAILURE(Store(Prompt(7, 5000), {}));  // evicts the first prompt from tier 1
  absl::StatusOr<KvCacheClient::Sequence> opened =
      client_->OpenSequence(kPool, prompt, "", {}, 0, kKvOnly);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 3 * kBlockSize);
  EXPECT_EQ(opened->cached_tokens_by_tier.host, 3 * kBlockSize);
  EXPECT_THAT(opened->part_masks, ElementsAre(kKv, kBoth, kKv));
  ASSERT_OK(client_->ReleaseSequence(opened->sequence_id));
  absl::StatusOr<KvCacheClient::LookupResult> both =
      client_->Lookup(kPool, "", prompt, "", {}, std::nullopt, kKvAndState);
  ASSERT_OK(both);
  EXPECT_EQ(both->num_cached_tokens, 2 * kBlockSize);
}

TEST_F(TokenPartsClientTest, BadPartsAreInvalidArgumentAndHoldNothing) {
  const std::vector<uint32_t> prompt = Prompt(2, 100);
  const std::vector<std::string> unknown = {"kv", "ssm"};
  EXPECT_THAT(client_->OpenSequence(kPool, prompt, "", {}, 0, unknown),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown part 'ssm'; the pool has kv, state")));
  EXPECT_THAT(client_->Lookup(kPool, "", prompt, "", {}, std::nullopt, unknown),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown part 'ssm'")));
  EXPECT_EQ(Referenced(), 0u);

  absl::StatusOr<KvCacheClient::Sequence> opened = client_->OpenSequence(kPool, prompt);
  ASSERT_OK(opened);
  const uint32_t full = 2 * kBlockSize;
  EXPECT_THAT(client_->CommitSequence(opened->sequence_id, full, {kKv, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 1 has part mask 0x4 but the pool has 2 part(s)")));
  EXPECT_THAT(client_->CommitSequence(opened->sequence_id, full, {kState, kKv}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 0 has part mask 0x2 without part 'kv'")));
  EXPECT_THAT(client_->CommitSequence(opened->sequence_id, full, {kKv}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("1 part masks for a commit of 32 tokens (2 full blocks")));
  ASSERT_OK(client_->ReleaseSequence(opened->sequence_id));
  absl::StatusOr<KvCacheClient::LookupResult> found =
      client_->Lookup(kPool, "", prompt, "", {}, std::nullopt, kKvOnly);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_cached_tokens, 0u);  // nothing was published
  EXPECT_EQ(Referenced(), 0u);
}

TEST_F(TokenPartsClientTest, APoolWithoutPartsAnswersAsBefore) {
  const std::vector<uint32_t> prompt = Prompt(2, 100);
  ASSERT_NO_FATAL_FAILURE(Store(prompt, {}, "default"));
  absl::StatusOr<KvCacheClient::Sequence> opened =
      client_->OpenSequence("default", prompt, "", {}, 0, kKvOnly);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 2 * kBlockSize);
  EXPECT_THAT(opened->part_masks, IsEmpty());
  ASSERT_OK(client_->ReleaseSequence(opened->sequence_id));
}

}  // namespace
}  // namespace kvcache::testing
