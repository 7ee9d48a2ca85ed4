// SplitBytesField: reads a serialized protobuf message out of a grpc::ByteBuffer without copying
// one of its bytes fields. The block data RPCs carry up to a few MiB of block bytes per message;
// parsing such a message copies every byte into a std::string, and then the receiver copies it
// again to where the bytes belong (the pool, the caller's buffer). Split instead hands out the
// field's bytes as views into the buffer's slices, and the rest of the message — its small
// fields, re-encoded — as a string to parse with protobuf as usual. Fields may come in any order;
// when the bytes field occurs more than once, `pieces` is the last occurrence, as protobuf's parser
// takes for a singular field, and `values` has them all, as it takes for a repeated one (the page
// calls' pages).
//
// Thread-safety: a SplitMessage is immutable once returned; its views live as long as it does.
#ifndef KVCACHE_COMMON_RPC_BYTES_FIELD_SPLIT_H_
#define KVCACHE_COMMON_RPC_BYTES_FIELD_SPLIT_H_

#include <google/protobuf/message.h>
#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/slice.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace kvcache {

struct SplitMessage {
  // One occurrence of the bytes field: its bytes, in order, inside `slices`.
  struct Value {
    uint64_t size = 0;
    std::vector<absl::string_view> pieces;
  };

  std::string rest;  // every other field, serialized: parse it into the message type
  bool has_field = false;
  uint64_t field_size = 0;                // the bytes field's length (its last occurrence)
  std::vector<absl::string_view> pieces;  // its bytes (its last occurrence)
  std::vector<Value> values;              // every occurrence in order, for a repeated field
  std::vector<grpc::Slice> slices;        // keeps the pieces alive
};

// INVALID_ARGUMENT for a malformed message: a truncated field, an overlong varint, a group
// (wire types 3 and 4) or an unknown wire type, field number 0.
absl::StatusOr<SplitMessage> SplitBytesField(const grpc::ByteBuffer& buffer, uint32_t field_number);

// Parses a whole message out of `buffer`; INVALID_ARGUMENT naming its type if it is not one. For
// the small messages of calls served raw.
absl::Status ParseByteBuffer(const grpc::ByteBuffer& buffer, google::protobuf::Message* message);

// The encoding's other direction: the tag and length that precede a bytes field of `size` bytes.
// A sender puts this, then the bytes as slices of their own, and sends the bytes uncopied.
std::string BytesFieldPrefix(uint32_t field_number, uint64_t size);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_RPC_BYTES_FIELD_SPLIT_H_
