// DeviceLinearAttentionState: one sequence's LinearAttentionState (model/linear_attention_state.h)
// in device memory, for the CUDA kernels of kernels/linear_attention_kernels.h. The device bytes
// have exactly the host state's byte layout (per linear layer: recurrent state, then conv state,
// float32), so SaveTo / RestoreFrom move the same StateBytes(config) bytes a host state saves,
// and a state can cross between the CPU and the GPU (or a pool page) unchanged.
//
// Built without CUDA, Create answers FAILED_PRECONDITION ("built without CUDA").
// Thread-safety: thread-compatible; the device bytes are the caller's to synchronize (SaveTo and
// RestoreFrom order themselves after the work already enqueued on `stream`).
#ifndef KVCACHE_MODEL_CUDA_DEVICE_LINEAR_STATE_H_
#define KVCACHE_MODEL_CUDA_DEVICE_LINEAR_STATE_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "model/qwen3_next_config.h"

namespace kvcache::worker {

class DeviceLinearAttentionState {
 public:
  // A zero state (position 0) on CUDA device `device`, the fill complete when Create returns.
  // Errors as DeviceKvPool::Create: INVALID_ARGUMENT for an invalid config or a negative device;
  // FAILED_PRECONDITION without CUDA or without that device; RESOURCE_EXHAUSTED out of memory.
  static absl::StatusOr<DeviceLinearAttentionState> Create(int device,
                                                           const Qwen3NextConfig& config);

  // cudaFree. REQUIRES: no device work still uses the state.
  ~DeviceLinearAttentionState();
  DeviceLinearAttentionState(DeviceLinearAttentionState&& other) noexcept;
  DeviceLinearAttentionState& operator=(DeviceLinearAttentionState&& other) noexcept;
  DeviceLinearAttentionState(const DeviceLinearAttentionState&) = delete;
  DeviceLinearAttentionState& operator=(const DeviceLinearAttentionState&) = delete;

  // Device addresses of linear layer `linear_index`'s [value_heads, key_head_dim, value_head_dim]
  // recurrent state and [conv_dim, conv_kernel - 1] conv state.
  float* recurrent(uint32_t linear_index) const { return base_ + recurrent_offsets_[linear_index]; }
  float* conv(uint32_t linear_index) const { return base_ + conv_offsets_[linear_index]; }
  uint64_t StateBytes() const { return bytes_; }
  int device() const { return device_; }
  uint64_t position() const { return position_; }
  void set_position(uint64_t position) { position_ = position; }

  // Copies the state into `out` once the work enqueued on `stream` (a cudaStream_t; nullptr =
  // the legacy default stream) is done; returns when the copy is complete. INVALID_ARGUMENT
  // unless out.size() == StateBytes(); a CUDA error as common/cuda/cuda_status.h maps it.
  absl::Status SaveTo(absl::Span<uint8_t> out, void* stream) const;
  // Replaces the state with `bytes` saved after `position` tokens, in order on `stream`; returns
  // when the copy is complete (so `bytes` may be freed). Errors as SaveTo; the position is
  // unchanged on error.
  absl::Status RestoreFrom(absl::Span<const uint8_t> bytes, uint64_t position, void* stream);

  // The same StateBytes() bytes to and from device memory of this state's device — a pool page's
  // state part (worker/hybrid_pages.h) — with a device-to-device copy: no host round trip, and
  // the bytes a host SaveTo would give. Ordered and waited for as SaveTo / RestoreFrom.
  // `device_bytes` must hold StateBytes() bytes (unchecked: device memory); INVALID_ARGUMENT for a
  // null pointer; a CUDA error as common/cuda/cuda_status.h maps it.
  absl::Status SaveToDevice(uint8_t* device_bytes, void* stream) const;
  absl::Status RestoreFromDevice(const uint8_t* device_bytes, uint64_t position, void* stream);
  // The zero state at position 0, as Create leaves it; ordered and waited for as RestoreFrom.
  absl::Status Reset(void* stream);

 private:
  DeviceLinearAttentionState(float* base, int device, const Qwen3NextConfig& config);
  void Free();
  // The copies, in device_linear_state_cuda.cc (a stub without CUDA).
  static absl::Status CopyToHost(const float* device_src, uint8_t* dst, uint64_t bytes,
                                 void* stream);
  static absl::Status CopyToDevice(const uint8_t* src, float* device_dst, uint64_t bytes,
                                   void* stream);
  // On `device` (made current for the call: the copy and the fill are that device's work).
  static absl::Status CopyOnDevice(int device, const void* device_src, void* device_dst,
                                   uint64_t bytes, void* stream);
  static absl::Status ZeroOnDevice(int device, float* device_dst, uint64_t bytes, void* stream);

  float* base_ = nullptr;  // owned; nullptr when moved from
  int device_ = -1;
  uint64_t bytes_ = 0;
  std::vector<uint64_t> recurrent_offsets_;  // in floats
  std::vector<uint64_t> conv_offsets_;
  uint64_t position_ = 0;
};

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_CUDA_DEVICE_LINEAR_STATE_H_
