// ReadFileToString: the whole of a small file (a PEM file, a token file), for the client's
// options. Thread safety: thread-safe (no shared state).
#ifndef KVCACHE_CLIENT_READ_FILE_H_
#define KVCACHE_CLIENT_READ_FILE_H_

#include <string>

#include "absl/status/statusor.h"

namespace kvcache {

// The bytes of `path`. INVALID_ARGUMENT naming the path and the system's reason (never any of
// the contents: the file may hold a secret) when it cannot be opened or read, or is not a
// regular file.
absl::StatusOr<std::string> ReadFileToString(const std::string& path);

}  // namespace kvcache

#endif  // KVCACHE_CLIENT_READ_FILE_H_
