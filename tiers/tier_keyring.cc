#include "tiers/tier_keyring.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/secret_file.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

constexpr absl::string_view kSalt = "kvcache tier keys v1";
constexpr absl::string_view kTenantInfo{"tenant\0", 7};
constexpr absl::string_view kNamesInfo = "tenant names";

absl::Status LineError(int line, absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("tier key file line ", line, ": ", what));
}

int HexDigit(char c) {
  const char lower = absl::ascii_tolower(c);
  if (lower >= '0' && lower <= '9') return lower - '0';
  if (lower >= 'a' && lower <= 'f') return lower - 'a' + 10;
  return -1;
}

// HKDF-SHA-256 of `key` with kSalt and `info` into out[0, size). False when OpenSSL fails.
bool Hkdf(const TierKeyBytes& key, absl::string_view info, uint8_t* out, size_t size) {
  EVP_PKEY_CTX* ctx = EVP_PKEY_CTX_new_id(EVP_PKEY_HKDF, nullptr);
  size_t length = size;
  const bool ok =
      ctx != nullptr && EVP_PKEY_derive_init(ctx) > 0 &&
      EVP_PKEY_CTX_set_hkdf_md(ctx, EVP_sha256()) > 0 &&
      EVP_PKEY_CTX_set1_hkdf_salt(ctx, reinterpret_cast<const unsigned char*>(kSalt.data()),
                                  static_cast<int>(kSalt.size())) > 0 &&
      EVP_PKEY_CTX_set1_hkdf_key(ctx, key.data(), static_cast<int>(key.size())) > 0 &&
      EVP_PKEY_CTX_add1_hkdf_info(ctx, reinterpret_cast<const unsigned char*>(info.data()),
                                  static_cast<int>(info.size())) > 0 &&
      EVP_PKEY_derive(ctx, out, &length) > 0 && length == size;
  EVP_PKEY_CTX_free(ctx);
  return ok;
}

absl::Status CheckKeys(const std::vector<TierMasterKey>& keys) {
  if (keys.empty()) return absl::InvalidArgumentError("a tier keyring needs at least one key");
  absl::flat_hash_set<uint32_t> ids;
  for (const TierMasterKey& key : keys) {
    if (key.id == 0) return absl::InvalidArgumentError("tier key id 0 (ids start at 1)");
    if (!ids.insert(key.id).second) {
      return absl::InvalidArgumentError(absl::StrCat("tier key id ", key.id, " listed twice"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<TierMasterKey>> ParseTierKeyFile(absl::string_view text) {
  std::vector<TierMasterKey> keys;
  absl::flat_hash_set<uint32_t> ids;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line.substr(0, line.find('#')));
    if (line.empty()) continue;
    const size_t colon = line.find(':');
    if (colon == absl::string_view::npos) return LineError(line_number, "not ID:HEX");
    TierMasterKey key;
    uint64_t id = 0;
    if (!absl::SimpleAtoi(line.substr(0, colon), &id) || id == 0 || id > UINT32_MAX) {
      return LineError(line_number, "the ID is a number from 1 to 4294967295");
    }
    key.id = static_cast<uint32_t>(id);
    const absl::string_view hex = line.substr(colon + 1);
    if (hex.size() != 2 * kTierKeyBytes) {
      return LineError(line_number, absl::StrCat("the key is ", 2 * kTierKeyBytes,
                                                 " hex digits (32 bytes; openssl rand -hex 32)"));
    }
    for (size_t i = 0; i < kTierKeyBytes; ++i) {
      const int high = HexDigit(hex[2 * i]), low = HexDigit(hex[2 * i + 1]);
      if (high < 0 || low < 0) return LineError(line_number, "the key has a non-hex digit");
      key.bytes[i] = static_cast<uint8_t>(high * 16 + low);
    }
    if (!ids.insert(key.id).second) {
      return LineError(line_number, absl::StrCat("key id ", key.id, " is listed twice"));
    }
    keys.push_back(key);
    OPENSSL_cleanse(&key, sizeof(key));
  }
  if (keys.empty()) return absl::InvalidArgumentError("tier key file: no key (want ID:HEX lines)");
  return keys;
}

absl::StatusOr<std::shared_ptr<TierKeyring>> TierKeyring::Load(const std::string& path) {
  std::shared_ptr<TierKeyring> keyring(new TierKeyring(path));
  RETURN_IF_ERROR(keyring->Reload());
  return keyring;
}

absl::StatusOr<std::shared_ptr<TierKeyring>> TierKeyring::FromKeys(
    std::vector<TierMasterKey> keys) {
  std::shared_ptr<TierKeyring> keyring(new TierKeyring(""));
  RETURN_IF_ERROR(keyring->Install(std::move(keys)));
  return keyring;
}

TierKeyring::~TierKeyring() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, master] : masters_) OPENSSL_cleanse(&master, sizeof(master));
  for (auto& [id, keys] : tenants_) OPENSSL_cleanse(&keys, sizeof(keys));
}

