// HybridPages: where a hybrid model's (Qwen3NextModel) full-attention KV and linear-attention
// state sit in a daemon pool's pages, and the forward pass and cold run over such pages.
//
// Pool geometry (DESIGN §5). The daemon sizes a block from its layout (layers, kv_heads,
// head_dim, block_size, dtype) and a pool's `parts` must sum to it. A hybrid pool therefore
// declares the model's full-attention layers plus the state padded up to whole "layer-blocks"
// (one layer's K and V for a block: 2 x kv_heads x head_dim x block_size elements) as its layer
// count, and parts=kv/<KV bytes>+state/<the rest>/trailing1. The padding is at most one
// layer-block per page; it costs memory, not correctness, and keeps the daemon's pool spec
// unchanged. HybridPoolGeometryFor gives the fields; HybridPagesIn checks a described pool.
//
// A page is [kv | state]: the KV part is HybridKvLayout's block, the state part's first
// StateBytes bytes hold the state after the page's last token (LinearAttentionState's layout)
// when the page's mask has the state bit. Which pages get a state: every `checkpoint_pages`-th
// (page i when (i + 1) % checkpoint_pages == 0), the worker's choice; the daemon's hit rule
// then ends a hit only at such a page.
//
// On a GPU (a device pool) the same pages are computed by CudaQwen3NextModel: the KV part through
// DevicePagedKv's page stride, the state part copied device to device from and into a
// DeviceLinearAttentionState, in the host state's byte layout — a page written by a CPU worker
// reads the same on a GPU one.
//
// Thread-safety: value types and free functions; a HybridHostPoolForward or
// HybridDevicePoolForward mutates the state it was given, one call at a time.
#ifndef KVCACHE_WORKER_HYBRID_PAGES_H_
#define KVCACHE_WORKER_HYBRID_PAGES_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/page_parts.h"
#include "common/pool_layout.h"
#include "model/cuda/device_linear_state.h"
#include "model/cuda/qwen3_next_cuda.h"
#include "model/linear_attention_state.h"
#include "model/qwen3_next.h"
#include "model/sampler.h"
#include "worker/generation.h"
#include "worker/pool_forward.h"

namespace kvcache::worker {

// The daemon pool a hybrid model needs, `block_size`-token pages with KV in `kv_dtype`.
struct HybridPoolGeometry {
  PoolLayout pool_layout;  // layers: the KV layers plus the padded state's layer-blocks
  std::string parts;       // the `parts` field: kv/<KV bytes>+state/<padded bytes>/trailing1
  PoolLayout kv_layout;    // HybridKvLayout
  uint64_t kv_bytes = 0;
  uint64_t state_bytes = 0;       // LinearAttentionState::StateBytes
  uint64_t state_part_bytes = 0;  // state_bytes padded to whole layer-blocks
  // ":layers=N:kv_heads=N:head_dim=N:block_size=N:dtype=D:parts=..." for a pool spec.
  std::string SpecFields() const;
};
HybridPoolGeometry HybridPoolGeometryFor(const Qwen3NextConfig& config, uint32_t block_size,
                                         DType kv_dtype);

// The pages of a pool a hybrid worker computes over.
struct HybridPages {
  PoolLayout kv_layout;       // HybridKvLayout: the KV part
  uint64_t page_bytes = 0;    // one block of the pool: kv | state (| padding)
  uint64_t state_offset = 0;  // the state part, from the page's first byte
  uint64_t state_bytes = 0;   // StateBytes; the state part holds at least these
  uint32_t kv_mask = 0;       // the kv part's bit
  uint32_t state_mask = 0;    // the state part's bit

