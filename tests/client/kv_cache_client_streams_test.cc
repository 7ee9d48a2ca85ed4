// KvCacheClient::PutBlocks / GetBlocks: round trips through a real in-process daemon (bytes,
// counts, namespaces, exact codes, epoch fencing), and against a fake daemon that lies — corrupt,
// short or oversized streams — to prove the client verifies what it receives and checksums what
// it sends.
#include <gmock/gmock.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"
#include "common/streaming_copy.h"
#include "tests/client/daemon_fixture.h"
#include "tests/testing/fake_session_service.h"
#include "tests/testing/grpc_kept_alive.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::PollUntil;
using ::kvcache::testing::RetryWhileUnavailable;
using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::testing::Each;
using ::testing::HasSubstr;
using ::testing::Le;

// Bytes for `num_blocks` blocks, each a distinct function of its index and `seed`.
std::string BlockBytes(size_t num_blocks, uint64_t block_bytes, uint32_t seed) {
  std::string bytes(num_blocks * block_bytes, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>((i * 131 + (i / block_bytes) * 7 + seed) & 0xff);
  }
  return bytes;
}

class KvCacheClientStreamsTest : public kvcache::testing::DaemonFixture {
 protected:
  KvCacheClientStreamsTest() { with_other_tenant_ = true; }
  uint64_t PoolBlockBytes() { return client_->DescribePool("default")->pool.block_bytes; }
};

TEST_F(KvCacheClientStreamsTest, PutThenGetRoundTripsTheBytes) {
  ASSERT_OK(client_->OpenSession("", "remote"));
  const uint64_t block_bytes = PoolBlockBytes();
  // 3 full blocks and a partial one, which a put ignores.
  const std::vector<uint32_t> prompt = Tokens(3 * kBlockSize + 5);
  const std::string bytes = BlockBytes(3, block_bytes, 1);
  // Small chunks that straddle block boundaries.
  absl::StatusOr<KvCacheClient::PutResult> put =
      client_->PutBlocks("default", prompt, bytes, "", {}, block_bytes / 3 + 1);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_blocks, 3u);
  EXPECT_EQ(put->num_already_cached, 0u);
  EXPECT_EQ(put->num_stored, 3u);
  // Idempotent: the second put keeps the cached blocks.
  put = client_->PutBlocks("default", prompt, bytes);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_blocks, 3u);
  EXPECT_EQ(put->num_already_cached, 3u);
  EXPECT_EQ(put->num_stored, 0u);

  for (const uint32_t chunk : {0u, 4096u, 1u << 20}) {
    absl::StatusOr<KvCacheClient::GetResult> got =
        client_->GetBlocks("default", prompt, "", {}, chunk);
    ASSERT_OK(got);
    EXPECT_EQ(got->num_blocks, 3u);
    EXPECT_EQ(got->num_cached_tokens, 3 * kBlockSize);
    EXPECT_EQ(got->block_bytes, block_bytes);
    EXPECT_TRUE(got->bytes == bytes) << "chunk " << chunk;
  }
  // Another client of the same tenant gets them too; the stream pinned nothing for long.
  std::unique_ptr<KvCacheClient> other = Connect();
  ASSERT_OK(other->OpenSession("", "other"));
  absl::StatusOr<KvCacheClient::GetResult> got =
      other->GetBlocks("default", Tokens(2 * kBlockSize));
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 2u);
  EXPECT_TRUE(got->bytes == bytes.substr(0, 2 * block_bytes));
  // The streams' pins end once the daemon finishes them (which may trail the client's last
  // read): then the blocks are evictable again.
  EXPECT_TRUE(PollUntil([&] {
    absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool("default");
    return described.ok() && described->counts.referenced == 0 && described->counts.evictable == 3;
  }));
}

