// PoolForward: one forward pass of the model over a paged KV pool, as a callable. It is the only
// step in which generating on the CPU (Qwen3MoeModel over a host pool: the daemon's shared memory
// or a private buffer) and on a GPU (CudaQwen3MoeModel over a device pool: the daemon's pool
// mapped through CUDA IPC, or a private device buffer) differ, so the generation loops
// (KvWorker::Generate, GenerateOver in worker/generation.h) are written once, over a PoolForward.
//
// The contract of every PoolForward: runs `tokens` at positions start_position,
// start_position + 1, ...; writes their K/V into the pool slots that `block_table` maps those
// positions to (K/V of lower positions must already be there) and returns the logits
// (vocab_size floats) of the last token. Errors: those of Qwen3MoeModel::Forward (both backends
// answer a bad request with the same codes), and a CUDA error as common/cuda/cuda_status.h maps
// it (RESOURCE_EXHAUSTED out of device memory, INTERNAL for a fault). When it returns, the
// pool writes it made are complete — for a device pool, the model's stream is synchronized — so
// the caller may commit the blocks to the daemon, or ship them, right away.
//
// Thread-safety: a PoolForward holds raw references to its model and pool, which must outlive
// it. One call at a time for a device pool (CudaQwen3MoeModel's scratch and stream); concurrent
// calls over a host pool are safe when they write different blocks.
#ifndef KVCACHE_WORKER_POOL_FORWARD_H_
#define KVCACHE_WORKER_POOL_FORWARD_H_

#include <cstdint>
#include <functional>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/pool_layout.h"
#include "model/cuda/qwen3_moe_cuda.h"
#include "model/qwen3_moe.h"

namespace kvcache::worker {

using PoolForward = std::function<absl::StatusOr<std::vector<float>>(
    absl::Span<const uint32_t> tokens, uint32_t start_position,
    absl::Span<const uint32_t> block_table)>;

// The CPU model over the host pool of `num_pool_blocks` blocks of `layout` at `pool_base`.
PoolForward HostPoolForward(const Qwen3MoeModel& model, uint8_t* pool_base,
                            const PoolLayout& layout, uint64_t num_pool_blocks);

// The CUDA model over the device pool of `num_pool_blocks` blocks of `layout` at `pool_base`
// (device memory of model.device(); CudaQwen3MoeModel::Forward checks it and answers
// INVALID_ARGUMENT otherwise).
PoolForward DevicePoolForward(CudaQwen3MoeModel& model, uint8_t* pool_base,
                              const PoolLayout& layout, uint64_t num_pool_blocks);

}  // namespace kvcache::worker

#endif  // KVCACHE_WORKER_POOL_FORWARD_H_
