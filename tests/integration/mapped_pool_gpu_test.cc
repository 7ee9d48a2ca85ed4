// MappedPool over CUDA IPC (client/mapped_pool.h) with a real kvcache-manager --device cuda:0 and
// kvcache-test-client processes: process A maps the device pool, cudaMemcpy's the KV pattern
// into its open sequence's blocks and commits; process B opens the same prompt, gets the hit,
// maps the pool and reads the same bytes back. This process maps the pool too (it is not the
// exporter, which CUDA would refuse), to check the device accessors and the epoch after a
// daemon restart.
//
// DevicePagesGpuTest: the page calls through the device mapping (pages named by keys, issue 31),
// from this process's device buffers: WritePages and ReadPagesInto round trip byte for byte and
// agree with PutPages / GetPages over the wire (whose host-side checksums check the kernel's); a
// byte changed in the device pool is DATA_LOSS naming the page; bad device addresses are refused
// before anything is reserved.
//
// Label gpu: every case skips ("no CUDA device") without a device or in a build without CUDA.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/mapped_pool.h"
#include "common/compatibility_manifest.h"
#include "common/cuda/cuda_device.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/integration/kv_pattern.h"
#include "tests/testing/status_matchers.h"

#if KVCACHE_WITH_CUDA
#include <cuda_runtime.h>
#endif

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

#if KVCACHE_WITH_CUDA

// A pool of 64 KiB pages, "kv" 60 KiB on every page and a one-page trailing "state" of 4 KiB.
class DevicePagesGpuTest : public DaemonProcessTest {
 protected:
  static constexpr uint64_t kPageBytes = 64 << 10;
  static constexpr uint32_t kPages = 8;

