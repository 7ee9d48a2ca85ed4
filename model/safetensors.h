// SafetensorsFile: a read-only, memory-mapped safetensors checkpoint. The format is an 8-byte
// little-endian header length N, N bytes of JSON mapping tensor names to {dtype, shape,
// data_offsets: [begin, end)} (offsets relative to the byte after the header), then the data.
// Open() validates the whole header up front: every tensor's byte range lies inside the file, no
// two ranges overlap, and each size equals product(shape) * element size. A "__metadata__" entry
// (string → string) is allowed and ignored.
//
// Get() converts BF16 / F16 / F32 tensors to float32 exactly; other safetensors dtypes are accepted
// by Open() (so a checkpoint carrying, say, an I64 buffer still opens) but Get() refuses them.
//
// Thread-safety: immutable after Open(); concurrent const calls are safe. Move-only.
#ifndef KVCACHE_MODEL_SAFETENSORS_H_
#define KVCACHE_MODEL_SAFETENSORS_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace kvcache::worker {

// A float32 copy of one tensor, row-major.
struct Tensor {
  std::vector<int64_t> shape;
  std::vector<float> data;
};

enum class SafetensorsDType {
  kBF16,
  kF16,
  kF32,
  kF64,
  kI8,
  kU8,
  kI16,
  kU16,
  kI32,
  kU32,
  kI64,
  kU64,
  kBool,
  kF8E4M3,
  kF8E5M2
};

// Where a tensor lives in the file.
struct TensorInfo {
  SafetensorsDType dtype;
  std::string dtype_name;  // as spelled in the header, e.g. "BF16"
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // absolute byte offset in the file
  uint64_t size = 0;   // bytes
};

std::string ShapeToString(absl::Span<const int64_t> shape);

class SafetensorsFile {
 public:
  // NOT_FOUND if `path` does not exist; INVALID_ARGUMENT (naming the file and the problem) for a
  // malformed file; other codes for I/O failures.
  static absl::StatusOr<SafetensorsFile> Open(const std::string& path);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  // NOT_FOUND for an unknown name; INVALID_ARGUMENT (naming the tensor, the expected and the actual
  // shape) when the shape differs from `expected_shape`, or when the dtype is not BF16/F16/F32.
  absl::StatusOr<Tensor> Get(const std::string& name,
                             absl::Span<const int64_t> expected_shape) const;

  // nullptr for an unknown name.
  const TensorInfo* Info(const std::string& name) const;
  // Sorted tensor names.
  std::vector<std::string> Names() const;
  const std::string& path() const { return path_; }

 private:
  SafetensorsFile() = default;
  void Unmap();

  std::string path_;
  const uint8_t* data_ = nullptr;  // the whole mapped file
  size_t size_ = 0;
  absl::flat_hash_map<std::string, TensorInfo> tensors_;
};

// The float32 data of tensor `name`, checked against `shape`, as SafetensorsFile::Get answers.
absl::StatusOr<std::vector<float>> LoadFloats(const SafetensorsFile& file, const std::string& name,
                                              std::vector<int64_t> shape);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_SAFETENSORS_H_
