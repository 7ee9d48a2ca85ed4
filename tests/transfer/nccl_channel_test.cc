// NcclChannel against a real in-process daemon (tests/client/daemon_fixture.h).
//
// NcclChannelTest (label unit, runs anywhere): the build flavour, unique ids, argument checks,
// and the no-device path, which must fail FAILED_PRECONDITION (not crash, not hang, not publish)
// on a machine whose CUDA runtime has no driver or device. In a build without NCCL every call
// must answer FAILED_PRECONDITION("built without NCCL").
//
// NcclChannelGpuTest (label gpu; built with NCCL only; skips with no CUDA device): a single-rank
// communicator connected through the daemon's rendezvous copies blocks to itself, within one pool
// and from one pool into another, compared byte for byte with the expected pool; the rendezvous
// and initialization deadlines; argument checks on a live channel. Two ranks cannot share one GPU
// (NCCL's rule), so the multi-rank send/recv path is not exercised here.
#include "transfer/nccl_channel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/cuda/cuda_device.h"
#include "tests/client/daemon_fixture.h"
#include "tests/testing/status_matchers.h"

#if KVCACHE_WITH_NCCL
#include <cuda_runtime.h>
#endif

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

constexpr absl::Duration kShortWait = absl::Milliseconds(300);
constexpr absl::Duration kLongWait = absl::Seconds(60);

class NcclChannelTest : public kvcache::testing::DaemonFixture {
 protected:
  // The code every call answers in a stub build, whatever the arguments.
  static absl::StatusCode Expected(absl::StatusCode real) {
    return NcclChannel::BuiltWithNccl() ? real : absl::StatusCode::kFailedPrecondition;
  }