  void SetUp() override {
    DaemonProcessTest::SetUp();
    if (!MappedPool::BuiltWithCuda()) GTEST_SKIP() << "no CUDA device (built without CUDA)";
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
    device_flag_ = "cuda:0";
    pool_name_ = "pages";
    pool_flag_ =
        "pages:model=demo:layers=1:kv_heads=8:head_dim=128:block_size=16:dtype=fp16:blocks=32:"
        "parts=kv/60K+state/4K/trailing1";
    ASSERT_NO_FATAL_FAILURE(StartDaemon());
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(target_);
    ASSERT_OK(client);
    client_ = *std::move(client);
    ASSERT_OK(client_->OpenSession(
        "", "device-pages", absl::Minutes(5),
        ManifestFields{.model_id = "demo",
                       .model_config_digest = "device-pages",
                       .kv_dtype = "fp16",
                       .page_tokens = 16,
                       .parts = {{"kv", kPageBytes - (4 << 10)}, {"state", 4 << 10}}}));
    absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool("pages");
    ASSERT_OK(described);
    absl::StatusOr<std::unique_ptr<MappedPool>> mapped = MappedPool::Map(*described);
    ASSERT_OK(mapped);
    mapped_ = *std::move(mapped);
    ASSERT_TRUE(mapped_->is_device());
    ASSERT_EQ(mapped_->block_bytes(), kPageBytes);
    ASSERT_EQ(cudaMalloc(&sources_, kPages * kPageBytes), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&destinations_, kPages * kPageBytes), cudaSuccess);
    host_.resize(kPages * kPageBytes);
    std::mt19937_64 rng(31);
    for (char& byte : host_) byte = static_cast<char>(rng());
    ASSERT_EQ(cudaMemcpy(sources_, host_.data(), host_.size(), cudaMemcpyHostToDevice),
              cudaSuccess);
  }

  void TearDown() override {
    mapped_.reset();  // closed before the daemon frees the memory
    client_.reset();
    if (sources_ != nullptr) cudaFree(sources_);
    if (destinations_ != nullptr) cudaFree(destinations_);
    DaemonProcessTest::TearDown();
  }

  static std::vector<std::string> Keys(const std::string& prefix, size_t count) {
    std::vector<std::string> keys;
    for (size_t i = 0; i < count; ++i) keys.push_back(absl::StrCat(prefix, "/", i));
    return keys;
  }
  // Page i of the device buffers (`offset` bytes in, to misalign it).
  std::vector<absl::string_view> SourcePages(size_t count, size_t offset = 0) const {
    std::vector<absl::string_view> pages;
    for (size_t i = 0; i < count; ++i) {
      pages.emplace_back(sources_ + i * kPageBytes + offset, kPageBytes);
    }
    return pages;
  }
  std::vector<absl::Span<char>> DestinationPages(size_t count, size_t offset = 0) const {
    std::vector<absl::Span<char>> pages;
    for (size_t i = 0; i < count; ++i) {
      pages.emplace_back(destinations_ + i * kPageBytes + offset, kPageBytes);
    }
    return pages;
  }
  std::string Downloaded(size_t count) const {
    std::string bytes(count * kPageBytes, '\0');
    EXPECT_EQ(cudaMemcpy(bytes.data(), destinations_, bytes.size(), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return bytes;
  }
  uint32_t Referenced() {
    absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool("pages");
    EXPECT_OK(described);
    return described.ok() ? described->counts.referenced : 0;
  }

  std::unique_ptr<KvCacheClient> client_;
  std::unique_ptr<MappedPool> mapped_;
  char* sources_ = nullptr;
  char* destinations_ = nullptr;
  std::string host_;  // what sources_ holds
};

TEST_F(DevicePagesGpuTest, WritePagesAndReadPagesIntoRoundTripFromDeviceBuffers) {
  const std::vector<std::string> keys = Keys("device", kPages);
  absl::StatusOr<KvCacheClient::PagesStored> written =
      client_->WritePages(*mapped_, keys, SourcePages(kPages));
  ASSERT_OK(written);
  EXPECT_EQ(written->num_published, kPages);
  EXPECT_EQ(Referenced(), 0u);

  absl::StatusOr<KvCacheClient::PagesRead> read =
      client_->ReadPagesInto(*mapped_, keys, DestinationPages(kPages));
  ASSERT_OK(read);
  EXPECT_EQ(read->num_pages, kPages);
  EXPECT_TRUE(Downloaded(kPages) == host_) << "the pages read differ from those written";
  client_->AwaitReleases();  // the release was sent, not waited for
  EXPECT_EQ(Referenced(), 0u);

  // Over the wire the client checksums on the host what the kernel checksummed on the device.
  absl::StatusOr<KvCacheClient::GotPages> got = client_->GetPages("pages", keys);
  ASSERT_OK(got);
  ASSERT_EQ(got->pages.size(), kPages);
  for (size_t i = 0; i < kPages; ++i) {
    EXPECT_TRUE(got->pages[i] == host_.substr(i * kPageBytes, kPageBytes)) << "page " << i;
  }

  // Written over the wire, read through the device mapping; a second write is all duplicates.
  const std::vector<std::string> wire_keys = Keys("wire", 2);
  std::vector<absl::string_view> wire_pages;
  for (size_t i = 0; i < 2; ++i) {
    wire_pages.push_back(absl::string_view(host_).substr((i + 4) * kPageBytes, kPageBytes));
  }
  ASSERT_OK(client_->PutPages("pages", wire_keys, wire_pages));
  ASSERT_OK(client_->ReadPagesInto(*mapped_, wire_keys, DestinationPages(2)));
  EXPECT_TRUE(Downloaded(2) == host_.substr(4 * kPageBytes, 2 * kPageBytes));
  absl::StatusOr<KvCacheClient::PagesStored> again =
      client_->WritePages(*mapped_, keys, SourcePages(kPages));
  ASSERT_OK(again);
  EXPECT_EQ(again->num_published, 0u);
  EXPECT_EQ(again->num_duplicates, kPages);
  client_->AwaitReleases();
  EXPECT_EQ(Referenced(), 0u);
}

TEST_F(DevicePagesGpuTest, AByteChangedInTheDevicePoolIsDataLossNamingThePage) {
  const std::vector<std::string> keys = Keys("changed", 3);
  ASSERT_OK(client_->WritePages(*mapped_, keys, SourcePages(3)));
  absl::StatusOr<KvCacheClient::AcquiredPages> acquired = client_->AcquirePages("pages", keys);
  ASSERT_OK(acquired);
  ASSERT_EQ(acquired->block_ids.size(), 3u);
  // A stray write into a published page, behind the daemon's back.
  ASSERT_EQ(cudaMemset(mapped_->Block(acquired->block_ids[1]) + 4000, 0x5a, 1), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_OK(client_->ReleaseSequence(acquired->sequence_id));

  EXPECT_THAT(client_->ReadPagesInto(*mapped_, keys, DestinationPages(3)),
              StatusIs(absl::StatusCode::kDataLoss,
                       HasSubstr("ReadPagesInto: page 1 (key \"changed/1\")")));
  EXPECT_THAT(client_->GetPages("pages", keys), StatusIs(absl::StatusCode::kDataLoss));
  EXPECT_EQ(Referenced(), 0u);
}

TEST_F(DevicePagesGpuTest, MisalignedDeviceAddressesAreRefusedBeforeAnythingIsReserved) {
  const std::vector<std::string> keys = Keys("misaligned", 2);
  EXPECT_THAT(
      client_->WritePages(*mapped_, keys, SourcePages(2, /*offset=*/8)),
      StatusIs(absl::StatusCode::kInvalidArgument,
               HasSubstr("WritePages: page 0: the source and destination must be 16-byte")));
  ASSERT_OK(client_->WritePages(*mapped_, keys, SourcePages(2)));
  EXPECT_THAT(client_->ReadPagesInto(*mapped_, keys, DestinationPages(2, /*offset=*/4)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("ReadPagesInto: page 0")));
  std::vector<absl::string_view> with_null = SourcePages(2);
  with_null[1] = absl::string_view(nullptr, 0);
  EXPECT_THAT(client_->WritePages(*mapped_, Keys("null", 2), with_null),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page 1 has 0 bytes")));
  EXPECT_EQ(Referenced(), 0u);
  absl::StatusOr<KvCacheClient::PagesFound> found = client_->ExistsPages("pages", Keys("null", 2));
  ASSERT_OK(found);
  EXPECT_EQ(found->num_pages, 0u);
}

#endif  // KVCACHE_WITH_CUDA

}  // namespace
}  // namespace kvcache::testing
