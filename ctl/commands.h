// kvcachectl's commands: each validates its input, connects, makes its calls and prints the
// answer as a table or JSON (ctl/format.h). The binary (kvcachectl_main.cc) only turns flags
// into these options.
//
// Exit codes (kExit*; `kvcachectl --help` lists them): a daemon's error is one stderr line
// "kvcachectl: <command>: <CODE>: <message>".
//
// Thread safety: RunCommand may run on any thread; `events` starts one thread of its own per
// stream, joined before it returns.
#ifndef KVCACHE_CTL_COMMANDS_H_
#define KVCACHE_CTL_COMMANDS_H_

#include <atomic>
#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/kv_cache_client.h"

namespace kvcache::ctl {

inline constexpr int kExitOk = 0;
inline constexpr int kExitDaemonError = 1;  // the daemon answered an error
inline constexpr int kExitUsage = 2;        // unknown command, bad flag value, unreadable input
inline constexpr int kExitUnreachable = 3;  // no daemon answered at the target in time
inline constexpr int kExitNotServing = 4;   // health: NOT_SERVING, or an unknown service

// A command, and the command-specific flags it reads (without "--"). A command given a flag of
// another command's is a usage error rather than silently ignored.
struct CommandSpec {
  absl::string_view name;
  absl::string_view args;  // for the usage text: "[--pool P] [--tenant T]"
  absl::string_view summary;
  std::vector<absl::string_view> flags;
};
absl::Span<const CommandSpec> Commands();
// nullptr for an unknown command.
const CommandSpec* FindCommand(absl::string_view name);

// -o: a table for people, or the same document as JSON or YAML (ctl/yaml.h) for scripts.
enum class OutputFormat { kTable, kJson, kYaml };

struct GlobalOptions {
  std::string target;
  // Credentials and TLS (client/client_flags.h), connect_timeout and rpc_timeout (--timeout).
  ClientOptions client;
  OutputFormat output = OutputFormat::kTable;
  bool no_headers = false;  // tables without their header row (and stats without its footer)
};

// The command-specific flags; each command reads its own (CommandSpec::flags).
struct CommandOptions {
  std::string pool;
  std::string tenant;
  std::string salt;
  std::string tokens_file;  // "" or "-": standard input
  std::string service;
  uint64_t from = 0;
  uint64_t epoch = 0;
  uint64_t limit = 0;  // events: stop after this many; 0: no limit
  bool follow = false;
  // pools, stats, sessions: when positive, run again every `watch` until interrupted, or until
  // `count` runs (0: no limit).
  absl::Duration watch = absl::ZeroDuration();
  uint64_t count = 0;
  // events without --follow: exit once nothing arrives for this long (see RunEvents).
  absl::Duration idle = absl::Milliseconds(300);
  // events with --follow: first and longest pause before resuming a broken stream.
  absl::Duration min_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  // When set and true (a signal handler's flag), `events` stops as if done: it prints the
  // resume point and exits 0; a --watch stops before its next run, exit 0.
  const std::atomic<bool>* interrupted = nullptr;
};

struct Streams {
  std::ostream& out;
  std::ostream& err;
  std::istream& in;  // lookup's tokens, when no file is given
};

// Runs `command` (one of Commands()) and returns its exit code.
int RunCommand(absl::string_view command, const GlobalOptions& global,
               const CommandOptions& options, Streams streams);

// The exit code for `status` from a call (kExitOk for OK): a daemon's error is kExitDaemonError;
// a failure to connect (`connecting`) is kExitUnreachable for UNAVAILABLE or DEADLINE_EXCEEDED,
// and for a unix socket's NOT_FOUND, PERMISSION_DENIED or FAILED_PRECONDITION (ProbeUnixSocket),
// and kExitUsage for INVALID_ARGUMENT (unusable TLS files or token).
int ExitCodeFor(const absl::Status& status, bool connecting);

}  // namespace kvcache::ctl

#endif  // KVCACHE_CTL_COMMANDS_H_
