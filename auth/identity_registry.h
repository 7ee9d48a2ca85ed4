// IdentityRegistry: turns an authenticated credential into an Identity, by the identity file
// (auth/identity_file.h) or, when the daemon runs without one, by the default that keeps the
// README's two commands: every caller the transport admits (a Unix-socket peer, which
// the owner-only socket limits to the daemon's uid; a TLS or --insecure TCP peer) is tenant
// "default", role worker.
// Install swaps the file in whole (SIGHUP reload): calls resolved afterwards see the new file;
// sessions opened before keep their tenant and principal.
//
// Error codes: UNAUTHENTICATED for a credential the file does not map. Messages name what was
// presented only when it is not a secret (a uid, a certificate's names; never a token).
//
// Thread safety: thread-safe.
#ifndef KVCACHE_AUTH_IDENTITY_REGISTRY_H_
#define KVCACHE_AUTH_IDENTITY_REGISTRY_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "auth/identity.h"
#include "auth/identity_file.h"

namespace kvcache {

inline constexpr absl::string_view kDefaultTenant = "default";

class IdentityRegistry {
 public:
  // Without a file until Install: the default identity for every Unix-socket peer.
  IdentityRegistry() = default;

  void Install(IdentityFile file);
  bool has_file() const;

  // By uid, then primary gid, then `uid *`.
  absl::StatusOr<Identity> ForUnixPeer(uid_t uid, gid_t gid) const;
  // `token` as sent after "Bearer ". Its SHA-256 is compared with every listed digest in
  // constant time, all of them, whatever matches.
  absl::StatusOr<Identity> ForToken(absl::string_view token) const;
  // The first of a verified client certificate's names (CN first, then SANs) that the file maps;
  // without a file, the default identity.
  absl::StatusOr<Identity> ForCertificate(const std::vector<std::string>& names) const;
  // A TCP peer with no credential (TLS without a client certificate, or plaintext under
  // --insecure): the default identity without a file; UNAUTHENTICATED with one.
  absl::StatusOr<Identity> ForAnonymousPeer(absl::string_view peer) const;

 private:
  std::shared_ptr<const IdentityFile> file() const;

  mutable absl::Mutex mu_;
  std::shared_ptr<const IdentityFile> file_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_AUTH_IDENTITY_REGISTRY_H_
