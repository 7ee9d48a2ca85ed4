#include "common/rpc/bytes_field_split.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Reads a message that may be split across slices at any byte.
class SliceCursor {
 public:
  explicit SliceCursor(const std::vector<grpc::Slice>& slices) : slices_(slices) { SkipEmpty(); }

  bool AtEnd() const { return slice_ == slices_.size(); }

  absl::StatusOr<uint64_t> ReadVarint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (AtEnd()) return Truncated();
      const uint8_t byte = Current()[offset_];
      Advance(1);
      value |= uint64_t{byte & 0x7fu} << shift;
      if ((byte & 0x80) == 0) return value;
    }
    return absl::InvalidArgumentError("malformed message: a varint longer than 10 bytes");
  }

  // Calls visit(piece) for the next `size` bytes, piece by piece.
  template <typename Visit>
  absl::Status Take(uint64_t size, Visit visit) {
    while (size > 0) {
      if (AtEnd()) return Truncated();
      const size_t available = slices_[slice_].size() - offset_;
      const size_t n = static_cast<size_t>(std::min<uint64_t>(size, available));
      visit(absl::string_view(reinterpret_cast<const char*>(Current()) + offset_, n));
      Advance(n);
      size -= n;
    }
    return absl::OkStatus();
  }

 private:
  const uint8_t* Current() const { return slices_[slice_].begin(); }

  void Advance(size_t n) {
    offset_ += n;
    if (offset_ == slices_[slice_].size()) {
      ++slice_;
      offset_ = 0;
      SkipEmpty();
    }
  }

  void SkipEmpty() {
    while (slice_ < slices_.size() && slices_[slice_].size() == 0) ++slice_;
  }

  static absl::Status Truncated() {
    return absl::InvalidArgumentError("malformed message: truncated field");
  }

  const std::vector<grpc::Slice>& slices_;
  size_t slice_ = 0;
  size_t offset_ = 0;
};

void AppendVarint(uint64_t value, std::string* out) {
  while (value >= 0x80) {
    out->push_back(static_cast<char>(value | 0x80));
    value >>= 7;
  }
  out->push_back(static_cast<char>(value));
}

}  // namespace

absl::Status ParseByteBuffer(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  if (!buffer.Valid()) {  // nothing behind it: the empty message
    message->Clear();
    return absl::OkStatus();
  }
  grpc::Slice flat;
  if (!buffer.DumpToSingleSlice(&flat).ok() ||
      !message->ParseFromArray(flat.begin(), static_cast<int>(flat.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("not a valid ", message->GetDescriptor()->name()));
  }
  return absl::OkStatus();
}

std::string BytesFieldPrefix(uint32_t field_number, uint64_t size) {
  std::string prefix;
  AppendVarint((uint64_t{field_number} << 3) | kLengthDelimited, &prefix);
  AppendVarint(size, &prefix);
  return prefix;
}

absl::StatusOr<SplitMessage> SplitBytesField(const grpc::ByteBuffer& buffer,
                                             uint32_t field_number) {
  SplitMessage split;
  // A buffer with nothing behind it is the empty message.
  if (buffer.Valid() && !buffer.Dump(&split.slices).ok()) {
    return absl::InvalidArgumentError("malformed message: unreadable buffer");
  }
  SliceCursor cursor(split.slices);
  const auto append_to_rest = [&split](absl::string_view piece) {
    split.rest.append(piece.data(), piece.size());
  };
  while (!cursor.AtEnd()) {
    const absl::StatusOr<uint64_t> tag = cursor.ReadVarint();
    if (!tag.ok()) return tag.status();
    const uint64_t field = *tag >> 3;
    const uint32_t wire_type = static_cast<uint32_t>(*tag & 7);
    if (field == 0 || field > (uint64_t{1} << 29) - 1) {
      return absl::InvalidArgumentError(absl::StrCat("malformed message: field number ", field));
    }
    if (wire_type == kLengthDelimited && field == field_number) {
      const absl::StatusOr<uint64_t> size = cursor.ReadVarint();
      if (!size.ok()) return size.status();
      SplitMessage::Value& value = split.values.emplace_back();
      value.size = *size;
      const absl::Status taken =
          cursor.Take(*size, [&value](absl::string_view piece) { value.pieces.push_back(piece); });
      if (!taken.ok()) return taken;
      continue;
    }
    AppendVarint(*tag, &split.rest);
    absl::Status copied;
    switch (wire_type) {
      case kVarint: {
        const absl::StatusOr<uint64_t> value = cursor.ReadVarint();
        if (!value.ok()) return value.status();
        AppendVarint(*value, &split.rest);
        break;
      }
      case kFixed64:
        copied = cursor.Take(8, append_to_rest);
        break;
      case kFixed32:
        copied = cursor.Take(4, append_to_rest);
        break;
      case kLengthDelimited: {
        const absl::StatusOr<uint64_t> size = cursor.ReadVarint();
        if (!size.ok()) return size.status();
        AppendVarint(*size, &split.rest);
        copied = cursor.Take(*size, append_to_rest);
        break;
      }
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("malformed message: wire type ", wire_type, " of field ", field));
    }
    if (!copied.ok()) return copied;
  }
  if (!split.values.empty()) {  // a singular field's last occurrence wins
    split.has_field = true;
    split.field_size = split.values.back().size;
    split.pieces = split.values.back().pieces;
  }
  return split;
}

}  // namespace kvcache
