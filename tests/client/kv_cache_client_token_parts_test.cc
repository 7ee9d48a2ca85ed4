// The C++ client's token calls with parts (issue 31) against a real daemon on a Unix socket: a
// pool "hybrid" of "kv" on every block and a one-block trailing "state", with a host tier moved
// by hand. A commit names each block's parts; OpenSequence and Lookup restore the parts asked
// for and answer each hit block's mask, through tier 2 too; bad input is INVALID_ARGUMENT over
// the wire, publishing and holding nothing; a pool without parts answers as before. The data
// streams carry the same masks: PutBlocks publishes them, GetBlocks ends where the hit rule ends
// and tells them.
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

  // `blocks` blocks of distinct bytes, each filled with its own byte.
  std::string BlockBytes(size_t blocks, char first) {
    absl::StatusOr<KvCacheClient::PoolDescription> description = client_->DescribePool(kPool);
    EXPECT_OK(description);
    const uint64_t block_bytes = description.ok() ? description->pool.block_bytes : 0;
    std::string bytes;
    for (size_t i = 0; i < blocks; ++i) bytes.append(block_bytes, static_cast<char>(first + i));
    return bytes;
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

// A copy of a block with more parts replaces tier 2's poorer one, and GetStats says so.
TEST_F(TokenPartsClientTest, ARicherCopySupersedesTierTwosAndGetStatsCountsIt) {
  const auto host_superseded = [&]() -> uint64_t {
    absl::StatusOr<KvCacheClient::Stats> stats = client_->GetStats(kPool);
    EXPECT_OK(stats);
    if (!stats.ok() || stats->pools.size() != 1) return ~uint64_t{0};
    for (const KvCacheClient::TierStats& tier : stats->pools[0].tiers) {
      if (tier.tier == "host") return tier.superseded;
    }
    return ~uint64_t{0};
  };
  const std::vector<uint32_t> prompt = Prompt(2, 100);
  ASSERT_NO_FATAL_FAILURE(Store(prompt, {kKv, kKv}));
  Pool& pool = **daemon_->manager().FindPool(kPool);
  pool.OffloadForTesting();
  EXPECT_EQ(host_superseded(), 0u);
  ASSERT_NO_FATAL_FAILURE(Store(prompt, {kKv, kBoth}));  // the state of block 2 comes later
  pool.OffloadForTesting();
  EXPECT_EQ(host_superseded(), 1u);
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

TEST_F(TokenPartsClientTest, PutBlocksMasksComeBackFromGetBlocksAndOpenSequence) {
  const std::vector<uint32_t> prompt = Prompt(6, 100);
  const std::string bytes = BlockBytes(6, 'a');
  const uint64_t block_bytes = bytes.size() / 6;
  absl::StatusOr<KvCacheClient::PutResult> put = client_->PutBlocks(
      kPool, prompt, bytes, "", {}, size_t{1} << 20, 0, {kKv, kKv, kKv, kBoth, kKv, kKv});
  ASSERT_OK(put);
  EXPECT_EQ(put->num_stored, 6u);

  absl::StatusOr<KvCacheClient::GetResult> got = client_->GetBlocks(kPool, prompt);
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 4u);
  EXPECT_THAT(got->part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  EXPECT_EQ(got->bytes, bytes.substr(0, 4 * block_bytes));
  got = client_->GetBlocks(kPool, prompt, "", {}, 0, kKvOnly);
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 6u);
  EXPECT_THAT(got->part_masks, ElementsAre(kKv, kKv, kKv, kBoth, kKv, kKv));
  EXPECT_EQ(got->bytes, bytes);

  std::string into(6 * block_bytes, '\0');
  absl::StatusOr<KvCacheClient::GetInfo> info =
      client_->GetBlocksInto(kPool, prompt, absl::MakeSpan(into), "", {}, 0, kKvAndState);
  ASSERT_OK(info);
  EXPECT_EQ(info->num_blocks, 4u);
  EXPECT_THAT(info->part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  uint64_t visited = 0;
  info = client_->GetBlocksVisit(
      kPool, prompt,
      [&](uint32_t, uint64_t, absl::string_view piece) {
        visited += piece.size();
        return absl::OkStatus();
      },
      "", {}, 0, kKvOnly);
  ASSERT_OK(info);
  EXPECT_EQ(visited, 6 * block_bytes);
  EXPECT_THAT(info->part_masks, ElementsAre(kKv, kKv, kKv, kBoth, kKv, kKv));

  // The get streams' reactors release their holds as they finish, after the client saw the end;
  // the open below needs the pool's free blocks.
  ASSERT_TRUE(PollUntil([&] { return Referenced() == 0; }));
  absl::StatusOr<KvCacheClient::Sequence> opened =
      client_->OpenSequence(kPool, prompt, "", {}, 0, kKvAndState);
  ASSERT_OK(opened);
  EXPECT_EQ(opened->num_cached_tokens, 4 * kBlockSize);
  EXPECT_THAT(opened->part_masks, ElementsAre(kKv, kKv, kKv, kBoth));
  ASSERT_OK(client_->ReleaseSequence(opened->sequence_id));
  EXPECT_EQ(Referenced(), 0u);
}

TEST_F(TokenPartsClientTest, APutThatSkipsItsPrefixStillMasksFromBlockZero) {
  const std::vector<uint32_t> prompt = Prompt(4, 100);
  const std::string bytes = BlockBytes(4, 'k');
  const uint64_t block_bytes = bytes.size() / 4;
  ASSERT_OK(client_->PutBlocks(kPool, Tokens(2 * kBlockSize, 100), bytes.substr(0, 2 * block_bytes),
                               "", {}, size_t{1} << 20, 0, {kKv, kBoth}));
  std::vector<absl::string_view> rest = {
      absl::string_view(bytes).substr(2 * block_bytes, block_bytes),
      absl::string_view(bytes).substr(3 * block_bytes)};
  const std::vector<uint32_t> masks = {kKv, kBoth, kKv, kBoth};
  absl::StatusOr<KvCacheClient::PutResult> put = client_->PutBlocks(
      kPool, prompt, rest, KvCacheClient::PutOptions{.first_block = 2, .part_masks = masks});
  ASSERT_OK(put);
  EXPECT_EQ(put->num_already_cached, 2u);
  EXPECT_EQ(put->num_stored, 2u);
  absl::StatusOr<KvCacheClient::GetResult> got = client_->GetBlocks(kPool, prompt);
  ASSERT_OK(got);
  EXPECT_THAT(got->part_masks, ElementsAre(kKv, kBoth, kKv, kBoth));
  EXPECT_EQ(got->bytes, bytes);
}

TEST_F(TokenPartsClientTest, BadPutMasksOrGetPartsAreInvalidArgumentAndHoldNothing) {
  const std::vector<uint32_t> prompt = Prompt(2, 100);
  const std::string bytes = BlockBytes(2, 'x');
  EXPECT_THAT(client_->PutBlocks(kPool, prompt, bytes, "", {}, size_t{1} << 20, 0, {kKv, 4}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 1 has part mask 0x4 but the pool has 2 part(s)")));
  EXPECT_THAT(client_->PutBlocks(kPool, prompt, bytes, "", {}, size_t{1} << 20, 0, {kState, kKv}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 0 has part mask 0x2 without part 'kv'")));
  EXPECT_THAT(client_->PutBlocks(kPool, prompt, bytes, "", {}, size_t{1} << 20, 0, {kKv}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 part masks for 2")));
  EXPECT_THAT(client_->GetBlocks(kPool, prompt, "", {}, 0, {"kv", "ssm"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown part 'ssm'")));
  absl::StatusOr<KvCacheClient::LookupResult> found =
      client_->Lookup(kPool, "", prompt, "", {}, std::nullopt, kKvOnly);
  ASSERT_OK(found);
  EXPECT_EQ(found->num_cached_tokens, 0u);  // nothing was published
  // The streams' reactors release as they finish, after the client saw the status.
  EXPECT_TRUE(PollUntil([&] { return Referenced() == 0; }));
}

TEST_F(TokenPartsClientTest, DataStreamsOfAPoolWithoutPartsAnswerAsBefore) {
  const std::vector<uint32_t> prompt = Prompt(2, 100);
  const std::string bytes = BlockBytes(2, 'p');
  EXPECT_THAT(
      client_->PutBlocks("default", prompt, bytes, "", {}, size_t{1} << 20, 0, {kBoth, kBoth}),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("block 0 has part mask 0x3 but the pool has 1 part(s)")));
  ASSERT_OK(client_->PutBlocks("default", prompt, bytes, "", {}, size_t{1} << 20, 0, {kKv, kKv}));
  absl::StatusOr<KvCacheClient::GetResult> got = client_->GetBlocks("default", prompt);
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 2u);
  EXPECT_THAT(got->part_masks, IsEmpty());
  EXPECT_EQ(got->bytes, bytes);
  EXPECT_THAT(client_->GetBlocks("default", prompt, "", {}, 0, {"state"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown part 'state'")));
}

}  // namespace
}  // namespace kvcache::testing
