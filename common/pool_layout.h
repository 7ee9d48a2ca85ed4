// PoolLayout: the shape of one KV block and its byte size. A block is block-major:
// [layer][K,V][token][kv_head][head_dim] elements in one contiguous byte range, so a block moves as
// one span. Value type; thread-compatible.
#ifndef KVCACHE_COMMON_POOL_LAYOUT_H_
#define KVCACHE_COMMON_POOL_LAYOUT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvcache {

// Values match kvcache.v1.DType.
enum class DType : uint32_t { kFloat16 = 1, kBFloat16 = 2, kFloat32 = 3, kFp8E4M3 = 4 };

inline constexpr uint32_t DTypeBytes(DType dtype) {
  switch (dtype) {
    case DType::kFloat16:
    case DType::kBFloat16:
      return 2;
    case DType::kFloat32:
      return 4;
    case DType::kFp8E4M3:
      return 1;
  }
  return 0;
}
absl::string_view DTypeName(DType dtype);
// Accepts "fp16"/"float16", "bf16"/"bfloat16", "fp32"/"float32", "fp8"/"fp8_e4m3".
absl::StatusOr<DType> ParseDType(absl::string_view name);

struct PoolLayout {
  uint32_t num_layers = 0;
  uint32_t num_kv_heads = 0;
  uint32_t head_dim = 0;
  uint32_t block_size = 16;  // tokens per block
  DType dtype = DType::kFloat16;

  // block_bytes = num_layers * 2 * block_size * num_kv_heads * head_dim * DTypeBytes(dtype)
  uint64_t BlockBytes() const;
  // Bytes of one token's K (or V) for one layer: num_kv_heads * head_dim * elem.
  uint64_t TokenBytes() const;
  // Byte offset inside a block of K (kv = 0) or V (kv = 1) for `layer`, token 0.
  uint64_t KvOffset(uint32_t layer, uint32_t kv) const;
  // XXH3-64 (seed 0) over "kvcache.layout.v1" and the five fields as u32 little-endian, in order.
  uint64_t Fingerprint() const;
  // INVALID_ARGUMENT unless every field is in range and a block is at most 1 GiB.
  absl::Status Validate() const;
  std::string DebugString() const;
};

}  // namespace kvcache

#endif  // KVCACHE_COMMON_POOL_LAYOUT_H_
