// The pool memories the tier tests run on, as a test parameter: host memory ("host"); host bytes
// behind the device interface ("staged": no host pointers, so every copy between a pool and its
// tiers goes through PoolMemory's batched CopyToHost/CopyFromHost — the CPU reference of the
// device path); and a CUDA pool ("cuda": D2H and H2D copies from page-locked tier-2 memory;
// CreatePoolMemory fails without a device, and tests skip it with "no CUDA device").
#ifndef KVCACHE_TESTS_TESTING_POOL_MEMORIES_H_
#define KVCACHE_TESTS_TESTING_POOL_MEMORIES_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "cache/cuda_pool_memory.h"
#include "cache/pool_memory.h"
#include "tests/testing/fault_injection_pool_memory.h"

namespace kvcache::testing {

enum class PoolMemoryKind { kHost, kStaged, kCuda };

inline absl::StatusOr<std::unique_ptr<PoolMemory>> CreatePoolMemory(PoolMemoryKind kind,
                                                                    uint64_t block_bytes,
                                                                    uint32_t num_blocks) {
  if (kind == PoolMemoryKind::kCuda) return CreateCudaPoolMemory(0, block_bytes, num_blocks);
  auto host = HostPoolMemory::Create(block_bytes, num_blocks);
  if (!host.ok()) return host.status();
  if (kind == PoolMemoryKind::kHost) return std::unique_ptr<PoolMemory>(*std::move(host));
  return std::unique_ptr<PoolMemory>(std::make_unique<FaultInjectionPoolMemory>(*std::move(host)));
}

// For INSTANTIATE_TEST_SUITE_P: "host", "staged", "cuda".
inline std::string PoolMemoryName(const ::testing::TestParamInfo<PoolMemoryKind>& info) {
  switch (info.param) {
    case PoolMemoryKind::kHost:
      return "host";
    case PoolMemoryKind::kStaged:
      return "staged";
    case PoolMemoryKind::kCuda:
      return "cuda";
  }
  return "unknown";
}

inline auto AllPoolMemories() {
  return ::testing::Values(PoolMemoryKind::kHost, PoolMemoryKind::kStaged, PoolMemoryKind::kCuda);
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_POOL_MEMORIES_H_
