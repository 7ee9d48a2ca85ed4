// The block data RPCs end to end over a real Unix socket: round trips, partial hits, and every
// failure path leaving the pool exactly as it was.
#include "server/block_streams.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/sync_stream.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#include <numeric>
#include <random>

#include "absl/strings/str_cat.h"
#include "client/block_stream.h"
#include "common/block_hash.h"
#include "common/page_parts.h"
#include "common/rpc/grpc_status.h"
#include "server/daemon.h"
#include "tests/testing/grpc_kept_alive.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::PollUntil;
using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr uint32_t kBlockSize = 4;
constexpr uint32_t kNumBlocks = 16;
constexpr uint32_t kBigBlocks = 8192;  // 32 MiB

class BlockStreamsTest : public ::testing::Test {
 protected:
  // PoolOptions::testing_hash_bits of pool "p" (0: full-width hashes).
  virtual uint32_t HashBits() const { return 0; }

  void SetUp() override {
    ::kvcache::testing::KeepGrpcInitialized();
    DaemonOptions options;
    options.listen = "unix://" + dir_.File("kv.sock");
    options.max_message_bytes = 256 << 10;
    PoolOptions pool;
    pool.name = "p";
    pool.model_id = "m";
    // 1 layer * 2 * 4 tokens * 2 heads * 128 dims * 2 bytes = 4 KiB blocks.
    pool.layout =
        PoolLayout{.num_layers = 1, .num_kv_heads = 2, .head_dim = 128, .block_size = kBlockSize};
    pool.num_blocks = kNumBlocks;
    pool.testing_hash_bits = HashBits();
    options.pools.push_back(pool);
    pool.testing_hash_bits = 0;
    // More bytes than gRPC and the socket buffer between a sender and a reader that stalls.
    pool.name = "big";
    pool.num_blocks = kBigBlocks;
    options.pools.push_back(pool);
    // A hybrid model's pages: KV on every block, a state the hit needs on the last one.
    pool.name = "parts";
    pool.num_blocks = kNumBlocks;
    pool.parts = *ParsePageParts("kv/3K+state/1K/trailing1", pool.layout.BlockBytes());
    options.pools.push_back(pool);
    auto daemon = Daemon::Start(options);
    ASSERT_OK(daemon);
    daemon_ = *std::move(daemon);
    block_bytes_ = pool.layout.BlockBytes();
    layout_ = pool.layout;
    stub_ = v1::KvCache::NewStub(
        grpc::CreateChannel(options.listen, grpc::InsecureChannelCredentials()));
    session_ = OpenSession("");  // the default identity's tenant, "default"
  }

