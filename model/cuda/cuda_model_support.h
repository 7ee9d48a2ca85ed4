// Host-side pieces shared by the CUDA models (qwen3_moe_cuda.cc, qwen3_next_cuda.cc): a growing
// device buffer, the one-allocation weight upload, and the device pool's request checks. Built
// only with CUDA; not part of the public API.
// Thread-safety: thread-compatible.
#ifndef KVCACHE_MODEL_CUDA_CUDA_MODEL_SUPPORT_H_
#define KVCACHE_MODEL_CUDA_CUDA_MODEL_SUPPORT_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/scoped_cuda_device.h"
#include "common/status_macros.h"
#include "model/cuda/moe_dispatch.h"
#include "model/cuda/qwen3_moe_cuda.h"
#include "model/model_config.h"

namespace kvcache::worker {

// An owned device allocation that grows on demand; growing does not keep the contents.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // REQUIRES: no enqueued work uses the buffer (cudaFree of memory in use is undefined).
  absl::Status Reserve(size_t bytes, const char* what) {
    if (bytes <= capacity_ && ptr_ != nullptr) return absl::OkStatus();
    Release();
    void* ptr = nullptr;
    KVCACHE_CUDA_RETURN_IF_ERROR(cudaMalloc(&ptr, std::max<size_t>(bytes, 1)),
                                 absl::StrCat("cudaMalloc of ", bytes, " bytes for ", what));
    ptr_ = ptr;
    capacity_ = bytes;
    return absl::OkStatus();
  }
  void Release() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
    capacity_ = 0;
  }
  template <typename T>
  T* get() const {
    return static_cast<T*>(ptr_);
  }

 private:
  void* ptr_ = nullptr;
  size_t capacity_ = 0;
};

// Lays tensors out in one allocation, each 256-byte aligned, and copies them in.
class WeightUploader {
 public:
  // `*slot` receives the tensor's device address in Finish; it must stay valid until then.
  void Add(const std::vector<float>& tensor, const float** slot) {
    entries_.push_back(Entry{&tensor, slot, bytes_});
    bytes_ += (tensor.size() * sizeof(float) + kAlign - 1) / kAlign * kAlign;
  }
  absl::Status Finish(DeviceBuffer& storage, cudaStream_t stream) {
    RETURN_IF_ERROR(storage.Reserve(bytes_, "weights"));
    for (const Entry& entry : entries_) {
      uint8_t* dst = storage.get<uint8_t>() + entry.offset;
      KVCACHE_CUDA_RETURN_IF_ERROR(
          cudaMemcpyAsync(dst, entry.tensor->data(), entry.tensor->size() * sizeof(float),
                          cudaMemcpyHostToDevice, stream),
          "cudaMemcpyAsync (weights)");
      *entry.slot = reinterpret_cast<const float*>(dst);
    }
    return CudaStatus(cudaStreamSynchronize(stream), "cudaStreamSynchronize (weights)");
  }

 private:
  static constexpr size_t kAlign = 256;
  struct Entry {
    const std::vector<float>* tensor;
    const float** slot;
    size_t offset;
  };
  std::vector<Entry> entries_;
  size_t bytes_ = 0;
};

// The device-only checks of a request over `kv`: a known pool size, a base in device memory of
// `device`, and distinct slots for the n positions being written, which it leaves in host_slots
// (block_table[p / block_size] * block_size + p % block_size). INVALID_ARGUMENT naming the
// problem. REQUIRES: CheckForwardRequest passed.
absl::Status CheckDevicePoolAndSlots(const DevicePagedKv& kv, int device, uint32_t start_position,
                                     size_t n, std::vector<int64_t>& host_slots);

// Device addresses of one SwiGLU MLP's weights.
struct DeviceMlp {
  const float* gate_proj = nullptr;  // [intermediate, hidden]
  const float* up_proj = nullptr;    // [intermediate, hidden]
  const float* down_proj = nullptr;  // [hidden, intermediate]
};

// The kernels' limits that a valid ModelConfig does not already imply (head_dim, experts).
absl::Status CheckKernelLimits(const ModelConfig& config);

