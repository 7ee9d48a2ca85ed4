#include "worker/pool_forward.h"

#include "model/paged_kv.h"

namespace kvcache::worker {

PoolForward HostPoolForward(const Qwen3MoeModel& model, uint8_t* pool_base,
                            const PoolLayout& layout, uint64_t num_pool_blocks) {
  return [&model, pool_base, layout, num_pool_blocks](
             absl::Span<const uint32_t> tokens, uint32_t start_position,
             absl::Span<const uint32_t> block_table) -> absl::StatusOr<std::vector<float>> {
    // A view per call: the table grows between calls (decode extends the sequence).
    PagedKv kv(pool_base, layout, block_table, num_pool_blocks);
    return model.Forward(tokens, start_position, kv);
  };
}

PoolForward DevicePoolForward(CudaQwen3MoeModel& model, uint8_t* pool_base,
                              const PoolLayout& layout, uint64_t num_pool_blocks) {
  return [&model, pool_base, layout, num_pool_blocks](
             absl::Span<const uint32_t> tokens, uint32_t start_position,
             absl::Span<const uint32_t> block_table) -> absl::StatusOr<std::vector<float>> {
    // CudaQwen3MoeModel::Forward synchronizes its stream before it returns.
    return model.Forward(tokens, start_position,
                         DevicePagedKv{.pool_base = pool_base,
                                       .layout = layout,
                                       .block_table = block_table,
                                       .num_pool_blocks = num_pool_blocks});
  };
}

}  // namespace kvcache::worker
