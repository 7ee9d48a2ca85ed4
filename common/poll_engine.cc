#include "common/poll_engine.h"

#include <stdlib.h>

#include <grpc/grpc.h>

#include "absl/strings/string_view.h"

namespace kvcache {

bool UsePollEngineForBlockStreams() {
  constexpr char kVariable[] = "GRPC_POLL_STRATEGY";  // read by grpc_init
  if (const char* chosen = getenv(kVariable); chosen != nullptr && chosen[0] != '\0') {
    return !grpc_is_initialized() && absl::string_view(chosen) == "poll";
  }
  if (grpc_is_initialized()) return false;
  return setenv(kVariable, "poll", /*overwrite=*/0) == 0;
}

}  // namespace kvcache
