// ParseCommandLineFlags: the command-line parsing every kvcache binary shares.
//
// Abseil's --help lists only the flags defined in a file named after the program
// (kvcache-manager.cc, kvcache-manager_main.cc); ours live in manager_main.cc, worker_main.cc and
// so on, so --help printed "No flags matched". This makes --help and --helpshort list the flags
// defined in any *_main.cc file, and in any *_flags.cc file (flags several binaries share, such
// as client/client_flags.cc's), with their defaults (--helpfull still lists Abseil's own too).
// --version prints "NAME VERSION (REVISION)" (common/version.h) and exits 0.
//
// Thread safety: call once, first thing in main(), before any other thread exists.
#ifndef KVCACHE_COMMON_COMMAND_LINE_H_
#define KVCACHE_COMMON_COMMAND_LINE_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace kvcache {

// Sets the usage message, parses argv (exiting on a bad flag or after --help, as
// absl::ParseCommandLine does) and returns the positional arguments, argv[0] first.
// The program's name as invoked: argv[0] without its directory ("kvcache-manager").
std::string ProgramName(absl::string_view argv0);

std::vector<char*> ParseCommandLineFlags(int argc, char** argv, absl::string_view usage);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_COMMAND_LINE_H_
