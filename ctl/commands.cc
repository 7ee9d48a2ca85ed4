#include "ctl/commands.h"

#include <algorithm>
#include <deque>
#include <istream>
#include <iterator>
#include <memory>
#include <optional>
#include <ostream>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/read_file.h"
#include "ctl/connection.h"
#include "ctl/format.h"
#include "ctl/yaml.h"

namespace kvcache::ctl {
namespace {

const std::vector<CommandSpec>& CommandList() {
  static const auto* const commands = new std::vector<CommandSpec>{
      {"pools",
       "[--watch [SECONDS]] [--count N]",
       "every pool: layout, page parts, memory, block counts, hash algorithm",
       {"watch", "count"}},
      {"describe",
       "--pool P",
       "one pool: its pools row, its page parts (name, offset, bytes, hit policy) and the "
       "compatibility manifests in use on it (digest, tenant, model, config digest, dtype, page "
       "tokens, parts, TP/PP/CP rank/size, key hash algorithm, sessions)",
       {"pool"}},
      {"stats",
       "[--pool P] [--tenant T] [--watch [SECONDS]] [--count N]",
       "per pool: prompt and hit tokens, hit ratio, block counts, evictions, resurrections, "
       "published and duplicate blocks, open sequences; open sessions",
       {"pool", "tenant", "watch", "count"}},
      {"sessions",
       "[--tenant T] [--watch [SECONDS]] [--count N]",
       "open sessions: id (\"-\" when hidden), tenant, principal, client, TTL, expiry, sequences",
       {"tenant", "watch", "count"}},
      {"lookup",
       "--pool P [--salt S] [--tenant T] [--tokens_file F]",
       "cached blocks and tokens of a prompt, read as decimal token ids (whitespace or comma "
       "separated) from --tokens_file, or standard input when it is empty or \"-\"",
       {"pool", "tenant", "salt", "tokens_file"}},
      {"events",
       "[--from N] [--epoch E] [--pool P] [--tenant T] [--follow] [--limit N]",
       "KV events (WatchEvents), one line each. Without --follow: what the daemon holds now, "
       "then exits once it has caught up with the daemon's head sequence (a daemon that "
       "reports none: once nothing arrives for 300 ms). With "
       "--follow: keeps streaming and resumes a broken stream where it left off (backoff "
       "0.1 s doubling to 5 s). Always ends, ^C included (exit 0), with \"resume with --from N "
       "--epoch E\" on stderr",
       {"from", "epoch", "pool", "tenant", "follow", "limit"}},
      {"health",
       "[--service S]",
       "grpc.health.v1 Check: prints SERVING, NOT_SERVING or SERVICE_UNKNOWN (exit 0 only for "
       "SERVING)",
       {"service"}},
      {"version",
       "",
       "this kvcachectl's version and source revision, and the daemon's when one answers",
       {}},
  };
  return *commands;
}

// Prints the one-line error of `command` and returns its exit code.
int Fail(std::ostream& err, absl::string_view command, const absl::Status& status,
         bool connecting = false) {
  err << "kvcachectl: " << command << ": " << absl::StatusCodeToString(status.code()) << ": "
      << status.message() << "\n";
  return ExitCodeFor(status, connecting);
}

int Usage(std::ostream& err, absl::string_view command, absl::string_view message) {
  err << "kvcachectl: " << command << ": " << message << " (see kvcachectl --help)\n";
  return kExitUsage;
}

// A command's document as -o json or -o yaml asks.
void PrintDocument(std::ostream& out, const GlobalOptions& global, const Json& document) {
  if (global.output == OutputFormat::kYaml) {
    out << ToYaml(document);
  } else {
    out << document.dump(2) << "\n";
  }
}

bool Tabular(const GlobalOptions& global) { return global.output == OutputFormat::kTable; }

absl::StatusOr<std::unique_ptr<Connection>> Connect(const GlobalOptions& global) {
  return Connection::Open(global.target, global.client);
}

int RunPools(Connection& connection, const GlobalOptions& global, const CommandOptions& options,
             Streams streams) {
  absl::StatusOr<std::vector<KvCacheClient::PoolInfo>> pools = connection.client().ListPools();
  if (!pools.ok()) return Fail(streams.err, "pools", pools.status());
  std::vector<KvCacheClient::PoolDescription> described;
  for (const KvCacheClient::PoolInfo& pool : *pools) {
    absl::StatusOr<KvCacheClient::PoolDescription> description =
        connection.client().DescribePool(pool.name);
    if (!description.ok()) return Fail(streams.err, "pools", description.status());
    described.push_back(*std::move(description));
  }
  if (Tabular(global)) {
    streams.out << PoolsTable(described).Render(!global.no_headers);
  } else {
    PrintDocument(streams.out, global, PoolsJson(described));
  }
  return kExitOk;
}

int RunDescribe(Connection& connection, const GlobalOptions& global, const CommandOptions& options,
                Streams streams) {
  absl::StatusOr<KvCacheClient::PoolDescription> description =
      connection.client().DescribePool(options.pool);
  if (!description.ok()) return Fail(streams.err, "describe", description.status());
  if (!Tabular(global)) {
    PrintDocument(streams.out, global, PoolJson(*description));
    return kExitOk;
  }
  const bool headers = !global.no_headers;
  streams.out << PoolsTable({*description}).Render(headers) << "\n"
              << PartsTable(description->pool.parts).Render(headers) << "\n";
  if (description->manifests.empty()) {
    streams.out << "no compatibility manifests in use\n";
  } else {
    streams.out << ManifestsTable(description->manifests).Render(headers);
  }
  return kExitOk;
}

int RunStats(Connection& connection, const GlobalOptions& global, const CommandOptions& options,
             Streams streams) {
  absl::StatusOr<v1::GetStatsResponse> stats = connection.GetStats(options.pool, options.tenant);
  if (!stats.ok()) return Fail(streams.err, "stats", stats.status());
  if (!Tabular(global)) {
    PrintDocument(streams.out, global, StatsJson(*stats));
  } else if (global.no_headers) {
    streams.out << StatsTable(*stats).Render(/*headers=*/false);
  } else {
    streams.out << StatsTable(*stats).Render() << "\nopen sessions: " << stats->open_sessions()
                << "\n";
  }
  return kExitOk;
}

int RunSessions(Connection& connection, const GlobalOptions& global, const CommandOptions& options,
                Streams streams) {
  absl::StatusOr<std::vector<KvCacheClient::ListedSession>> sessions =
      connection.client().ListSessions(options.tenant);
  if (!sessions.ok()) return Fail(streams.err, "sessions", sessions.status());
  if (Tabular(global)) {
    streams.out << SessionsTable(*sessions).Render(!global.no_headers);
  } else {
    PrintDocument(streams.out, global, SessionsJson(*sessions));
  }
  return kExitOk;
}

// The tokens of `lookup`, from --tokens_file or standard input. INVALID_ARGUMENT when they
// cannot be read or parsed.
absl::StatusOr<std::vector<uint32_t>> ReadTokens(const CommandOptions& options, Streams streams) {
  std::string text;
  if (options.tokens_file.empty() || options.tokens_file == "-") {
    text.assign(std::istreambuf_iterator<char>(streams.in), std::istreambuf_iterator<char>());
    if (streams.in.bad()) return absl::InvalidArgumentError("cannot read standard input");
  } else {
    absl::StatusOr<std::string> file = ReadFileToString(options.tokens_file);
    if (!file.ok()) return absl::InvalidArgumentError(file.status().message());
    text = *std::move(file);
  }
  return ParseTokens(text);
}

int RunLookup(Connection& connection, const GlobalOptions& global, const CommandOptions& options,
              const std::vector<uint32_t>& tokens, Streams streams) {
  absl::StatusOr<KvCacheClient::LookupResult> result =
      connection.client().Lookup(options.pool, options.tenant, tokens, options.salt);
  if (!result.ok()) return Fail(streams.err, "lookup", result.status());
  const LookupReport report{.pool = options.pool, .num_tokens = tokens.size(), .result = *result};
  if (Tabular(global)) {
    streams.out << LookupTable(report).Render(!global.no_headers);
  } else {
    PrintDocument(streams.out, global, LookupJson(report));
  }
  return kExitOk;
}

int RunHealth(Connection& connection, const GlobalOptions& global, const CommandOptions& options,
              Streams streams) {
  absl::StatusOr<HealthStatus> health = connection.CheckHealth(options.service);
  if (!health.ok()) return Fail(streams.err, "health", health.status());
  const absl::string_view name = HealthStatusName(*health);
  if (Tabular(global)) {
    streams.out << name << "\n";
  } else {
    PrintDocument(streams.out, global, HealthJson(options.service, name));
  }
  return *health == HealthStatus::kServing ? kExitOk : kExitNotServing;
}

// Reads one EventWatch on a thread of its own, so the command can wait for the next response
// with a timeout (EventWatch::Next blocks) and notice a signal meanwhile. Holds at most
// kMaxQueued responses: a slow reader of our stdout slows the stream instead of growing memory.
class WatchReader {
 public:
  using Item = absl::StatusOr<v1::WatchEventsResponse>;