// Sets `device` current (for the caller's scope: `scoped`) and creates a non-blocking stream.
absl::Status StartModelStream(int device, ScopedCudaDevice& scoped, cudaStream_t& stream);
// On `device`: synchronizes `stream`, calls `release` (which frees the model's buffers: nothing
// uses them any more), then destroys the stream; best effort.
void StopModelStream(int device, cudaStream_t stream, absl::FunctionRef<void()> release);

// Stages tokens, positions start.., and the first `blocks` block-table entries into
// host_indices (that order) and uploads them into `indices`, and host_slots into `slots`.
absl::Status UploadRequest(absl::Span<const uint32_t> tokens, uint32_t start_position,
                           absl::Span<const uint32_t> block_table, uint32_t blocks,
                           const std::vector<int64_t>& host_slots,
                           std::vector<uint32_t>& host_indices, DeviceBuffer& indices,
                           DeviceBuffer& slots, cudaStream_t stream);

// The attention core of n tokens after the projections: per-head q_norm / k_norm of q and k in
// place, RoPE on each head's first rotary_dim dims, K and V written to `pool_layer` of the pool
// (slots), then causal GQA attention over the pool into attn ([n, heads * head_dim]).
absl::Status NormRopeWriteAttend(const ModelConfig& config, uint32_t rotary_dim,
                                 uint32_t pool_layer, uint32_t n, uint32_t blocks,
                                 const float* q_norm, const float* k_norm, float* q, float* k,
                                 const float* v, const uint32_t* positions,
                                 const uint32_t* block_table, const int64_t* slots,
                                 const DevicePagedKv& kv, float* attn, cudaStream_t stream);

// The MoE's routing of n tokens: x's post-attention RMSNorm into `normed`, the router logits,
// and MoeRouteCuda's top-k ids and weights.
absl::Status NormAndRoute(const ModelConfig& config, const float* x, const float* post_norm,
                          const float* router, uint32_t n, float* normed, float* router_logits,
                          uint32_t* topk_ids, float* topk_weights, cudaStream_t stream);

// Brings MoeRouteCuda's ids and weights of n tokens (and `extra_count` floats of
// `device_extra` into `host_extra`, when given) to the host, synchronizes the stream and plans
// the expert grouping. INTERNAL when the routing is malformed.
absl::Status RouteOnHost(const DeviceBuffer& topk_ids, const DeviceBuffer& topk_weights, uint32_t n,
                         uint32_t top_k, uint32_t num_experts, std::vector<uint32_t>& host_ids,
                         std::vector<float>& host_weights, MoeDispatchPlan& plan,
                         cudaStream_t stream, const float* device_extra = nullptr,
                         std::vector<float>* host_extra = nullptr, size_t extra_count = 0);

// Each selected expert once over its contiguous block of plan's rows of moe_in into moe_out
// (serialized on the stream, so they share one workspace of n * intermediate floats).
absl::Status RunRoutedExperts(const MoeDispatchPlan& plan, const std::vector<DeviceMlp>& experts,
                              const float* moe_in, uint32_t hidden, uint32_t intermediate,
                              float* workspace, float* moe_out, cudaStream_t stream);

// The device half of a CUDA model's Forward, after the CPU model's checks: on `device`, the pool
// checks (CheckDevicePoolAndSlots, filling host_slots), then `run` with no stale CUDA error
// pending; on failure the stream is synchronized so that no work of the call is left running.
absl::StatusOr<std::vector<float>> RunForwardOnDevice(
    int device, cudaStream_t stream, const DevicePagedKv& kv, uint32_t start_position, size_t n,
    std::vector<int64_t>& host_slots, absl::FunctionRef<absl::StatusOr<std::vector<float>>()> run);

// The final RMSNorm and lm_head of the last of n rows of x, copied to the host after a sync of
// the stream (which also surfaces any asynchronous fault of the call).
absl::StatusOr<std::vector<float>> LastTokenLogits(const ModelConfig& config, const float* x,
                                                   uint32_t n, const float* final_norm,
                                                   const float* lm_head, float* normed,
                                                   float* logits_device, cudaStream_t stream);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_CUDA_CUDA_MODEL_SUPPORT_H_
