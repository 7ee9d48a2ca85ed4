#include "common/secret_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace kvcache {
namespace {

absl::Status OpenError(const std::string& path, int error) {
  const std::string message = absl::StrFormat("cannot read %s: %s", path, std::strerror(error));
  if (error == ENOENT) return absl::NotFoundError(message);
  if (error == EACCES) return absl::PermissionDeniedError(message);
  return absl::InvalidArgumentError(message);
}

}  // namespace

absl::Status CheckSecretFileAccess(const std::string& path, mode_t mode, uid_t owner,
                                   uid_t reader) {
  const mode_t permissions = mode & 0777;
  if (owner != reader && owner != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s belongs to uid %d, not to this process (uid %d) nor root: a secret's file must be "
        "its reader's own",
        path, owner, reader));
  }
  // The owner's own file: owner-only. Root's: its group may read it too (a Secret under fsGroup).
  const mode_t others = owner == reader ? 0077 : 0037;
  if ((permissions & others) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is open to others (mode %04o): make it owner-only (chmod 600)%s", path, permissions,
        owner == reader ? "" : ", or root's and readable by its group only (0440 or 0640)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadSecretFile(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return OpenError(path, errno);
  // Checked on the open file: what is read is what was checked (a Secret's path is a symlink).
  struct stat info;
  absl::Status usable;
  if (fstat(fd, &info) != 0) {
    usable = OpenError(path, errno);
  } else if (!S_ISREG(info.st_mode)) {
    usable = absl::FailedPreconditionError(absl::StrFormat("%s is not a regular file", path));
  } else {
    usable = CheckSecretFileAccess(path, info.st_mode, info.st_uid, geteuid());
  }
  std::string contents;
  char buffer[4096];
  while (usable.ok()) {
    const ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) usable = OpenError(path, errno);
    if (n <= 0) break;
    contents.append(buffer, static_cast<size_t>(n));
  }
  close(fd);
  if (!usable.ok()) return usable;
  return contents;
}

}  // namespace kvcache