  explicit WatchReader(std::unique_ptr<EventWatch> watch)
      : watch_(std::move(watch)), thread_([this] { Loop(); }) {}
  ~WatchReader() {
    {
      absl::MutexLock lock(&mu_);
      stopping_ = true;
    }
    watch_->Cancel();
    thread_.join();
  }

  // The next response or the stream's final status; nullopt if none came within `timeout`.
  std::optional<Item> Next(absl::Duration timeout) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !queue_.empty(); };
    if (!mu_.AwaitWithTimeout(absl::Condition(&ready), timeout)) return std::nullopt;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    return item;
  }

 private:
  static constexpr size_t kMaxQueued = 16;

  void Loop() {
    for (;;) {
      Item item = watch_->Next();
      const bool last = !item.ok();
      absl::MutexLock lock(&mu_);
      auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || queue_.size() < kMaxQueued;
      };
      mu_.Await(absl::Condition(&room));
      if (stopping_) return;
      queue_.push_back(std::move(item));
      if (last) return;
    }
  }

  const std::unique_ptr<EventWatch> watch_;
  absl::Mutex mu_;
  std::deque<Item> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // last: starts once the members it uses exist
};

// Where a later `events --from N --epoch E` picks up.
struct ResumePoint {
  uint64_t sequence = 0;
  uint64_t epoch = 0;
};

