#include "model/linear_attention_state.h"

#include <algorithm>
#include <bit>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace kvcache::worker {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the state's byte layout is little-endian float32, copied as is");

uint64_t FloatsPerLayer(const Qwen3NextConfig& config) {
  return config.linear.recurrent_floats() + config.linear.conv_floats();
}

}  // namespace

uint64_t LinearAttentionState::StateBytes(const Qwen3NextConfig& config) {
  return uint64_t{config.num_linear_attention_layers()} * FloatsPerLayer(config) * sizeof(float);
}

uint64_t LinearAttentionState::RecurrentOffset(const Qwen3NextConfig& config,
                                               uint32_t linear_index) {
  return uint64_t{linear_index} * FloatsPerLayer(config);
}

uint64_t LinearAttentionState::ConvOffset(const Qwen3NextConfig& config, uint32_t linear_index) {
  return RecurrentOffset(config, linear_index) + config.linear.recurrent_floats();
}

LinearAttentionState::LinearAttentionState(const Qwen3NextConfig& config)
    : values_(StateBytes(config) / sizeof(float), 0.0f) {
  for (uint32_t i = 0; i < config.num_linear_attention_layers(); ++i) {
    recurrent_offsets_.push_back(RecurrentOffset(config, i));
    conv_offsets_.push_back(ConvOffset(config, i));
  }
}

absl::Status LinearAttentionState::SaveTo(absl::Span<uint8_t> out) const {
  if (out.size() != StateBytes()) {
    return absl::InvalidArgumentError(absl::StrCat("linear-attention state is ", StateBytes(),
                                                   " bytes; the buffer has ", out.size()));
  }
  std::memcpy(out.data(), values_.data(), out.size());
  return absl::OkStatus();
}

absl::Status LinearAttentionState::RestoreFrom(absl::Span<const uint8_t> bytes, uint64_t position) {
  if (bytes.size() != StateBytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("linear-attention state is ", StateBytes(), " bytes; got ", bytes.size()));
  }
  std::memcpy(values_.data(), bytes.data(), bytes.size());
  position_ = position;
  return absl::OkStatus();
}

void LinearAttentionState::Reset() {
  std::fill(values_.begin(), values_.end(), 0.0f);
  position_ = 0;
}

bool LinearAttentionState::operator==(const LinearAttentionState& other) const {
  // Bitwise, so that -0 and NaN payloads count as differences.
  return position_ == other.position_ && values_.size() == other.values_.size() &&
         std::memcmp(values_.data(), other.values_.data(), values_.size() * sizeof(float)) == 0;
}

PoolLayout HybridKvLayout(const Qwen3NextConfig& config, uint32_t block_size, DType kv_dtype) {
  return PoolLayout{.num_layers = config.num_full_attention_layers(),
                    .num_kv_heads = config.base.num_key_value_heads,
                    .head_dim = config.base.head_dim,
                    .block_size = block_size,
                    .dtype = kv_dtype};
}

uint64_t HybridKvBytesPerPage(const Qwen3NextConfig& config, uint32_t block_size, DType kv_dtype) {
  return HybridKvLayout(config, block_size, kv_dtype).BlockBytes();
}

std::string HybridPagePartsSpec(const Qwen3NextConfig& config, uint32_t block_size,
                                DType kv_dtype) {
  return absl::StrCat("kv/", HybridKvBytesPerPage(config, block_size, kv_dtype), "+state/",
                      LinearAttentionState::StateBytes(config), "/trailing1");
}

}  // namespace kvcache::worker
