// BlockStream against a real in-process daemon: a server-streaming method called through the
// generic stub, and how a stream ends when it is cancelled, destroyed unfinished, past its
// deadline or pointed at no method. The client's own streams (PutBlocks, GetBlocks) are tested
// through KvCacheClient in kv_cache_client_streams_test.cc.
#include "client/block_stream.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/rpc/bytes_field_split.h"
#include "common/rpc/chunk_bytes.h"
#include "common/rpc/grpc_status.h"
#include "kvcache/v1/kvcache.pb.h"
#include "tests/client/daemon_fixture.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::PollUntil;
using ::kvcache::testing::StatusIs;

constexpr char kGetBlocks[] = "/kvcache.v1.KvCache/GetBlocks";
// Cached in "large" by SetUp; in chunks of kMinChunkBytes, far more than the HTTP/2 window of a
// client that stops reading, so an abandoned stream stays open on the daemon until cancelled.
constexpr uint32_t kBlocks = 40;

class BlockStreamTest : public kvcache::testing::DaemonFixture {
 protected:
  void SetUp() override {
    ASSERT_NO_FATAL_FAILURE(DaemonFixture::SetUp());
    ASSERT_OK(client_->OpenSession("", "block-stream-test"));
    block_bytes_ = client_->DescribePool("large")->pool.block_bytes;
    ASSERT_OK(client_->PutBlocks("large", Tokens(kBlocks * kBlockSize),
                                 std::string(kBlocks * block_bytes_, 'b')));
    stub_ = std::make_unique<grpc::GenericStub>(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  // GetBlocks for the cached blocks, kMinChunkBytes per data message.
  grpc::ByteBuffer GetRequest() const {
    v1::GetBlocksRequest request;
    request.set_session_id(client_->session_id());
    request.set_epoch(client_->session_epoch());
    request.set_pool("large");
    const std::vector<uint32_t> tokens = Tokens(kBlocks * kBlockSize);
    request.mutable_tokens()->Add(tokens.begin(), tokens.end());
    request.set_max_chunk_bytes(kMinChunkBytes);
    const std::string serialized = request.SerializeAsString();
    grpc::Slice slice(serialized);
    return grpc::ByteBuffer(&slice, 1);
  }

  std::unique_ptr<BlockStream> Start(const char* method, absl::Duration timeout) {
    return std::make_unique<BlockStream>(stub_.get(), method, absl::Now() + timeout,
                                         /*wait_for_ready=*/false);
  }

  // Reads the stream's first message, which must be GetBlocks' header.
  void ExpectHeader(BlockStream& stream) {
    grpc::ByteBuffer buffer;
    ASSERT_TRUE(stream.Read(&buffer));
    grpc::Slice flat;
    ASSERT_TRUE(buffer.DumpToSingleSlice(&flat).ok());
    v1::GetBlocksResponse message;
    ASSERT_TRUE(message.ParseFromArray(flat.begin(), static_cast<int>(flat.size())));
    ASSERT_TRUE(message.has_header());
    EXPECT_EQ(message.header().num_blocks(), kBlocks);
  }

  bool DaemonHoldsNoPins() {
    absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool("large");
    return described.ok() && described->counts.referenced == 0;
  }

  uint64_t block_bytes_ = 0;
  std::unique_ptr<grpc::GenericStub> stub_;
};

TEST_F(BlockStreamTest, ServerStreamingMethodTakesItsRequestWithWriteLast) {
  std::unique_ptr<BlockStream> stream = Start(kGetBlocks, absl::Seconds(30));
  ASSERT_TRUE(stream->WriteLast(GetRequest()));
  ASSERT_NO_FATAL_FAILURE(ExpectHeader(*stream));
  uint64_t bytes = 0;
  int messages = 0;
  grpc::ByteBuffer buffer;
  while (stream->Read(&buffer)) {
    absl::StatusOr<SplitMessage> split =
        SplitBytesField(buffer, v1::GetBlocksResponse::kDataFieldNumber);
    ASSERT_OK(split);
    bytes += split->field_size;
    ++messages;
  }
  EXPECT_OK(FromGrpcStatus(stream->Finish()));
  EXPECT_EQ(bytes, kBlocks * block_bytes_);
  EXPECT_EQ(messages, kBlocks * block_bytes_ / kMinChunkBytes);
}

TEST_F(BlockStreamTest, CancelledStreamFailsItsReadsAndFinishesCancelled) {
  std::unique_ptr<BlockStream> stream = Start(kGetBlocks, absl::Seconds(30));
  ASSERT_TRUE(stream->WriteLast(GetRequest()));
  ASSERT_NO_FATAL_FAILURE(ExpectHeader(*stream));
  stream->Cancel();
  grpc::ByteBuffer buffer;
  EXPECT_FALSE(stream->Read(&buffer));
  EXPECT_THAT(FromGrpcStatus(stream->Finish()), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_TRUE(PollUntil([&] { return DaemonHoldsNoPins(); }));
}

TEST_F(BlockStreamTest, DestroyingAnUnfinishedStreamCancelsIt) {
  std::unique_ptr<BlockStream> stream = Start(kGetBlocks, absl::Seconds(60));
  ASSERT_TRUE(stream->WriteLast(GetRequest()));
  ASSERT_NO_FATAL_FAILURE(ExpectHeader(*stream));
  // Unread messages are left: without a cancel the call would end only at its deadline.
  const absl::Time start = absl::Now();
  stream.reset();
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
  EXPECT_TRUE(PollUntil([&] { return DaemonHoldsNoPins(); }));
}

TEST_F(BlockStreamTest, StreamPastItsDeadlineIsDeadlineExceeded) {
  std::unique_ptr<BlockStream> stream = Start(kGetBlocks, -absl::Seconds(1));
  stream->WriteLast(GetRequest());  // may fail or not: the deadline decides the status
  grpc::ByteBuffer buffer;
  EXPECT_FALSE(stream->Read(&buffer));
  EXPECT_THAT(FromGrpcStatus(stream->Finish()), StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(BlockStreamTest, UnknownMethodIsUnimplemented) {
  std::unique_ptr<BlockStream> stream =
      Start("/kvcache.v1.KvCache/NoSuchMethod", absl::Seconds(30));
  stream->WriteLast(GetRequest());  // the daemon may answer before or after it arrives
  grpc::ByteBuffer buffer;
  EXPECT_FALSE(stream->Read(&buffer));
  EXPECT_THAT(FromGrpcStatus(stream->Finish()), StatusIs(absl::StatusCode::kUnimplemented));
}

}  // namespace
}  // namespace kvcache