TEST_F(KvCacheClientStreamsTest, PutBlocksAreWhatAMappedWorkerHits) {
  ASSERT_OK(client_->OpenSession("", "remote"));
  absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool("default");
  ASSERT_OK(described);
  const uint64_t block_bytes = described->pool.block_bytes;
  const std::string bytes = BlockBytes(2, block_bytes, 9);
  ASSERT_OK(client_->PutBlocks("default", Tokens(2 * kBlockSize), bytes));

  absl::StatusOr<std::unique_ptr<MappedPool>> mapped = MappedPool::Map(*described);
  ASSERT_OK(mapped);
  absl::StatusOr<KvCacheClient::Sequence> sequence =
      client_->OpenSequence("default", Tokens(2 * kBlockSize + 1));
  ASSERT_OK(sequence);
  ASSERT_EQ(sequence->num_cached_tokens, 2 * kBlockSize);
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(std::memcmp((*mapped)->Block(sequence->block_ids[b]), bytes.data() + b * block_bytes,
                          block_bytes),
              0)
        << "block " << b;
  }
}

TEST_F(KvCacheClientStreamsTest,
       PutOfScatteredBlocksReportsProgressAndGetIntoFillsTheCallersBuffer) {
  ASSERT_OK(client_->OpenSession("", "remote"));
  const uint64_t block_bytes = PoolBlockBytes();
  // Each block in a buffer of its own, as blocks lie in a mapped pool.
  std::vector<std::string> owned;
  std::vector<absl::string_view> blocks;
  for (uint32_t b = 0; b < 4; ++b) owned.push_back(BlockBytes(1, block_bytes, 20 + b));
  for (const std::string& block : owned) blocks.push_back(block);
  std::vector<uint64_t> progress;
  KvCacheClient::PutOptions options;
  options.chunk_bytes = block_bytes / 2 + 3;  // messages straddle blocks
  options.after_chunk = [&progress](uint64_t sent) {
    progress.push_back(sent);
    return absl::OkStatus();
  };
  absl::StatusOr<KvCacheClient::PutResult> put =
      client_->PutBlocks("default", Tokens(4 * kBlockSize + 1), blocks, options);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_stored, 4u);
  ASSERT_FALSE(progress.empty());
  EXPECT_TRUE(std::is_sorted(progress.begin(), progress.end()));
  EXPECT_EQ(progress.back(), 4 * block_bytes);

  std::string all;
  for (const std::string& block : owned) all += block;
  std::string destination(5 * block_bytes, 'z');
  absl::StatusOr<KvCacheClient::GetInfo> got = client_->GetBlocksInto(
      "default", Tokens(5 * kBlockSize), absl::MakeSpan(destination.data(), destination.size()));
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 4u);
  EXPECT_TRUE(destination.substr(0, 4 * block_bytes) == all);
  EXPECT_EQ(destination.substr(4 * block_bytes), std::string(block_bytes, 'z'));

  // A destination too small for what the daemon holds: OUT_OF_RANGE, and the stream's pins end.
  std::string small(3 * block_bytes, '\0');
  EXPECT_THAT(client_->GetBlocksInto("default", Tokens(5 * kBlockSize),
                                     absl::MakeSpan(small.data(), small.size())),
              StatusIs(absl::StatusCode::kOutOfRange, HasSubstr("destination holds")));
  EXPECT_TRUE(PollUntil([&] {
    absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool("default");
    return described.ok() && described->counts.referenced == 0;
  }));
}

// A get of kStreamingCopyMinTotalBytes or more writes the caller's buffer with streaming stores:
// the bytes land intact wherever the buffer starts and however the chunks cut the blocks.
TEST_F(KvCacheClientStreamsTest, LargeGetIntoAnUnalignedBufferRoundTripsTheBytes) {
  ASSERT_OK(client_->OpenSession("", "remote"));
  const uint64_t block_bytes = client_->DescribePool("large")->pool.block_bytes;
  const size_t num_blocks = kLargeBlocks;
  ASSERT_GE(num_blocks * block_bytes, kStreamingCopyMinTotalBytes);
  const std::string bytes = BlockBytes(num_blocks, block_bytes, 40);
  const std::vector<uint32_t> prompt = Tokens(num_blocks * kBlockSize);
  ASSERT_OK(client_->PutBlocks("large", prompt, bytes));

  constexpr size_t kOffset = 3;  // neither 16- nor 64-byte aligned
  for (const uint32_t chunk : {0u, 100003u}) {
    std::string buffer(kOffset + bytes.size() + 1, 'z');
    absl::StatusOr<KvCacheClient::GetInfo> got = client_->GetBlocksInto(
        "large", prompt, absl::MakeSpan(buffer.data() + kOffset, bytes.size()), "", {}, chunk);
    ASSERT_OK(got);
    EXPECT_EQ(got->num_blocks, num_blocks);
    EXPECT_TRUE(buffer.substr(kOffset, bytes.size()) == bytes) << "chunk " << chunk;
    EXPECT_EQ(buffer.substr(0, kOffset), "zzz");
    EXPECT_EQ(buffer.back(), 'z');
  }
}