// Errors after which the same watch may succeed later: the daemon went away or restarted, the
// network broke, the daemon was at its watcher limit.
bool Retryable(const absl::Status& status) {
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
    case absl::StatusCode::kCancelled:
    case absl::StatusCode::kDeadlineExceeded:
    case absl::StatusCode::kResourceExhausted:
    case absl::StatusCode::kAborted:
    case absl::StatusCode::kInternal:
    case absl::StatusCode::kUnknown:
      return true;
    default:
      return false;
  }
}

// Whether the watcher can resume from `response` (its next_sequence and epoch): after any live
// response, and after the last message of a snapshot, which the daemon marks snapshot_end.
// Daemons from before the marker: a snapshot's events all carry its sequence S, and only its last
// message moves next_sequence to S + 1; the others repeat the sequence the watch stood at before
// it (`before`). When that is S + 1 itself (a restarted daemon that has counted to the same
// number) the two cannot be told apart, and the message counts as not the last: resuming from
// before it costs a repeated snapshot, never a missed block.
bool Resumable(const v1::WatchEventsResponse& response, const ResumePoint& before) {
  if (!response.snapshot() || response.snapshot_end()) return true;
  if (response.events().empty()) return false;
  const uint64_t after_snapshot = response.events(0).sequence() + 1;
  return response.next_sequence() == after_snapshot && after_snapshot != before.sequence;
}

bool Interrupted(const CommandOptions& options) {
  return options.interrupted != nullptr && options.interrupted->load(std::memory_order_relaxed);
}

// Sleeps `duration` in short steps; false if interrupted meanwhile.
bool SleepUnlessInterrupted(absl::Duration duration, const CommandOptions& options) {
  const absl::Time end = absl::Now() + duration;
  while (absl::Now() < end) {
    if (Interrupted(options)) return false;
    absl::SleepFor(std::min(absl::Milliseconds(50), end - absl::Now()));
  }
  return !Interrupted(options);
}

