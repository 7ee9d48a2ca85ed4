#include "tiers/record_seal.h"

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/byte_writer.h"
#include "common/status_macros.h"
#include "common/tenant.h"

namespace kvcache {
namespace {

constexpr size_t kPreambleBytes = 24;
constexpr size_t kNonceOffset = 12;
constexpr size_t kBoxOffset = kPreambleBytes;
constexpr size_t kBoxBytes = 4 + kMaxTenantBytes;                         // 260
constexpr size_t kHeaderOffset = kBoxOffset + kBoxBytes + kSealTagBytes;  // 300
static_assert(SealedHeadBytes(0) == kHeaderOffset + RecordHeaderBytes(0) + 2 * kSealTagBytes);

// The record's three messages: each its own nonce (N with these low bits).
enum Part : uint8_t { kHeaderPart = 0, kBodyPart = 1, kBoxPart = 2 };

uint64_t LoadLe(const char* in, int bytes) {
  uint64_t value = 0;
  for (int i = 0; i < bytes; ++i) value |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}
uint32_t LoadU32(const char* in) { return static_cast<uint32_t>(LoadLe(in, 4)); }
void StoreLe(char* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out[i] = static_cast<char>(value >> (8 * i));
}

const EVP_CIPHER* Aes256Gcm() {
  static const EVP_CIPHER* const cipher = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  return cipher;
}

// A calling thread's contexts, one per key it used last (a few: a record takes the names key and
// its tenant's), each set up with its key once. OpenSSL expands an AES key schedule and GHASH's
// table, or an HMAC key's inner and outer states, on every keyed init: at 32 KiB records that set-
// up cost as much as a third of the cipher pass. Entries are cleansed when replaced and at thread
// exit (EVP's free functions cleanse), and a key is compared in constant time.
template <typename Context, void (*Free)(Context*)>
class ThreadKeyedContexts {
 public:
  ThreadKeyedContexts() = default;
  ThreadKeyedContexts(const ThreadKeyedContexts&) = delete;
  ThreadKeyedContexts& operator=(const ThreadKeyedContexts&) = delete;
  ~ThreadKeyedContexts() {
    for (Entry& entry : entries_) Clear(entry);
  }

  // The context keyed with `key`; `init` keys a fresh one (false: OpenSSL failed). Null on failure.
  template <typename Init>
  Context* For(const TierKeyBytes& key, Context* (*make)(), Init init) {
    for (Entry& entry : entries_) {
      if (entry.context != nullptr &&
          CRYPTO_memcmp(entry.key.data(), key.data(), key.size()) == 0) {
        return entry.context;
      }
    }
    Entry& entry = entries_[next_];
    next_ = (next_ + 1) % kEntries;
    Clear(entry);
    entry.context = make();
    if (entry.context == nullptr || !init(entry.context, key)) {
      Clear(entry);
      return nullptr;
    }
    entry.key = key;
    return entry.context;
  }

 private:
  static constexpr size_t kEntries = 4;
  struct Entry {
    TierKeyBytes key{};
    Context* context = nullptr;
  };
  static void Clear(Entry& entry) {
    if (entry.context != nullptr) Free(entry.context);
    entry.context = nullptr;
    OPENSSL_cleanse(entry.key.data(), entry.key.size());
  }

