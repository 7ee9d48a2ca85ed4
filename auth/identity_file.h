// The daemon's identity file (--identities PATH): maps credentials to a tenant and a role, and
// sets per-tenant quotas. One entry per line; '#' starts a comment; fields are separated by
// blanks:
//
//   tenant  NAME [max_referenced_blocks=N] [max_sessions=N] [max_open_sequences=N]
//                [max_put_bytes_in_flight=SIZE]
//   uid     UID|*   TENANT ROLE     # a Unix-socket peer's uid (SO_PEERCRED); * = any other uid
//   gid     GID     TENANT ROLE     # a Unix-socket peer's primary gid, when its uid has no line
//   token   NAME sha256:HEX TENANT ROLE   # a bearer token, stored as the SHA-256 of its bytes
//   subject NAME    TENANT ROLE     # a client certificate's CN or one of its SANs (mutual TLS)
//
// ROLE is reader, worker or admin. A token's NAME only labels it (logs, principals); the token
// itself never appears in the file. SIZE takes a K/M/G suffix. A tenant with no `tenant` line
// has no limits.
#ifndef KVCACHE_AUTH_IDENTITY_FILE_H_
#define KVCACHE_AUTH_IDENTITY_FILE_H_

#include <sys/types.h>

#include <array>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "auth/identity.h"
#include "common/tenant.h"

namespace kvcache {

using Sha256Digest = std::array<uint8_t, 32>;

struct TokenEntry {
  std::string name;
  Sha256Digest digest;
  std::string tenant;
  Role role;
};

struct IdentityFile {
  struct Mapping {
    std::string tenant;
    Role role;
  };
  absl::flat_hash_map<uid_t, Mapping> uids;
  std::optional<Mapping> any_uid;
  absl::flat_hash_map<gid_t, Mapping> gids;
  std::vector<TokenEntry> tokens;
  absl::flat_hash_map<std::string, Mapping> subjects;
  absl::flat_hash_map<std::string, TenantLimits> limits;
};

// INVALID_ARGUMENT naming the line and what is wrong with it (never echoing a digest).
absl::StatusOr<IdentityFile> ParseIdentityFile(absl::string_view text);
// NOT_FOUND / PERMISSION_DENIED when the file cannot be read, else as ParseIdentityFile.
absl::StatusOr<IdentityFile> LoadIdentityFile(const std::string& path);

Sha256Digest Sha256Of(absl::string_view bytes);
// "sha256:HEX" of `token`: how a token line of the file names it.
std::string TokenDigestText(absl::string_view token);

}  // namespace kvcache

#endif  // KVCACHE_AUTH_IDENTITY_FILE_H_
