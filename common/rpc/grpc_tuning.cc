#include "common/rpc/grpc_tuning.h"

#include <grpc/grpc.h>
#include <stdlib.h>

#include <string>

#include "absl/strings/string_view.h"

namespace kvcache {
namespace {

// Sets `variable` to `value` unless it is set; whether it now holds `value`.
bool SetUnlessChosen(const char* variable, absl::string_view value) {
  const char* chosen = getenv(variable);
  if (chosen != nullptr && chosen[0] != '\0') return chosen == value;
  return setenv(variable, std::string(value).c_str(), /*overwrite=*/0) == 0;
}

}  // namespace

bool TuneGrpcForBlockStreams() {
  // Set before asking whether gRPC started: asking runs gRPC's first setup, which reads
  // GRPC_EXPERIMENTS.
  const bool poll = SetUnlessChosen("GRPC_POLL_STRATEGY", "poll");
  const bool whole_reads = SetUnlessChosen("GRPC_EXPERIMENTS", "-tcp_read_chunks");
  return poll && whole_reads && !grpc_is_initialized();
}

}  // namespace kvcache