absl::Status TierKeyring::Reload() {
  if (path_.empty()) return absl::FailedPreconditionError("this tier keyring has no key file");
  absl::StatusOr<std::string> text = ReadSecretFile(path_);
  if (!text.ok()) {
    return absl::Status(text.status().code(),
                        absl::StrCat("--tier_key_file: ", text.status().message()));
  }
  absl::StatusOr<std::vector<TierMasterKey>> keys = ParseTierKeyFile(*text);
  OPENSSL_cleanse(text->data(), text->size());
  if (!keys.ok()) {
    return absl::Status(keys.status().code(), absl::StrCat(path_, ": ", keys.status().message()));
  }
  return Install(*std::move(keys));
}

absl::Status TierKeyring::Install(std::vector<TierMasterKey> keys) {
  RETURN_IF_ERROR(CheckKeys(keys));
  absl::flat_hash_map<uint32_t, Master> masters;
  std::vector<uint32_t> ids;
  for (const TierMasterKey& key : keys) {
    Master& master = masters[key.id];
    master.bytes = key.bytes;
    if (!Hkdf(key.bytes, kNamesInfo, master.names.data(), master.names.size())) {
      return absl::InternalError("HKDF-SHA-256 failed (OpenSSL)");
    }
    ids.push_back(key.id);
  }
  for (TierMasterKey& key : keys) OPENSSL_cleanse(&key, sizeof(key));
  absl::MutexLock lock(&mu_);
  // Keys derived from a master key that stays are still right; the others go.
  for (auto it = tenants_.begin(); it != tenants_.end();) {
    auto kept = masters.find(it->first.first);
    if (kept == masters.end() || kept->second.bytes != masters_.at(it->first.first).bytes) {
      OPENSSL_cleanse(&it->second, sizeof(it->second));
      tenants_.erase(it++);
    } else {
      ++it;
    }
  }
  for (auto& [id, master] : masters_) OPENSSL_cleanse(&master, sizeof(master));
  masters_ = std::move(masters);
  ids_ = std::move(ids);
  return absl::OkStatus();
}

uint32_t TierKeyring::sealing_key_id() const {
  absl::MutexLock lock(&mu_);
  return ids_.front();
}

std::vector<uint32_t> TierKeyring::key_ids() const {
  absl::MutexLock lock(&mu_);
  return ids_;
}

absl::StatusOr<TierKeyring::TenantKeys> TierKeyring::TenantKeysFor(uint32_t id,
                                                                   absl::string_view tenant) const {
  TierKeyBytes master;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto cached = tenants_.find(std::pair<uint32_t, std::string>(id, tenant));
    if (cached != tenants_.end()) return cached->second;
    auto found = masters_.find(id);
    if (found == masters_.end()) {
      return absl::NotFoundError(absl::StrCat("no tier key with id ", id));
    }
    master = found->second.bytes;
  }
  // Derived outside the lock: loads and stores of other tenants go on meanwhile.
  uint8_t derived[2 * kTierKeyBytes];
  const std::string info = absl::StrCat(kTenantInfo, tenant);
  const bool ok = Hkdf(master, info, derived, sizeof(derived));
  TenantKeys keys;
  std::copy(derived, derived + kTierKeyBytes, keys.seal.begin());
  std::copy(derived + kTierKeyBytes, derived + 2 * kTierKeyBytes, keys.name.begin());
  OPENSSL_cleanse(derived, sizeof(derived));
  if (!ok) {
    OPENSSL_cleanse(master.data(), master.size());
    return absl::InternalError("HKDF-SHA-256 failed (OpenSSL)");
  }
  absl::MutexLock lock(&mu_);
  // Kept only while the master key is still the one it came from (a reload may have raced).
  auto found = masters_.find(id);
  if (found != masters_.end() && found->second.bytes == master) {
    if (tenants_.size() >= kMaxCachedTenants) tenants_.clear();
    tenants_.emplace(std::pair<uint32_t, std::string>(id, tenant), keys);
  }
  OPENSSL_cleanse(master.data(), master.size());
  return keys;
}

absl::StatusOr<TierKeyBytes> TierKeyring::NamesKey(uint32_t id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto found = masters_.find(id);
  if (found == masters_.end()) return absl::NotFoundError(absl::StrCat("no tier key with id ", id));
  return found->second.names;
}

}  // namespace kvcache