TEST_F(KvCacheClientStreamsTest, GetVisitHandsOutEveryPieceInOrderAndItsErrorCancelsTheStream) {
  ASSERT_OK(client_->OpenSession("", "remote"));
  const uint64_t block_bytes = PoolBlockBytes();
  const std::string bytes = BlockBytes(4, block_bytes, 30);
  ASSERT_OK(client_->PutBlocks("default", Tokens(4 * kBlockSize + 1), bytes));

  // Chunks that straddle blocks: a block arrives in pieces, some pieces end mid-block.
  const uint32_t chunk_bytes = static_cast<uint32_t>(block_bytes + block_bytes / 3 + 16);
  std::string visited;
  absl::StatusOr<KvCacheClient::GetInfo> got = client_->GetBlocksVisit(
      "default", Tokens(4 * kBlockSize),
      [&](uint32_t block, uint64_t offset, absl::string_view piece) {
        EXPECT_EQ(block * block_bytes + offset, visited.size()) << "pieces come in stream order";
        EXPECT_LE(offset + piece.size(), block_bytes) << "a piece stays within its block";
        visited.append(piece.data(), piece.size());
        return absl::OkStatus();
      },
      "", {}, chunk_bytes);
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 4u);
  EXPECT_EQ(got->num_cached_tokens, 4 * kBlockSize);
  EXPECT_TRUE(visited == bytes);

  // The visitor's error stops the stream, comes back as it is, and the daemon's pins end.
  int calls = 0;
  EXPECT_THAT(client_->GetBlocksVisit(
                  "default", Tokens(4 * kBlockSize),
                  [&](uint32_t, uint64_t, absl::string_view) {
                    return ++calls == 2 ? absl::ResourceExhaustedError("staging buffer full")
                                        : absl::OkStatus();
                  },
                  "", {}, chunk_bytes),
              StatusIs(absl::StatusCode::kResourceExhausted, HasSubstr("staging buffer full")));
  EXPECT_EQ(calls, 2);
  EXPECT_TRUE(PollUntil([&] {
    absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool("default");
    return described.ok() && described->counts.referenced == 0;
  }));
}

TEST_F(KvCacheClientStreamsTest, PutStoppedHalfwayByItsProgressCallbackStoresNothing) {
  ASSERT_OK(client_->OpenSession("", "remote"));
  const uint64_t block_bytes = PoolBlockBytes();
  const std::string bytes = BlockBytes(4, block_bytes, 31);
  std::vector<absl::string_view> blocks;
  for (int b = 0; b < 4; ++b)
    blocks.push_back(absl::string_view(bytes).substr(b * block_bytes, block_bytes));
  KvCacheClient::PutOptions options;
  options.chunk_bytes = block_bytes;
  options.after_chunk = [&](uint64_t sent) {
    return sent >= 2 * block_bytes ? absl::AbortedError("stop here") : absl::OkStatus();
  };
  EXPECT_THAT(client_->PutBlocks("default", Tokens(4 * kBlockSize), blocks, options),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("stop here")));
  EXPECT_EQ(client_->Lookup("default", "", Tokens(4 * kBlockSize))->num_cached_blocks, 0u);
  EXPECT_TRUE(PollUntil([&] {
    absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool("default");
    return described.ok() && described->counts.referenced == 0;
  }));
  // The same client puts them afterwards.
  options.after_chunk = nullptr;
  ASSERT_OK(client_->PutBlocks("default", Tokens(4 * kBlockSize), blocks, options));
  EXPECT_EQ(client_->Lookup("default", "", Tokens(4 * kBlockSize))->num_cached_blocks, 4u);
}

