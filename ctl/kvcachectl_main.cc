// kvcachectl: the operator's command line for a running kvcache daemon (pools, stats, sessions,
// lookup, events, health, version). Commands and output are in ctl/commands.h and ctl/format.h;
// this file defines the flags, the help text, and turns flag mistakes into exit code 2 (Abseil's
// parser exits 1, which kvcachectl reserves for the daemon's errors). It also reads kubectl's
// short forms, which Abseil's flags do not have: "-o yaml" for --output, and "--watch" with an
// optional number of seconds after it.
#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/time.h"
#include "client/client_flags.h"
#include "common/command_line.h"
#include "common/rpc/listen_address.h"
#include "common/version.h"
#include "ctl/commands.h"
#include "ctl/completion.h"

// Global flags.
ABSL_FLAG(
    std::string, target, "",
    "daemon address: unix:///path/kv.sock or HOST:PORT; default: the daemon's default "
    "socket (unix://$XDG_RUNTIME_DIR/kvcache/kv.sock, else unix:///tmp/kvcache-$UID/kv.sock)");
ABSL_FLAG(bool, json, false, "the same as -o json");
ABSL_FLAG(std::string, output, "table",
          "-o: table, json or yaml. json: one document per command, and for events one object "
          "per line (JSON Lines); yaml: the same document as YAML, each event a \"---\" "
          "document (default: table)");
ABSL_FLAG(bool, no_headers, false,
          "tables without their header row (stats: without the open sessions line too)");
ABSL_FLAG(absl::Duration, timeout, absl::Seconds(5),
          "how long to wait for the daemon: to connect, and for each call");
// Command flags (each command reads its own; see Commands()).
ABSL_FLAG(std::string, pool, "",
          "pool name (lookup, describe: required; stats, events: empty for all)");
ABSL_FLAG(std::string, tenant, "",
          "tenant to report on; empty: the tenant of this caller's identity (an admin's: every "
          "tenant). Another tenant needs an admin identity");
ABSL_FLAG(std::string, salt, "", "lookup: the cache salt the prompt was stored with");
ABSL_FLAG(std::string, tokens_file, "",
          "lookup: file of decimal token ids separated by whitespace or commas; empty or \"-\": "
          "standard input");
ABSL_FLAG(uint64_t, from, 0,
          "events: first sequence wanted, e.g. the N of a previous run's \"resume with --from N "
          "--epoch E\"; 0: everything the daemon still holds");
ABSL_FLAG(uint64_t, epoch, 0,
          "events: the daemon epoch --from was counted in (a restarted daemon then sends a "
          "snapshot); 0: the daemon's current one");
ABSL_FLAG(bool, follow, false,
          "events: keep streaming; resume a broken stream (daemon restart, network) where it "
          "left off");
ABSL_FLAG(uint64_t, limit, 0, "events: stop after this many events; 0: no limit");
ABSL_FLAG(absl::Duration, watch, absl::ZeroDuration(),
          "run again every interval until ^C: --watch (2 s), --watch 5, --watch=500ms; empty: "
          "run once");
ABSL_FLAG(uint64_t, count, 0, "with --watch: stop after this many runs; 0: no limit");
ABSL_FLAG(std::string, service, "",
          "health: the service to check; \"\" is the whole daemon, \"kvcache.v1.KvCache\" its API");

