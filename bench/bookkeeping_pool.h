// A host pool for the benches of the core's bookkeeping (pool_bench, block_memory_bench): one fp16
// element a token, so the pool's bytes stay small (2 MiB a million 16-token blocks) and what is
// measured is the bookkeeping, which does not depend on block bytes. Bench-only code.
#ifndef KVCACHE_BENCH_BOOKKEEPING_POOL_H_
#define KVCACHE_BENCH_BOOKKEEPING_POOL_H_

#include <cstdint>
#include <memory>
#include <utility>

#include "bench/bench_run.h"
#include "cache/kv_event_log.h"
#include "cache/pool.h"

namespace kvcache::bench {

inline constexpr char kBookkeepingPoolName[] = "bench";

// Pool index 0 named kBookkeepingPoolName; `events` (registered by the caller with AddPool, or
// null) receives its index changes. Exits 1 when the pool cannot be made.
inline std::unique_ptr<Pool> MakeBookkeepingPool(uint32_t num_blocks, uint32_t block_size,
                                                 KvEventLog* events = nullptr) {
  PoolOptions options;
  options.name = kBookkeepingPoolName;
  options.model_id = "bench";
  options.layout = PoolLayout{.num_layers = 1,
                              .num_kv_heads = 1,
                              .head_dim = 1,
                              .block_size = block_size,
                              .dtype = DType::kFloat16};
  options.num_blocks = num_blocks;
  auto memory = ValueOrFail(HostPoolMemory::Create(options.layout.BlockBytes(), num_blocks),
                            "HostPoolMemory::Create");
  return ValueOrFail(Pool::Create(options, 0, std::move(memory), nullptr, nullptr, events),
                     "Pool::Create");
}

}  // namespace kvcache::bench

#endif  // KVCACHE_BENCH_BOOKKEEPING_POOL_H_
