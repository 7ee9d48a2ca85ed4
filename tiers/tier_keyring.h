// TierKeyring: the master keys that seal the records the lower tiers write outside the daemon's
// memory — the disk tier's file, the cluster tier's Redis values (tiers/record_seal.h) — and the
// keys derived from them. One keyring serves every pool of a daemon (--tier_key_file).
//
// The key file (docs/security.md, "Sealed tiers"): one master key per line, newest first,
//
//   ID:HEX      # ID a decimal number 1 to 4294967295; HEX 64 hex digits, the key's 32 bytes
//
// '#' starts a comment; blank lines are ignored; each ID at most once. The first key seals every
// new record; every key listed opens the records sealed with it (a record names its key's ID).
// Rotation: add a new key on top and send SIGHUP; remove the old line once its records no longer
// matter. The file is a secret: read through ReadSecretFile (common/secret_file.h), owner-only or
// refused, and neither the keys nor anything derived from them is ever logged or written.
//
// Derived keys: HKDF-SHA-256 (RFC 5869), the master key as input keying material, the salt
// "kvcache tier keys v1", and as info:
//   "tenant" 0x00 NAME  -> 64 bytes: the tenant's AES-256-GCM key (bytes 0-31) and the HMAC-SHA-256
//                          key that names its values in the cluster (bytes 32-63);
//   "tenant names"      -> 32 bytes: the AES-256-GCM key of the tenant-name box of every record,
//                          which lets a restart learn whose key opens a disk record.
// Derived keys are kept in memory per (key ID, tenant), at most kMaxCachedTenants of them.
//
// Thread safety: thread-safe. Install and Reload swap the keys under a mutex; the derived keys of
// removed master keys go with them.
#ifndef KVCACHE_TIERS_TIER_KEYRING_H_
#define KVCACHE_TIERS_TIER_KEYRING_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kvcache {

inline constexpr size_t kTierKeyBytes = 32;  // AES-256
using TierKeyBytes = std::array<uint8_t, kTierKeyBytes>;

struct TierMasterKey {
  uint32_t id = 0;
  TierKeyBytes bytes{};
};

// The keys of a key file's text, in the file's order (newest first). INVALID_ARGUMENT naming the
// line and what is wrong with it (never echoing key material): a line that is not ID:HEX, an ID
// of 0 or past 2^32 - 1, HEX of another length than 64 or not hex, an ID listed twice, no key.
absl::StatusOr<std::vector<TierMasterKey>> ParseTierKeyFile(absl::string_view text);

class TierKeyring {
 public:
  // The keyring of the key file at `path`: ReadSecretFile's errors (NOT_FOUND, PERMISSION_DENIED,
  // FAILED_PRECONDITION for a file others may read), or ParseTierKeyFile's, each naming the path.
  static absl::StatusOr<std::shared_ptr<TierKeyring>> Load(const std::string& path);
  // A keyring of `keys` (tests, benches); INVALID_ARGUMENT without a key or with an ID twice.
  static absl::StatusOr<std::shared_ptr<TierKeyring>> FromKeys(std::vector<TierMasterKey> keys);

  ~TierKeyring();
  TierKeyring(const TierKeyring&) = delete;
  TierKeyring& operator=(const TierKeyring&) = delete;

  // Rereads the file Load read (SIGHUP). On any error the keys stay as they were.
  absl::Status Reload() ABSL_LOCKS_EXCLUDED(mu_);
  // Replaces the keys (newest first). INVALID_ARGUMENT as FromKeys; the keys stay then.
  absl::Status Install(std::vector<TierMasterKey> keys) ABSL_LOCKS_EXCLUDED(mu_);

  const std::string& path() const { return path_; }
  // The ID of the key that seals new records: the first.
  uint32_t sealing_key_id() const ABSL_LOCKS_EXCLUDED(mu_);
  // Every key's ID, newest first.
  std::vector<uint32_t> key_ids() const ABSL_LOCKS_EXCLUDED(mu_);

  struct TenantKeys {
    TierKeyBytes seal;  // AES-256-GCM: the tenant's records
    TierKeyBytes name;  // HMAC-SHA-256: the names of the tenant's cluster values
  };
  // The tenant's keys under master key `id`, derived on first use. NOT_FOUND when the keyring
  // holds no key `id`.
  absl::StatusOr<TenantKeys> TenantKeysFor(uint32_t id, absl::string_view tenant) const
      ABSL_LOCKS_EXCLUDED(mu_);
  // The key of the tenant-name box under master key `id`. NOT_FOUND as TenantKeysFor.
  absl::StatusOr<TierKeyBytes> NamesKey(uint32_t id) const ABSL_LOCKS_EXCLUDED(mu_);

  // Derived keys kept in memory; past this many the cache starts over.
  static constexpr size_t kMaxCachedTenants = 4096;

 private:
  struct Master {
    TierKeyBytes bytes;
    TierKeyBytes names;  // derived at install: every record's box needs it
  };
  explicit TierKeyring(std::string path) : path_(std::move(path)) {}

  const std::string path_;  // empty: not from a file (Reload: FAILED_PRECONDITION)

  mutable absl::Mutex mu_;
  std::vector<uint32_t> ids_ ABSL_GUARDED_BY(mu_);  // newest first
  absl::flat_hash_map<uint32_t, Master> masters_ ABSL_GUARDED_BY(mu_);
  mutable absl::flat_hash_map<std::pair<uint32_t, std::string>, TenantKeys> tenants_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_TIERS_TIER_KEYRING_H_
