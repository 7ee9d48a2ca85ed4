// KV bytes across real processes: workers that map the daemon's shared-memory pool write KV in
// place and other processes read exactly those bytes on a prefix hit, also after the blocks sat
// soft-free and were resurrected; and clients without a mapping move the same bytes with
// PutBlocks / GetBlocks. Every client process checks the bytes against the deterministic pattern
// of tests/integration/kv_pattern.h, and prints their digest, which the test compares with the
// digest it computes itself.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/integration/daemon_process_fixture.h"
#include "tests/integration/kv_pattern.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::ClientResult;
using ::kvcache::testing::DaemonProcessTest;
using ::kvcache::testing::Digest;
using ::kvcache::testing::ExpectedPrefixBytes;
using ::kvcache::testing::Prefix;
using ::testing::ElementsAreArray;

class DaemonKvSharingTest : public DaemonProcessTest {
 protected:
  PoolLayout Layout() {
    absl::StatusOr<KvCacheClient::PoolDescription> described = observer_->DescribePool("default");
    EXPECT_OK(described);
    return described.ok() ? described->pool.layout : PoolLayout{};
  }

  // The digest a client must print for the first `num_blocks` blocks of the prompt.
  std::string ExpectedDigest(uint32_t num_tokens, uint32_t first_token, size_t num_blocks) {
    std::vector<uint32_t> tokens(num_tokens);
    for (uint32_t i = 0; i < num_tokens; ++i) tokens[i] = first_token + i;
    return Digest(ExpectedPrefixBytes(Layout(), tokens, num_blocks));
  }
};

TEST_F(DaemonKvSharingTest, KvWrittenInPlaceIsReadByOtherProcessesAlsoAfterResurrection) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  constexpr uint32_t kTokens = 3 * kBlockSize + 8;  // 3 full blocks and a partial one
  const std::string num_tokens = std::to_string(kTokens);
  const std::string expected = ExpectedDigest(kTokens, 1000, 3);

  // A: computes the whole prompt, writing its KV through its own mapping, commits and exits.
  const ClientResult a = RunClient({"write-kv", "default", num_tokens, "1000"});
  ASSERT_EQ(a.block_ids.size(), 4u);
  EXPECT_EQ(a.num_cached_tokens, 0u);
  EXPECT_EQ(a.Number("written"), kTokens);
  EXPECT_EQ(PoolStats().counts.referenced, 0u);
  EXPECT_EQ(PoolStats().counts.evictable, 3u);

  // B: another process hits the 3 full blocks and reads A's bytes through its own mapping.
  const ClientResult b = RunClient({"read-kv", "default", num_tokens, "1000"});
  EXPECT_EQ(b.num_cached_tokens, 3 * kBlockSize);
  EXPECT_THAT(Prefix(b.block_ids, 3), ElementsAreArray(Prefix(a.block_ids, 3)));
  EXPECT_EQ(b.Number("mismatched_blocks"), 0);
  EXPECT_EQ(b.Field("digest"), expected);

  // B released: the blocks sit evictable. Another prompt takes fresh blocks meanwhile (and
  // writes them); with free blocks left nothing is evicted and the evictable blocks are untouched.
  EXPECT_EQ(PoolStats().counts.evictable, 3u);
  const ClientResult filler =
      RunClient({"write-kv", "default", std::to_string(40 * kBlockSize), "50000"});
  EXPECT_EQ(filler.num_cached_tokens, 0u);
  ASSERT_EQ(filler.block_ids.size(), 40u);
  for (uint32_t block : Prefix(a.block_ids, 3)) {
    EXPECT_THAT(filler.block_ids, ::testing::Not(::testing::Contains(block)));
  }

  // C: resurrects the soft-free blocks; the bytes are still A's.
  const uint64_t resurrected_before = PoolStats().resurrected_blocks;
  const ClientResult c = RunClient({"read-kv", "default", num_tokens, "1000"});
  EXPECT_EQ(c.num_cached_tokens, 3 * kBlockSize);
  EXPECT_THAT(Prefix(c.block_ids, 3), ElementsAreArray(Prefix(a.block_ids, 3)));
  EXPECT_EQ(c.Number("mismatched_blocks"), 0);
  EXPECT_EQ(c.Field("digest"), expected);

  const KvCacheClient::PoolStats stats = PoolStats();
  EXPECT_EQ(stats.resurrected_blocks, resurrected_before + 3);
  EXPECT_EQ(stats.evictions, 0u);
  EXPECT_EQ(stats.counts.referenced, 0u);
  EXPECT_EQ(stats.counts.free + stats.counts.evictable, kPoolBlocks);
}

