#include "auth/identity_registry.h"

#include <openssl/crypto.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace kvcache {
namespace {

Identity Of(std::string principal, const IdentityFile::Mapping& mapping) {
  return Identity{std::move(principal), mapping.tenant, mapping.role};
}

}  // namespace

void IdentityRegistry::Install(IdentityFile file) {
  auto installed = std::make_shared<const IdentityFile>(std::move(file));
  absl::MutexLock lock(&mu_);
  file_ = std::move(installed);
}

std::shared_ptr<const IdentityFile> IdentityRegistry::file() const {
  absl::ReaderMutexLock lock(&mu_);
  return file_;
}

bool IdentityRegistry::has_file() const { return file() != nullptr; }

absl::StatusOr<Identity> IdentityRegistry::ForUnixPeer(uid_t uid, gid_t gid) const {
  std::string principal = absl::StrCat("uid:", uid);
  const std::shared_ptr<const IdentityFile> file = this->file();
  if (file == nullptr) {
    return Identity{std::move(principal), std::string(kDefaultTenant), Role::kWorker};
  }
  if (auto it = file->uids.find(uid); it != file->uids.end()) {
    return Of(std::move(principal), it->second);
  }
  if (auto it = file->gids.find(gid); it != file->gids.end()) {
    return Of(std::move(principal), it->second);
  }
  if (file->any_uid.has_value()) return Of(std::move(principal), *file->any_uid);
  return absl::UnauthenticatedError(absl::StrCat(
      "uid ", uid, " (gid ", gid, ") is not in the identity file and sent no bearer token"));
}

absl::StatusOr<Identity> IdentityRegistry::ForToken(absl::string_view token) const {
  const std::shared_ptr<const IdentityFile> file = this->file();
  const Sha256Digest digest = Sha256Of(token);
  const TokenEntry* match = nullptr;
  if (file != nullptr) {
    for (const TokenEntry& entry : file->tokens) {
      // No early exit: the time taken does not depend on which entry, if any, matches.
      const bool equal = CRYPTO_memcmp(entry.digest.data(), digest.data(), digest.size()) == 0;
      match = equal ? &entry : match;
    }
  }
  if (match == nullptr) return absl::UnauthenticatedError("bearer token not recognized");
  return Identity{absl::StrCat("token:", match->name), match->tenant, match->role};
}

absl::StatusOr<Identity> IdentityRegistry::ForCertificate(
    const std::vector<std::string>& names) const {
  const std::shared_ptr<const IdentityFile> file = this->file();
  if (file == nullptr) {
    return Identity{absl::StrCat("cert:", names.empty() ? "" : names.front()),
                    std::string(kDefaultTenant), Role::kWorker};
  }
  for (const std::string& name : names) {
    if (auto it = file->subjects.find(name); it != file->subjects.end()) {
      return Of(absl::StrCat("cert:", name), it->second);
    }
  }
  return absl::UnauthenticatedError(absl::StrCat("client certificate (", absl::StrJoin(names, ", "),
                                                 ") is not in the identity file"));
}

absl::StatusOr<Identity> IdentityRegistry::ForAnonymousPeer(absl::string_view peer) const {
  if (file() == nullptr) {
    return Identity{absl::StrCat("tcp:", peer), std::string(kDefaultTenant), Role::kWorker};
  }
  return absl::UnauthenticatedError(
      "no credential: send a bearer token (authorization metadata) or a client certificate");
}

}  // namespace kvcache
