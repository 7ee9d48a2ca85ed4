// Authenticator: who is calling (auth/identity.h), from what the transport proved and what the
// call carries — never from a request body. In order:
//   1. a bearer token in the `authorization` metadata ("Bearer <token>"), wherever it comes from;
//   2. a client certificate that TLS verified against --tls_client_ca (its CN, then its SANs);
//   3. a Unix-socket peer's uid and gid, from SO_PEERCRED at accept (server/unix_listener.h);
//   4. any other TCP peer (TLS without a client certificate, or plaintext with --insecure): the
//      default identity without an identity file, refused with one.
// Then Permit checks the identity's role against what a method needs.
//
// Error codes: UNAUTHENTICATED for no credential or one the identity file does not map (the
// message says what is missing, never the token); PERMISSION_DENIED from Permit and TenantFor.
//
// Thread safety: thread-safe.
#ifndef KVCACHE_SERVER_AUTHENTICATOR_H_
#define KVCACHE_SERVER_AUTHENTICATOR_H_

#include <grpcpp/server_context.h>

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "auth/identity.h"
#include "auth/identity_registry.h"
#include "server/unix_listener.h"

namespace kvcache {

class Authenticator {
 public:
  // Both must outlive the authenticator; `unix_listener` may be null (a TCP daemon).
  Authenticator(const IdentityRegistry* identities, const UnixListener* unix_listener)
      : identities_(identities), unix_listener_(unix_listener) {}

  absl::StatusOr<Identity> Authenticate(const grpc::ServerContextBase& context) const;

 private:
  const IdentityRegistry* const identities_;
  const UnixListener* const unix_listener_;
};

// PERMISSION_DENIED unless `caller`'s role reaches `needed` (reader < worker < admin).
absl::Status Permit(const Identity& caller, Role needed, absl::string_view method);

// The tenant a request acts in: the caller's own when `requested` is empty or names it; another
// only for an admin (PERMISSION_DENIED otherwise). INVALID_ARGUMENT for a name longer than any
// tenant's (kMaxTenantBytes), whoever asks.
absl::StatusOr<std::string> TenantFor(const Identity& caller, absl::string_view requested);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_AUTHENTICATOR_H_