TEST_F(DaemonKvSharingTest, BlocksPutOverGrpcComeBackByteIdenticalOverGrpcAndShm) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  constexpr uint32_t kTokens = 4 * kBlockSize + 3;
  const std::string num_tokens = std::to_string(kTokens);
  const std::string expected = ExpectedDigest(kTokens, 3000, 4);

  // A remote-style client puts the prompt's 4 full blocks.
  const ClientResult put = RunClient({"put-kv", "default", num_tokens, "3000"});
  EXPECT_EQ(put.Number("put_blocks"), 4);
  EXPECT_EQ(put.Number("stored"), 4);
  EXPECT_EQ(put.Field("digest"), expected);
  EXPECT_EQ(PoolStats().counts.evictable, 4u);

  // Another process gets them back.
  const ClientResult got = RunClient({"get-kv", "default", num_tokens, "3000"});
  EXPECT_EQ(got.Number("got_blocks"), 4);
  EXPECT_EQ(got.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(got.Number("mismatched_blocks"), 0);
  EXPECT_EQ(got.Field("digest"), expected);

  // A worker that maps the pool hits the same bytes.
  const ClientResult mapped = RunClient({"read-kv", "default", num_tokens, "3000"});
  EXPECT_EQ(mapped.num_cached_tokens, 4 * kBlockSize);
  EXPECT_EQ(mapped.Number("mismatched_blocks"), 0);
  EXPECT_EQ(mapped.Field("digest"), expected);

  // A second put of the same prefix keeps what is cached.
  const ClientResult again = RunClient({"put-kv", "default", num_tokens, "3000"});
  EXPECT_EQ(again.Number("put_blocks"), 4);
  EXPECT_EQ(again.Number("stored"), 0);
  EXPECT_EQ(again.num_cached_tokens, 4 * kBlockSize);

  const KvCacheClient::PoolStats stats = PoolStats();
  EXPECT_EQ(stats.published_blocks, 4u);
  EXPECT_EQ(stats.counts.referenced, 0u);
  EXPECT_EQ(stats.counts.free + stats.counts.evictable, kPoolBlocks);
}

TEST_F(DaemonKvSharingTest, KvWrittenInPlaceIsServedOverGrpc) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  constexpr uint32_t kTokens = 2 * kBlockSize + 1;
  const std::string num_tokens = std::to_string(kTokens);
  const ClientResult written = RunClient({"write-kv", "default", num_tokens, "6000"});
  ASSERT_EQ(written.block_ids.size(), 3u);
  const ClientResult got = RunClient({"get-kv", "default", num_tokens, "6000"});
  EXPECT_EQ(got.Number("got_blocks"), 2);
  EXPECT_EQ(got.Number("mismatched_blocks"), 0);
  EXPECT_EQ(got.Field("digest"), ExpectedDigest(kTokens, 6000, 2));
  // A shorter prompt gets only its own full block.
  const ClientResult diverged =
      RunClient({"get-kv", "default", std::to_string(kBlockSize), "6000"});
  EXPECT_EQ(diverged.Number("got_blocks"), 1);
  EXPECT_EQ(diverged.Field("digest"), ExpectedDigest(kBlockSize, 6000, 1));
}

}  // namespace
}  // namespace kvcache
