#include "model/cuda/cuda_model_support.h"

#include "absl/strings/str_cat.h"
#include "kernels/worker_kernels.h"
#include "model/paged_kv.h"

namespace kvcache::worker {

absl::Status CheckDevicePoolAndSlots(const DevicePagedKv& kv, int device, uint32_t start_position,
                                     size_t n, std::vector<int64_t>& host_slots) {
  if (kv.num_pool_blocks == PagedKv::kUnknownPoolBlocks) {
    return absl::InvalidArgumentError(
        "a device KV pool needs its size (num_pool_blocks): the kernels bound every access by it");
  }
  cudaPointerAttributes attributes{};
  const cudaError_t err = cudaPointerGetAttributes(&attributes, kv.pool_base);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool base is not device memory: ", cudaGetErrorString(err)));
  }
  const bool usable = attributes.type == cudaMemoryTypeManaged ||
                      (attributes.type == cudaMemoryTypeDevice && attributes.device == device);
  if (!usable) {
    return absl::InvalidArgumentError(
        absl::StrCat("KV pool base is not device memory of CUDA device ", device, " (memory type ",
                     static_cast<int>(attributes.type), " on device ", attributes.device, ")"));
  }
  // The slots of the positions being written: two equal ones would race in WriteKvCuda.
  const uint32_t block_size = kv.layout.block_size;
  host_slots.resize(n);
  for (size_t t = 0; t < n; ++t) {
    const uint64_t position = uint64_t{start_position} + t;
    host_slots[t] = static_cast<int64_t>(
        uint64_t{kv.block_table[position / block_size]} * block_size + position % block_size);
  }
  const absl::Status slots =
      kernels::ValidateSlotMapping(host_slots, kv.num_pool_blocks, block_size);
  if (!slots.ok()) {
    return absl::Status(slots.code(),
                        absl::StrCat("KV slots of the positions being written: ", slots.message()));
  }
  return absl::OkStatus();
}

absl::Status CheckKernelLimits(const ModelConfig& config) {
  if (config.head_dim > kernels::kMaxCudaHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "head_dim ", config.head_dim, " exceeds the CUDA kernels' ", kernels::kMaxCudaHeadDim));
  }
  if (config.num_experts > kernels::kMaxCudaExperts) {
    return absl::InvalidArgumentError(absl::StrCat("num_experts ", config.num_experts,
                                                   " exceeds the CUDA kernels' ",
                                                   kernels::kMaxCudaExperts));
  }
  return absl::OkStatus();
}

absl::Status StartModelStream(int device, ScopedCudaDevice& scoped, cudaStream_t& stream) {
  KVCACHE_CUDA_RETURN_IF_ERROR(scoped.Set(device), absl::StrCat("cudaSetDevice(", device, ")"));
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                               "cudaStreamCreateWithFlags");
  return absl::OkStatus();
}

void StopModelStream(int device, cudaStream_t stream, absl::FunctionRef<void()> release) {
  ScopedCudaDevice scoped;
  (void)scoped.Set(device);  // freed on whichever device is current if this fails
  // No kernel or copy may still use the buffers when they are freed.
  if (stream != nullptr && cudaStreamSynchronize(stream) != cudaSuccess) cudaGetLastError();
  release();
  if (stream != nullptr && cudaStreamDestroy(stream) != cudaSuccess) cudaGetLastError();
}

