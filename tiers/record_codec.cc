#include "tiers/record_codec.h"

#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"

namespace kvcache {
namespace {

constexpr uint64_t kModelIdOffset = 20;
constexpr uint64_t kAfterModelIdOffset = kModelIdOffset + kMaxRecordModelIdBytes;  // 276
constexpr uint64_t kTokensOffset = 368;
// Format version 1: no prefix digest, so its header is 8 bytes shorter.
constexpr uint32_t kRecordFormatVersion1 = 1;
constexpr uint64_t RecordHeaderBytesV1(uint32_t tokens) { return RecordHeaderBytes(tokens) - 8; }

// Little-endian field access at a cursor; the layout is the header comment's.
class Writer {
 public:
  explicit Writer(char* out) : out_(out) {}
  void U32(uint32_t value) { Le(value, 4); }
  void U64(uint64_t value) { Le(value, 8); }
  void Bytes(const void* data, uint64_t size) {
    std::memcpy(out_ + offset_, data, size);
    offset_ += size;
  }
  void Zeros(uint64_t size) {
    std::memset(out_ + offset_, 0, size);
    offset_ += size;
  }
  uint64_t offset() const { return offset_; }

 private:
  void Le(uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out_[offset_ + i] = static_cast<char>(value >> (8 * i));
    offset_ += bytes;
  }
  char* const out_;
  uint64_t offset_ = 0;
};

class Reader {
 public:
  explicit Reader(const char* in) : in_(in) {}
  uint32_t U32() { return static_cast<uint32_t>(Le(4)); }
  uint64_t U64() { return Le(8); }
  const char* Skip(uint64_t size) {
    const char* at = in_ + offset_;
    offset_ += size;
    return at;
  }

 private:
  uint64_t Le(int bytes) {
    uint64_t value = 0;
    for (int i = 0; i < bytes; ++i) {
      value |= uint64_t{static_cast<unsigned char>(in_[offset_ + i])} << (8 * i);
    }
    offset_ += bytes;
    return value;
  }
  const char* const in_;
  uint64_t offset_ = 0;
};

// Whether the header checksum, the last 8 of `size` bytes, covers the bytes before it.
// REQUIRES: bytes.size() >= size >= 8.
bool HeaderChecksumMatches(absl::string_view bytes, uint64_t size) {
  return Reader(bytes.data() + size - 8).U64() == BlockChecksum(bytes.data(), size - 8);
}

}  // namespace

absl::Status EncodeRecordHeader(const RecordHeader& header, absl::Span<char> out) {
  return EncodeRecordHeader(header.pool, header.block, header.sequence, out);
}

absl::Status EncodeRecordHeader(const PoolIdentity& pool, const BlockRecordIdentity& block,
                                uint64_t sequence, absl::Span<char> out) {
  const std::string& model_id = pool.model_id;
  if (model_id.size() > kMaxRecordModelIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("model id of ", model_id.size(),
                                                   " bytes; a record holds at most ",
                                                   kMaxRecordModelIdBytes));
  }
  const uint64_t tokens = block.tokens.size();
  if (tokens > kMaxRecordTokens) {
    return absl::InvalidArgumentError(
        absl::StrCat(tokens, " tokens; a record holds at most ", kMaxRecordTokens));
  }
  const uint64_t size = RecordHeaderBytes(static_cast<uint32_t>(tokens));
  if (out.size() < size) {
    return absl::InvalidArgumentError(
        absl::StrCat("a record header needs ", size, " bytes, the buffer has ", out.size()));
  }
  Writer writer(out.data());
  writer.U64(kRecordMagic);
  writer.U32(kRecordFormatVersion);
  writer.U32(static_cast<uint32_t>(tokens));
  writer.U32(static_cast<uint32_t>(model_id.size()));
  writer.Bytes(model_id.data(), model_id.size());
  writer.Zeros(kAfterModelIdOffset - writer.offset());
  writer.U64(pool.layout_fingerprint);
  writer.U32(static_cast<uint32_t>(pool.hash_algorithm));
  writer.U64(pool.block_bytes);
  writer.U64(block.hash.hi);
  writer.U64(block.hash.lo);
  writer.U64(block.parent_hash.hi);
  writer.U64(block.parent_hash.lo);
  writer.U64(block.namespace_digest);
  writer.U64(block.extras_digest);
  writer.U64(block.prefix_digest);
  writer.U64(block.checksum);
  writer.U64(sequence);
  for (uint32_t token : block.tokens) writer.U32(token);
  writer.U64(BlockChecksum(out.data(), writer.offset()));
  return absl::OkStatus();
}