TEST_F(KvCacheClientStreamsTest, PutOfScatteredBlocksChecksEachBlock) {
  ASSERT_OK(client_->OpenSession("", "remote"));
  const uint64_t block_bytes = PoolBlockBytes();
  const std::string block = BlockBytes(1, block_bytes, 5);
  const std::vector<absl::string_view> two = {block, block};
  EXPECT_THAT(client_->PutBlocks("default", Tokens(3 * kBlockSize), two, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("2 blocks given")));
  const std::vector<absl::string_view> short_one = {block, absl::string_view(block).substr(1)};
  EXPECT_THAT(client_->PutBlocks("default", Tokens(2 * kBlockSize), short_one, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block 1 has")));
  KvCacheClient::PutOptions past;
  past.first_block = 3;
  EXPECT_THAT(client_->PutBlocks("default", Tokens(2 * kBlockSize), {}, past),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("past the 2 full blocks")));
  EXPECT_EQ(client_->Lookup("default", "", Tokens(2 * kBlockSize))->num_cached_blocks, 0u);
}

TEST_F(KvCacheClientStreamsTest, GetReturnsTheLongestCachedPrefixOnly) {
  ASSERT_OK(client_->OpenSession("", "remote"));
  const uint64_t block_bytes = PoolBlockBytes();
  const std::string bytes = BlockBytes(2, block_bytes, 3);
  ASSERT_OK(client_->PutBlocks("default", Tokens(2 * kBlockSize), bytes));
  absl::StatusOr<KvCacheClient::GetResult> got =
      client_->GetBlocks("default", Tokens(5 * kBlockSize + 1));
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 2u);
  EXPECT_TRUE(got->bytes == bytes);

  got = client_->GetBlocks("default", Tokens(3 * kBlockSize, 7000));
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 0u);
  EXPECT_EQ(got->num_cached_tokens, 0u);
  EXPECT_TRUE(got->bytes.empty());
  // Shorter than a block: nothing to match, not an error.
  got = client_->GetBlocks("default", Tokens(3));
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 0u);
}

TEST_F(KvCacheClientStreamsTest, SaltsExtraKeysAndTenantsNamespaceTheBlocks) {
  ASSERT_OK(client_->OpenSession("", "remote"));
  const std::vector<uint32_t> prompt = Tokens(2 * kBlockSize);
  const ExtraKeys lora{.lora_id = "adapter", .multimodal_items = {}};
  ASSERT_OK(
      client_->PutBlocks("default", prompt, BlockBytes(2, PoolBlockBytes(), 5), "salt", lora));
  EXPECT_EQ(client_->GetBlocks("default", prompt, "salt", lora)->num_blocks, 2u);
  EXPECT_EQ(client_->GetBlocks("default", prompt, "salt")->num_blocks, 0u);
  EXPECT_EQ(client_->GetBlocks("default", prompt, "", lora)->num_blocks, 0u);
  std::unique_ptr<KvCacheClient> stranger = ConnectAsOtherTenant();
  ASSERT_NE(stranger, nullptr);
  ASSERT_OK(stranger->OpenSession("", "remote"));
  EXPECT_EQ(stranger->GetBlocks("default", prompt, "salt", lora)->num_blocks, 0u);
}

