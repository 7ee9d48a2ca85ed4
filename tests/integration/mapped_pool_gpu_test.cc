// MappedPool over CUDA IPC (client/mapped_pool.h) with a real kvcache-manager --device cuda:0 and
// kvcache-test-client processes: process A maps the device pool, cudaMemcpy's the KV pattern
// into its open sequence's blocks and commits; process B opens the same prompt, gets the hit,
// maps the pool and reads the same bytes back. This process maps the pool too (it is not the
// exporter, which CUDA would refuse), to check the device accessors and the epoch after a
// daemon restart.
//
// Label gpu: every case skips ("no CUDA device") without a device or in a build without CUDA.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "client/mapped_pool.h"
#include "common/cuda/cuda_device.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/integration/kv_pattern.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;

class MappedPoolGpuTest : public DaemonProcessTest {
 protected:
  void SetUp() override {
    DaemonProcessTest::SetUp();
    if (!MappedPool::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device (built without CUDA)";
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
    device_flag_ = "cuda:0";
    ASSERT_NO_FATAL_FAILURE(StartDaemon());
  }

  KvCacheClient::PoolDescription Describe() {
    absl::StatusOr<KvCacheClient::PoolDescription> described = observer_->DescribePool("default");
    EXPECT_OK(described);
    return described.ok() ? *described : KvCacheClient::PoolDescription{};
  }

  static std::vector<uint32_t> Tokens(uint32_t count, uint32_t first) {
    std::vector<uint32_t> tokens(count);
    for (uint32_t i = 0; i < count; ++i) tokens[i] = first + i;
    return tokens;
  }
};

TEST_F(MappedPoolGpuTest, DaemonDescribesADevicePool) {
  const KvCacheClient::PoolDescription described = Describe();
  EXPECT_EQ(described.pool.memory_kind, "cuda");
  EXPECT_EQ(described.pool.mapping.kind, KvCacheClient::PoolMapping::Kind::kCudaIpc);
  EXPECT_EQ(described.pool.mapping.cuda_device, 0);
  EXPECT_EQ(described.pool.mapping.cuda_ipc_handle.size(), 64u);
  EXPECT_EQ(described.pool.mapping.size_bytes, uint64_t{kPoolBlocks} * described.pool.block_bytes);
}

TEST_F(MappedPoolGpuTest, AnotherProcessReadsWhatOneWroteThroughTheDeviceMapping) {
  constexpr uint32_t kTokens = 2 * kBlockSize + 5;  // two full blocks and a partial one
  const std::string tokens = std::to_string(kTokens);
  const ClientResult a = RunClient({"write-kv", "default", tokens, "1000"});
  EXPECT_EQ(a.Field("device"), "0");  // written through cudaMemcpy into the device mapping
  EXPECT_EQ(a.num_cached_tokens, 0u);
  EXPECT_EQ(a.Number("written"), kTokens);

  const ClientResult b = RunClient({"read-kv", "default", tokens, "1000"});
  EXPECT_EQ(b.Field("device"), "0");
  EXPECT_EQ(b.num_cached_tokens, 2 * kBlockSize);
  EXPECT_EQ(Prefix(b.block_ids, 2), Prefix(a.block_ids, 2));  // the same physical blocks
  EXPECT_EQ(b.Number("mismatched_blocks"), 0);
  EXPECT_EQ(b.Field("digest"),
            Digest(ExpectedPrefixBytes(Describe().pool.layout, Tokens(kTokens, 1000), 2)));
  EXPECT_TRUE(AwaitAllReleased());
}

TEST_F(MappedPoolGpuTest, DeviceMappingHandsOutDeviceAddressesOnly) {
  const KvCacheClient::PoolDescription described = Describe();
  absl::StatusOr<std::unique_ptr<MappedPool>> mapped = MappedPool::Map(described);
  ASSERT_OK(mapped);
  const MappedPool& pool = **mapped;
  EXPECT_TRUE(pool.is_device());
  EXPECT_EQ(pool.device(), 0);
  EXPECT_EQ(pool.epoch(), described.epoch);
  EXPECT_EQ(pool.num_blocks(), kPoolBlocks);
  EXPECT_NE(pool.Block(0), nullptr);
  EXPECT_EQ(pool.Block(3) - pool.Block(0), 3 * static_cast<std::ptrdiff_t>(pool.block_bytes()));
  EXPECT_THAT(pool.CheckedBlock(0),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("device memory")));
  EXPECT_THAT(pool.Keys<uint16_t>(0, 0), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(pool.Values<uint16_t>(0, 0), StatusIs(absl::StatusCode::kFailedPrecondition));
  // A second mapping in the same process shares the first one's (CUDA counts the opens).
  absl::StatusOr<std::unique_ptr<MappedPool>> again = MappedPool::Map(described);
  ASSERT_OK(again);
  EXPECT_EQ((*again)->Block(0), pool.Block(0));
}

TEST_F(MappedPoolGpuTest, RestartedDaemonIsANewEpochWithANewHandle) {
  const KvCacheClient::PoolDescription before = Describe();
  {
    absl::StatusOr<std::unique_ptr<MappedPool>> mapped = MappedPool::Map(before);
    ASSERT_OK(mapped);
    EXPECT_EQ((*mapped)->epoch(), before.epoch);
    // Closed before the daemon frees the memory: CUDA leaves a mapping of freed memory undefined.
  }
  RunClient({"write-kv", "default", std::to_string(2 * kBlockSize + 1), "7000"});

  observer_.reset();
  ASSERT_NO_FATAL_FAILURE(StopDaemon());
  ASSERT_NO_FATAL_FAILURE(StartDaemon());
  const KvCacheClient::PoolDescription after = Describe();
  EXPECT_NE(after.epoch, before.epoch);
  EXPECT_NE(after.pool.mapping.cuda_ipc_handle, before.pool.mapping.cuda_ipc_handle);
  // The stopped daemon's handle no longer opens; the new one does, for the new epoch.
  EXPECT_FALSE(MappedPool::Map(before).ok());
  absl::StatusOr<std::unique_ptr<MappedPool>> remapped = MappedPool::Map(after);
  ASSERT_OK(remapped);
  EXPECT_EQ((*remapped)->epoch(), after.epoch);
  // Nothing of the old epoch is cached: the prompt is a miss on the new pool.
  const ClientResult reread =
      RunClient({"read-kv", "default", std::to_string(2 * kBlockSize + 1), "7000"});
  EXPECT_EQ(reread.num_cached_tokens, 0u);
}

}  // namespace
}  // namespace kvcache::testing
