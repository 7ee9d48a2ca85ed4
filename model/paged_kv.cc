#include "model/paged_kv.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/float_convert.h"
#include "common/status_macros.h"

namespace kvcache::worker {

void EncodeKv(DType dtype, const float* values, uint32_t count, uint8_t* dst) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(dst, values, size_t{count} * sizeof(float));
      return;
    case DType::kBFloat16:
      for (uint32_t i = 0; i < count; ++i) {
        const uint16_t bits = FloatToBFloat16(values[i]);
        std::memcpy(dst + 2 * i, &bits, 2);
      }
      return;
    case DType::kFloat16:
      for (uint32_t i = 0; i < count; ++i) {
        const uint16_t bits = FloatToFloat16(values[i]);
        std::memcpy(dst + 2 * i, &bits, 2);
      }
      return;
    case DType::kFp8E4M3:
      for (uint32_t i = 0; i < count; ++i) dst[i] = FloatToFp8E4M3(values[i]);
      return;
  }
}

void DecodeKv(DType dtype, const uint8_t* src, uint32_t count, float* out) {
  switch (dtype) {
    case DType::kFloat32:
      std::memcpy(out, src, size_t{count} * sizeof(float));
      return;
    case DType::kBFloat16:
      for (uint32_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        out[i] = BFloat16ToFloat(bits);
      }
      return;
    case DType::kFloat16:
      for (uint32_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, src + 2 * i, 2);
        out[i] = Float16ToFloat(bits);
      }
      return;
    case DType::kFp8E4M3:
      for (uint32_t i = 0; i < count; ++i) out[i] = Fp8E4M3ToFloat(src[i]);
      return;
  }
}

PagedKv::PagedKv(uint8_t* pool_base, PoolLayout layout, absl::Span<const uint32_t> block_table,
                 uint64_t num_pool_blocks, uint64_t page_stride_bytes)
    : pool_base_(pool_base),
      layout_(layout),
      block_table_(block_table),
      num_pool_blocks_(num_pool_blocks),
      page_stride_(page_stride_bytes == 0 ? layout.BlockBytes() : page_stride_bytes),
      token_bytes_(layout.TokenBytes()) {}

absl::Status PagedKv::Validate() const {
  RETURN_IF_ERROR(layout_.Validate());
  if (pool_base_ == nullptr) return absl::InvalidArgumentError("KV pool base is null");
  if (page_stride_ < layout_.BlockBytes()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "page stride ", page_stride_, " is below the KV block's ", layout_.BlockBytes(), " bytes"));
  }
  if (num_pool_blocks_ == kUnknownPoolBlocks) return absl::OkStatus();
  for (size_t i = 0; i < block_table_.size(); ++i) {
    if (block_table_[i] >= num_pool_blocks_) {
      return absl::OutOfRangeError(absl::StrCat("block table entry ", i, " is block ",
                                                block_table_[i], " but the pool has ",
                                                num_pool_blocks_, " blocks"));
    }
  }
  return absl::OkStatus();
}

absl::Status PagedKv::CheckModelShape(uint32_t num_layers, uint32_t num_kv_heads,
                                      uint32_t head_dim) const {
  if (layout_.num_layers != num_layers || layout_.num_kv_heads != num_kv_heads ||
      layout_.head_dim != head_dim) {
    return absl::FailedPreconditionError(absl::StrCat(
        "KV pool layout (", layout_.DebugString(), ") does not match the model (layers=",
        num_layers, " kv_heads=", num_kv_heads, " head_dim=", head_dim, ")"));
  }
  return absl::OkStatus();
}

absl::Status PagedKv::CheckAccess(uint32_t layer, uint32_t kv, uint64_t position) const {
  if (layer >= layout_.num_layers || kv > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("layer ", layer, " out of range: the pool has ", layout_.num_layers));
  }
  if (position >= capacity_tokens()) {
    return absl::OutOfRangeError(absl::StrCat("position ", position, " is past the ",
                                              block_table_.size(), "-block table (",
                                              capacity_tokens(), " tokens)"));
  }
  return absl::OkStatus();
}

uint8_t* PagedKv::Slot(uint32_t layer, uint32_t kv, uint64_t position) const {
  const uint64_t block = block_table_[position / layout_.block_size];
  const uint64_t slot = position % layout_.block_size;
  return pool_base_ + block * page_stride_ + layout_.KvOffset(layer, kv) + slot * token_bytes_;
}

absl::Status PagedKv::Write(uint32_t layer, uint32_t kv, uint64_t position, const float* values) {
  RETURN_IF_ERROR(CheckAccess(layer, kv, position));
  EncodeKv(layout_.dtype, values, token_elements(), Slot(layer, kv, position));
  return absl::OkStatus();
}

absl::Status PagedKv::Read(uint32_t layer, uint32_t kv, uint64_t position, float* out) const {
  RETURN_IF_ERROR(CheckAccess(layer, kv, position));
  DecodeKv(layout_.dtype, Slot(layer, kv, position), token_elements(), out);
  return absl::OkStatus();
}

absl::Status PagedKv::ReadRange(uint32_t layer, uint32_t kv, uint64_t begin, uint64_t end,
                                float* out) const {
  if (begin >= end) return absl::OkStatus();
  RETURN_IF_ERROR(CheckAccess(layer, kv, end - 1));
  const uint32_t elements = token_elements();
  uint64_t position = begin;
  while (position < end) {
    // Tokens of one block are contiguous for a given (layer, kv): decode a whole run at once.
    const uint64_t block_end = (position / layout_.block_size + 1) * layout_.block_size;
    const uint64_t run = std::min(end, block_end) - position;
    DecodeKv(layout_.dtype, Slot(layer, kv, position), static_cast<uint32_t>(run * elements),
             out + (position - begin) * elements);
    position += run;
  }
  return absl::OkStatus();
}

}  // namespace kvcache::worker