  void TearDown() override {
    // Stream reactors release in OnDone, which may trail the client's view of the stream.
    const absl::Time give_up = absl::Now() + absl::Seconds(30);
    while (FirstPool().Stats().referenced != 0 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(2));
    }
    EXPECT_EQ(FirstPool().Stats().referenced, 0);
    EXPECT_OK(FirstPool().CheckInvariants());
    daemon_.reset();
  }

  Pool& FirstPool() { return *daemon_->manager().pools()[0]; }

  uint64_t OpenSession(const std::string& tenant, uint32_t ttl_ms = 0) {
    grpc::ClientContext context;
    v1::OpenSessionRequest request;
    request.set_tenant(tenant);
    request.set_ttl_ms(ttl_ms);
    v1::OpenSessionResponse response;
    EXPECT_TRUE(stub_->OpenSession(&context, request, &response).ok());
    return response.session_id();
  }

  std::string RandomBlocks(size_t blocks, uint32_t seed) {
    std::string bytes(blocks * block_bytes_, '\0');
    std::mt19937 rng(seed);
    for (char& byte : bytes) byte = static_cast<char>(rng());
    return bytes;
  }

  v1::PutBlocksHeader Header(const std::vector<uint32_t>& tokens, const std::string& bytes,
                             const std::string& pool = "p") {
    v1::PutBlocksHeader header;
    header.set_session_id(session_);
    header.set_pool(pool);
    header.mutable_tokens()->Add(tokens.begin(), tokens.end());
    for (size_t offset = 0; offset + block_bytes_ <= bytes.size(); offset += block_bytes_) {
      header.add_block_checksums(XXH3_64bits_withSeed(bytes.data() + offset, block_bytes_, 0));
    }
    return header;
  }

  // Sends `header` then `bytes` in `chunk`-sized messages; returns the final status.
  absl::StatusOr<v1::PutBlocksResponse> Put(const v1::PutBlocksHeader& header,
                                            const std::string& bytes, size_t chunk = 3000) {
    grpc::ClientContext context;
    v1::PutBlocksResponse response;
    auto writer = stub_->PutBlocks(&context, &response);
    v1::PutBlocksRequest request;
    *request.mutable_header() = header;
    writer->Write(request);
    for (size_t offset = 0; offset < bytes.size(); offset += chunk) {
      request.set_data(bytes.substr(offset, chunk));
      if (!writer->Write(request)) break;  // the daemon already finished the call
    }
    writer->WritesDone();
    const absl::Status status = FromGrpcStatus(writer->Finish());
    if (!status.ok()) return status;
    return response;
  }

  struct Got {
    v1::GetBlocksHeader header;
    std::string bytes;
    int messages = 0;
  };
  absl::StatusOr<Got> Get(const std::vector<uint32_t>& tokens, uint64_t session,
                          uint32_t max_chunk = 0, const std::string& pool = "p",
                          const std::vector<std::string>& restore_parts = {}) {
    grpc::ClientContext context;
    v1::GetBlocksRequest request;
    request.set_session_id(session);
    request.set_pool(pool);
    request.mutable_tokens()->Add(tokens.begin(), tokens.end());
    request.set_max_chunk_bytes(max_chunk);
    request.mutable_restore_parts()->Add(restore_parts.begin(), restore_parts.end());
    auto reader = stub_->GetBlocks(&context, request);
    Got got;
    v1::GetBlocksResponse response;
    while (reader->Read(&response)) {
      ++got.messages;
      if (response.has_header()) got.header = response.header();
      got.bytes += response.data();
    }
    const absl::Status status = FromGrpcStatus(reader->Finish());
    if (!status.ok()) return status;
    return got;
  }

  std::tuple<uint32_t, uint32_t, uint32_t> Counts() {
    const PoolStatsSnapshot stats = FirstPool().Stats();
    return {stats.free, stats.evictable, stats.referenced};
  }

  ScopedTempDir dir_{"kvcache-streams"};  // for the socket
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  uint64_t session_ = 0;
  uint64_t block_bytes_ = 0;
  PoolLayout layout_;
  std::vector<uint32_t> tokens_ = [] {
    std::vector<uint32_t> tokens(14);  // 3 full blocks and 2 tokens
    std::iota(tokens.begin(), tokens.end(), 100);
    return tokens;
  }();
};

TEST_F(BlockStreamsTest, PutThenGetReturnsIdenticalBytesToAnotherSession) {
  const std::string bytes = RandomBlocks(3, 1);
  auto put = Put(Header(tokens_, bytes), bytes);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_blocks(), 3);
  EXPECT_EQ(put->num_stored(), 3);
  EXPECT_EQ(put->num_already_cached(), 0);
  EXPECT_EQ(Counts(), std::make_tuple(13u, 3u, 0u));  // published, released, findable

  auto got = Get(tokens_, OpenSession(""), 4096);
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 3);
  EXPECT_EQ(got->header.num_cached_tokens(), 12);
  EXPECT_EQ(got->header.block_bytes(), block_bytes_);
  EXPECT_EQ(got->header.block_checksums_size(), 3);
  EXPECT_EQ(got->bytes, bytes);
  EXPECT_EQ(got->messages, 1 + 3);  // header, then one 4 KiB chunk per block

  // The documented floor (issue 17: it was silent): below 4096, chunks are 4096 bytes.
  got = Get(tokens_, session_, 100);
  ASSERT_OK(got);
  EXPECT_EQ(got->bytes, bytes);
  EXPECT_EQ(got->messages, 1 + 3);
}

TEST_F(BlockStreamsTest, PutKeepsCachedBlocksAndStoresOnlyTheMissingOnes) {
  const std::string bytes = RandomBlocks(3, 2);
  std::vector<uint32_t> prefix(tokens_.begin(), tokens_.begin() + 8);
  ASSERT_OK(
      Put(Header(prefix, bytes.substr(0, 2 * block_bytes_)), bytes.substr(0, 2 * block_bytes_)));
  auto put = Put(Header(tokens_, bytes), bytes);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_already_cached(), 2);
  EXPECT_EQ(put->num_stored(), 1);
  auto got = Get(tokens_, session_);
  ASSERT_OK(got);
  EXPECT_EQ(got->bytes, bytes);
}

