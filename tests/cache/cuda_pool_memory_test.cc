// CudaPoolMemory (cache/cuda_pool_memory.h). CudaPoolMemoryTest (label unit) has one right answer
// for every build and machine without a device; CudaPoolMemoryGpuTest (label gpu; skips with no
// device) holds a device pool against the host pool's behaviour.
#include "cache/cuda_pool_memory.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "common/cuda/cuda_device.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

TEST(CudaPoolMemoryGpuTest, WritesReadsCopiesAndExportsLikeTheHostPool) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  constexpr uint64_t kBlockBytes = (64 << 10) + 48;
  constexpr uint32_t kBlocks = 8;
  auto device = CreateCudaPoolMemory(0, kBlockBytes, kBlocks);
  ASSERT_OK(device);
  auto host = HostPoolMemory::Create(kBlockBytes, kBlocks);
  ASSERT_OK(host);
  std::string bytes(kBlockBytes, '\0');
  std::mt19937 rng(7);
  for (char& byte : bytes) byte = static_cast<char>(rng());
  for (PoolMemory* memory : {device->get(), static_cast<PoolMemory*>(host->get())}) {
    ASSERT_OK(memory->Write(2, 0, bytes));
    ASSERT_OK(memory->CopyBlock(2, 5));
  }
  std::string from_device(kBlockBytes, '\0');
  ASSERT_OK((*device)->Read(5, 0, kBlockBytes, from_device.data()));
  EXPECT_EQ(from_device, bytes);
  EXPECT_EQ(*(*device)->Checksum(5), *(*host)->Checksum(5));
  EXPECT_THAT((*device)->Read(8, 0, 1, from_device.data()),
              testing::StatusIs(absl::StatusCode::kOutOfRange));
  const MappingInfo mapping = (*device)->mapping();
  EXPECT_EQ(mapping.kind, MappingInfo::Kind::kCudaIpc);
  EXPECT_EQ(mapping.cuda_ipc_handle.size(), 64u);
  EXPECT_EQ(mapping.size_bytes, kBlockBytes * kBlocks);
}

// A batch's checksums come from one kernel launch where the block size allows (a multiple of 64
// bytes) and block by block through the host where it does not: both give each block's
// XXH3-64, as the host pool does.
TEST(CudaPoolMemoryGpuTest, ChecksumsABatchOnTheDeviceAsTheHostPoolDoes) {
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  for (const uint64_t block_bytes : {uint64_t{64} << 10, (uint64_t{64} << 10) + 48}) {
    SCOPED_TRACE(block_bytes);
    constexpr uint32_t kBlocks = 200;
    auto device = CreateCudaPoolMemory(0, block_bytes, kBlocks);
    ASSERT_OK(device);
    auto host = HostPoolMemory::Create(block_bytes, kBlocks);
    ASSERT_OK(host);
    std::mt19937 rng(static_cast<uint32_t>(block_bytes));
    std::string bytes(block_bytes, '\0');
    std::vector<uint32_t> blocks;
    for (uint32_t block = 0; block < kBlocks; block += 2) {
      for (char& byte : bytes) byte = static_cast<char>(rng());
      ASSERT_OK((*device)->Write(block, 0, bytes));
      ASSERT_OK((*host)->Write(block, 0, bytes));
      blocks.insert(blocks.begin(), block);  // out of order, as a reservation's may be
    }
    std::vector<uint64_t> on_device(blocks.size());
    std::vector<uint64_t> on_host(blocks.size());
    ASSERT_OK((*device)->ChecksumBlocks(blocks, absl::MakeSpan(on_device)));
    ASSERT_OK((*host)->ChecksumBlocks(blocks, absl::MakeSpan(on_host)));
    EXPECT_EQ(on_device, on_host);
    EXPECT_EQ(on_device.front(), *(*device)->Checksum(blocks.front()));
    EXPECT_THAT((*device)->ChecksumBlocks(std::vector<uint32_t>{kBlocks},
                                          absl::MakeSpan(on_device).first(1)),
                testing::StatusIs(absl::StatusCode::kOutOfRange));
  }
}

TEST(CudaPoolMemoryTest, NoDeviceIsAPreconditionNotACrash) {
  if (CudaDeviceAvailable()) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THAT(CreateCudaPoolMemory(0, 4096, 4),
              testing::StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace kvcache
