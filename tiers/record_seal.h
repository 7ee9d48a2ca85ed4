// RecordSealer: seals and opens the block records that leave the daemon's memory — the disk
// tier's slots and the cluster tier's values — with AES-256-GCM under a key of the record's
// tenant (tiers/tier_keyring.h), so that whoever reads the disk file or the Redis Cluster learns
// neither the KV nor the tokens, and whoever writes there cannot plant a record that opens.
//
// A sealed record is a head and a body. The head replaces the plaintext record header
// (tiers/record_codec.h); the body is the block's bytes, encrypted, of the same length (a store
// puts it where the plaintext bytes went). Head layout (little-endian, offsets in bytes), for a
// record of n tokens:
//   0    u64  magic "KVCSEAL\1" (kSealedRecordMagic): sealed, seal format 1
//   8    u32  key id: the master key whose derived keys sealed the record
//   12   12   nonce N: random (RAND_bytes), the low two bits of its last byte zero; the record's
//             three messages use N|2 (box), N|0 (header), N|1 (body)
//   24   260  tenant box: u32 name length, then the tenant's name zero-padded to 256 bytes;
//             AES-256-GCM under the keyring's names key, AAD bytes [0, 24)
//   284  16   the box's tag
//   300  L    the record header (RecordHeaderBytes(n) = 376 + 4n bytes, record_codec.h's encoding,
//             its own XXH3 included), AES-256-GCM under the tenant's key, AAD bytes [0, 300), the
//             pool's identity (u32 length + model id, u64 layout fingerprint, u32 hash algorithm,
//             u64 block bytes) and the part byte 'H'
//   300+L 16  the header's tag
//   316+L 16  the body's tag: AES-256-GCM under the tenant's key, AAD bytes [0, 24), the pool's
//             identity, the part byte 'B', then the block's chain hash (hi, lo), namespace digest
//             and prefix digest as u64s
// SealedHeadBytes(n) = 332 + RecordHeaderBytes(n) = 708 + 4n.
//
// What binds what: the box and the header are authenticated together (the header's AAD covers
// the box), so a byte flipped anywhere in the head fails the header's tag; the body's AAD names
// the block the reader expects, so a body under another key, pool or tenant does not open, and
// its nonce is its head's, so a body never opens under another head. A reader opens the header
// with the key of the tenant it reads for: a record sealed for another tenant does not open,
// whatever its plaintext says. Only a restart, which knows no tenant yet, opens the box first.
//
// Opening never hands out unauthenticated bytes: a header is decoded only after its tag checks,
// and a body decrypted into the caller's memory is the caller's to discard unless OpenBody
// answers OK (nothing past a failed open is served).
//
// Thread safety: thread-safe (the keyring is; each call uses a GCM context of its thread's own).
#ifndef KVCACHE_TIERS_RECORD_SEAL_H_
#define KVCACHE_TIERS_RECORD_SEAL_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "tiers/block_record.h"
#include "tiers/record_codec.h"
#include "tiers/tier_keyring.h"

namespace kvcache {

inline constexpr uint64_t kSealedRecordMagic = 0x014c'4145'5343'564bULL;  // "KVCSEAL\1"
inline constexpr size_t kSealNonceBytes = 12;
inline constexpr size_t kSealTagBytes = 16;

inline constexpr uint64_t SealedHeadBytes(uint32_t tokens) {
  return 332 + RecordHeaderBytes(tokens);
}

// What the first bytes of a record say it is.
enum class RecordSealing : uint8_t {
  kEmpty,     // all zero: a slot never written
  kUnsealed,  // record_codec.h's magic
  kSealed,    // kSealedRecordMagic
  kOther,     // anything else (torn, garbled, not a record)
};
RecordSealing RecordSealingOf(absl::string_view head);

// A piece of a record's body: `size` bytes from `in` to `out` (the same memory is fine).
struct SealPiece {
  const char* in;
  char* out;
  uint64_t size;
};

// A head that opened, and what its body needs.
struct OpenedHead {
  RecordHeader header;  // header.block.tenant: the tenant whose key opened it
  uint32_t key_id = 0;
  std::array<uint8_t, kSealNonceBytes> nonce{};
  std::array<uint8_t, kSealTagBytes> body_tag{};
};

class RecordSealer {
 public:
  // Records of `pool`, each of `tokens_per_block` tokens. REQUIRES: `keyring` is not null.
  RecordSealer(std::shared_ptr<const TierKeyring> keyring, const PoolIdentity& pool,
               uint32_t tokens_per_block);

  const TierKeyring& keyring() const { return *keyring_; }
  // SealedHeadBytes(tokens_per_block): every head's size.
  uint64_t head_bytes() const { return SealedHeadBytes(tokens_per_block_); }

  // Seals a record for header.block.tenant under the keyring's newest key: its head into
  // head[0, head_bytes()), and its body, `body`'s pieces in order (block_bytes in all), each
  // encrypted from `in` to `out`. INVALID_ARGUMENT: a tenant name past kMaxTenantBytes, another
  // token count, a head too short, or what EncodeRecordHeader refuses; INTERNAL: OpenSSL failed.
  absl::Status Seal(const RecordHeader& header, absl::Span<const SealPiece> body,
                    absl::Span<char> head) const;

  // Opens the head at the front of `head` (head_bytes()) for `tenant`. NOT_FOUND: an empty slot
  // (all zero magic). FAILED_PRECONDITION: an unsealed record (written by a daemon without a key
  // file). UNAUTHENTICATED: a sealed record that does not open: a key id the keyring lacks, another
  // tenant's record, another pool's, or any byte changed. DATA_LOSS: not a record, or too short.
  absl::StatusOr<OpenedHead> OpenHead(absl::string_view head, absl::string_view tenant) const;
  // The same for a reader that knows no tenant (a restart's scan): the tenant is the box's.
  absl::StatusOr<OpenedHead> OpenHead(absl::string_view head) const;

  // Decrypts `body`'s pieces (in order) and checks them against `head` and the block the reader
  // expects (`expected`'s chain hash, namespace digest and prefix digest). UNAUTHENTICATED when
  // they do not open; each piece's `out` then holds bytes that must not be used.
  absl::Status OpenBody(const OpenedHead& head, const BlockRecordIdentity& expected,
                        absl::Span<const SealPiece> body) const;

  // HMAC-SHA-256 of `bytes` under the tenant's name key of master key `key_id`, its first 16
  // bytes: a name that says nothing to whoever lacks the key. NOT_FOUND: no such key.
  absl::StatusOr<std::array<uint8_t, 16>> NameDigest(uint32_t key_id, absl::string_view tenant,
                                                     absl::string_view bytes) const;

 private:
  absl::StatusOr<OpenedHead> OpenHeader(absl::string_view head, uint32_t key_id,
                                        absl::string_view tenant) const;

  const std::shared_ptr<const TierKeyring> keyring_;
  const std::string pool_aad_;  // the pool's identity, encoded for the AADs
  const uint32_t tokens_per_block_;
};

}  // namespace kvcache

#endif  // KVCACHE_TIERS_RECORD_SEAL_H_
