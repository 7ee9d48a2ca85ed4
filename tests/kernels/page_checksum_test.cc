// Pages copied and checksummed in one pass (kernels/page_checksum.h).
//
// Label unit (every build): the CPU reference, which computes XXH3 block by block with the
// kernel's arithmetic (kernels/xxh3_blocks.h), equals libxxhash's XXH3-64 (BlockChecksum) for
// every page size from 256 bytes to 4 KiB in 64-byte steps and for larger ones that end a block
// in every way, and copies the bytes; the checks refuse sizes and pointers the kernel cannot take.
//
// Label gpu (CUDA builds; skips without a device): PageChecksumGpuTest, the kernel against
// BlockChecksum and the copy byte for byte, pages scattered over a buffer and read from mapped
// page-locked host memory, with and without destinations.
#include "kernels/page_checksum.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/block_checksum.h"
#include "common/cuda/cuda_device.h"
#include "tests/testing/status_matchers.h"

#if KVCACHE_WITH_CUDA
#include <cuda_runtime.h>

#include "tests/testing/device_array.h"
#endif

namespace kvcache::kernels {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

std::vector<uint8_t> RandomBytes(size_t size, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<uint8_t> bytes(size);
  for (size_t i = 0; i < size; i += 8) {
    const uint64_t word = rng();
    std::memcpy(bytes.data() + i, &word, std::min<size_t>(8, size - i));
  }
  return bytes;
}

// Sizes past 4 KiB: a whole number of 1 KiB blocks (the tail is a whole block), one stripe more,
// one less, and the pool pages the benches use.
std::vector<uint64_t> PageSizes() {
  std::vector<uint64_t> sizes;
  for (uint64_t size = 256; size <= 4096; size += 64) sizes.push_back(size);
  for (const uint64_t size : {8192u, 8192u + 64, 65536u - 64, 65536u, 65536u + 64, 61440u}) {
    sizes.push_back(size);
  }
  sizes.push_back(1 << 20);
  sizes.push_back((1 << 20) + 960);  // past a chunk of 64 blocks, with 15 stripes of tail
  return sizes;
}

TEST(PageChecksumTest, CpuReferenceIsXxh3OfEveryPageAndCopiesIt) {
  for (const uint64_t size : PageSizes()) {
    SCOPED_TRACE(size);
    const std::vector<uint8_t> first = RandomBytes(size, size);
    const std::vector<uint8_t> second = RandomBytes(size, size + 1);
    std::vector<uint8_t> copied(size, 0);
    const PageCopy copies[] = {{first.data(), copied.data()}, {second.data(), nullptr}};
    uint64_t checksums[2] = {};
    ASSERT_OK(CopyPagesChecksummedCpu(copies, size, absl::MakeSpan(checksums)));
    EXPECT_EQ(checksums[0], BlockChecksum(first.data(), size));
    EXPECT_EQ(checksums[1], BlockChecksum(second.data(), size));
    EXPECT_EQ(copied, first);
  }
}

TEST(PageChecksumTest, SizesAndPointersTheKernelCannotTakeAreRefused) {
  alignas(16) static uint8_t page[1024];
  uint64_t checksum = 0;
  for (const uint64_t size : {0u, 64u, 192u, 240u, 1000u, 1024u + 32}) {
    EXPECT_THAT(CheckChecksummedPageBytes(size),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("multiple of 64")))
        << size;
  }
  EXPECT_OK(CheckChecksummedPageBytes(256));
  const PageCopy misaligned[] = {{page, page + 512}, {page + 8, nullptr}};
  EXPECT_THAT(ValidatePageCopies(misaligned, 256),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page 1: the source and")));
  const PageCopy no_source[] = {{nullptr, page}};
  EXPECT_THAT(
      CopyPagesChecksummedCpu(no_source, 256, absl::MakeSpan(&checksum, 1)),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("page 0: the source is null")));
  const PageCopy one[] = {{page, nullptr}};
  EXPECT_THAT(CopyPagesChecksummedCpu(one, 256, {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0 checksums for 1 pages")));
  // The launcher's own checks come before any CUDA call, in every build.
  EXPECT_THAT(CopyPagesChecksummedCuda(nullptr, 1, 256, &checksum, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("copies is null")));
  EXPECT_THAT(CopyPagesChecksummedCuda(nullptr, 1, 100, &checksum, nullptr),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(CopyPagesChecksummedCuda(nullptr, 0, 256, nullptr, nullptr));
}

#if KVCACHE_WITH_CUDA

using ::kvcache::testing::DeviceArray;

class PageChecksumGpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  }
};

TEST_F(PageChecksumGpuTest, MatchesXxh3AndCopiesEveryPage) {
  constexpr size_t kPages = 5;
  for (const uint64_t size : PageSizes()) {
    SCOPED_TRACE(size);
    // Pages at uneven (16-byte aligned) offsets of one buffer, in reverse order.
    const uint64_t stride = size + 48;
    const std::vector<uint8_t> host = RandomBytes(kPages * stride, size);
    DeviceArray<uint8_t> sources(host);
    DeviceArray<uint8_t> destinations(kPages * stride);
    ASSERT_EQ(cudaMemset(destinations.get(), 0, kPages * stride), cudaSuccess);
    std::vector<PageCopy> copies;
    std::vector<uint64_t> want;
    for (size_t i = 0; i < kPages; ++i) {
      const uint64_t at = (kPages - 1 - i) * stride;
      // The third page only checksummed.
      copies.push_back({sources.get() + at, i == 2 ? nullptr : destinations.get() + at});
      want.push_back(BlockChecksum(host.data() + at, size));
    }
    ASSERT_OK(ValidatePageCopies(copies, size));
    std::vector<uint8_t> copy_bytes(copies.size() * sizeof(PageCopy));
    std::memcpy(copy_bytes.data(), copies.data(), copy_bytes.size());
    DeviceArray<uint8_t> device_copies(copy_bytes);
    DeviceArray<uint64_t> checksums(kPages);
    ASSERT_OK(CopyPagesChecksummedCuda(reinterpret_cast<const PageCopy*>(device_copies.get()),
                                       kPages, size, checksums.get(), nullptr));
    EXPECT_EQ(checksums.Download(), want);
    const std::vector<uint8_t> copied = destinations.Download();
    for (size_t i = 0; i < kPages; ++i) {
      const uint64_t at = (kPages - 1 - i) * stride;
      const bool equal = std::memcmp(copied.data() + at, host.data() + at, size) == 0;
      EXPECT_EQ(equal, i != 2) << "page " << i;
    }
  }
}

TEST_F(PageChecksumGpuTest, ReadsItsListFromMappedHostMemory) {
  constexpr uint64_t kSize = 64 << 10;
  constexpr uint32_t kPages = 128;
  const std::vector<uint8_t> host = RandomBytes(kPages * kSize, 7);
  DeviceArray<uint8_t> sources(host);
  DeviceArray<uint8_t> destinations(kPages * kSize);
  void* mapped = nullptr;
  ASSERT_EQ(
      cudaHostAlloc(&mapped, kPages * (sizeof(PageCopy) + sizeof(uint64_t)), cudaHostAllocMapped),
      cudaSuccess);
  auto* copies = static_cast<PageCopy*>(mapped);
  auto* checksums = reinterpret_cast<uint64_t*>(copies + kPages);
  for (uint32_t i = 0; i < kPages; ++i) {
    copies[i] = {sources.get() + i * kSize, destinations.get() + i * kSize};
  }
  ASSERT_OK(CopyPagesChecksummedCuda(copies, kPages, kSize, checksums, nullptr));
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (uint32_t i = 0; i < kPages; ++i) {
    EXPECT_EQ(checksums[i], BlockChecksum(host.data() + i * kSize, kSize)) << "page " << i;
  }
  EXPECT_EQ(destinations.Download(), host);
  cudaFreeHost(mapped);
}

#endif  // KVCACHE_WITH_CUDA

}  // namespace
}  // namespace kvcache::kernels