absl::StatusOr<RecordHeader> DecodeRecordHeader(absl::string_view bytes) {
  if (bytes.size() < RecordHeaderBytes(0)) {
    return absl::DataLossError(absl::StrCat("record header truncated: ", bytes.size(), " bytes"));
  }
  Reader reader(bytes.data());
  const uint64_t magic = reader.U64();
  if (magic == 0) return absl::NotFoundError("no record (empty slot)");
  if (magic != kRecordMagic) return absl::DataLossError("not a record header (magic)");
  const uint32_t version = reader.U32();
  const uint32_t tokens = reader.U32();
  if (tokens > kMaxRecordTokens) {
    return absl::DataLossError(absl::StrCat("record claims ", tokens, " tokens"));
  }
  if (version == kRecordFormatVersion1 && bytes.size() >= RecordHeaderBytesV1(tokens) &&
      HeaderChecksumMatches(bytes, RecordHeaderBytesV1(tokens))) {
    return absl::FailedPreconditionError(
        absl::StrCat("record format version 1, without a prefix digest; this build reads ",
                     kRecordFormatVersion));
  }
  if (version != kRecordFormatVersion) {
    return absl::DataLossError(
        absl::StrCat("record format version ", version, ", expected ", kRecordFormatVersion));
  }
  const uint64_t size = RecordHeaderBytes(tokens);
  if (bytes.size() < size) {
    return absl::DataLossError(
        absl::StrCat("record header truncated: ", bytes.size(), " of ", size, " bytes"));
  }
  // The checksum first: nothing below is trusted before it matches.
  if (!HeaderChecksumMatches(bytes, size)) {
    return absl::DataLossError("record header checksum mismatch (torn or garbled)");
  }
  RecordHeader header;
  const uint32_t model_id_bytes = reader.U32();
  if (model_id_bytes > kMaxRecordModelIdBytes) {
    return absl::DataLossError(absl::StrCat("record model id of ", model_id_bytes, " bytes"));
  }
  header.pool.model_id.assign(reader.Skip(kMaxRecordModelIdBytes), model_id_bytes);
  header.pool.layout_fingerprint = reader.U64();
  header.pool.hash_algorithm = static_cast<HashAlgorithm>(reader.U32());
  header.pool.block_bytes = reader.U64();
  header.block.hash.hi = reader.U64();
  header.block.hash.lo = reader.U64();
  header.block.parent_hash.hi = reader.U64();
  header.block.parent_hash.lo = reader.U64();
  header.block.namespace_digest = reader.U64();
  header.block.extras_digest = reader.U64();
  header.block.prefix_digest = reader.U64();
  header.block.checksum = reader.U64();
  header.sequence = reader.U64();
  header.block.tokens.resize(tokens);
  Reader token_reader(bytes.data() + kTokensOffset);
  for (uint32_t& token : header.block.tokens) token = token_reader.U32();
  return header;
}

absl::string_view PoolMismatch(const PoolIdentity& found, const PoolIdentity& expected) {
  if (found.model_id != expected.model_id) return "model_id";
  if (found.layout_fingerprint != expected.layout_fingerprint) return "layout_fingerprint";
  if (found.hash_algorithm != expected.hash_algorithm) return "hash_algorithm";
  if (found.block_bytes != expected.block_bytes) return "block_bytes";
  return "";
}

}  // namespace kvcache