TEST_F(BlockStreamsTest, PutCanSkipTheBlocksTheDaemonHolds) {
  const std::string bytes = RandomBlocks(3, 9);
  std::vector<uint32_t> prefix(tokens_.begin(), tokens_.begin() + 4);
  ASSERT_OK(Put(Header(prefix, bytes.substr(0, block_bytes_)), bytes.substr(0, block_bytes_)));
  // Blocks 1 and 2 only; block 0 is already cached here.
  const std::string rest = bytes.substr(block_bytes_);
  v1::PutBlocksHeader header = Header(tokens_, rest);
  header.set_first_block(1);
  auto put = Put(header, rest);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_stored(), 2);
  auto got = Get(tokens_, session_);
  ASSERT_OK(got);
  EXPECT_EQ(got->bytes, bytes);
  // Skipping a block the daemon does not hold is refused, and changes nothing.
  std::vector<uint32_t> other = tokens_;
  other[0] = 7;
  v1::PutBlocksHeader bad = Header(other, rest);
  bad.set_first_block(1);
  EXPECT_THAT(Put(bad, rest), StatusIs(absl::StatusCode::kFailedPrecondition,
                                       HasSubstr("only 0 of them are cached")));
  EXPECT_EQ(FirstPool().Lookup("default", SequenceSpec{other})->num_cached_blocks, 0);
  bad.set_first_block(4);
  EXPECT_THAT(Put(bad, ""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block 4")));
}

// Part masks (DESIGN §13) through the data streams, in pool "parts" (kv on every block, a state
// on the last one of a hit): the put publishes each block's mask, and the get ends where the hit
// rule ends it, telling each block's mask, as OpenSequence does.
constexpr uint32_t kKv = 1;
constexpr uint32_t kState = 2;
constexpr uint32_t kBoth = kKv | kState;

TEST_F(BlockStreamsTest, PutPublishesPartMasksAndGetEndsWhereTheHitRuleEnds) {
  std::vector<uint32_t> tokens(4 * kBlockSize + 1);
  std::iota(tokens.begin(), tokens.end(), 300);
  const std::string bytes = RandomBlocks(4, 21);
  v1::PutBlocksHeader header = Header(tokens, bytes, "parts");
  for (uint32_t mask : {kKv, kKv, kBoth, kKv}) header.add_part_masks(mask);
  auto put = Put(header, bytes);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_stored(), 4);

  // Every part: the state of block 2 ends the hit there; blocks 0 and 1 need none.
  auto got = Get(tokens, session_, 0, "parts");
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 3);
  EXPECT_EQ(got->header.num_cached_tokens(), 3 * kBlockSize);
  EXPECT_THAT(got->header.part_masks(), ElementsAre(kKv, kKv, kBoth));
  EXPECT_EQ(got->bytes, bytes.substr(0, 3 * block_bytes_));
  got = Get(tokens, session_, 0, "parts", {"kv", "state"});
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 3);
  got = Get(tokens, session_, 0, "parts", {"kv"});
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 4);
  EXPECT_THAT(got->header.part_masks(), ElementsAre(kKv, kKv, kBoth, kKv));
  EXPECT_EQ(got->bytes, bytes);

  // The token API sees the same masks.
  grpc::ClientContext context;
  v1::OpenSequenceRequest open;
  open.set_session_id(session_);
  open.set_pool("parts");
  open.mutable_tokens()->Add(tokens.begin(), tokens.end());
  v1::OpenSequenceResponse opened;
  ASSERT_TRUE(stub_->OpenSequence(&context, open, &opened).ok());
  EXPECT_EQ(opened.num_cached_tokens(), 3 * kBlockSize);
  EXPECT_THAT(opened.part_masks(), ElementsAre(kKv, kKv, kBoth));
  grpc::ClientContext release_context;
  v1::ReleaseSequenceRequest release;
  release.set_session_id(session_);
  release.set_sequence_id(opened.sequence_id());
  v1::ReleaseSequenceResponse released;
  ASSERT_TRUE(stub_->ReleaseSequence(&release_context, release, &released).ok());

  // Without a state anywhere nothing restores every part.
  std::vector<uint32_t> plain = tokens;
  plain[0] = 1;
  header = Header(plain, bytes, "parts");
  for (int i = 0; i < 4; ++i) header.add_part_masks(kKv);
  ASSERT_OK(Put(header, bytes));
  got = Get(plain, session_, 0, "parts");
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 0);
  EXPECT_TRUE(got->bytes.empty());
}