  std::string Key() const {
    return absl::StrCat("nccl/", ::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
};

TEST_F(NcclChannelTest, BuiltWithNcclMatchesTheBuild) {
#if KVCACHE_WITH_NCCL
  EXPECT_TRUE(NcclChannel::BuiltWithNccl());
#else
  EXPECT_FALSE(NcclChannel::BuiltWithNccl());
#endif
}

TEST_F(NcclChannelTest, NewUniqueIdNeedsNoDevice) {
  absl::StatusOr<std::string> first = NcclChannel::NewUniqueId();
  if (!NcclChannel::BuiltWithNccl()) {
    EXPECT_THAT(first,
                StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("built without NCCL")));
    return;
  }
  ASSERT_OK(first);
  EXPECT_EQ(first->size(), NcclChannel::kUniqueIdBytes);
  absl::StatusOr<std::string> second = NcclChannel::NewUniqueId();
  ASSERT_OK(second);
  EXPECT_NE(*first, *second);
}

TEST_F(NcclChannelTest, ConnectRejectsBadArguments) {
  ASSERT_OK(client_->OpenSession("", "prefill"));
  const absl::StatusCode invalid = Expected(absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(NcclChannel::Connect(nullptr, Key(), 0, 1, 0, kShortWait), StatusIs(invalid));
  EXPECT_THAT(NcclChannel::Connect(client_.get(), "", 0, 1, 0, kShortWait), StatusIs(invalid));
  EXPECT_THAT(NcclChannel::Connect(client_.get(), Key(), 0, 0, 0, kShortWait), StatusIs(invalid));
  EXPECT_THAT(NcclChannel::Connect(client_.get(), Key(), 1, 1, 0, kShortWait), StatusIs(invalid));
  EXPECT_THAT(NcclChannel::Connect(client_.get(), Key(), -1, 2, 0, kShortWait), StatusIs(invalid));
  EXPECT_THAT(NcclChannel::Connect(client_.get(), Key(), 0, 1, -1, kShortWait), StatusIs(invalid));
}

TEST_F(NcclChannelTest, ConnectToAMissingDeviceFailsPrecondition) {
  ASSERT_OK(client_->OpenSession("", "prefill"));
  // No machine has device 4096; with no driver at all the answer is the same.
  EXPECT_THAT(NcclChannel::Connect(client_.get(), Key(), 0, 1, 4096, kShortWait),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

TEST_F(NcclChannelTest, WithoutADeviceConnectFailsPreconditionAndPublishesNothing) {
  if (CudaDeviceAvailable()) GTEST_SKIP() << "a CUDA device is present";
  ASSERT_OK(client_->OpenSession("", "prefill"));
  const absl::Time start = absl::Now();
  EXPECT_THAT(NcclChannel::Connect(client_.get(), Key(), 0, 1, 0, kLongWait),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  // A rank that would await the id does not wait for it either.
  EXPECT_THAT(NcclChannel::Connect(client_.get(), Key(), 1, 2, 0, kLongWait),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_LT(absl::Now() - start, kLongWait / 2);
  // Rank 0 published no id that a peer could pick up.
  std::unique_ptr<KvCacheClient> peer = Connect();
  ASSERT_NE(peer, nullptr);
  ASSERT_OK(peer->OpenSession("", "decode"));
  EXPECT_THAT(peer->AwaitRendezvous(Key(), kShortWait),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

#if KVCACHE_WITH_NCCL

// cudaMalloc'ed bytes, freed on destruction.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes) {
    if (cudaMalloc(&data_, bytes) != cudaSuccess) data_ = nullptr;
  }
  ~DeviceBuffer() {
    if (data_ != nullptr) cudaFree(data_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint8_t* get() const { return static_cast<uint8_t*>(data_); }

 private:
  void* data_ = nullptr;
};

// Every byte depends on its block, its offset and `seed`.
std::vector<uint8_t> Pattern(uint32_t num_blocks, uint64_t block_bytes, uint32_t seed) {
  std::vector<uint8_t> pool(num_blocks * block_bytes);
  for (uint32_t block = 0; block < num_blocks; ++block) {
    for (uint64_t i = 0; i < block_bytes; ++i) {
      pool[block * block_bytes + i] = static_cast<uint8_t>(block * 131 + i * 7 + (i >> 8) + seed);
    }
  }
  return pool;
}

// The first differing byte, for a readable failure.
std::string FirstDifference(const std::vector<uint8_t>& got, const std::vector<uint8_t>& want,
                            uint64_t block_bytes) {
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    if (got[i] != want[i]) {
      return absl::StrCat("byte ", i, " (block ", i / block_bytes, ", offset ", i % block_bytes,
                          "): got ", got[i], ", want ", want[i]);
    }
  }
  return got.size() == want.size() ? "none" : "sizes differ";
}

class NcclChannelGpuTest : public NcclChannelTest {
 protected:
  void SetUp() override {
    NcclChannelTest::SetUp();
    if (HasFatalFailure()) return;
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
    ASSERT_OK(client_->OpenSession("", "prefill"));
  }

  // A single-rank channel on device 0 through the rendezvous.
  std::unique_ptr<NcclChannel> SingleRank() {
    absl::StatusOr<std::unique_ptr<NcclChannel>> channel =
        NcclChannel::Connect(client_.get(), Key(), 0, 1, 0, kLongWait);
    EXPECT_OK(channel);
    return channel.ok() ? *std::move(channel) : nullptr;
  }

  // Uploads `pool`, runs SelfCopyBlocks, downloads, and compares with the host copy.
  void CheckSelfCopy(NcclChannel& channel, uint32_t num_blocks, uint64_t block_bytes,
                     const std::vector<uint32_t>& src, const std::vector<uint32_t>& dst,
                     uint32_t seed) {
    SCOPED_TRACE(
        absl::StrCat(num_blocks, " blocks of ", block_bytes, " bytes, ", src.size(), " copies"));
    std::vector<uint8_t> expected = Pattern(num_blocks, block_bytes, seed);
    DeviceBuffer pool(expected.size());
    ASSERT_NE(pool.get(), nullptr);
    ASSERT_EQ(cudaMemcpy(pool.get(), expected.data(), expected.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_OK(channel.SelfCopyBlocks(pool.get(), block_bytes, src, dst));
    ASSERT_OK(channel.Synchronize(kLongWait));
    for (size_t k = 0; k < src.size(); ++k) {
      std::copy_n(expected.begin() + src[k] * block_bytes, block_bytes,
                  expected.begin() + dst[k] * block_bytes);
    }
    std::vector<uint8_t> got(expected.size());
    ASSERT_EQ(cudaMemcpy(got.data(), pool.get(), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_TRUE(got == expected) << "first difference at "
                                 << FirstDifference(got, expected, block_bytes);
  }
};

TEST_F(NcclChannelGpuTest, SingleRankChannelThroughTheRendezvous) {
  std::unique_ptr<NcclChannel> channel = SingleRank();
  ASSERT_NE(channel, nullptr);
  EXPECT_EQ(channel->rank(), 0);
  EXPECT_EQ(channel->world_size(), 1);
  EXPECT_EQ(channel->cuda_device(), 0);
  EXPECT_NE(channel->stream(), nullptr);
  // Rank 0 published the id: a peer of the tenant reads the raw unique id.
  std::unique_ptr<KvCacheClient> peer = Connect();
  ASSERT_NE(peer, nullptr);
  ASSERT_OK(peer->OpenSession("", "decode"));
  absl::StatusOr<std::string> id = peer->AwaitRendezvous(Key(), kShortWait);
  ASSERT_OK(id);
  EXPECT_EQ(id->size(), NcclChannel::kUniqueIdBytes);
  EXPECT_OK(channel->Synchronize());  // nothing pending
  EXPECT_OK(channel->Warm(0, kLongWait));
}

TEST_F(NcclChannelGpuTest, SelfCopyBlocksMovesExactlyTheNamedBlocks) {
  std::unique_ptr<NcclChannel> channel = SingleRank();
  ASSERT_NE(channel, nullptr);
  ASSERT_OK(channel->Warm(0, kLongWait));
  uint32_t seed = 1;
  // Odd sizes included: NCCL moves bytes, not elements.
  for (uint64_t block_bytes : {uint64_t{1}, uint64_t{7}, uint64_t{4096}, uint64_t{4099},
                               uint64_t{65537}, uint64_t{1} << 20}) {
    CheckSelfCopy(*channel, 16, block_bytes, {0, 3, 5, 9, 14}, {7, 1, 2, 15, 4}, seed++);
    // A block may feed several destinations.
    CheckSelfCopy(*channel, 16, block_bytes, {6, 6, 6}, {10, 11, 12}, seed++);
  }
}

// From one allocation into another (the nccl transport's sender pool -> receiver pool): only the
// named destination blocks change, the source pool not at all, and the same ids may appear on
// both sides since the pools are distinct.
TEST_F(NcclChannelGpuTest, SelfCopyBlocksBetweenTwoPools) {
  std::unique_ptr<NcclChannel> channel = SingleRank();
  ASSERT_NE(channel, nullptr);
  constexpr uint32_t kBlocks = 12;
  constexpr uint64_t kBlockBytes = 6144;
  const std::vector<uint8_t> source = Pattern(kBlocks, kBlockBytes, 21);
  std::vector<uint8_t> expected = Pattern(kBlocks, kBlockBytes, 22);
  DeviceBuffer from(source.size()), to(expected.size());
  ASSERT_NE(from.get(), nullptr);
  ASSERT_NE(to.get(), nullptr);
  ASSERT_EQ(cudaMemcpy(from.get(), source.data(), source.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(cudaMemcpy(to.get(), expected.data(), expected.size(), cudaMemcpyHostToDevice),
            cudaSuccess);
  const std::vector<uint32_t> src = {2, 3, 4, 11};
  const std::vector<uint32_t> dst = {2, 9, 0, 3};
  ASSERT_OK(channel->SelfCopyBlocks(from.get(), to.get(), kBlockBytes, src, dst));
  ASSERT_OK(channel->Synchronize(kLongWait));
  for (size_t k = 0; k < src.size(); ++k) {
    std::copy_n(source.begin() + src[k] * kBlockBytes, kBlockBytes,
                expected.begin() + dst[k] * kBlockBytes);
  }
  std::vector<uint8_t> got(expected.size()), source_after(source.size());
  ASSERT_EQ(cudaMemcpy(got.data(), to.get(), got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
  ASSERT_EQ(
      cudaMemcpy(source_after.data(), from.get(), source_after.size(), cudaMemcpyDeviceToHost),
      cudaSuccess);
  EXPECT_TRUE(got == expected) << "first difference at "
                               << FirstDifference(got, expected, kBlockBytes);
  EXPECT_TRUE(source_after == source);
  // A repeated destination is still refused.
  EXPECT_THAT(channel->SelfCopyBlocks(from.get(), to.get(), kBlockBytes, {1, 2}, {5, 5}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("repeats")));
}

TEST_F(NcclChannelGpuTest, SelfCopyBlocksAcrossSeveralGroups) {
  std::unique_ptr<NcclChannel> channel = SingleRank();
  ASSERT_NE(channel, nullptr);
  const uint32_t copies = NcclChannel::kMaxBlocksPerGroup * 2 + 37;
  std::vector<uint32_t> src(copies), dst(copies);
  for (uint32_t k = 0; k < copies; ++k) {
    src[k] = k;
    dst[k] = 2 * copies - 1 - k;  // the second half, reversed
  }
  CheckSelfCopy(*channel, 2 * copies, 520, src, dst, 3);
}

TEST_F(NcclChannelGpuTest, ArgumentErrorsOnALiveChannel) {
  std::unique_ptr<NcclChannel> channel = SingleRank();
  ASSERT_NE(channel, nullptr);
  DeviceBuffer pool(16 * 64);
  ASSERT_NE(pool.get(), nullptr);
  const std::vector<uint32_t> ids = {1, 2};
  const auto invalid = StatusIs(absl::StatusCode::kInvalidArgument);
  // A send to self needs its receive in the same group: SelfCopyBlocks does that.
  EXPECT_THAT(channel->SendBlocks(pool.get(), 64, ids, 0), invalid);
  EXPECT_THAT(channel->RecvBlocks(pool.get(), 64, ids, 0), invalid);
  EXPECT_THAT(channel->SendBlocks(pool.get(), 64, ids, 1), invalid);
  EXPECT_THAT(channel->RecvBlocks(pool.get(), 64, ids, -1), invalid);
  EXPECT_THAT(channel->Warm(1), invalid);
  EXPECT_THAT(channel->SelfCopyBlocks(pool.get(), 64, {1, 2}, {3}), invalid);
  EXPECT_THAT(channel->SelfCopyBlocks(pool.get(), 64, {1, 2}, {3, 3}), invalid);
  EXPECT_THAT(channel->SelfCopyBlocks(pool.get(), 64, {1, 2}, {2, 3}), invalid);
  EXPECT_THAT(channel->SelfCopyBlocks(pool.get(), 0, {1}, {2}), invalid);
  EXPECT_THAT(channel->SelfCopyBlocks(nullptr, 64, {1}, {2}), invalid);
  EXPECT_THAT(channel->SelfCopyBlocks(pool.get(), uint64_t{1} << 40, {1}, {0xffffffffu}), invalid);
  // Nothing to move is fine, and none of the above broke the channel.
  EXPECT_OK(channel->SelfCopyBlocks(pool.get(), 64, {}, {}));
  EXPECT_OK(channel->Synchronize(kLongWait));
  CheckSelfCopy(*channel, 16, 64, {1}, {2}, 9);
}

TEST_F(NcclChannelGpuTest, AwaitingRankRunsIntoTheTimeout) {
  const absl::Time start = absl::Now();
  EXPECT_THAT(NcclChannel::Connect(client_.get(), Key(), 1, 2, 0, kShortWait),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST_F(NcclChannelGpuTest, AwaitedValueMustBeAnNcclId) {
  ASSERT_OK(client_->PublishRendezvous(Key(), "not an id"));
  EXPECT_THAT(NcclChannel::Connect(client_.get(), Key(), 1, 2, 0, kShortWait),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not an NCCL unique id")));
}

TEST_F(NcclChannelGpuTest, InitWaitingForAnAbsentRankRunsIntoTheTimeout) {
  // Rank 0 of 2 publishes, then waits in initialization for rank 1, which never comes.
  const absl::Time start = absl::Now();
  EXPECT_THAT(NcclChannel::Connect(client_.get(), Key(), 0, 2, 0, absl::Seconds(2)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  // The communicator was aborted, not leaked: a single-rank channel still works (its rank 0
  // publishes over the stale id: the same session may).
  std::unique_ptr<NcclChannel> channel = SingleRank();
  ASSERT_NE(channel, nullptr);
  CheckSelfCopy(*channel, 4, 256, {0}, {3}, 5);
}

#endif  // KVCACHE_WITH_NCCL

}  // namespace
}  // namespace kvcache