  Entry entries_[kEntries];
  size_t next_ = 0;
};

// The calling thread's GCM context keyed with `key`, ready for a message's nonce.
EVP_CIPHER_CTX* GcmContextFor(const TierKeyBytes& key) {
  thread_local ThreadKeyedContexts<EVP_CIPHER_CTX, EVP_CIPHER_CTX_free> contexts;
  if (Aes256Gcm() == nullptr) return nullptr;
  return contexts.For(key, EVP_CIPHER_CTX_new, [](EVP_CIPHER_CTX* ctx, const TierKeyBytes& key) {
    return EVP_CipherInit_ex(ctx, Aes256Gcm(), nullptr, key.data(), nullptr, 1) == 1;
  });
}

EVP_MAC* HmacMac() {
  static EVP_MAC* const mac = EVP_MAC_fetch(nullptr, "HMAC", nullptr);
  return mac;
}
EVP_MAC_CTX* NewHmacContext() {
  return HmacMac() == nullptr ? nullptr : EVP_MAC_CTX_new(HmacMac());
}

// The calling thread's HMAC-SHA-256 context keyed with `key`; EVP_MAC_init with no key restarts
// it from the key's saved states.
EVP_MAC_CTX* HmacContextFor(const TierKeyBytes& key) {
  thread_local ThreadKeyedContexts<EVP_MAC_CTX, EVP_MAC_CTX_free> contexts;
  return contexts.For(key, NewHmacContext, [](EVP_MAC_CTX* ctx, const TierKeyBytes& key) {
    char digest[] = "SHA256";
    const OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string("digest", digest, 0),
                                 OSSL_PARAM_construct_end()};
    return EVP_MAC_init(ctx, key.data(), key.size(), params) == 1;
  });
}

// One AES-256-GCM message: `aad`'s parts, then `pieces` in order, each from `in` to `out`.
// Encrypting, writes the tag into `tag`; decrypting, checks it. False when the tag differs or
// OpenSSL fails.
bool Gcm(bool encrypt, const TierKeyBytes& key, const uint8_t* nonce,
         std::initializer_list<absl::string_view> aad, absl::Span<const SealPiece> pieces,
         uint8_t* tag) {
  EVP_CIPHER_CTX* ctx = GcmContextFor(key);
  if (ctx == nullptr) return false;
  const int enc = encrypt ? 1 : 0;
  if (EVP_CipherInit_ex(ctx, nullptr, nullptr, nullptr, nonce, enc) != 1) return false;
  int length = 0;
  for (absl::string_view part : aad) {
    if (part.empty()) continue;
    if (EVP_CipherUpdate(ctx, nullptr, &length, reinterpret_cast<const uint8_t*>(part.data()),
                         static_cast<int>(part.size())) != 1) {
      return false;
    }
  }
  constexpr uint64_t kChunk = uint64_t{1} << 30;  // EVP lengths are ints
  for (const SealPiece& piece : pieces) {
    for (uint64_t done = 0; done < piece.size; done += kChunk) {
      const int size = static_cast<int>(std::min(kChunk, piece.size - done));
      if (EVP_CipherUpdate(ctx, reinterpret_cast<uint8_t*>(piece.out + done), &length,
                           reinterpret_cast<const uint8_t*>(piece.in + done), size) != 1) {
        return false;
      }
    }
  }
  if (!encrypt &&
      EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_SET_TAG, static_cast<int>(kSealTagBytes), tag) != 1) {
    return false;
  }
  uint8_t final_block[16];
  if (EVP_CipherFinal_ex(ctx, final_block, &length) != 1) return false;  // decrypting: the tag
  return !encrypt ||
         EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, static_cast<int>(kSealTagBytes), tag) == 1;
}

std::array<uint8_t, kSealNonceBytes> NonceOf(const uint8_t* base, Part part) {
  std::array<uint8_t, kSealNonceBytes> nonce;
  std::copy(base, base + kSealNonceBytes, nonce.begin());
  nonce[kSealNonceBytes - 1] |= part;
  return nonce;
}

std::string PoolAad(const PoolIdentity& pool) {
  ByteWriter writer;
  writer.String(pool.model_id);
  writer.U64(pool.layout_fingerprint);
  writer.U32(static_cast<uint32_t>(pool.hash_algorithm));
  writer.U64(pool.block_bytes);
  return std::string(writer.data(), writer.size());
}

// The body's AAD after the preamble and the pool: 'B' and the block it must be.
std::string BodyAad(const BlockRecordIdentity& block) {
  ByteWriter writer;
  writer.Raw("B");
  writer.U64(block.hash.hi);
  writer.U64(block.hash.lo);
  writer.U64(block.namespace_digest);
  writer.U64(block.prefix_digest);
  return std::string(writer.data(), writer.size());
}

absl::Status DoesNotOpen(absl::string_view why) {
  return absl::UnauthenticatedError(absl::StrCat("sealed record does not open: ", why));
}