TEST_F(KvCacheClientStreamsTest, WrongByteCountIsInvalidArgumentAndStoresNothing) {
  ASSERT_OK(client_->OpenSession("", "remote"));
  const uint64_t block_bytes = PoolBlockBytes();
  const std::vector<uint32_t> prompt = Tokens(2 * kBlockSize + 3);
  EXPECT_THAT(client_->PutBlocks("default", prompt, BlockBytes(3, block_bytes, 0)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("want")));
  std::string short_by_one = BlockBytes(2, block_bytes, 0);
  short_by_one.pop_back();
  EXPECT_THAT(client_->PutBlocks("default", prompt, short_by_one),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // No full block: the daemon refuses a put of nothing.
  EXPECT_THAT(client_->PutBlocks("default", Tokens(kBlockSize - 1), ""),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->PutBlocks("nope", prompt, ""), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->GetBlocks("nope", prompt), StatusIs(absl::StatusCode::kNotFound));
  // A put larger than the pool.
  EXPECT_THAT(client_->PutBlocks("tiny", Tokens((kTinyBlocks + 1) * kBlockSize),
                                 BlockBytes(kTinyBlocks + 1, block_bytes, 0)),
              StatusIs(absl::StatusCode::kResourceExhausted));

  absl::StatusOr<KvCacheClient::Stats> stats = client_->GetStats();
  ASSERT_OK(stats);
  for (const KvCacheClient::PoolStats& pool : stats->pools) {
    EXPECT_EQ(pool.published_blocks, 0u) << pool.pool;
    EXPECT_EQ(pool.counts.referenced, 0u) << pool.pool;
  }
  EXPECT_FALSE(client_->session_lost());
  EXPECT_FALSE(client_->epoch_changed());
}

TEST_F(KvCacheClientStreamsTest, DataCallsNeedAnOpenSession) {
  const std::vector<uint32_t> prompt = Tokens(kBlockSize);
  const std::string bytes = BlockBytes(1, PoolBlockBytes(), 0);
  EXPECT_THAT(client_->PutBlocks("default", prompt, bytes),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("OpenSession")));
  EXPECT_THAT(client_->GetBlocks("default", prompt),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("OpenSession")));
  ASSERT_OK(client_->OpenSession("", "remote"));
  EXPECT_OK(client_->PutBlocks("default", prompt, bytes));
  ASSERT_OK(client_->CloseSession());
  EXPECT_THAT(client_->GetBlocks("default", prompt),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_FALSE(client_->epoch_changed());
}