namespace kvcache::ctl {
namespace {

constexpr char kProgram[] = "kvcachectl";
constexpr size_t kHelpWidth = 100;

// Set by SIGINT / SIGTERM while `events` runs, so it can print its resume point before exiting.
std::atomic<bool> interrupted{false};
void OnSignal(int) { interrupted.store(true, std::memory_order_relaxed); }

constexpr const char* kGlobalFlags[] = {"target",          "output",  "no_headers", "json",
                                        "timeout",         "tls",     "tls_ca",     "tls_cert",
                                        "tls_server_name", "tls_key", "token_file"};
constexpr char kDefaultWatch[] = "2s";

// argv with kubectl's short forms spelled as Abseil's flags: "-o X" and "-o=X" become
// "--output=X"; "--watch" becomes "--watch=2s", or "--watch=Ns" when a number N follows it
// (taken with it) or is its value; a flag's name may use '-' for '_' (--no-headers). Arguments
// after "--" are left alone.
std::vector<std::string> NormalizeArgs(int argc, char** argv) {
  std::vector<std::string> out;
  bool flags_done = false;
  for (int i = 0; i < argc; ++i) {
    const std::string arg = argv[i];
    absl::string_view value = arg;
    double seconds = 0;
    if (i == 0 || flags_done) {
      out.push_back(arg);
    } else if (arg == "--") {
      flags_done = true;
      out.push_back(arg);
    } else if (arg == "-o" && i + 1 < argc) {
      out.push_back(absl::StrCat("--output=", argv[++i]));
    } else if (absl::ConsumePrefix(&value, "-o=")) {
      out.push_back(absl::StrCat("--output=", value));
    } else if (arg == "--watch" || arg == "-watch") {
      if (i + 1 < argc && absl::SimpleAtod(argv[i + 1], &seconds)) {
        out.push_back(absl::StrCat("--watch=", argv[++i], "s"));
      } else {
        out.push_back(absl::StrCat("--watch=", kDefaultWatch));
      }
    } else if ((absl::ConsumePrefix(&value, "--watch=") ||
                absl::ConsumePrefix(&value, "-watch=")) &&
               absl::SimpleAtod(value, &seconds)) {
      out.push_back(absl::StrCat("--watch=", value, "s"));
    } else if (absl::StartsWith(arg, "-") && arg.size() > 1) {
      // kubectl spells flags with '-' (--no-headers), Abseil with '_' (--no_headers).
      const size_t dashes = absl::StartsWith(arg, "--") ? 2 : 1;
      const size_t name_end = std::min(arg.find('='), arg.size());
      std::string spelled = arg;
      std::replace(spelled.begin() + dashes, spelled.begin() + name_end, '-', '_');
      out.push_back(spelled);
    } else {
      out.push_back(arg);
    }
  }
  return out;
}

std::string Wrap(absl::string_view text, size_t indent) {
  std::string out;
  size_t column = 0;
  for (absl::string_view word : absl::StrSplit(text, ' ', absl::SkipEmpty())) {
    if (column > indent && column + 1 + word.size() > kHelpWidth) {
      out += "\n";
      column = 0;
    }
    if (column == 0) {
      out.append(indent, ' ');
      column = indent;
    } else {
      out += ' ';
      ++column;
    }
    absl::StrAppend(&out, word);
    column += word.size();
  }
  return out + "\n";
}

std::string FlagHelp(absl::string_view name, absl::string_view used_by) {
  const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
  if (flag == nullptr) return "";
  std::string text = flag->Help();
  // A description that says what its default means needs no "(default: ...)" after it.
  if (!absl::StrContains(text, "default") && !absl::StrContains(text, "empty:")) {
    const std::string value = flag->DefaultValue();
    absl::StrAppend(&text, " (default: ",
                    flag->IsOfType<std::string>() ? absl::StrCat("\"", value, "\"") : value, ")");
  }
  if (!used_by.empty()) absl::StrAppend(&text, " [", used_by, "]");
  return absl::StrCat("  --", name, "\n", Wrap(text, 6));
}

std::string HelpText() {
  std::string text = absl::StrCat(
      "kvcachectl: the kvcache daemon's operator command line\n\n"
      "usage: kvcachectl [flags] COMMAND [command flags]\n"
      "       kvcachectl help [COMMAND]   (or COMMAND --help): one command's flags\n"
      "       kvcachectl completion bash  bash completion: source <(kvcachectl completion bash)\n"
      "\ncommands:\n");
  for (const CommandSpec& spec : Commands()) {
    absl::StrAppend(&text, "  ", spec.name, spec.args.empty() ? "" : " ", spec.args, "\n",
                    Wrap(spec.summary, 6));
  }
  absl::StrAppend(
      &text, "\nexit codes:\n",
      "  0  ok\n"
      "  1  the daemon answered an error: one line \"kvcachectl: COMMAND: CODE: message\" on "
      "stderr\n"
      "  2  usage error: unknown command or flag, bad flag value, unreadable tokens\n"
      "  3  cannot reach the daemon, said at once where it can be told: no such socket "
      "(NOT_FOUND),\n     connection refused (UNAVAILABLE: a stale socket, a closed port), "
      "permission denied\n     (PERMISSION_DENIED), not a socket; else UNAVAILABLE or "
      "DEADLINE_EXCEEDED after --timeout\n"
      "  4  health: the service is NOT_SERVING, or the daemon does not know it\n",
      "\n--json output:\n",
      Wrap("Field names are snake_case and stable; every key is always present, null where it "
           "does not apply; counts are JSON numbers. 64-bit values that may exceed 2^53, which a "
           "JavaScript reader would round, are strings: block hashes and layout fingerprints as "
           "16 lowercase hex digits (a block hash's low 64 bits, as in vLLM's KV events), "
           "session ids as decimal.",
           2),
      "\nglobal flags:\n");
  for (const char* name : kGlobalFlags) absl::StrAppend(&text, FlagHelp(name, ""));
  absl::StrAppend(&text, "  $", kTokenEnvironmentVariable,
                  "\n      the bearer token, when --token_file is empty\n\ncommand flags:\n");
  std::vector<absl::string_view> seen;
  for (const CommandSpec& spec : Commands()) {
    for (absl::string_view name : spec.flags) {
      if (std::find(seen.begin(), seen.end(), name) != seen.end()) continue;
      seen.push_back(name);
      std::vector<absl::string_view> users;
      for (const CommandSpec& other : Commands()) {
        if (std::find(other.flags.begin(), other.flags.end(), name) != other.flags.end()) {
          users.push_back(other.name);
        }
      }
      absl::StrAppend(&text, FlagHelp(name, absl::StrJoin(users, ", ")));
    }
  }
  return text;
}

// One command's help: its usage, what it does and the flags it takes (`kvcachectl help COMMAND`,
// `kvcachectl COMMAND --help`), the global flags left to the whole help.
std::string CommandHelpText(const CommandSpec& spec) {
  std::string text =
      absl::StrCat("usage: kvcachectl [global flags] ", spec.name, spec.args.empty() ? "" : " ",
                   spec.args, "\n\n", Wrap(spec.summary, 2));
  if (!spec.flags.empty()) {
    absl::StrAppend(&text, "\nflags:\n");
    for (absl::string_view name : spec.flags) absl::StrAppend(&text, FlagHelp(name, ""));
  }
  absl::StrAppend(&text,
                  "\nglobal flags (--target, -o, --timeout, TLS, token) and exit codes: "
                  "kvcachectl --help\n");
  return text;
}

// The flags as the completion script needs them: which take a value, and which name a file.
std::vector<CompletionFlag> CompletionFlags(absl::Span<const absl::string_view> names) {
  constexpr absl::string_view kFileFlags[] = {"tokens_file", "tls_ca", "tls_cert", "tls_key",
                                              "token_file"};
  std::vector<CompletionFlag> flags;
  for (absl::string_view name : names) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    if (flag == nullptr) continue;
    CompletionFlag::Value value = CompletionFlag::Value::kWord;
    // --watch's number is optional (NormalizeArgs): a word after it is no value of its.
    if (flag->IsOfType<bool>() || name == "watch") value = CompletionFlag::Value::kNone;
    if (std::find(std::begin(kFileFlags), std::end(kFileFlags), name) != std::end(kFileFlags)) {
      value = CompletionFlag::Value::kFile;
    }
    flags.push_back(CompletionFlag{.name = std::string(name), .value = value});
  }
  return flags;
}

std::string CompletionScript() {
  std::vector<absl::string_view> global(std::begin(kGlobalFlags), std::end(kGlobalFlags));
  std::vector<absl::string_view> command;
  for (const CommandSpec& spec : Commands()) {
    for (absl::string_view name : spec.flags) {
      if (std::find(command.begin(), command.end(), name) == command.end()) {
        command.push_back(name);
      }
    }
  }
  return BashCompletionScript(Commands(), CompletionFlags(global), CompletionFlags(command));
}

int UsageError(absl::string_view message) {
  std::cerr << kProgram << ": " << message << " (see kvcachectl --help)\n";
  return kExitUsage;
}

// Checks every flag on the command line as Abseil's parser will see it, so that a mistake exits
// kExitUsage instead of Abseil's 1. Sets *help for a plain --help or --helpshort, and *version
// for --version, which kvcachectl answers itself (exit 0); Abseil's other help flags are left to
// it. Sets *command to the first positional argument (the command), if there is one.
absl::Status CheckFlags(int argc, char** argv, bool* help, bool* version, std::string* command) {
  for (int i = 1; i < argc; ++i) {
    absl::string_view arg = argv[i];
    if (arg == "--") break;
    if (!absl::ConsumePrefix(&arg, "-") || arg.empty()) {  // a positional argument
      if (command->empty()) *command = argv[i];
      continue;
    }
    absl::ConsumePrefix(&arg, "-");
    const size_t equals = arg.find('=');
    const absl::string_view name = arg.substr(0, equals);
    const bool has_value = equals != absl::string_view::npos;
    if ((name == "help" || name == "helpshort") && !has_value) {
      *help = true;
      continue;
    }
    if (name == "version" && !has_value) {
      *version = true;
      continue;
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::string value = has_value ? std::string(arg.substr(equals + 1)) : "";
    if (flag == nullptr && absl::StartsWith(name, "no")) {
      flag = absl::FindCommandLineFlag(name.substr(2));
      if (flag == nullptr || !flag->IsOfType<bool>() || has_value) {
        return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
      }
      value = "false";
    } else if (flag == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    } else if (!has_value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
    }
    // Sets the flag; Abseil's parser sets it again to the same value.
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::InvalidArgumentError(
          error.empty() ? absl::StrCat("bad value '", value, "' for --", name) : error);
    }
  }
  return absl::OkStatus();
}

int Main(int raw_argc, char** raw_argv) {
  std::vector<std::string> args = NormalizeArgs(raw_argc, raw_argv);
  std::vector<char*> argv_storage;
  for (std::string& arg : args) argv_storage.push_back(arg.data());
  argv_storage.push_back(nullptr);
  const int argc = static_cast<int>(args.size());
  char** argv = argv_storage.data();

  bool help = false;
  bool version = false;
  std::string first_positional;
  if (absl::Status flags = CheckFlags(argc, argv, &help, &version, &first_positional);
      !flags.ok()) {
    return UsageError(flags.message());
  }
  if (help) {  // COMMAND --help: that command's; else the whole help
    const CommandSpec* spec = FindCommand(first_positional);
    std::cout << (spec != nullptr ? CommandHelpText(*spec) : HelpText());
    return kExitOk;
  }
  if (version) {
    std::cout << VersionLine(kProgram) << "\n";
    return kExitOk;
  }
  std::vector<char*> positional =
      ParseCommandLineFlags(argc, argv, "kvcachectl: the kvcache daemon's operator command line");
  if (positional.size() < 2) return UsageError("no command given");
  const std::string command = positional[1];
  if (command == "help") {  // help [COMMAND]
    if (positional.size() > 3) return UsageError("help: one command at most");
    if (positional.size() == 2) {
      std::cout << HelpText();
      return kExitOk;
    }
    const CommandSpec* spec = FindCommand(positional[2]);
    if (spec == nullptr) {
      return UsageError(absl::StrCat("help: unknown command '", positional[2], "'"));
    }
    std::cout << CommandHelpText(*spec);
    return kExitOk;
  }
  if (command == "completion") {  // completion bash
    if (positional.size() != 3 || absl::string_view(positional[2]) != "bash") {
      return UsageError("completion: say which shell: kvcachectl completion bash");
    }
    std::cout << CompletionScript();
    return kExitOk;
  }
  const CommandSpec* spec = FindCommand(command);
  if (spec == nullptr) return UsageError(absl::StrCat("unknown command '", command, "'"));
  if (positional.size() > 2) {
    return UsageError(absl::StrCat(command, ": unexpected argument '", positional[2], "'"));
  }
  // A flag of another command would be ignored silently: refuse it.
  for (const CommandSpec& other : Commands()) {
    for (absl::string_view name : other.flags) {
      if (std::find(spec->flags.begin(), spec->flags.end(), name) != spec->flags.end()) continue;
      const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
      if (flag != nullptr && flag->CurrentValue() != flag->DefaultValue()) {
        return UsageError(absl::StrCat(command, ": --", name, " does not apply to ", command));
      }
    }
  }

  const absl::Duration timeout = absl::GetFlag(FLAGS_timeout);
  if (timeout <= absl::ZeroDuration()) return UsageError("--timeout must be positive");
  absl::StatusOr<ClientOptions> client =
      ClientOptionsFromFlags(ClientOptions{.connect_timeout = timeout, .rpc_timeout = timeout});
  if (!client.ok()) return UsageError(client.status().message());
  const std::string output = absl::GetFlag(FLAGS_output);
  OutputFormat format = OutputFormat::kTable;
  if (output == "json") {
    format = OutputFormat::kJson;
  } else if (output == "yaml") {
    format = OutputFormat::kYaml;
  } else if (output != "table") {
    return UsageError(
        absl::StrCat("-o: unknown output format '", output, "' (table, json or yaml)"));
  }
  if (absl::GetFlag(FLAGS_json)) {
    if (format == OutputFormat::kYaml) return UsageError("--json and -o yaml exclude each other");
    format = OutputFormat::kJson;
  }
  GlobalOptions global{.target = absl::GetFlag(FLAGS_target),
                       .client = *std::move(client),
                       .output = format,
                       .no_headers = absl::GetFlag(FLAGS_no_headers)};
  if (global.target.empty()) global.target = DefaultListenAddress();

  CommandOptions options{.pool = absl::GetFlag(FLAGS_pool),
                         .tenant = absl::GetFlag(FLAGS_tenant),
                         .salt = absl::GetFlag(FLAGS_salt),
                         .tokens_file = absl::GetFlag(FLAGS_tokens_file),
                         .service = absl::GetFlag(FLAGS_service),
                         .from = absl::GetFlag(FLAGS_from),
                         .epoch = absl::GetFlag(FLAGS_epoch),
                         .limit = absl::GetFlag(FLAGS_limit),
                         .follow = absl::GetFlag(FLAGS_follow),
                         .watch = absl::GetFlag(FLAGS_watch),
                         .count = absl::GetFlag(FLAGS_count)};
  if (options.watch < absl::ZeroDuration()) return UsageError("--watch must not be negative");
  if (command == "events" || options.watch > absl::ZeroDuration()) {
    // `events` and a --watch run until stopped; events prints where to resume before it exits.
    std::signal(SIGINT, OnSignal);
    std::signal(SIGTERM, OnSignal);
    options.interrupted = &interrupted;
  }
  return RunCommand(command, global, options, Streams{std::cout, std::cerr, std::cin});
}

}  // namespace
}  // namespace kvcache::ctl

int main(int argc, char** argv) { return kvcache::ctl::Main(argc, argv); }