TEST_F(BlockStreamsTest, APutWithMorePartsSupersedesThePoorerCopy) {
  std::vector<uint32_t> tokens(3 * kBlockSize);
  std::iota(tokens.begin(), tokens.end(), 500);
  const std::string kv_only = RandomBlocks(3, 22);
  v1::PutBlocksHeader header = Header(tokens, kv_only, "parts");
  for (int i = 0; i < 3; ++i) header.add_part_masks(kKv);
  ASSERT_OK(Put(header, kv_only));
  // The same KV, now with the state written into block 2.
  const std::string with_state = kv_only.substr(0, 2 * block_bytes_) + RandomBlocks(1, 23);
  header = Header(tokens, with_state, "parts");
  for (uint32_t mask : {kKv, kKv, kBoth}) header.add_part_masks(mask);
  auto put = Put(header, with_state);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_already_cached(), 0);  // no cached block restores every part
  auto got = Get(tokens, session_, 0, "parts");
  ASSERT_OK(got);
  EXPECT_THAT(got->header.part_masks(), ElementsAre(kKv, kKv, kBoth));
  EXPECT_EQ(got->bytes, with_state);
}

TEST_F(BlockStreamsTest, BadPartMasksOrPartsAreInvalidArgumentAndChangeNothing) {
  Pool& parts = **daemon_->manager().FindPool("parts");
  const std::string bytes = RandomBlocks(3, 24);
  const std::vector<uint32_t> tokens(tokens_.begin(), tokens_.begin() + 3 * kBlockSize);
  const auto put_with = [&](std::vector<uint32_t> masks) {
    v1::PutBlocksHeader header = Header(tokens, bytes, "parts");
    header.mutable_part_masks()->Add(masks.begin(), masks.end());
    return Put(header, bytes);
  };
  EXPECT_THAT(put_with({kKv, kKv}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("2 part masks for 3 full blocks of 12 tokens; want one per full "
                                 "block from block 0")));
  EXPECT_THAT(put_with({kKv, 4, kKv}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 1 has part mask 0x4 but the pool has 2 part(s)")));
  EXPECT_THAT(put_with({kKv, kKv, kState}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 2 has part mask 0x2 without part 'kv'")));
  // A put that skips blocks still gives a mask for each block from block 0.
  v1::PutBlocksHeader skipping = Header(tokens, bytes.substr(block_bytes_), "parts");
  skipping.set_first_block(1);
  skipping.add_part_masks(kKv);
  skipping.add_part_masks(kBoth);
  EXPECT_THAT(Put(skipping, bytes.substr(block_bytes_)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 part masks for 3")));
  EXPECT_THAT(Get(tokens, session_, 0, "parts", {"kv", "ssm"}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("unknown part 'ssm'; the pool has kv, state")));
  EXPECT_EQ(parts.Lookup("default", SequenceSpec{tokens})->num_cached_blocks, 0);
  // Nothing published, and once the reactors are done, nothing held.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (parts.Stats().referenced != 0 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(2));
  }
  EXPECT_EQ(parts.Stats().referenced, 0);
  EXPECT_EQ(parts.Stats().free, kNumBlocks);
  EXPECT_OK(parts.CheckInvariants());
}

TEST_F(BlockStreamsTest, APoolWithoutPartsTakesOnlyItsOnePartsMaskAndAnswersNone) {
  const std::string bytes = RandomBlocks(3, 25);
  v1::PutBlocksHeader header = Header(tokens_, bytes);
  for (int i = 0; i < 3; ++i) header.add_part_masks(kKv | kState);
  EXPECT_THAT(Put(header, bytes),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("block 0 has part mask 0x3 but the pool has 1 part(s)")));
  EXPECT_EQ(FirstPool().Lookup("default", SequenceSpec{tokens_})->num_cached_blocks, 0);
  header.clear_part_masks();
  for (int i = 0; i < 3; ++i) header.add_part_masks(kKv);
  ASSERT_OK(Put(header, bytes));
  for (const std::vector<std::string>& restore :
       {std::vector<std::string>{}, std::vector<std::string>{"kv"}}) {
    auto got = Get(tokens_, session_, 0, "p", restore);
    ASSERT_OK(got);
    EXPECT_EQ(got->header.num_blocks(), 3);
    EXPECT_THAT(got->header.part_masks(), IsEmpty());
    EXPECT_EQ(got->bytes, bytes);
  }
  EXPECT_THAT(Get(tokens_, session_, 0, "p", {"state"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown part 'state'")));
}

// Regression (issue 17): GetBlocks of a prompt with more full blocks than the pool answered
// RESOURCE_EXHAUSTED although its leading blocks were cached and Lookup found them.
TEST_F(BlockStreamsTest, GetOfAPromptLongerThanThePoolReturnsItsCachedPrefix) {
  const std::string bytes = RandomBlocks(3, 4);
  ASSERT_OK(Put(Header(tokens_, bytes), bytes));
  for (const size_t length : {size_t{kBlockSize * (kNumBlocks + 5)}, size_t{60000}}) {
    SCOPED_TRACE(length);
    std::vector<uint32_t> prompt(length);
    std::iota(prompt.begin(), prompt.end(), 100);
    auto got = Get(prompt, session_);
    ASSERT_OK(got);
    EXPECT_EQ(got->header.num_cached_tokens(), 12);
    EXPECT_EQ(got->bytes, bytes);
  }
}

TEST_F(BlockStreamsTest, GetOfAnUncachedOrForeignPromptMatchesNothing) {
  const std::string bytes = RandomBlocks(3, 3);
  ASSERT_OK(Put(Header(tokens_, bytes), bytes));
  std::vector<uint32_t> other = tokens_;
  other[0] = 1;
  auto got = Get(other, session_);
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 0);
  EXPECT_TRUE(got->bytes.empty());
  // Tenants never share blocks: a session of another tenant, opened (in the core: the default
  // identity may not name another tenant) for this test's own uid.
  absl::StatusOr<std::shared_ptr<Session>> other_tenant = daemon_->manager().sessions().Open(
      absl::StrCat("uid:", getuid()), "tenant-b", "test", absl::Seconds(10));
  ASSERT_OK(other_tenant);
  got = Get(tokens_, (*other_tenant)->id);
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 0);
}

// Issue 17, forced collisions with real bytes: pool "p" keeps 8 bits of every chain hash, so the
// test can pick prompts whose chains collide. A collision must cost a miss, never another
// prompt's bytes.
class WeakHashBlockStreamsTest : public BlockStreamsTest {
 protected:
  uint32_t HashBits() const override { return 8; }

  // The chain pool "p" computes for the default tenant's prompt.
  std::vector<Hash128> Chain(const std::vector<uint32_t>& tokens) const {
    BlockHasher hasher(HashAlgorithm::kXxh3_128, 8);
    const Hash128 root = hasher.Root(HashNamespace{"m", layout_.Fingerprint(), "default", ""});
    std::vector<Hash128> chain;
    hasher.ExtendChain(root, tokens, kBlockSize, {}, &chain);
    return chain;
  }
  // A one-block prompt other than `tokens` whose hash collides with its block 0.
  std::vector<uint32_t> CollidingBlock(const std::vector<uint32_t>& tokens) const {
    for (uint32_t first = 5000; first < 500000; ++first) {
      std::vector<uint32_t> candidate = {first, 7, 7, 7};
      if (Chain(candidate)[0] == Chain(tokens)[0]) return candidate;
    }
    return {};
  }
  static std::vector<uint32_t> Concat(std::vector<uint32_t> a, const std::vector<uint32_t>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }
};

TEST_F(WeakHashBlockStreamsTest, ACollidingPromptGetsAMissNotAnotherPromptsBytes) {
  const std::vector<uint32_t> a = {1, 2, 3, 4};
  const std::vector<uint32_t> b = CollidingBlock(a);
  ASSERT_FALSE(b.empty());
  const std::string a_bytes = RandomBlocks(1, 11);
  ASSERT_OK(Put(Header(a, a_bytes), a_bytes));

  auto got = Get(b, session_);
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 0);
  EXPECT_TRUE(got->bytes.empty());

  // B's own bytes: stored in a block of their own, which its hash cannot index (A's holds it).
  const std::string b_bytes = RandomBlocks(1, 12);
  auto put = Put(Header(b, b_bytes), b_bytes);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_already_cached(), 0);
  got = Get(b, session_);
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 0);
  got = Get(a, session_);
  ASSERT_OK(got);
  ASSERT_EQ(got->header.num_blocks(), 1);
  EXPECT_EQ(got->bytes, a_bytes);
  EXPECT_EQ(got->header.block_checksums(0),
            XXH3_64bits_withSeed(a_bytes.data(), a_bytes.size(), 0));
  // B's two gets, B's put (its open's walk and its commit).
  EXPECT_EQ(FirstPool().collisions_caught(), 4);
}

TEST_F(WeakHashBlockStreamsTest, AContinuationOfACollidingPrefixIsNeverServedAnotherPrefixsBytes) {
  const std::vector<uint32_t> q = {1, 2, 3, 4};
  const std::vector<uint32_t> p = CollidingBlock(q);
  ASSERT_FALSE(p.empty());
  const std::vector<uint32_t> tail = {9, 9, 9, 9};
  ASSERT_NE(Chain(Concat(p, tail))[1], Chain(q)[0]);
  const std::string q_bytes = RandomBlocks(1, 21);
  ASSERT_OK(Put(Header(q, q_bytes), q_bytes));
  // P's block collides with Q's and stays private; the tail's KV was computed over P.
  const std::string p_tail_bytes = RandomBlocks(2, 22);
  ASSERT_OK(Put(Header(Concat(p, tail), p_tail_bytes), p_tail_bytes));

  auto got = Get(Concat(q, tail), session_);
  ASSERT_OK(got);
  ASSERT_EQ(got->header.num_blocks(), 1);  // Q's block, not P's tail after it
  EXPECT_EQ(got->bytes, q_bytes);
  got = Get(Concat(p, tail), session_);
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 0);
  EXPECT_GE(FirstPool().collisions_caught(), 3);
}

TEST_F(BlockStreamsTest, BadChecksumIsDataLossAndRegistersNothing) {
  const auto before = Counts();
  const std::string bytes = RandomBlocks(3, 4);
  v1::PutBlocksHeader header = Header(tokens_, bytes);
  header.set_block_checksums(2, header.block_checksums(2) ^ 1);
  EXPECT_THAT(Put(header, bytes), StatusIs(absl::StatusCode::kDataLoss, HasSubstr("block 2")));
  auto got = Get(tokens_, session_);
  ASSERT_OK(got);
  EXPECT_EQ(got->header.num_blocks(), 0);
  TearDown();  // settle the reactor, then compare
  SetUp();
  EXPECT_EQ(Counts(), before);
}

TEST_F(BlockStreamsTest, StreamEndingEarlyIsDataLossAndLeavesThePoolUnchanged) {
  const auto before = Counts();
  const std::string bytes = RandomBlocks(3, 5);
  EXPECT_THAT(Put(Header(tokens_, bytes), bytes.substr(0, bytes.size() - 100)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ended after")));
  EXPECT_EQ(FirstPool().Lookup("default", SequenceSpec{tokens_})->num_cached_blocks, 0);
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (Counts() != before && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ(Counts(), before);
}

TEST_F(BlockStreamsTest, WrongSizesAndOrderAreInvalidArgument) {
  const std::string bytes = RandomBlocks(3, 6);
  EXPECT_THAT(Put(Header(tokens_, bytes), bytes + "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("more than")));
  v1::PutBlocksHeader header = Header(tokens_, bytes);
  header.mutable_block_checksums()->RemoveLast();
  EXPECT_THAT(Put(header, bytes),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 checksums for 3")));
  std::vector<uint32_t> short_prompt(tokens_.begin(), tokens_.begin() + 3);
  EXPECT_THAT(Put(Header(short_prompt, ""), ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no full block")));

  grpc::ClientContext context;
  v1::PutBlocksResponse response;
  auto writer = stub_->PutBlocks(&context, &response);
  v1::PutBlocksRequest request;
  request.set_data("no header first");
  writer->Write(request);
  writer->WritesDone();
  EXPECT_THAT(FromGrpcStatus(writer->Finish()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("header")));
  EXPECT_EQ(FirstPool().Lookup("default", SequenceSpec{tokens_})->num_cached_blocks, 0);
}

// Put messages as raw bytes, for encodings the typed stub cannot produce.
absl::Status PutRaw(const std::shared_ptr<grpc::Channel>& channel,
                    const std::vector<std::string>& messages) {
  grpc::GenericStub stub(channel);
  BlockStream stream(&stub, "/kvcache.v1.KvCache/PutBlocks", absl::Now() + absl::Seconds(30),
                     /*wait_for_ready=*/false);
  bool open = true;
  for (const std::string& message : messages) {
    grpc::Slice slice(message);
    open = stream.Write(grpc::ByteBuffer(&slice, 1));
    if (!open) break;
  }
  if (open) stream.WritesDone();
  grpc::ByteBuffer reply;
  stream.Read(&reply);  // a put's reply must be read before its status
  return FromGrpcStatus(stream.Finish());
}

TEST_F(BlockStreamsTest, MalformedPutMessagesAreInvalidArgumentAndChangeNothing) {
  const std::string bytes = RandomBlocks(3, 8);
  v1::PutBlocksRequest header_message;
  *header_message.mutable_header() = Header(tokens_, bytes);
  const std::string header = header_message.SerializeAsString();
  v1::PutBlocksRequest data_message;
  data_message.set_data(bytes);
  const std::string data = data_message.SerializeAsString();
  const auto channel = grpc::CreateChannel(daemon_->address(), grpc::InsecureChannelCredentials());
  const auto counts = Counts();

  // The data field cut short inside the message.
  EXPECT_THAT(PutRaw(channel, {header, data.substr(0, data.size() - 10)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("truncated")));
  // Header and data in one message (the typed API's oneof cannot say that).
  EXPECT_THAT(PutRaw(channel, {header + data}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not both")));
  // A group, which proto3 never encodes.
  EXPECT_THAT(PutRaw(channel, {header, "\x0b"}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("wire type 3")));
  // Bytes that are no PutBlocksRequest: field 1 (the header) holding an invalid message.
  EXPECT_THAT(PutRaw(channel, {std::string("\x0a\x02\x08\x80", 4)}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("PutBlocksRequest")));
  EXPECT_EQ(FirstPool().Lookup("default", SequenceSpec{tokens_})->num_cached_blocks, 0);
  // OnDone releases after the client saw the status.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (Counts() != counts && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(2));
  EXPECT_EQ(Counts(), counts);

  // The same connection still serves a well-formed put.
  EXPECT_OK(PutRaw(channel, {header, data}));
  EXPECT_EQ(FirstPool().Lookup("default", SequenceSpec{tokens_})->num_cached_blocks, 3);
}

TEST_F(BlockStreamsTest, OversizeMessageIsResourceExhaustedAndChangesNothing) {
  const std::vector<uint32_t> many(4 * 15, 9);  // 15 blocks = 60 KiB per block set
  const std::string bytes(15 * block_bytes_, 'k');
  // One message over the daemon's 256 KiB limit.
  const std::string huge = bytes + std::string(300 << 10, 'x');
  EXPECT_THAT(Put(Header(many, bytes), huge, huge.size()),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(FirstPool().Lookup("default", SequenceSpec{many})->num_cached_blocks, 0);
}

TEST_F(BlockStreamsTest, CancelledPutReleasesItsBlocks) {
  const std::string bytes = RandomBlocks(3, 7);
  grpc::ClientContext context;
  v1::PutBlocksResponse response;
  auto writer = stub_->PutBlocks(&context, &response);
  v1::PutBlocksRequest request;
  *request.mutable_header() = Header(tokens_, bytes);
  writer->Write(request);
  request.set_data(bytes.substr(0, block_bytes_ + 10));
  writer->Write(request);
  context.TryCancel();
  EXPECT_THAT(FromGrpcStatus(writer->Finish()), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_EQ(FirstPool().Lookup("default", SequenceSpec{tokens_})->num_cached_blocks, 0);
  // TearDown waits (bounded) for the reactor's release and checks nothing is referenced.
}

// Regression (issue 17): a put stream outlived its session. With ttl_ms=500, a put of 10 blocks
// that sent 5 and stalled kept its 10 blocks referenced after the lease ended, then answered OK
// and published them. The stream is bound to the lease: when it ends, the put ends ABORTED at
// once, its blocks go back, and nothing is published, whatever the client sends later.
TEST_F(BlockStreamsTest, APutEndsWithItsLeaseAndPublishesNothing) {
  const uint64_t short_lease = OpenSession("", 500);
  std::vector<uint32_t> tokens(10 * kBlockSize);
  std::iota(tokens.begin(), tokens.end(), 7000);
  const std::string bytes = RandomBlocks(10, 11);
  v1::PutBlocksHeader header = Header(tokens, bytes);
  header.set_session_id(short_lease);

  grpc::ClientContext context;
  v1::PutBlocksResponse response;
  auto writer = stub_->PutBlocks(&context, &response);
  v1::PutBlocksRequest request;
  *request.mutable_header() = header;
  ASSERT_TRUE(writer->Write(request));
  request.set_data(bytes.substr(0, 5 * block_bytes_));
  ASSERT_TRUE(writer->Write(request));
  // The daemon holds the put's 10 blocks while the client stalls...
  ASSERT_TRUE(PollUntil([&] { return FirstPool().Stats().referenced == 10; }));
  // ... until the lease ends (no keep-alive): then they return without the client doing a thing.
  ASSERT_TRUE(PollUntil([&] {
    return daemon_->manager().sessions().size() == 1 && FirstPool().Stats().referenced == 0;
  }));
  // What the client sends now is too late.
  request.set_data(bytes.substr(5 * block_bytes_));
  writer->Write(request);
  writer->WritesDone();
  EXPECT_THAT(FromGrpcStatus(writer->Finish()),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("lease ended during the put")));
  EXPECT_EQ(FirstPool().Lookup("default", SequenceSpec{tokens})->num_cached_blocks, 0);
  EXPECT_EQ(Counts(), std::make_tuple(kNumBlocks, 0u, 0u));
}

// Same for a get whose reader stalls: its pinned blocks are released when the lease ends.
TEST_F(BlockStreamsTest, AGetEndsWithItsLeaseAndUnpinsItsBlocks) {
  Pool& big = *daemon_->manager().pools()[1];
  std::vector<uint32_t> tokens(kBigBlocks * kBlockSize);
  std::iota(tokens.begin(), tokens.end(), 1);
  const std::string bytes = RandomBlocks(kBigBlocks, 12);
  ASSERT_OK(Put(Header(tokens, bytes, "big"), bytes, 128 << 10));
  ASSERT_EQ(big.Stats().evictable, kBigBlocks);

  const uint64_t short_lease = OpenSession("", 500);
  grpc::ClientContext context;
  v1::GetBlocksRequest request;
  request.set_session_id(short_lease);
  request.set_pool("big");
  request.mutable_tokens()->Add(tokens.begin(), tokens.end());
  request.set_max_chunk_bytes(64 << 10);
  auto reader = stub_->GetBlocks(&context, request);
  v1::GetBlocksResponse response;
  ASSERT_TRUE(reader->Read(&response));  // the header; then the reader stalls
  ASSERT_TRUE(response.has_header());
  ASSERT_EQ(response.header().num_blocks(), kBigBlocks);
  EXPECT_EQ(big.Stats().referenced, kBigBlocks);  // pinned while they stream
  // The lease ends: the blocks go back to the evictable list while the reader still sleeps.
  ASSERT_TRUE(PollUntil(
      [&] { return daemon_->manager().sessions().size() == 1 && big.Stats().referenced == 0; }));
  EXPECT_EQ(big.Stats().evictable, kBigBlocks);
  while (reader->Read(&response)) {
  }
  EXPECT_THAT(FromGrpcStatus(reader->Finish()), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_OK(big.CheckInvariants());
}

// A stream naming a session that has already ended never starts.
TEST_F(BlockStreamsTest, AStreamOfAnEndedSessionIsAborted) {
  const uint64_t ended = OpenSession("");
  ASSERT_OK(daemon_->manager().CloseSession(ended, 0, absl::StrCat("uid:", getuid())));
  v1::PutBlocksHeader header = Header(tokens_, RandomBlocks(3, 13));
  header.set_session_id(ended);
  EXPECT_THAT(Put(header, RandomBlocks(3, 13)), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(Get(tokens_, ended), StatusIs(absl::StatusCode::kAborted));
}

TEST_F(BlockStreamsTest, UnknownSessionOrPoolIsNotFound) {
  const std::string bytes = RandomBlocks(3, 8);
  v1::PutBlocksHeader header = Header(tokens_, bytes);
  header.set_session_id(999);
  EXPECT_THAT(Put(header, bytes), StatusIs(absl::StatusCode::kNotFound, HasSubstr("session")));
  header = Header(tokens_, bytes);
  header.set_pool("nope");
  EXPECT_THAT(Put(header, bytes), StatusIs(absl::StatusCode::kNotFound, HasSubstr("pool")));
  EXPECT_THAT(Get(tokens_, 999), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(BlockStreamsTest, PoolLivesInOwnerOnlySharedMemory) {
  grpc::ClientContext context;
  v1::DescribePoolRequest request;
  request.set_pool("p");
  v1::DescribePoolResponse response;
  ASSERT_TRUE(stub_->DescribePool(&context, request, &response).ok());
  const v1::PoolMapping& mapping = response.pool().mapping();
  ASSERT_EQ(mapping.kind(), v1::PoolMapping::KIND_SHM);
  EXPECT_EQ(mapping.size_bytes(), kNumBlocks * block_bytes_);
  const int fd = shm_open(mapping.shm_name().c_str(), O_RDONLY, 0);
  ASSERT_GE(fd, 0) << mapping.shm_name();
  struct stat info;
  ASSERT_EQ(fstat(fd, &info), 0);
  close(fd);
  EXPECT_EQ(info.st_mode & 0777, 0600);
  EXPECT_EQ(static_cast<uint64_t>(info.st_size), mapping.size_bytes());
  struct stat socket_info;
  ASSERT_EQ(stat(dir_.File("kv.sock").c_str(), &socket_info), 0);
  EXPECT_EQ(socket_info.st_mode & 0777, 0600);
}

}  // namespace
}  // namespace kvcache