TEST_F(KvCacheClientStreamsTest, LostLeaseIsAborted) {
  absl::StatusOr<KvCacheClient::SessionInfo> session = client_->OpenSession("", "remote");
  ASSERT_OK(session);
  const std::vector<uint32_t> prompt = Tokens(kBlockSize);
  ASSERT_OK(client_->GetBlocks("default", prompt));  // caches the pool's layout
  ASSERT_OK(daemon_->manager().CloseSession(session->session_id, session->epoch,
                                            OwnerOf(session->session_id)));
  EXPECT_THAT(client_->PutBlocks("default", prompt, BlockBytes(1, PoolBlockBytes(), 0)),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(client_->GetBlocks("default", prompt), StatusIs(absl::StatusCode::kAborted));
  EXPECT_TRUE(client_->session_lost());
}

TEST_F(KvCacheClientStreamsTest, RestartedDaemonFencesTheStreams) {
  ClientOptions options;
  options.wait_for_ready = true;  // across the restart
  std::unique_ptr<KvCacheClient> client = Connect(options);
  ASSERT_OK(client->OpenSession("", "remote"));
  const std::vector<uint32_t> prompt = Tokens(kBlockSize);
  const std::string bytes = BlockBytes(1, PoolBlockBytes(), 0);
  ASSERT_OK(client->PutBlocks("default", prompt, bytes));
  client_.reset();
  daemon_.reset();
  ASSERT_NO_FATAL_FAILURE(StartDaemon());

  EXPECT_THAT(RetryWhileUnavailable([&] { return client->GetBlocks("default", prompt); }),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(client->epoch_changed());
  EXPECT_THAT(client->PutBlocks("default", prompt, bytes),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // A new session works against the new daemon (and its freshly described layout).
  ASSERT_OK(client->OpenSession("", "remote"));
  absl::StatusOr<KvCacheClient::PutResult> put = client->PutBlocks("default", prompt, bytes);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_stored, 1u);
  absl::StatusOr<KvCacheClient::GetResult> got = client->GetBlocks("default", prompt);
  ASSERT_OK(got);
  EXPECT_TRUE(got->bytes == bytes);
}

// A daemon that answers the data calls as the test tells it to, to check the client's side.
class FakeKvCache final : public kvcache::testing::FakeSessionService {
 public:
  static constexpr uint64_t kEpoch = 77;
  FakeKvCache()
      : FakeSessionService(kEpoch, ::kvcache::testing::FakePool(kLayout, /*num_blocks=*/16)) {}
  static constexpr PoolLayout kLayout{.num_layers = 1,
                                      .num_kv_heads = 2,
                                      .head_dim = 32,
                                      .block_size = 4,
                                      .dtype = DType::kFloat16};

  enum class GetMode { kHonest, kCorruptSecondBlock, kTruncated, kOversized, kOtherEpoch };

  void set_get_mode(GetMode mode) { get_mode_ = mode; }
  void set_cached(std::string bytes) {
    absl::MutexLock lock(&mu_);
    cached_ = std::move(bytes);
  }

  struct Put {
    std::vector<uint64_t> checksums;
    std::vector<size_t> chunk_sizes;
    std::string bytes;
  };
  Put last_put() {
    absl::MutexLock lock(&mu_);
    return last_put_;
  }

  grpc::Status GetBlocks(grpc::ServerContext*, const v1::GetBlocksRequest* request,
                         grpc::ServerWriter<v1::GetBlocksResponse>* writer) override {
    const uint64_t block_bytes = kLayout.BlockBytes();
    std::string bytes;
    {
      absl::MutexLock lock(&mu_);
      bytes = cached_;
    }
    const uint32_t blocks =
        std::min<uint64_t>(request->tokens_size() / kLayout.block_size, bytes.size() / block_bytes);
    bytes.resize(blocks * block_bytes);
    v1::GetBlocksResponse message;
    message.set_epoch(get_mode_ == GetMode::kOtherEpoch ? kEpoch + 1 : kEpoch);
    v1::GetBlocksHeader* header = message.mutable_header();
    header->set_num_blocks(blocks);
    header->set_num_cached_tokens(blocks * kLayout.block_size);
    header->set_block_bytes(block_bytes);
    for (uint32_t i = 0; i < blocks; ++i) {
      header->add_block_checksums(XXH3_64bits(bytes.data() + i * block_bytes, block_bytes));
    }
    writer->Write(message);
    switch (get_mode_.load()) {
      case GetMode::kCorruptSecondBlock:
        bytes[block_bytes + 17] ^= 0x01;
        break;
      case GetMode::kTruncated:
        bytes.resize(bytes.size() - 1);
        break;
      case GetMode::kOversized:
        bytes.push_back('x');
        break;
      default:
        break;
    }
    // Odd-sized chunks.
    for (size_t offset = 0; offset < bytes.size(); offset += 1000) {
      message.set_data(bytes.substr(offset, 1000));
      if (!writer->Write(message)) break;
    }
    return grpc::Status::OK;
  }

  grpc::Status PutBlocks(grpc::ServerContext*, grpc::ServerReader<v1::PutBlocksRequest>* reader,
                         v1::PutBlocksResponse* response) override {
    Put put;
    v1::PutBlocksRequest message;
    while (reader->Read(&message)) {
      if (message.has_header()) {
        put.checksums.assign(message.header().block_checksums().begin(),
                             message.header().block_checksums().end());
      } else {
        put.chunk_sizes.push_back(message.data().size());
        put.bytes += message.data();
      }
    }
    response->set_epoch(kEpoch);
    response->set_num_blocks(put.checksums.size());
    response->set_num_stored(put.checksums.size());
    absl::MutexLock lock(&mu_);
    last_put_ = std::move(put);
    return grpc::Status::OK;
  }

 private:
  std::atomic<GetMode> get_mode_{GetMode::kHonest};
  absl::Mutex mu_;
  std::string cached_ ABSL_GUARDED_BY(mu_);
  Put last_put_ ABSL_GUARDED_BY(mu_);
};

class FakeDaemonTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::kvcache::testing::KeepGrpcInitialized();
    const std::string address = "unix://" + dir_.File("fake.sock");
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address, grpc::InsecureServerCredentials());
    builder.RegisterService(&service_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(address);
    ASSERT_OK(client);
    client_ = *std::move(client);
    ASSERT_OK(client_->OpenSession("", "test"));
  }

  void TearDown() override {
    client_.reset();
    if (server_ != nullptr) server_->Shutdown();
  }

  static std::vector<uint32_t> Tokens(size_t count) { return std::vector<uint32_t>(count, 5); }

  const uint64_t block_bytes_ = FakeKvCache::kLayout.BlockBytes();

  ScopedTempDir dir_{"kvcache_fake_daemon"};  // for the socket
  FakeKvCache service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<KvCacheClient> client_;
};

