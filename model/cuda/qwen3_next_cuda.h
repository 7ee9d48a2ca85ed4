// CudaQwen3NextModel: the hybrid decoder of model/qwen3_next.h on a CUDA device, its full-attention
// KV in a paged device pool (DevicePagedKv, model/cuda/qwen3_moe_cuda.h) and its linear-attention
// state in a DeviceLinearAttentionState (same bytes as the CPU model's LinearAttentionState).
//
// Same math in the same order as Qwen3NextModel::Forward, built from kernels/worker_kernels.h
// (RMSNorm, Linear, partial RoPE, KV write, paged attention, routing, experts, combine) and
// kernels/linear_attention_kernels.h (conv, gated delta rule, output gates). The projections whose
// rows Hugging Face interleaves (in_proj_qkvz per key head, in_proj_ba, q_proj's [query | gate]
// per head) are uploaded with their rows regrouped, so one Linear yields each of q/k/v, z, b, a,
// query and gate contiguously — the same dot products, so bit-exact with the CPU's regrouped
// values. The shared expert is summed after the routed experts with weight sigmoid(gate) (the
// sigmoid on the host, worker::Sigmoid), in the CPU's order.
//
// Exactness: against the CPU within a tolerance (attention, expert matvecs and the exp / log1p of
// the gates differ in the last bits, see the kernels); on one device, bit-identical across call
// patterns: a prefill in one call, in chunks, token by token, or resumed from a state saved after
// m tokens (on the device or copied through host bytes) and the pool's KV gives the same logits,
// KV bytes and state, since every kernel is batch-invariant and the recurrence runs token by
// token.
//
// Streams, errors and thread-safety as CudaQwen3MoeModel: one non-blocking stream, synchronized
// before Forward returns; one Forward at a time per object.
#ifndef KVCACHE_MODEL_CUDA_QWEN3_NEXT_CUDA_H_
#define KVCACHE_MODEL_CUDA_QWEN3_NEXT_CUDA_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/cuda/device_linear_state.h"
#include "model/cuda/qwen3_moe_cuda.h"
#include "model/qwen3_next.h"

namespace kvcache::worker {

class CudaQwen3NextModel {
 public:
  // Uploads `model`'s weights to CUDA device `device`. Errors as CudaQwen3MoeModel::Create, plus
  // INVALID_ARGUMENT for linear-attention shapes the kernels cannot run (conv kernel above
  // kMaxCudaConvKernel, value head dim above kMaxCudaLinearHeadDim).
  static absl::StatusOr<CudaQwen3NextModel> Create(const Qwen3NextModel& model, int device);

  ~CudaQwen3NextModel();
  CudaQwen3NextModel(CudaQwen3NextModel&& other) noexcept;
  CudaQwen3NextModel& operator=(CudaQwen3NextModel&& other) noexcept;
  CudaQwen3NextModel(const CudaQwen3NextModel&) = delete;
  CudaQwen3NextModel& operator=(const CudaQwen3NextModel&) = delete;

  // Qwen3NextModel::Forward on the device. Errors: the CPU model's checks, codes and messages,
  // then CudaQwen3MoeModel::Forward's device checks, and FAILED_PRECONDITION for a state on
  // another device. Nothing is written to the pool or the state when a check fails.
  absl::StatusOr<std::vector<float>> Forward(absl::Span<const uint32_t> tokens,
                                             uint32_t start_position, const DevicePagedKv& kv,
                                             DeviceLinearAttentionState& state);

  int device() const;

 private:
  struct Impl;
  explicit CudaQwen3NextModel(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_CUDA_QWEN3_NEXT_CUDA_H_
