#include "common/pool_layout.h"

#include <xxhash.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/byte_writer.h"

namespace kvcache {

absl::string_view DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
    case DType::kFloat32:
      return "fp32";
    case DType::kFp8E4M3:
      return "fp8_e4m3";
  }
  return "unknown";
}

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "fp16" || lower == "float16") return DType::kFloat16;
  if (lower == "bf16" || lower == "bfloat16") return DType::kBFloat16;
  if (lower == "fp32" || lower == "float32") return DType::kFloat32;
  if (lower == "fp8" || lower == "fp8_e4m3") return DType::kFp8E4M3;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype '", name, "' (want fp16, bf16, fp32 or fp8_e4m3)"));
}

uint64_t PoolLayout::TokenBytes() const {
  return uint64_t{num_kv_heads} * head_dim * DTypeBytes(dtype);
}

uint64_t PoolLayout::BlockBytes() const {
  return uint64_t{num_layers} * 2 * block_size * TokenBytes();
}

uint64_t PoolLayout::KvOffset(uint32_t layer, uint32_t kv) const {
  return (uint64_t{layer} * 2 + kv) * block_size * TokenBytes();
}

uint64_t PoolLayout::Fingerprint() const {
  ByteWriter writer;
  writer.Raw("kvcache.layout.v1");
  writer.U32(num_layers);
  writer.U32(num_kv_heads);
  writer.U32(head_dim);
  writer.U32(block_size);
  writer.U32(static_cast<uint32_t>(dtype));
  return XXH3_64bits_withSeed(writer.data(), writer.size(), 0);
}

absl::Status PoolLayout::Validate() const {
  constexpr uint32_t kMaxDim = 1 << 16;
  if (num_layers == 0 || num_layers > kMaxDim || num_kv_heads == 0 || num_kv_heads > kMaxDim ||
      head_dim == 0 || head_dim > kMaxDim || block_size == 0 || block_size > kMaxDim) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout fields must be in [1, 65536]: ", DebugString()));
  }
  if (DTypeBytes(dtype) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("layout has an unknown dtype ", static_cast<uint32_t>(dtype)));
  }
  if (BlockBytes() > (uint64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("block of ", BlockBytes(), " bytes exceeds 1 GiB: ", DebugString()));
  }
  return absl::OkStatus();
}

std::string PoolLayout::DebugString() const {
  return absl::StrCat("layers=", num_layers, " kv_heads=", num_kv_heads, " head_dim=", head_dim,
                      " block_size=", block_size, " dtype=", DTypeName(dtype));
}

}  // namespace kvcache