// `events`. The resume point is the last response's next_sequence and epoch, except inside a
// snapshot (see Resumable): a watch cut, or stopped by --limit, there resumes from where the
// snapshot began, in that epoch, and the daemon sends a whole new snapshot. Stopping by --limit
// inside a live response resumes right after the last event printed.
//
// Without --follow the command ends once a response's next_sequence reaches its head_sequence
// (the daemon's head when it answered): everything it held then has been printed. A daemon
// that sends no head (older ones) is caught up once no response arrives for options.idle; a
// snapshot in progress is waited out for up to the call timeout.
int RunEvents(Connection& connection, const GlobalOptions& global, const CommandOptions& options,
              Streams streams) {
  ResumePoint resume{.sequence = options.from, .epoch = options.epoch};
  if (resume.epoch == 0) {
    // 0 means "the daemon's own": learn which, so the resume line names it.
    absl::StatusOr<uint64_t> epoch = connection.client().Ping();
    if (!epoch.ok()) return Fail(streams.err, "events", epoch.status());
    resume.epoch = *epoch;
  }
  auto finish = [&](int code) {
    streams.out.flush();
    streams.err << "kvcachectl: events: resume with --from " << resume.sequence << " --epoch "
                << resume.epoch << "\n";
    return code;
  };
  StreamTable table = EventsTable();
  if (Tabular(global) && !global.no_headers) streams.out << table.Header() << std::flush;

  uint64_t printed = 0;
  absl::Duration backoff = options.min_backoff;
  for (;;) {
    WatchReader reader(connection.client().WatchEvents({.start_sequence = resume.sequence,
                                                        .epoch = resume.epoch,
                                                        .tenant = options.tenant,
                                                        .pool = options.pool}));
    bool mid_snapshot = false;
    absl::Time last_response = absl::Now();
    bool broken = false;
    while (!broken) {
      if (Interrupted(options)) return finish(kExitOk);
      std::optional<WatchReader::Item> item = reader.Next(absl::Milliseconds(50));
      if (!item.has_value()) {
        const absl::Duration quiet = absl::Now() - last_response;
        if (!options.follow && quiet >= (mid_snapshot ? global.client.rpc_timeout : options.idle)) {
          return finish(kExitOk);
        }
        continue;
      }
      if (!item->ok()) {
        const absl::Status& status = item->status();
        if (!options.follow || !Retryable(status)) {
          Fail(streams.err, "events", status);
          return finish(kExitDaemonError);
        }
        streams.err << "kvcachectl: events: stream broke ("
                    << absl::StatusCodeToString(status.code()) << ": " << status.message()
                    << "); resuming with --from " << resume.sequence << " --epoch " << resume.epoch
                    << " in " << absl::FormatDuration(backoff) << "\n";
        if (!SleepUnlessInterrupted(backoff, options)) return finish(kExitOk);
        backoff = std::min(backoff * 2, options.max_backoff);
        broken = true;
        continue;
      }
      const v1::WatchEventsResponse& response = **item;
      last_response = absl::Now();
      backoff = options.min_backoff;
      const ResumePoint before = resume;
      mid_snapshot = !Resumable(response, before);
      const ResumePoint after = mid_snapshot ? before
                                             : ResumePoint{.sequence = response.next_sequence(),
                                                           .epoch = response.epoch()};
      for (int i = 0; i < response.events_size(); ++i) {
        const v1::KvEvent& event = response.events(i);
        if (global.output == OutputFormat::kJson) {
          streams.out << EventJson(event).dump() << "\n";
        } else if (global.output == OutputFormat::kYaml) {
          streams.out << "---\n" << ToYaml(EventJson(event));  // one document per event
        } else {
          streams.out << table.Row(EventCells(event));
        }
        if (options.limit != 0 && ++printed == options.limit) {
          if (i + 1 == response.events_size()) {
            resume = after;
          } else if (!response.snapshot()) {
            resume = {.sequence = event.sequence() + 1, .epoch = response.epoch()};
          }  // else: inside a snapshot, resume where this response found us
          return finish(kExitOk);
        }
      }
      resume = after;
      streams.out.flush();
      // Caught up with the daemon: what it held when it answered has all been printed.
      if (!options.follow && !mid_snapshot && response.head_sequence() != 0 &&
          response.next_sequence() >= response.head_sequence()) {
        return finish(kExitOk);
      }
    }
  }
}

using ReadCommand = int (*)(Connection&, const GlobalOptions&, const CommandOptions&, Streams);

