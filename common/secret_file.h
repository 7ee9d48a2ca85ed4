// Files holding a secret (the cluster tier's Redis password): read only when no one but their
// owner can read them, the rule OpenSSH and PostgreSQL apply to their keys. A file the reader
// owns must be owner-only (no group or world bits); a file root owns may also be readable by its
// group, as kubelet lays out a Secret's files under a pod's fsGroup (root's, group fsGroup,
// 0440); a file of any other owner, or with any world bit, is refused.
//
// Thread safety: thread-safe (no shared state).
#ifndef KVCACHE_COMMON_SECRET_FILE_H_
#define KVCACHE_COMMON_SECRET_FILE_H_

#include <sys/types.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvcache {

// Whether a file of `mode` owned by `owner` may hold a secret for `reader` (by the rule above):
// OK, or FAILED_PRECONDITION saying what is wrong with `path` and how to mend it.
absl::Status CheckSecretFileAccess(const std::string& path, mode_t mode, uid_t owner, uid_t reader);

// The contents of `path`, a regular file this process's effective uid may keep a secret in.
// NOT_FOUND or PERMISSION_DENIED when it cannot be opened, FAILED_PRECONDITION when it is not a
// regular file or others can read it, INVALID_ARGUMENT for other read errors. Messages name the
// path, never anything of the contents.
absl::StatusOr<std::string> ReadSecretFile(const std::string& path);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_SECRET_FILE_H_