TEST_F(FakeDaemonTest, PutSendsEachBlocksXxh3InChunksOfTheAskedSize) {
  const std::string bytes = BlockBytes(3, block_bytes_, 11);
  ASSERT_OK(client_->PutBlocks("pool", Tokens(3 * 4 + 2), bytes, "", {}, 700));
  const FakeKvCache::Put put = service_.last_put();
  ASSERT_EQ(put.checksums.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(put.checksums[i],
              XXH3_64bits_withSeed(bytes.data() + i * block_bytes_, block_bytes_, 0))
        << "block " << i;
  }
  EXPECT_THAT(put.chunk_sizes, Each(Le(700u)));
  EXPECT_EQ(put.chunk_sizes.size(), (bytes.size() + 699) / 700);
  EXPECT_TRUE(put.bytes == bytes);
}

TEST_F(FakeDaemonTest, HonestStreamIsAccepted) {
  const std::string bytes = BlockBytes(3, block_bytes_, 4);
  service_.set_cached(bytes);
  absl::StatusOr<KvCacheClient::GetResult> got = client_->GetBlocks("pool", Tokens(3 * 4));
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 3u);
  EXPECT_EQ(got->num_cached_tokens, 12u);
  EXPECT_TRUE(got->bytes == bytes);
}

TEST_F(FakeDaemonTest, CorruptBlockIsDataLoss) {
  service_.set_cached(BlockBytes(3, block_bytes_, 4));
  service_.set_get_mode(FakeKvCache::GetMode::kCorruptSecondBlock);
  EXPECT_THAT(client_->GetBlocks("pool", Tokens(3 * 4)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("block 1 of 3")));
}

TEST_F(FakeDaemonTest, CorruptBlockIsDataLossAfterAVisitorSawIt) {
  const std::string bytes = BlockBytes(3, block_bytes_, 4);
  service_.set_cached(bytes);
  service_.set_get_mode(FakeKvCache::GetMode::kCorruptSecondBlock);
  std::string visited;
  EXPECT_THAT(client_->GetBlocksVisit("pool", Tokens(3 * 4),
                                      [&](uint32_t, uint64_t, absl::string_view piece) {
                                        visited.append(piece.data(), piece.size());
                                        return absl::OkStatus();
                                      }),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("block 1 of 3")));
  // As documented: the bad block's bytes were visited before its checksum was checked, and
  // nothing after it.
  ASSERT_EQ(visited.size(), 2 * block_bytes_);
  EXPECT_TRUE(visited.substr(0, block_bytes_) == bytes.substr(0, block_bytes_));
  EXPECT_FALSE(visited.substr(block_bytes_) == bytes.substr(block_bytes_, block_bytes_));
}

TEST_F(FakeDaemonTest, ShortStreamIsDataLoss) {
  service_.set_cached(BlockBytes(2, block_bytes_, 4));
  service_.set_get_mode(FakeKvCache::GetMode::kTruncated);
  EXPECT_THAT(client_->GetBlocks("pool", Tokens(2 * 4)),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("ended after")));
}

TEST_F(FakeDaemonTest, OversizedStreamIsRejected) {
  service_.set_cached(BlockBytes(2, block_bytes_, 4));
  service_.set_get_mode(FakeKvCache::GetMode::kOversized);
  EXPECT_THAT(client_->GetBlocks("pool", Tokens(2 * 4)),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("more than")));
}

TEST_F(FakeDaemonTest, StreamFromAnotherEpochIsFenced) {
  service_.set_cached(BlockBytes(2, block_bytes_, 4));
  service_.set_get_mode(FakeKvCache::GetMode::kOtherEpoch);
  EXPECT_THAT(client_->GetBlocks("pool", Tokens(2 * 4)),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("restarted")));
  EXPECT_TRUE(client_->epoch_changed());
}

}  // namespace
}  // namespace kvcache
