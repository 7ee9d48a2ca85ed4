// DeviceLinearAttentionState's build-independent half: the checks, the layout and ownership. The
// CUDA copies are in device_linear_state_cuda.cc (device_linear_state_stub.cc without CUDA); the
// allocation is DeviceKvPool's (device_bytes.h).
#include "model/cuda/device_linear_state.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/cuda/cuda_device.h"
#include "common/status_macros.h"
#include "model/cuda/device_bytes.h"
#include "model/linear_attention_state.h"

namespace kvcache::worker {

absl::StatusOr<DeviceLinearAttentionState> DeviceLinearAttentionState::Create(
    int device, const Qwen3NextConfig& config) {
  RETURN_IF_ERROR(config.Validate());
  RETURN_IF_ERROR(CheckCudaDevice(device));
  ASSIGN_OR_RETURN(uint8_t* const base,
                   AllocateZeroedDeviceBytes(device, LinearAttentionState::StateBytes(config),
                                             "linear-attention state"));
  return DeviceLinearAttentionState(reinterpret_cast<float*>(base), device, config);
}

DeviceLinearAttentionState::DeviceLinearAttentionState(float* base, int device,
                                                       const Qwen3NextConfig& config)
    : base_(base), device_(device), bytes_(LinearAttentionState::StateBytes(config)) {
  for (uint32_t i = 0; i < config.num_linear_attention_layers(); ++i) {
    recurrent_offsets_.push_back(LinearAttentionState::RecurrentOffset(config, i));
    conv_offsets_.push_back(LinearAttentionState::ConvOffset(config, i));
  }
}

DeviceLinearAttentionState::~DeviceLinearAttentionState() { Free(); }

DeviceLinearAttentionState::DeviceLinearAttentionState(DeviceLinearAttentionState&& other) noexcept
    : base_(std::exchange(other.base_, nullptr)),
      device_(other.device_),
      bytes_(other.bytes_),
      recurrent_offsets_(std::move(other.recurrent_offsets_)),
      conv_offsets_(std::move(other.conv_offsets_)),
      position_(other.position_) {}

DeviceLinearAttentionState& DeviceLinearAttentionState::operator=(
    DeviceLinearAttentionState&& other) noexcept {
  if (this != &other) {
    Free();
    base_ = std::exchange(other.base_, nullptr);
    device_ = other.device_;
    bytes_ = other.bytes_;
    recurrent_offsets_ = std::move(other.recurrent_offsets_);
    conv_offsets_ = std::move(other.conv_offsets_);
    position_ = other.position_;
  }
  return *this;
}

void DeviceLinearAttentionState::Free() {
  if (base_ == nullptr) return;
  ReleaseDeviceBytes(reinterpret_cast<uint8_t*>(base_), device_);
  base_ = nullptr;
}

absl::Status DeviceLinearAttentionState::SaveTo(absl::Span<uint8_t> out, void* stream) const {
  if (out.size() != bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear-attention state is ", bytes_, " bytes; the buffer has ", out.size()));
  }
  return CopyToHost(base_, out.data(), bytes_, stream);
}

absl::Status DeviceLinearAttentionState::RestoreFrom(absl::Span<const uint8_t> bytes,
                                                     uint64_t position, void* stream) {
  if (bytes.size() != bytes_) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear-attention state is ", bytes_, " bytes; got ", bytes.size()));
  }
  RETURN_IF_ERROR(CopyToDevice(bytes.data(), base_, bytes_, stream));
  position_ = position;
  return absl::OkStatus();
}

absl::Status DeviceLinearAttentionState::SaveToDevice(uint8_t* device_bytes, void* stream) const {
  if (device_bytes == nullptr) {
    return absl::InvalidArgumentError("saving a linear-attention state into a null device address");
  }
  return CopyOnDevice(device_, base_, device_bytes, bytes_, stream);
}

absl::Status DeviceLinearAttentionState::RestoreFromDevice(const uint8_t* device_bytes,
                                                           uint64_t position, void* stream) {
  if (device_bytes == nullptr) {
    return absl::InvalidArgumentError(
        "restoring a linear-attention state from a null device address");
  }
  RETURN_IF_ERROR(CopyOnDevice(device_, device_bytes, base_, bytes_, stream));
  position_ = position;
  return absl::OkStatus();
}

absl::Status DeviceLinearAttentionState::Reset(void* stream) {
  RETURN_IF_ERROR(ZeroOnDevice(device_, base_, bytes_, stream));
  position_ = 0;
  return absl::OkStatus();
}

}  // namespace kvcache::worker
