// Where the daemon listens unless told otherwise, so the daemon, the demo and other clients agree:
// unix://$XDG_RUNTIME_DIR/kvcache/kv.sock, else unix:///tmp/kvcache-$UID/kv.sock.
#ifndef KVCACHE_COMMON_RPC_LISTEN_ADDRESS_H_
#define KVCACHE_COMMON_RPC_LISTEN_ADDRESS_H_

#include <unistd.h>

#include <cstdlib>
#include <string>

#include "absl/strings/str_cat.h"

namespace kvcache {

inline std::string DefaultListenAddress() {
  const char* runtime_dir = std::getenv("XDG_RUNTIME_DIR");
  if (runtime_dir != nullptr && runtime_dir[0] != '\0') {
    return absl::StrCat("unix://", runtime_dir, "/kvcache/kv.sock");
  }
  return absl::StrCat("unix:///tmp/kvcache-", getuid(), "/kv.sock");
}

}  // namespace kvcache

#endif  // KVCACHE_COMMON_RPC_LISTEN_ADDRESS_H_
