// ByteWriter: builds the canonical byte encodings that hashes run over (docs/hash_spec.md).
// Integers are little-endian; strings are length-prefixed with a u32. Not thread-safe.
#ifndef KVCACHE_COMMON_BYTE_WRITER_H_
#define KVCACHE_COMMON_BYTE_WRITER_H_

#include <cstdint>
#include <cstring>
#include <string>

#include "absl/strings/string_view.h"

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
