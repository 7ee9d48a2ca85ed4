// Identity: who is calling, as the daemon authenticated it — never what a request body says
// (DESIGN §7). The tenant scopes every block the caller can see; the role says which calls it may
// make; the principal names the credential itself, and a session may be used only by the
// principal that opened it.
#ifndef KVCACHE_AUTH_IDENTITY_H_
#define KVCACHE_AUTH_IDENTITY_H_

#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace kvcache {

enum class Role {
  kReader,  // routers and CLIs: pools, lookups and stats of its tenant; no sessions, no bytes
  kWorker,  // inference workers: everything within its tenant
  kAdmin,   // operators: everything, and may name another tenant
};

absl::string_view RoleName(Role role);
std::optional<Role> ParseRole(absl::string_view name);

struct Identity {
  // "uid:1000", "token:router-1", "cert:worker-a.example": the credential, never a secret.
  std::string principal;
  std::string tenant;
  Role role = Role::kWorker;
};

}  // namespace kvcache

#endif  // KVCACHE_AUTH_IDENTITY_H_
