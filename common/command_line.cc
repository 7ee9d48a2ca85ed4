#include "common/command_line.h"

#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/version.h"

namespace kvcache {
namespace {

// Flags are defined only in the binaries' main files and in the *_flags.cc files that several
// binaries share (the path is the definition's __FILE__).
bool DefinedInOurFlagFile(absl::string_view path) {
  return absl::EndsWith(path, "_main.cc") || absl::EndsWith(path, "_flags.cc");
}

}  // namespace

std::string ProgramName(absl::string_view argv0) {
  const size_t slash = argv0.rfind('/');
  return std::string(slash == absl::string_view::npos ? argv0 : argv0.substr(slash + 1));
}

std::vector<char*> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage) {
  absl::FlagsUsageConfig config;
  config.contains_help_flags = DefinedInOurFlagFile;
  config.contains_helpshort_flags = DefinedInOurFlagFile;
  // --version: "kvcache-manager 0.1.0 (a3b2f13)" instead of Abseil's build-mode line.
  const std::string program = argc > 0 ? ProgramName(argv[0]) : "kvcache";
  config.version_string = [program] { return absl::StrCat(VersionLine(program), "\n"); };
  absl::SetFlagsUsageConfig(config);
  absl::SetProgramUsageMessage(usage);
  return absl::ParseCommandLine(argc, argv);
}

}  // namespace kvcache