  // The parts page `page_index` (from 0) holds once written with a state every
  // `checkpoint_pages` pages.
  uint32_t MaskOfPage(uint32_t page_index, uint32_t checkpoint_pages) const {
    return (page_index + 1) % checkpoint_pages == 0 ? kv_mask | state_mask : kv_mask;
  }
};

// Checks that `pool` (its layout, block bytes and parts, as DescribePool gave them) holds the
// model's pages: FAILED_PRECONDITION naming the pool and what differs (no part "kv" at offset 0
// of HybridKvBytesPerPage bytes, no trailing part "state" of at least StateBytes, kv_heads /
// head_dim / block size other than the model's full-attention layers', or a dtype the model
// cannot write).
absl::StatusOr<HybridPages> HybridPagesIn(const Qwen3NextConfig& config, absl::string_view pool,
                                          const PoolLayout& layout, uint64_t block_bytes,
                                          absl::Span<const PagePartLayout> parts);

// The pages of HybridPoolGeometryFor's pool (for private pools).
HybridPages HybridPagesOf(const HybridPoolGeometry& geometry);

// The CPU hybrid model over a host pool of `num_pool_blocks` pages at `pool_base`, continuing
// `*state` (which must be at the call's start position). With checkpoint_pages > 0 the state
// after every checkpoint_pages-th page's last token is saved into that page's state part; 0
// saves none (one plain Forward). `model` and `state` must outlive the returned callable.
PoolForward HybridHostPoolForward(const Qwen3NextModel& model, uint8_t* pool_base,
                                  const HybridPages& pages, uint64_t num_pool_blocks,
                                  uint32_t checkpoint_pages, LinearAttentionState* state);

// The CUDA hybrid model over a device pool of `num_pool_blocks` pages at `pool_base` (device
// memory of model.device()), continuing `*state`, as HybridHostPoolForward: with checkpoint_pages
// > 0 the prefill runs in chunks that end at every checkpoint_pages-th page's last token, and the
// state there is copied into that page's state part on the device (the CUDA model is
// batch-invariant, so the chunks change no bit); 0 saves none (one Forward). When it returns, the
// pool writes are complete. `model` and `state` must outlive the returned callable.
PoolForward HybridDevicePoolForward(CudaQwen3NextModel& model, uint8_t* pool_base,
                                    const HybridPages& pages, uint64_t num_pool_blocks,
                                    uint32_t checkpoint_pages, DeviceLinearAttentionState* state);

// Sets `state` to the state after `position` tokens: zero at 0, else the bytes in the state part
// of `page` (the page ending at `position`). INVALID_ARGUMENT when position is not a page end.
absl::Status RestoreHybridState(const HybridPages& pages, const uint8_t* page, uint32_t position,
                                LinearAttentionState& state);

// RestoreHybridState on a GPU: `device_page` is the page's device address; the state bytes are
// copied device to device.
absl::Status RestoreHybridStateOnDevice(const HybridPages& pages, const uint8_t* device_page,
                                        uint32_t position, DeviceLinearAttentionState& state);

// The hybrid's cold reference: GenerateOver with the CPU model over a private, zero-filled pool
// of HybridPoolGeometryFor's pages, a fresh state, and no checkpoints (the prompt in one Forward).
absl::StatusOr<GenerationResult> GenerateColdHybrid(const Qwen3NextModel& model,
                                                    absl::Span<const uint32_t> prompt,
                                                    uint32_t max_new_tokens, Sampler& sampler,
                                                    uint32_t block_size, DType dtype);

// GenerateColdHybrid on a GPU: the CUDA model (of `config`, its CPU model's) over a fresh,
// zero-filled device pool of HybridPoolGeometryFor's pages on model.device() (DeviceKvPool) and a
// fresh DeviceLinearAttentionState, freed on return; no checkpoints. The reference of cached GPU
// runs of the hybrid on the same device and build, which it equals bit for bit. Errors:
// DeviceKvPool::Create's and DeviceLinearAttentionState::Create's (FAILED_PRECONDITION without
// CUDA or a device), then as CudaQwen3NextModel::Forward / Sample.
absl::StatusOr<GenerationResult> GenerateColdHybridCuda(CudaQwen3NextModel& model,
                                                        const Qwen3NextConfig& config,
                                                        absl::Span<const uint32_t> prompt,
                                                        uint32_t max_new_tokens, Sampler& sampler,
                                                        uint32_t block_size, DType dtype);

}  // namespace kvcache::worker

#endif  // KVCACHE_WORKER_HYBRID_PAGES_H_