// Runs a read command once, or with --watch every options.watch until interrupted or
// options.count runs: a blank line between tables, YAML documents each opened by "---", JSON
// documents one after another (a stream `jq` reads). Stops at the first failing run, with its
// exit code.
int RunWatched(ReadCommand run, Connection& connection, const GlobalOptions& global,
               const CommandOptions& options, Streams streams) {
  const bool watching = options.watch > absl::ZeroDuration();
  for (uint64_t runs = 1;; ++runs) {
    if (watching && global.output == OutputFormat::kYaml) streams.out << "---\n";
    const int code = run(connection, global, options, streams);
    streams.out.flush();
    if (code != kExitOk || !watching || (options.count != 0 && runs >= options.count)) {
      return code;
    }
    if (!SleepUnlessInterrupted(options.watch, options)) return kExitOk;
    if (Tabular(global)) streams.out << "\n";
  }
}

}  // namespace

absl::Span<const CommandSpec> Commands() { return CommandList(); }

const CommandSpec* FindCommand(absl::string_view name) {
  for (const CommandSpec& spec : CommandList()) {
    if (spec.name == name) return &spec;
  }
  return nullptr;
}

int ExitCodeFor(const absl::Status& status, bool connecting) {
  if (status.ok()) return kExitOk;
  if (connecting) {
    switch (status.code()) {
      case absl::StatusCode::kUnavailable:
      case absl::StatusCode::kDeadlineExceeded:
      case absl::StatusCode::kNotFound:            // no such socket
      case absl::StatusCode::kPermissionDenied:    // the socket is not ours to open
      case absl::StatusCode::kFailedPrecondition:  // the path is not a socket
        return kExitUnreachable;
      case absl::StatusCode::kInvalidArgument:
        return kExitUsage;
      default:
        break;
    }
  }
  return kExitDaemonError;
}

int RunCommand(absl::string_view command, const GlobalOptions& global,
               const CommandOptions& options, Streams streams) {
  if (FindCommand(command) == nullptr) {
    return Usage(streams.err, command, "unknown command");
  }
  if (command == "version") {
    // The client's version needs no daemon: one that does not answer is said on stderr, and the
    // command still succeeds.
    std::optional<KvCacheClient::ServerVersion> server;
    absl::StatusOr<std::unique_ptr<Connection>> connection = Connect(global);
    absl::StatusOr<KvCacheClient::ServerVersion> asked =
        connection.ok() ? (*connection)->client().GetServerVersion()
                        : absl::StatusOr<KvCacheClient::ServerVersion>(connection.status());
    if (asked.ok()) {
      server = *std::move(asked);
    } else {
      streams.err << "kvcachectl version: no daemon's version from " << global.target << ": "
                  << asked.status() << "\n";
    }
    if (Tabular(global)) {
      streams.out << VersionText(server, global.target);
    } else {
      PrintDocument(streams.out, global, VersionJson(server, global.target));
    }
    return kExitOk;
  }
  if (options.count != 0 && options.watch <= absl::ZeroDuration()) {
    return Usage(streams.err, command, "--count needs --watch");
  }
  // Input is checked before connecting: a usage error never waits for a daemon.
  std::vector<uint32_t> tokens;
  if (command == "describe" && options.pool.empty()) {
    return Usage(streams.err, command, "--pool is required");
  }
  if (command == "lookup") {
    if (options.pool.empty()) return Usage(streams.err, command, "--pool is required");
    absl::StatusOr<std::vector<uint32_t>> read = ReadTokens(options, streams);
    if (!read.ok()) return Usage(streams.err, command, read.status().message());
    tokens = *std::move(read);
  }
  absl::StatusOr<std::unique_ptr<Connection>> connection = Connect(global);
  if (!connection.ok()) {
    return Fail(streams.err, command, connection.status(), /*connecting=*/true);
  }
  if (command == "pools") return RunWatched(&RunPools, **connection, global, options, streams);
  if (command == "describe") return RunDescribe(**connection, global, options, streams);
  if (command == "stats") return RunWatched(&RunStats, **connection, global, options, streams);
  if (command == "sessions") {
    return RunWatched(&RunSessions, **connection, global, options, streams);
  }
  if (command == "lookup") return RunLookup(**connection, global, options, tokens, streams);
  if (command == "events") return RunEvents(**connection, global, options, streams);
  return RunHealth(**connection, global, options, streams);
}

}  // namespace kvcache::ctl