// The first bytes' verdict, for OpenHead: OK for a sealed head at least `size` bytes long.
absl::Status CheckSealed(absl::string_view head, uint64_t size) {
  switch (RecordSealingOf(head)) {
    case RecordSealing::kEmpty:
      return absl::NotFoundError("no record (empty slot)");
    case RecordSealing::kUnsealed:
      return absl::FailedPreconditionError("an unsealed record (written without a tier key)");
    case RecordSealing::kOther:
      return absl::DataLossError("not a record (magic)");
    case RecordSealing::kSealed:
      break;
  }
  if (head.size() < size) {
    return absl::DataLossError(
        absl::StrCat("sealed record head truncated: ", head.size(), " of ", size, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

RecordSealing RecordSealingOf(absl::string_view head) {
  if (head.size() < 8) return RecordSealing::kOther;
  const uint64_t magic = LoadLe(head.data(), 8);
  if (magic == 0) return RecordSealing::kEmpty;
  if (magic == kRecordMagic) return RecordSealing::kUnsealed;
  if (magic == kSealedRecordMagic) return RecordSealing::kSealed;
  return RecordSealing::kOther;
}

RecordSealer::RecordSealer(std::shared_ptr<const TierKeyring> keyring, const PoolIdentity& pool,
                           uint32_t tokens_per_block)
    : keyring_(std::move(keyring)), pool_aad_(PoolAad(pool)), tokens_per_block_(tokens_per_block) {}

absl::Status RecordSealer::Seal(const RecordHeader& header, absl::Span<const SealPiece> body,
                                absl::Span<char> head) const {
  const absl::string_view tenant = header.block.tenant;
  if (tenant.size() > kMaxTenantBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a tenant name of ", tenant.size(), " bytes; at most ", kMaxTenantBytes));
  }
  if (header.block.tokens.size() != tokens_per_block_) {
    return absl::InvalidArgumentError(absl::StrCat("a record of ", header.block.tokens.size(),
                                                   " tokens; this sealer's have ",
                                                   tokens_per_block_));
  }
  const uint64_t header_bytes = RecordHeaderBytes(tokens_per_block_);
  if (head.size() < head_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a sealed head needs ", head_bytes(), " bytes, the buffer has ", head.size()));
  }
  const uint32_t key_id = keyring_->sealing_key_id();
  ASSIGN_OR_RETURN(const TierKeyring::TenantKeys keys, keyring_->TenantKeysFor(key_id, tenant));
  ASSIGN_OR_RETURN(const TierKeyBytes names_key, keyring_->NamesKey(key_id));
  char* const out = head.data();
  // The record header in place, encrypted below.
  RETURN_IF_ERROR(
      EncodeRecordHeader(header, absl::MakeSpan(out + kHeaderOffset, head.size() - kHeaderOffset)));
  uint8_t nonce[kSealNonceBytes];
  if (RAND_bytes(nonce, sizeof(nonce)) != 1) return absl::InternalError("RAND_bytes failed");
  nonce[kSealNonceBytes - 1] &= 0xfc;
  StoreLe(out, kSealedRecordMagic, 8);
  StoreLe(out + 8, key_id, 4);
  std::memcpy(out + kNonceOffset, nonce, sizeof(nonce));
  const absl::string_view preamble(out, kPreambleBytes);

  char* const box = out + kBoxOffset;
  std::memset(box, 0, kBoxBytes);
  StoreLe(box, tenant.size(), 4);
  std::memcpy(box + 4, tenant.data(), tenant.size());
  uint8_t* const box_tag = reinterpret_cast<uint8_t*>(box + kBoxBytes);
  const SealPiece box_piece{box, box, kBoxBytes};
  const SealPiece header_piece{out + kHeaderOffset, out + kHeaderOffset, header_bytes};
  uint8_t* const header_tag = reinterpret_cast<uint8_t*>(out + kHeaderOffset + header_bytes);
  uint8_t* const body_tag = header_tag + kSealTagBytes;
  const bool sealed =
      Gcm(true, names_key, NonceOf(nonce, kBoxPart).data(), {preamble}, {&box_piece, 1}, box_tag) &&
      Gcm(true, keys.seal, NonceOf(nonce, kHeaderPart).data(),
          {absl::string_view(out, kHeaderOffset), pool_aad_, "H"}, {&header_piece, 1},
          header_tag) &&
      Gcm(true, keys.seal, NonceOf(nonce, kBodyPart).data(),
          {preamble, pool_aad_, BodyAad(header.block)}, body, body_tag);
  if (!sealed) return absl::InternalError("AES-256-GCM failed (OpenSSL)");
  return absl::OkStatus();
}

absl::StatusOr<OpenedHead> RecordSealer::OpenHead(absl::string_view head,
                                                  absl::string_view tenant) const {
  RETURN_IF_ERROR(CheckSealed(head, head_bytes()));
  return OpenHeader(head, LoadU32(head.data() + 8), tenant);
}

absl::StatusOr<OpenedHead> RecordSealer::OpenHead(absl::string_view head) const {
  RETURN_IF_ERROR(CheckSealed(head, head_bytes()));
  const uint32_t key_id = LoadU32(head.data() + 8);
  absl::StatusOr<TierKeyBytes> names_key = keyring_->NamesKey(key_id);
  if (!names_key.ok()) return DoesNotOpen(absl::StrCat("no key with id ", key_id));
  char box[kBoxBytes];
  uint8_t tag[kSealTagBytes];
  std::memcpy(tag, head.data() + kBoxOffset + kBoxBytes, sizeof(tag));
  const SealPiece piece{head.data() + kBoxOffset, box, kBoxBytes};
  if (!Gcm(false, *names_key,
           NonceOf(reinterpret_cast<const uint8_t*>(head.data() + kNonceOffset), kBoxPart).data(),
           {head.substr(0, kPreambleBytes)}, {&piece, 1}, tag)) {
    return DoesNotOpen("its tenant box fails authentication (another master key?)");
  }
  const uint32_t length = LoadU32(box);
  if (length > kMaxTenantBytes) return DoesNotOpen("its tenant box is malformed");
  return OpenHeader(head, key_id, absl::string_view(box + 4, length));
}

absl::StatusOr<OpenedHead> RecordSealer::OpenHeader(absl::string_view head, uint32_t key_id,
                                                    absl::string_view tenant) const {
  absl::StatusOr<TierKeyring::TenantKeys> keys = keyring_->TenantKeysFor(key_id, tenant);
  if (!keys.ok()) return DoesNotOpen(absl::StrCat("no key with id ", key_id));
  OpenedHead opened;
  opened.key_id = key_id;
  std::memcpy(opened.nonce.data(), head.data() + kNonceOffset, kSealNonceBytes);
  const auto nonce = NonceOf(opened.nonce.data(), kHeaderPart);
  const uint64_t header_bytes = RecordHeaderBytes(tokens_per_block_);
  std::string header(header_bytes, '\0');
  uint8_t tag[kSealTagBytes];
  std::memcpy(tag, head.data() + kHeaderOffset + header_bytes, sizeof(tag));
  const SealPiece piece{head.data() + kHeaderOffset, header.data(), header_bytes};
  if (!Gcm(false, keys->seal, nonce.data(), {head.substr(0, kHeaderOffset), pool_aad_, "H"},
           {&piece, 1}, tag)) {
    OPENSSL_cleanse(header.data(), header.size());
    return DoesNotOpen("its header fails authentication (another tenant, pool or key, or changed)");
  }
  absl::StatusOr<RecordHeader> decoded = DecodeRecordHeader(header);
  OPENSSL_cleanse(header.data(), header.size());
  if (!decoded.ok()) {
    // Authentic but not a header this build reads: a writer's bug, never served.
    return absl::DataLossError(
        absl::StrCat("sealed record header unreadable: ", decoded.status().message()));
  }
  opened.header = *std::move(decoded);
  opened.header.block.tenant = std::string(tenant);
  std::memcpy(opened.body_tag.data(), head.data() + kHeaderOffset + header_bytes + kSealTagBytes,
              kSealTagBytes);
  return opened;
}

absl::Status RecordSealer::OpenBody(const OpenedHead& head, const BlockRecordIdentity& expected,
                                    absl::Span<const SealPiece> body) const {
  absl::StatusOr<TierKeyring::TenantKeys> keys =
      keyring_->TenantKeysFor(head.key_id, head.header.block.tenant);
  if (!keys.ok()) return DoesNotOpen(absl::StrCat("no key with id ", head.key_id));
  char preamble[kPreambleBytes];
  StoreLe(preamble, kSealedRecordMagic, 8);
  StoreLe(preamble + 8, head.key_id, 4);
  std::memcpy(preamble + kNonceOffset, head.nonce.data(), kSealNonceBytes);
  std::array<uint8_t, kSealTagBytes> tag = head.body_tag;
  if (!Gcm(false, keys->seal, NonceOf(head.nonce.data(), kBodyPart).data(),
           {absl::string_view(preamble, kPreambleBytes), pool_aad_, BodyAad(expected)}, body,
           tag.data())) {
    return DoesNotOpen("its bytes fail authentication (another block, or changed)");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::array<uint8_t, 16>> RecordSealer::NameDigest(uint32_t key_id,
                                                                 absl::string_view tenant,
                                                                 absl::string_view bytes) const {
  ASSIGN_OR_RETURN(const TierKeyring::TenantKeys keys, keyring_->TenantKeysFor(key_id, tenant));
  uint8_t mac[EVP_MAX_MD_SIZE];
  size_t length = 0;
  EVP_MAC_CTX* ctx = HmacContextFor(keys.name);
  if (ctx == nullptr || EVP_MAC_init(ctx, nullptr, 0, nullptr) != 1 ||
      EVP_MAC_update(ctx, reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size()) != 1 ||
      EVP_MAC_final(ctx, mac, &length, sizeof(mac)) != 1 || length < 16) {
    return absl::InternalError("HMAC-SHA-256 failed (OpenSSL)");
  }
  std::array<uint8_t, 16> digest;
  std::copy(mac, mac + 16, digest.begin());
  return digest;
}

}  // namespace kvcache
