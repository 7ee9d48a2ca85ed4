// The encoding of a block record's header (tiers/block_record.h) below tier 1: what the disk tier
// writes at the front of each slot and what a cluster-store tier will write at the front of each
// value (one value = header + block bytes). Transport-neutral: bytes in, bytes out.
//
// Layout (little-endian, offsets in bytes), for a record of n tokens:
//   0   u64  magic "KVCREC\0\1" (kRecordMagic)
//   8   u32  format version (kRecordFormatVersion)
//   12  u32  n, tokens in the block
//   16  u32  model id length (at most kMaxRecordModelIdBytes)
//   20  256  model id, zero-padded
//   276 u64  layout fingerprint
//   284 u32  hash algorithm (HashAlgorithm's value)
//   288 u64  block bytes
//   296 16   chain hash (hi, lo)
//   312 16   parent hash (hi, lo)
//   328 u64  namespace digest
//   336 u64  extras digest
//   344 u64  prefix digest (BlockHasher::PrefixDigest)
//   352 u64  checksum of the block's bytes (BlockChecksum)
//   360 u64  sequence: the writer's generation number (newer records have larger ones)
//   368 4n   tokens, u32 each
//   ... u64  XXH3-64 (seed 0) of every byte before it
// RecordHeaderBytes(n) = 376 + 4n; RecordHeaderSlotBytes(n) rounds it up to kRecordAlignment, the
// O_DIRECT unit, for stores that place the bytes right after it. The header checksum covers the
// bytes' checksum, so a record whose header decodes names exactly the bytes it was written with.
//
// Version 1 had no prefix digest (the same layout without the field at 344: 368 + 4n bytes). Its
// records cannot be verified against a whole prefix (tiers/block_record.h), so they are never
// served: an intact one decodes as FAILED_PRECONDITION, for stores to skip and count apart from
// damage.
//
// Thread safety: free functions on values; thread-safe.
#ifndef KVCACHE_TIERS_RECORD_CODEC_H_
#define KVCACHE_TIERS_RECORD_CODEC_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tiers/block_record.h"

namespace kvcache {

inline constexpr uint64_t kRecordMagic = 0x0100'4345'5243'564bULL;  // "KVCREC\0\1"
inline constexpr uint32_t kRecordFormatVersion = 2;
inline constexpr uint32_t kMaxRecordModelIdBytes = 256;
// Decode's bound on n, so a garbled count cannot ask for an absurd read (a block of 1 GiB at
// 1 byte per token has far fewer tokens than this).
inline constexpr uint32_t kMaxRecordTokens = 1 << 20;
inline constexpr uint64_t kRecordAlignment = 4096;

struct RecordHeader {
  PoolIdentity pool;
  BlockRecordIdentity block;
  uint64_t sequence = 0;

  bool operator==(const RecordHeader&) const = default;
};

inline constexpr uint64_t RoundUpToRecordAlignment(uint64_t bytes) {
  return (bytes + kRecordAlignment - 1) / kRecordAlignment * kRecordAlignment;
}
inline constexpr uint64_t RecordHeaderBytes(uint32_t tokens) { return 376 + 4ull * tokens; }
inline constexpr uint64_t RecordHeaderSlotBytes(uint32_t tokens) {
  return RoundUpToRecordAlignment(RecordHeaderBytes(tokens));
}

// Writes the header into out[0, RecordHeaderBytes(tokens)). INVALID_ARGUMENT when the model id is
// longer than kMaxRecordModelIdBytes, there are more than kMaxRecordTokens tokens, or `out` is
// shorter than RecordHeaderBytes. Bytes of `out` past the header are left as they are.
absl::Status EncodeRecordHeader(const RecordHeader& header, absl::Span<char> out);
// The same from its parts, which a store has apart: no copy of the identity's tokens and tenant.
absl::Status EncodeRecordHeader(const PoolIdentity& pool, const BlockRecordIdentity& block,
                                uint64_t sequence, absl::Span<char> out);

// Reads a header from the front of `bytes` (any bytes after it are ignored). NOT_FOUND when the
// magic is zero (a slot never written); FAILED_PRECONDITION for an intact header of format
// version 1 (written by an older build; never served); DATA_LOSS for anything else that is not a
// whole, intact header of this format: another magic, an unknown version, a count out of range,
// too few bytes, a header checksum that differs (a torn or garbled write).
absl::StatusOr<RecordHeader> DecodeRecordHeader(absl::string_view bytes);

// The first PoolIdentity field in which a decoded record differs from the pool reading it
// ("model_id", "layout_fingerprint", "hash_algorithm", "block_bytes"); empty when it is the
// pool's own. A record of another pool is foreign: never served, whatever its hash.
absl::string_view PoolMismatch(const PoolIdentity& found, const PoolIdentity& expected);

}  // namespace kvcache

#endif  // KVCACHE_TIERS_RECORD_CODEC_H_
