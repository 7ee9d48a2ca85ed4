#include "common/command_line.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace kvcache {
namespace {

// Flags are defined only in the binaries' main files and in the *_flags.cc files that several
// binaries share (the path is the definition's __FILE__).
bool DefinedInOurFlagFile(absl::string_view path) {
  return absl::EndsWith(path, "_main.cc") || absl::EndsWith(path, "_flags.cc");
}

}  // namespace

std::vector<char*> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = DefinedInOurFlagFile;
  config.contains_helpshort_flags = DefinedInOurFlagFile;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace kvcache
