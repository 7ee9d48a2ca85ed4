#include "common/command_line.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"

namespace kvcache {
namespace {

// Flags are defined only in the binaries' main files (the path is the definition's __FILE__).
bool DefinedInAMainFile(absl::string_view path) { return absl::EndsWith(path, "_main.cc"); }

}  // namespace

std::vector<char*> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = DefinedInAMainFile;
  config.contains_helpshort_flags = DefinedInAMainFile;
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace kvcache
