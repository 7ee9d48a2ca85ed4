#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/float_convert.h"
#include "common/status_macros.h"

namespace kvcache::worker {
namespace {

// The reference implementation refuses headers above 100 MB; so do we.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

struct DTypeEntry {
  const char* name;
  SafetensorsDType dtype;
  uint64_t bytes;
};

constexpr DTypeEntry kDTypes[] = {
    {"BF16", SafetensorsDType::kBF16, 2},      {"F16", SafetensorsDType::kF16, 2},
    {"F32", SafetensorsDType::kF32, 4},        {"F64", SafetensorsDType::kF64, 8},
    {"I8", SafetensorsDType::kI8, 1},          {"U8", SafetensorsDType::kU8, 1},
    {"I16", SafetensorsDType::kI16, 2},        {"U16", SafetensorsDType::kU16, 2},
    {"I32", SafetensorsDType::kI32, 4},        {"U32", SafetensorsDType::kU32, 4},
    {"I64", SafetensorsDType::kI64, 8},        {"U64", SafetensorsDType::kU64, 8},
    {"BOOL", SafetensorsDType::kBool, 1},      {"F8_E4M3", SafetensorsDType::kF8E4M3, 1},
    {"F8_E5M2", SafetensorsDType::kF8E5M2, 1},
};

const DTypeEntry* FindDType(const std::string& name) {
  for (const DTypeEntry& entry : kDTypes) {
    if (name == entry.name) return &entry;
  }
  return nullptr;
}

// Parses one header entry into `info` (offsets still relative to the data section).
absl::Status ParseEntry(const std::string& name, const nlohmann::json& entry, TensorInfo& info,
                        uint64_t& elem_bytes) {
  if (!entry.is_object()) return absl::InvalidArgumentError("entry is not a JSON object");
  const auto dtype = entry.find("dtype");
  const auto shape = entry.find("shape");
  const auto offsets = entry.find("data_offsets");
  if (dtype == entry.end() || !dtype->is_string()) {
    return absl::InvalidArgumentError("missing or non-string \"dtype\"");
  }
  info.dtype_name = dtype->get<std::string>();
  const DTypeEntry* dtype_entry = FindDType(info.dtype_name);
  if (dtype_entry == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("unknown dtype \"", info.dtype_name, "\""));
  }
  info.dtype = dtype_entry->dtype;
  elem_bytes = dtype_entry->bytes;
  if (shape == entry.end() || !shape->is_array()) {
    return absl::InvalidArgumentError("missing or non-array \"shape\"");
  }
  for (const nlohmann::json& dim : *shape) {
    if (!dim.is_number_unsigned() || dim.get<uint64_t>() > (1ull << 62)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "shape ", shape->dump(), " has a dimension that is not a non-negative integer"));
    }
    info.shape.push_back(static_cast<int64_t>(dim.get<uint64_t>()));
  }
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned()) {
    return absl::InvalidArgumentError("\"data_offsets\" must be two non-negative integers");
  }
  const uint64_t begin = (*offsets)[0].get<uint64_t>();
  const uint64_t end = (*offsets)[1].get<uint64_t>();
  if (end < begin) {
    return absl::InvalidArgumentError(
        absl::StrCat("data_offsets [", begin, ", ", end, ") end before they begin"));
  }
  info.begin = begin;
  info.size = end - begin;
  return absl::OkStatus();
}