absl::Status UploadRequest(absl::Span<const uint32_t> tokens, uint32_t start_position,
                           absl::Span<const uint32_t> block_table, uint32_t blocks,
                           const std::vector<int64_t>& host_slots,
                           std::vector<uint32_t>& host_indices, DeviceBuffer& indices,
                           DeviceBuffer& slots, cudaStream_t stream) {
  const size_t n = tokens.size();
  host_indices.resize(2 * n + blocks);
  std::copy(tokens.begin(), tokens.end(), host_indices.begin());
  for (size_t t = 0; t < n; ++t) host_indices[n + t] = start_position + static_cast<uint32_t>(t);
  std::copy(block_table.begin(), block_table.begin() + blocks, host_indices.begin() + 2 * n);
  KVCACHE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(indices.get<uint32_t>(), host_indices.data(),
                      host_indices.size() * sizeof(uint32_t), cudaMemcpyHostToDevice, stream),
      "cudaMemcpyAsync (indices)");
  return CudaStatus(cudaMemcpyAsync(slots.get<int64_t>(), host_slots.data(), n * sizeof(int64_t),
                                    cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync (slot mapping)");
}

absl::Status NormRopeWriteAttend(const ModelConfig& config, uint32_t rotary_dim,
                                 uint32_t pool_layer, uint32_t n, uint32_t blocks,
                                 const float* q_norm, const float* k_norm, float* q, float* k,
                                 const float* v, const uint32_t* positions,
                                 const uint32_t* block_table, const int64_t* slots,
                                 const DevicePagedKv& kv, float* attn, cudaStream_t stream) {
  const uint32_t head_dim = config.head_dim;
  const uint32_t heads = config.num_attention_heads;
  const uint32_t kv_heads = config.num_key_value_heads;
  const float eps = config.rms_norm_eps;
  // Per-head norms in place (rows = tokens * heads), then RoPE, as the CPU models per head.
  RETURN_IF_ERROR(kernels::RmsNormCuda(q, q_norm, eps, n * heads, head_dim, q, stream));
  RETURN_IF_ERROR(kernels::RmsNormCuda(k, k_norm, eps, n * kv_heads, head_dim, k, stream));
  RETURN_IF_ERROR(kernels::PartialRopeCuda(q, positions, n, heads, head_dim, rotary_dim,
                                           config.rope_theta, stream));
  RETURN_IF_ERROR(kernels::PartialRopeCuda(k, positions, n, kv_heads, head_dim, rotary_dim,
                                           config.rope_theta, stream));
  // K/V go to the pool first; attention then reads every position, the new ones included, back
  // from it (same stream: the write is complete before attention starts).
  RETURN_IF_ERROR(kernels::WriteKvCuda(k, v, slots, n, pool_layer, kv.layout, kv.num_pool_blocks,
                                       kv.pool_base, stream, kv.page_stride_bytes));
  return kernels::PagedAttentionCuda(q, positions, /*seq_ids=*/nullptr, block_table, n, heads,
                                     /*num_seqs=*/1, blocks, pool_layer, kv.layout,
                                     kv.num_pool_blocks, kv.pool_base, attn, stream,
                                     kv.page_stride_bytes);
}

absl::Status NormAndRoute(const ModelConfig& config, const float* x, const float* post_norm,
                          const float* router, uint32_t n, float* normed, float* router_logits,
                          uint32_t* topk_ids, float* topk_weights, cudaStream_t stream) {
  RETURN_IF_ERROR(kernels::RmsNormCuda(x, post_norm, config.rms_norm_eps, n, config.hidden_size,
                                       normed, stream));
  RETURN_IF_ERROR(kernels::LinearCuda(normed, router, n, config.hidden_size, config.num_experts,
                                      false, router_logits, stream));
  return kernels::MoeRouteCuda(router_logits, n, config.num_experts, config.num_experts_per_tok,
                               config.norm_topk_prob, topk_ids, topk_weights, stream);
}

absl::Status RouteOnHost(const DeviceBuffer& topk_ids, const DeviceBuffer& topk_weights, uint32_t n,
                         uint32_t top_k, uint32_t num_experts, std::vector<uint32_t>& host_ids,
                         std::vector<float>& host_weights, MoeDispatchPlan& plan,
                         cudaStream_t stream, const float* device_extra,
                         std::vector<float>* host_extra, size_t extra_count) {
  const size_t routed = size_t{n} * top_k;
  host_ids.resize(routed);
  host_weights.resize(routed);
  KVCACHE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_ids.data(), topk_ids.get<uint32_t>(), routed * sizeof(uint32_t),
                      cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync (expert ids)");
  KVCACHE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(host_weights.data(), topk_weights.get<float>(), routed * sizeof(float),
                      cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync (expert weights)");
  if (host_extra != nullptr) {
    host_extra->resize(extra_count);
    KVCACHE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(host_extra->data(), device_extra, extra_count * sizeof(float),
                        cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync (routing extras)");
  }
  // The expert row counts decide the launches, so the host needs the routing now. This sync also
  // retires the previous layer's uploads from `plan`, which is rewritten below.
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize (routing)");
  const absl::Status planned = PlanMoeDispatch(host_ids, host_weights, n, top_k, num_experts, plan);
  if (!planned.ok()) {
    return absl::InternalError(absl::StrCat("MoeRouteCuda output: ", planned.message()));
  }
  return absl::OkStatus();
}

absl::Status RunRoutedExperts(const MoeDispatchPlan& plan, const std::vector<DeviceMlp>& experts,
                              const float* moe_in, uint32_t hidden, uint32_t intermediate,
                              float* workspace, float* moe_out, cudaStream_t stream) {
  for (size_t e = 0; e < experts.size(); ++e) {
    const uint32_t begin = plan.expert_begin[e];
    const uint32_t rows = plan.expert_begin[e + 1] - begin;
    if (rows == 0) continue;
    const DeviceMlp& expert = experts[e];
    RETURN_IF_ERROR(kernels::ExpertSwiGluCuda(
        moe_in + size_t{begin} * hidden, expert.gate_proj, expert.up_proj, expert.down_proj, rows,
        hidden, intermediate, workspace, moe_out + size_t{begin} * hidden, stream));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<float>> RunForwardOnDevice(
    int device, cudaStream_t stream, const DevicePagedKv& kv, uint32_t start_position, size_t n,
    std::vector<int64_t>& host_slots, absl::FunctionRef<absl::StatusOr<std::vector<float>>()> run) {
  ScopedCudaDevice scoped;
  KVCACHE_CUDA_RETURN_IF_ERROR(scoped.Set(device), absl::StrCat("cudaSetDevice(", device, ")"));
  RETURN_IF_ERROR(CheckDevicePoolAndSlots(kv, device, start_position, n, host_slots));
  // A non-sticky error left by an earlier call of the caller's must not be reported as the
  // failure of one of our launches (CheckLaunch reads cudaGetLastError).
  cudaGetLastError();
  absl::StatusOr<std::vector<float>> logits = run();
  if (!logits.ok() && cudaStreamSynchronize(stream) != cudaSuccess) {
    cudaGetLastError();  // the call's own error is already in `logits`
  }
  return logits;
}

absl::StatusOr<std::vector<float>> LastTokenLogits(const ModelConfig& config, const float* x,
                                                   uint32_t n, const float* final_norm,
                                                   const float* lm_head, float* normed,
                                                   float* logits_device, cudaStream_t stream) {
  const float* last = x + size_t{n - 1} * config.hidden_size;
  // Only the last token's logits are needed.
  RETURN_IF_ERROR(kernels::RmsNormCuda(last, final_norm, config.rms_norm_eps, 1, config.hidden_size,
                                       normed, stream));
  RETURN_IF_ERROR(kernels::LinearCuda(normed, lm_head, 1, config.hidden_size, config.vocab_size,
                                      false, logits_device, stream));
  std::vector<float> logits(config.vocab_size);
  KVCACHE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(logits.data(), logits_device, logits.size() * sizeof(float),
                      cudaMemcpyDeviceToHost, stream),
      "cudaMemcpyAsync (logits)");
  // Also surfaces any asynchronous kernel fault of this call.
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream), "cudaStreamSynchronize (forward)");
  return logits;
}

}  // namespace kvcache::worker
