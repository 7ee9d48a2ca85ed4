// ByteWriter: builds the canonical byte encodings that hashes run over (docs/hash_spec.md).
// Integers are little-endian; strings are length-prefixed with a u32. Not thread-safe.
#ifndef KVCACHE_COMMON_BYTE_WRITER_H_
#define KVCACHE_COMMON_BYTE_WRITER_H_

#include <bit>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvcache {

class ByteWriter {
 public:
  void Clear() { bytes_.clear(); }
  void Raw(absl::string_view bytes) { bytes_.append(bytes.data(), bytes.size()); }
  void U32(uint32_t value) {
    unsigned char le[4];
    for (int i = 0; i < 4; ++i) le[i] = static_cast<unsigned char>(value >> (8 * i));
    bytes_.append(reinterpret_cast<const char*>(le), 4);
  }
  void U64(uint64_t value) {
    unsigned char le[8];
    for (int i = 0; i < 8; ++i) le[i] = static_cast<unsigned char>(value >> (8 * i));
    bytes_.append(reinterpret_cast<const char*>(le), 8);
  }
  // Each value as U32 would write it, in one append (hashing encodes every prompt token).
  void U32s(absl::Span<const uint32_t> values) {
    if constexpr (std::endian::native == std::endian::little) {
      bytes_.append(reinterpret_cast<const char*>(values.data()), 4 * values.size());
    } else {
      for (uint32_t value : values) U32(value);
    }
  }
  // Overwrites the 8 bytes at `offset` with `value` as U64 writes it. REQUIRES: offset + 8 <=
  // size().
  void U64At(size_t offset, uint64_t value) {
    for (int i = 0; i < 8; ++i) bytes_[offset + i] = static_cast<char>(value >> (8 * i));
  }
  // u32 length, then the bytes.
  void String(absl::string_view bytes) {
    U32(static_cast<uint32_t>(bytes.size()));
    Raw(bytes);
  }
  const char* data() const { return bytes_.data(); }
  size_t size() const { return bytes_.size(); }

 private:
  std::string bytes_;
};

}  // namespace kvcache

#endif  // KVCACHE_COMMON_BYTE_WRITER_H_