absl::Status ParseHeader(const std::string& header, uint64_t data_start, uint64_t file_size,
                         absl::flat_hash_map<std::string, TensorInfo>& tensors) {
  const nlohmann::json root = nlohmann::json::parse(header, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return absl::InvalidArgumentError("header is not valid JSON");
  if (!root.is_object()) return absl::InvalidArgumentError("header is not a JSON object");
  const uint64_t data_size = file_size - data_start;
  for (const auto& [name, entry] : root.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) return absl::InvalidArgumentError("__metadata__ is not an object");
      continue;
    }
    TensorInfo info;
    uint64_t elem_bytes = 0;
    if (absl::Status status = ParseEntry(name, entry, info, elem_bytes); !status.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\": ", status.message()));
    }
    uint64_t expected = elem_bytes;
    for (int64_t dim : info.shape) {
      const uint64_t d = static_cast<uint64_t>(dim);
      if (d != 0 && expected > std::numeric_limits<uint64_t>::max() / d) {
        return absl::InvalidArgumentError(absl::StrCat("tensor \"", name, "\": shape ",
                                                       ShapeToString(info.shape), " is too large"));
      }
      expected *= d;
    }
    if (info.size != expected) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": data_offsets span ", info.size, " bytes but ",
                       info.dtype_name, " shape ", ShapeToString(info.shape), " needs ", expected));
    }
    if (info.begin > data_size || info.size > data_size - info.begin) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor \"", name, "\": data_offsets [", info.begin, ", ",
                       info.begin + info.size, ") exceed the ", data_size, "-byte data section"));
    }
    info.begin += data_start;
    tensors.emplace(name, std::move(info));
  }
  // No two non-empty byte ranges may overlap.
  std::vector<std::pair<const std::string*, const TensorInfo*>> by_offset;
  for (const auto& [name, info] : tensors) {
    if (info.size > 0) by_offset.emplace_back(&name, &info);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](const auto& a, const auto& b) {
    return a.second->begin != b.second->begin ? a.second->begin < b.second->begin
                                              : *a.first < *b.first;
  });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const TensorInfo& prev = *by_offset[i - 1].second;
    if (prev.begin + prev.size > by_offset[i].second->begin) {
      return absl::InvalidArgumentError(absl::StrCat("tensors \"", *by_offset[i - 1].first,
                                                     "\" and \"", *by_offset[i].first,
                                                     "\" have overlapping data_offsets"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::string ShapeToString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<SafetensorsFile> SafetensorsFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int error = errno;
    return absl::Status(absl::ErrnoToStatusCode(error),
                        absl::StrCat("cannot open ", path, ": ", std::strerror(error)));
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int error = errno;
    ::close(fd);
    return absl::Status(absl::ErrnoToStatusCode(error),
                        absl::StrCat("cannot stat ", path, ": ", std::strerror(error)));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat(path, " is not a regular file"));
  }
  const uint64_t file_size = static_cast<uint64_t>(st.st_size);
  if (file_size < 8) {
    ::close(fd);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated safetensors file: ", file_size, " bytes, need at least 8"));
  }
  void* mapped = ::mmap(nullptr, file_size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_error = errno;
  ::close(fd);
  if (mapped == MAP_FAILED) {
    return absl::Status(absl::ErrnoToStatusCode(map_error),
                        absl::StrCat("cannot mmap ", path, ": ", std::strerror(map_error)));
  }
  SafetensorsFile file;
  file.path_ = path;
  file.data_ = static_cast<const uint8_t*>(mapped);
  file.size_ = file_size;

  uint64_t header_bytes = 0;
  for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | file.data_[i];
  if (header_bytes > file_size - 8) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": truncated header: header length ",
                                                   header_bytes, " exceeds the ", file_size - 8,
                                                   " bytes after the length prefix"));
  }
  if (header_bytes > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": header length ", header_bytes, " exceeds the 100 MB limit"));
  }
  const std::string header(reinterpret_cast<const char*>(file.data_ + 8), header_bytes);
  absl::Status status;
  try {
    status = ParseHeader(header, 8 + header_bytes, file_size, file.tensors_);
  } catch (const nlohmann::json::exception& e) {
    status = absl::InvalidArgumentError(absl::StrCat("malformed header: ", e.what()));
  }
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": ", status.message()));
  }
  return file;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : path_(std::move(other.path_)),
      data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      tensors_(std::move(other.tensors_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    Unmap();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    tensors_ = std::move(other.tensors_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { Unmap(); }

void SafetensorsFile::Unmap() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
  data_ = nullptr;
  size_ = 0;
}

const TensorInfo* SafetensorsFile::Info(const std::string& name) const {
  const auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

std::vector<std::string> SafetensorsFile::Names() const {
  std::vector<std::string> names;
  names.reserve(tensors_.size());
  for (const auto& [name, info] : tensors_) names.push_back(name);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<Tensor> SafetensorsFile::Get(const std::string& name,
                                            absl::Span<const int64_t> expected_shape) const {
  const TensorInfo* info = Info(name);
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat(path_, ": no tensor \"", name, "\""));
  }
  if (!std::equal(info->shape.begin(), info->shape.end(), expected_shape.begin(),
                  expected_shape.end())) {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", name, "\" has shape ",
                                                   ShapeToString(info->shape), ", expected ",
                                                   ShapeToString(expected_shape)));
  }
  Tensor tensor;
  tensor.shape = info->shape;
  const uint8_t* src = data_ + info->begin;
  switch (info->dtype) {
    case SafetensorsDType::kF32: {
      tensor.data.resize(info->size / 4);
      if (info->size > 0) std::memcpy(tensor.data.data(), src, info->size);
      break;
    }
    case SafetensorsDType::kBF16:
    case SafetensorsDType::kF16: {
      const size_t count = info->size / 2;
      tensor.data.resize(count);
      const bool bf16 = info->dtype == SafetensorsDType::kBF16;
      for (size_t i = 0; i < count; ++i) {
        const uint16_t bits = static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
        tensor.data[i] = bf16 ? BFloat16ToFloat(bits) : Float16ToFloat(bits);
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat(path_, ": tensor \"", name, "\" has dtype ",
                                                     info->dtype_name,
                                                     "; only BF16, F16 and F32 are supported"));
  }
  return tensor;
}

absl::StatusOr<std::vector<float>> LoadFloats(const SafetensorsFile& file, const std::string& name,
                                              std::vector<int64_t> shape) {
  absl::StatusOr<Tensor> tensor = file.Get(name, shape);
  if (!tensor.ok()) return tensor.status();
  return std::move(tensor->data);
}

}  // namespace kvcache::worker
