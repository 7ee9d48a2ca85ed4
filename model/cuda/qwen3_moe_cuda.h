// CudaQwen3MoeModel: the Qwen3-MoE decoder of model/qwen3_moe.h on a CUDA device, with its KV in
// a paged pool in device memory (a cudaMalloc'ed buffer, or a daemon pool mapped through CUDA IPC).
//
// Same math in the same order as the CPU model, per layer: input RMSNorm → q/k/v projections →
// per-head q_norm / k_norm → RoPE → K/V written into the pool (WriteKvCuda) → causal GQA attention
// over K/V read back from the pool (PagedAttentionCuda) → o_proj + residual → post-attention
// RMSNorm → router logits → softmax / top-k (MoeRouteCuda) → each selected expert once over the
// tokens routed to it (ExpertSwiGluCuda) → weighted sum in expert-index order + residual
// (MoeCombineCuda); then the final norm and lm_head of the last token. The kernels are those of
// kernels/worker_kernels.h; weights are uploaded once, as float32.
//
// Exactness against the CPU model (Qwen3MoeModel::Forward):
//  - bit-exact given equal inputs: the embedding lookup, every Linear (q/k/v/o projections,
//    router, lm_head: worker::Dot's lane order, no FMA), the residual adds, the MoE weighted sum,
//    and the KV write (the pool bytes are exactly what PagedKv::WriteK / WriteV would write for
//    the same K/V floats);
//  - equal in practice (the last bit, rarely an ulp): RMSNorm (double sum in another order),
//    RoPE (CUDA's double pow / sin / cos), routing probabilities;
//  - within a tolerance: attention (online softmax, warp-tree dot products) and the expert
//    matvecs (warp-tree sums, CUDA's expf). Everything downstream of layer 0's attention therefore
//    differs from the CPU in the last bits: logits agree to ~1e-6 relative, not bit for bit, and
//    only layer 0's K/V bytes are (in practice) identical to the CPU pool's.
// Determinism: no atomics, and every kernel is batch-invariant (a token's results do not depend on
// which other tokens share its call). So on one device and build a token's logits depend only on
// its token, its position and the pool bytes of the positions before it: one-shot, chunked and
// token-by-token prefill, and prefill over prefix blocks computed by another sequence (shared or
// byte-copied), give bit-identical logits and KV bytes — the property the prefix cache relies on.
//
// Streams: all work runs on the model's own non-blocking stream. Forward synchronizes that stream
// before it returns (successfully or not), so when it returns every pool write is complete and the
// caller may commit the blocks. Work the caller enqueued on the pool elsewhere (copies, NCCL
// receives) must be complete before Forward is called.
//
// Thread-safety: thread-compatible. Forward uses the object's scratch buffers and stream: one call
// at a time per object (one object per thread otherwise). The pool must not be written by others
// during a call. The calling thread's current CUDA device is restored on return.
#ifndef KVCACHE_MODEL_CUDA_QWEN3_MOE_CUDA_H_
#define KVCACHE_MODEL_CUDA_QWEN3_MOE_CUDA_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/pool_layout.h"
#include "model/model_config.h"
#include "model/qwen3_moe.h"

namespace kvcache::worker {

// One sequence's view of a KV pool in device memory: as worker::PagedKv, with a device base.
struct DevicePagedKv {
  uint8_t* pool_base = nullptr;            // device memory on the model's device
  PoolLayout layout;                       // the pool's block layout
  absl::Span<const uint32_t> block_table;  // host memory: position p is in block_table[p / bs]
  uint64_t num_pool_blocks = 0;            // pool size in blocks (required: bounds the kernels)
  // Bytes from one block to the next, as PagedKv's page_stride_bytes: 0 for layout.BlockBytes()
  // (a pool of KV alone); a pool whose pages hold more than the KV (the hybrid's [kv | state])
  // gives its page bytes. The bytes past each block's KV are never touched.
  uint64_t page_stride_bytes = 0;
};

class CudaQwen3MoeModel {
 public:
  // Uploads `model`'s weights to CUDA device `device` and creates the stream. `model` is not
  // referenced afterwards.
  // FAILED_PRECONDITION "built without CUDA" in a build without CUDA, "no CUDA device" where the
  // runtime finds none, and "does not exist here" for a device this process does not see;
  // INVALID_ARGUMENT for a negative device or a model the kernels cannot run (head_dim >
  // kMaxCudaHeadDim, num_experts > kMaxCudaExperts); CUDA errors as common/cuda/cuda_status.h
  // maps them (RESOURCE_EXHAUSTED out of device memory, INTERNAL for a fault), with their text.
  static absl::StatusOr<CudaQwen3MoeModel> Create(const Qwen3MoeModel& model, int device);

  // Frees every device allocation and the stream. Move-only; a moved-from object answers
  // FAILED_PRECONDITION.
  ~CudaQwen3MoeModel();
  CudaQwen3MoeModel(CudaQwen3MoeModel&& other) noexcept;
  CudaQwen3MoeModel& operator=(CudaQwen3MoeModel&& other) noexcept;
  CudaQwen3MoeModel(const CudaQwen3MoeModel&) = delete;
  CudaQwen3MoeModel& operator=(const CudaQwen3MoeModel&) = delete;

  // Qwen3MoeModel::Forward on the device: runs `tokens` at positions start_position, ...; writes
  // their K/V into the pool and returns the logits (vocab_size floats) of the last token.
  // Errors: exactly Qwen3MoeModel::Forward's checks, codes and messages (CheckForwardRequest),
  // then: INVALID_ARGUMENT when num_pool_blocks is PagedKv::kUnknownPoolBlocks, when pool_base is
  // not device memory of this model's device, or when the block table maps two of the positions
  // being written to one slot (they would race; the CPU model would silently overwrite);
  // RESOURCE_EXHAUSTED when growing the scratch buffers runs out of device memory; INTERNAL for
  // another CUDA error (common/cuda/cuda_status.h). Nothing is written to the pool when a check
  // fails; after a CUDA error the pool contents of the positions being written are unspecified.
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const uint32_t> tokens,
                                             uint32_t start_position, const DevicePagedKv& kv);

  // The CUDA device the model runs on (Create's `device`); -1 for a moved-from model.
  int device() const;

 private:
  struct Impl;
  explicit CudaQwen3MoeModel(std::unique_ptr<Impl> impl);

  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_CUDA_QWEN3_MOE_CUDA_H_
