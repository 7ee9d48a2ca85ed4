#include "redis/redis_cluster.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <map>
#include <optional>

#include "absl/base/call_once.h"
#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace kvcache {
namespace {

// A refresh of the slot map is wanted after every failure; a dead cluster must not get one per
// batch.
constexpr absl::Duration kMinRefreshInterval = absl::Milliseconds(100);

// A node that sent nothing at all for this long when a caller's deadline cut the wait is taken
// for hung (a Redis node on a network answers in well under a millisecond) and rested; a shorter
// cut says nothing of the node, only that the caller had little time left.
constexpr absl::Duration kSilenceThatTrips = absl::Milliseconds(5);

// The class of a Redis error, its first word ("WRONGPASS", "NOAUTH", "ERR"): what a message may
// repeat of a reply to AUTH, whose text could hold more than the class.
absl::string_view ErrorClass(absl::string_view error) {
  const absl::string_view word = error.substr(0, error.find(' '));
  const bool upper = !word.empty() && std::all_of(word.begin(), word.end(),
                                                  [](char c) { return c >= 'A' && c <= 'Z'; });
  return upper ? word : "error";
}

// Whether a wait that got no reply rests the node: always when it timed out on the client's own
// io_timeout, or lost its connection; when the caller's deadline cut it, only if the node had
// sent nothing for at least kSilenceThatTrips.
bool NoReplyTrips(bool cut_by_deadline, bool answered, absl::Duration waited) {
  return !cut_by_deadline || (!answered && waited >= kSilenceThatTrips);
}

absl::StatusOr<std::pair<std::string, int>> SplitAddress(absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (colon == absl::string_view::npos || !absl::SimpleAtoi(address.substr(colon + 1), &port) ||
      port <= 0 || port > 65535) {
    return absl::InvalidArgumentError(
        absl::StrCat("Redis address '", address, "' is not HOST:PORT"));
  }
  return std::pair{std::string(address.substr(0, colon)), port};
}

struct Redirect {
  bool ask = false;
  uint16_t slot = 0;
  std::string address;  // HOST:PORT; HOST empty when the node did not say
};

// "MOVED 3999 127.0.0.1:6381" / "ASK 3999 127.0.0.1:6381".
std::optional<Redirect> ParseRedirect(absl::string_view error) {
  std::vector<absl::string_view> parts = absl::StrSplit(error, ' ');
  if (parts.size() != 3 || (parts[0] != "MOVED" && parts[0] != "ASK")) return std::nullopt;
  int slot = 0;
  if (!absl::SimpleAtoi(parts[1], &slot) || slot < 0 || slot >= kRedisClusterSlots) {
    return std::nullopt;
  }
  return Redirect{.ask = parts[0] == "ASK",
                  .slot = static_cast<uint16_t>(slot),
                  .address = std::string(parts[2])};
}

}  // namespace

struct RedisCluster::Command {
  // Views of the caller's keys and values, which outlive the call.
  std::vector<absl::string_view> argv;
  // A SET's value, the last argument, in pieces sent one after another (never joined here).
  bool has_value = false;
  absl::InlinedVector<absl::string_view, 2> value;
  // SetAsMade: the value is asked of the batch's maker when first written; one it could not make
  // is withheld (never sent, no reply read).
  bool value_pending = false;
  bool withheld = false;
  uint16_t slot = 0;
  uint64_t weight = 0;     // bytes it puts in flight
  Node* target = nullptr;  // set by an ASK; null: the slot's owner
  bool asking = false;
  int redirects = 0;
};

uint16_t RedisCluster::KeySlot(absl::string_view key) {
  const size_t open = key.find('{');
  if (open != absl::string_view::npos) {
    const size_t close = key.find('}', open + 1);
    if (close != absl::string_view::npos && close > open + 1) {
      key = key.substr(open + 1, close - open - 1);
    }
  }
  uint16_t crc = 0;  // CRC16-CCITT (XMODEM): polynomial 0x1021, initial 0, as Redis computes it
  for (const char c : key) {
    crc ^= static_cast<uint16_t>(static_cast<uint8_t>(c)) << 8;
    for (int bit = 0; bit < 8; ++bit) {
      crc = (crc & 0x8000) != 0 ? static_cast<uint16_t>((crc << 1) ^ 0x1021)
                                : static_cast<uint16_t>(crc << 1);
    }
  }
  return crc % kRedisClusterSlots;
}

absl::StatusOr<std::unique_ptr<RedisCluster>> RedisCluster::Create(RedisClusterOptions options) {
  if (options.seeds.empty()) {
    return absl::InvalidArgumentError("a Redis Cluster needs at least one HOST:PORT to start from");
  }
  for (const std::string& seed : options.seeds) {
    if (absl::Status valid = SplitAddress(seed).status(); !valid.ok()) return valid;
  }
  if (options.max_redirects < 1 || options.max_pipeline_bytes == 0) {
    return absl::InvalidArgumentError("max_redirects and max_pipeline_bytes must be positive");
  }
  // hiredis writes with write(2): a node that closed its end (killed, restarted) would raise
  // SIGPIPE, whose default action ends the whole process — a daemon killed by a Redis restart.
  // Where nobody chose a disposition, ignore it; the write then fails with EPIPE, a node failure.
  struct sigaction current {};
  if (::sigaction(SIGPIPE, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) {
    ::signal(SIGPIPE, SIG_IGN);
  }
  auto cluster = std::unique_ptr<RedisCluster>(new RedisCluster(std::move(options)));
  for (const std::string& seed : cluster->options_.seeds) cluster->NodeFor(seed);
  return cluster;
}

RedisCluster::RedisCluster(RedisClusterOptions options) : options_(std::move(options)) {
  slot_owner_.fill(-1);
}

RedisCluster::~RedisCluster() {
  std::vector<Node*> nodes;
  {
    absl::MutexLock lock(&map_mu_);  // never held while taking a node's: the order is node, map
    for (auto& node : nodes_) nodes.push_back(node.get());
  }
  for (Node* node : nodes) {
    absl::MutexLock lock(&node->mu);
    if (node->context != nullptr) redisFree(node->context);
    node->context = nullptr;
  }
}

RedisCluster::Node* RedisCluster::NodeFor(const std::string& address) {
  absl::MutexLock lock(&map_mu_);
  auto found = by_address_.find(address);
  if (found != by_address_.end()) return found->second;
  absl::StatusOr<std::pair<std::string, int>> split = SplitAddress(address);
  if (!split.ok()) return nullptr;
  auto node = std::make_unique<Node>();
  node->address = address;
  node->host = split->first;
  node->port = split->second;
  node->index = static_cast<int>(nodes_.size());
  Node* raw = node.get();
  nodes_.push_back(std::move(node));
  by_address_[address] = raw;
  return raw;
}

RedisCluster::Node* RedisCluster::SlotOwner(uint16_t slot) {
  absl::MutexLock lock(&map_mu_);
  const int32_t owner = slot_owner_[slot];
  return owner < 0 ? nullptr : nodes_[owner].get();
}

int RedisCluster::MappedSlots() const {
  absl::MutexLock lock(&map_mu_);
  return static_cast<int>(
      std::count_if(slot_owner_.begin(), slot_owner_.end(), [](int32_t o) { return o >= 0; }));
}

bool RedisCluster::Resting(const Node& node) {
  const int64_t until = node.resting_until_ns.load(std::memory_order_acquire);
  if (until == kNotResting) return false;
  return absl::ToUnixNanos(absl::Now()) < until || node.probing.load(std::memory_order_acquire);
}

RedisCluster::Admission RedisCluster::Admit(Node* node) {
  const int64_t until = node->resting_until_ns.load(std::memory_order_acquire);
  if (until == kNotResting) return Admission::kUse;
  if (absl::ToUnixNanos(absl::Now()) < until) return Admission::kSkip;
  // Claimed under the node's lock, so one batch probes; Release ends an unresolved claim.
  return node->probing.exchange(true) ? Admission::kSkip : Admission::kProbe;
}

void RedisCluster::Release(Node* node) {
  node->probing.store(false, std::memory_order_release);
  node->mu.Unlock();
}

void RedisCluster::MarkAnswered(Node* node) {
  absl::MutexLock lock(&node->failure_mu);
  node->last_failure.clear();
  node->resting_until_ns.store(kNotResting, std::memory_order_release);
  node->probing.store(false, std::memory_order_release);
}

absl::Status RedisCluster::SkippedStatus(Node* node) {
  skipped_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&node->failure_mu);
  return absl::UnavailableError(absl::StrCat("Redis node ", node->address, " failed recently (",
                                             node->last_failure, "); skipped while it rests"));
}

absl::Status RedisCluster::CredentialsRefused(Node* node, absl::string_view error_class) {
  const std::string line =
      error_class == "NOAUTH"
          ? absl::StrCat("Redis node ", node->address,
                         " wants a password and none is configured (NOAUTH)")
          : absl::StrCat("Redis node ", node->address, " refused the configured credentials (",
                         error_class, ")");
  if (!node->credentials_refused && options_.on_credentials_refused) {
    options_.on_credentials_refused(line);
  }
  node->credentials_refused = true;
  return absl::UnavailableError(line);
}

namespace {

// hiredis' own reply functions (the same for every context) and ours: the same but for bulk
// strings, which a reader whose privdata is a StringSink hands to the sink's visitor straight
// from its buffer. The reply then carries no bytes: the visitor has had them.
redisReplyObjectFunctions* hiredis_reply_functions = nullptr;
redisReplyObjectFunctions sinking_reply_functions;

}  // namespace

struct RedisCluster::StringSink {
  ValueVisitor* visitor;
  size_t index = 0;      // of the command whose reply is read
  bool visited = false;  // whether that reply was a string, given to the visitor
};

void* RedisCluster::CreateStringOrSink(const redisReadTask* task, char* str, size_t len) {
  auto* sink = static_cast<StringSink*>(task->privdata);
  if (sink != nullptr && task->type == REDIS_REPLY_STRING && task->parent == nullptr) {
    (*sink->visitor)(sink->index, absl::string_view(str, len));
    sink->visited = true;
    len = 0;
  }
  return hiredis_reply_functions->createString(task, str, len);
}

void RedisCluster::UseStringSinks(redisContext* context) {
  static absl::once_flag once;
  absl::call_once(once, [context] {
    hiredis_reply_functions = context->reader->fn;
    sinking_reply_functions = *hiredis_reply_functions;
    sinking_reply_functions.createString = CreateStringOrSink;
  });
  context->reader->fn = &sinking_reply_functions;
}

absl::Status RedisCluster::EnsureConnected(Node* node, absl::Time deadline) {
  if (node->context != nullptr && node->context->err == 0) {
    // Between batches nothing is owed on a connection, so anything to read is the node's end of
    // it: a restarted node closed it. Reconnect now rather than lose the batch and rest a node
    // that is back.
    pollfd idle{.fd = node->context->fd, .events = POLLIN | POLLRDHUP, .revents = 0};
    if (::poll(&idle, 1, 0) == 0) return absl::OkStatus();
    redisFree(node->context);
    node->context = nullptr;
    stale_reconnects_.fetch_add(1, std::memory_order_relaxed);
  }
  if (node->context != nullptr) {
    MarkFailed(node, "connection broken");
    return absl::UnavailableError(
        absl::StrCat("Redis node ", node->address, ": connection broken"));
  }
  // Within the caller's deadline too: connecting to or authenticating with a hung node must not
  // cost a request more than its budget.
  const absl::Duration left = std::max(deadline - absl::Now(), absl::Milliseconds(1));
  redisContext* context = redisConnectWithTimeout(
      node->host.c_str(), node->port, absl::ToTimeval(std::min(options_.connect_timeout, left)));
  if (context == nullptr || context->err != 0) {
    const std::string why = context == nullptr ? "out of memory" : context->errstr;
    if (context != nullptr) redisFree(context);
    MarkFailed(node, absl::StrCat("cannot connect: ", why));
    return absl::UnavailableError(
        absl::StrCat("cannot connect to Redis node ", node->address, ": ", why));
  }
  connects_.fetch_add(1, std::memory_order_relaxed);
  UseStringSinks(context);
  node->context = context;
  if (!options_.password.empty()) {
    redisSetTimeout(context, absl::ToTimeval(std::min(options_.io_timeout, left)));
    std::vector<const char*> argv = {"AUTH"};
    std::vector<size_t> lengths = {4};
    if (!options_.username.empty()) {
      argv.push_back(options_.username.data());
      lengths.push_back(options_.username.size());
    }
    argv.push_back(options_.password.data());
    lengths.push_back(options_.password.size());
    auto* reply = static_cast<redisReply*>(
        redisCommandArgv(context, static_cast<int>(argv.size()), argv.data(), lengths.data()));
    if (reply == nullptr) {
      const std::string why = absl::StrCat("no reply to AUTH: ", context->errstr);
      MarkFailed(node, why);
      return absl::UnavailableError(absl::StrCat("Redis node ", node->address, ": ", why));
    }
    // Never the password, nor Redis' text (which could echo it): the error's class only.
    const std::string error_class =
        reply->type == REDIS_REPLY_STATUS
            ? ""
            : std::string(reply->type == REDIS_REPLY_ERROR
                              ? ErrorClass(absl::string_view(reply->str, reply->len))
                              : "error");
    freeReplyObject(reply);
    if (!error_class.empty()) {
      absl::Status refused = CredentialsRefused(node, error_class);
      MarkFailed(node, absl::StrCat("refused the configured credentials (", error_class, ")"));
      return refused;
    }
    node->credentials_refused = false;
  }
  redisSetTimeout(context, absl::ToTimeval(options_.io_timeout));
  return absl::OkStatus();
}

void RedisCluster::MarkFailed(Node* node, std::string why) {
  {
    absl::MutexLock lock(&node->failure_mu);
    node->last_failure = std::move(why);
  }
  if (node->context != nullptr) redisFree(node->context);
  node->context = nullptr;
  node->resting_until_ns.store(absl::ToUnixNanos(absl::Now() + options_.retry_down_after),
                               std::memory_order_release);
  node->probing.store(false, std::memory_order_release);
  node_failures_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&map_mu_);
  refresh_wanted_ = true;
}

void RedisCluster::MaybeRefreshSlots(absl::Time deadline) {
  {
    absl::MutexLock lock(&map_mu_);
    if (!refresh_wanted_ || absl::Now() - last_refresh_ < kMinRefreshInterval) return;
    last_refresh_ = absl::Now();
  }
  // A failure leaves the old map; keys without a node fail alone.
  RefreshSlots(deadline).IgnoreError();
}

absl::StatusOr<redisReply*> RedisCluster::NodeCommand(Node* node, const char* command,
                                                      absl::Time deadline) {
  if (Resting(*node)) return SkippedStatus(node);
  if (deadline == absl::InfiniteFuture()) {
    node->mu.Lock();
  } else if (!node->mu.TryLock()) {
    return absl::UnavailableError(
        absl::StrCat("Redis node ", node->address, " is busy with another batch"));
  }
  if (Admit(node) == Admission::kSkip) {
    Release(node);
    return SkippedStatus(node);
  }
  if (absl::Status connected = EnsureConnected(node, deadline); !connected.ok()) {
    Release(node);
    return connected;
  }
  const absl::Duration left = deadline - absl::Now();
  const bool deadline_bound = left < options_.io_timeout;
  if (deadline_bound) {
    redisSetTimeout(node->context, absl::ToTimeval(std::max(left, absl::Milliseconds(1))));
  }
  const absl::Time sent = absl::Now();
  auto* reply = static_cast<redisReply*>(redisCommand(node->context, command));
  absl::StatusOr<redisReply*> result;
  if (reply == nullptr) {
    const std::string why = absl::StrCat(
        node->context->errstr[0] != 0 ? node->context->errstr : "no reply", " to ", command);
    result = absl::UnavailableError(absl::StrCat("Redis node ", node->address, ": ", why));
    const bool cut = deadline_bound && absl::Now() >= deadline;
    if (NoReplyTrips(cut, false, absl::Now() - sent)) {
      MarkFailed(node, why);
    } else {
      redisFree(node->context);  // the reply is still owed: the connection is out of step
      node->context = nullptr;
    }
  } else {
    MarkAnswered(node);
    if (deadline_bound) redisSetTimeout(node->context, absl::ToTimeval(options_.io_timeout));
    if (reply->type == REDIS_REPLY_ERROR &&
        ErrorClass(absl::string_view(reply->str, reply->len)) == "NOAUTH") {
      freeReplyObject(reply);
      result = CredentialsRefused(node, "NOAUTH");
    } else {
      result = reply;
    }
  }
  Release(node);
  return result;
}

absl::Status RedisCluster::RefreshSlots(absl::Time deadline) {
  std::vector<Node*> candidates;
  {
    absl::MutexLock lock(&map_mu_);
    for (auto& node : nodes_) candidates.push_back(node.get());
  }
  absl::Status last = absl::UnavailableError("no Redis node is known");
  for (Node* node : candidates) {
    struct Range {
      int start;
      int end;
      std::string address;
    };
    std::vector<Range> ranges;
    absl::StatusOr<redisReply*> reply = NodeCommand(node, "CLUSTER SLOTS", deadline);
    if (!reply.ok()) {
      last = reply.status();
      continue;
    }
    if ((*reply)->type == REDIS_REPLY_ARRAY) {
      for (size_t i = 0; i < (*reply)->elements; ++i) {
        const redisReply* entry = (*reply)->element[i];
        if (entry->type != REDIS_REPLY_ARRAY || entry->elements < 3) continue;
        const redisReply* master = entry->element[2];
        if (master->type != REDIS_REPLY_ARRAY || master->elements < 2) continue;
        std::string host(master->element[0]->str == nullptr ? "" : master->element[0]->str,
                         master->element[0]->len);
        if (host.empty() || host == "?") host = node->host;
        ranges.push_back(Range{static_cast<int>(entry->element[0]->integer),
                               static_cast<int>(entry->element[1]->integer),
                               absl::StrCat(host, ":", master->element[1]->integer)});
      }
    } else {
      last = absl::UnavailableError(
          absl::StrCat("Redis node ", node->address, " is not in cluster mode (CLUSTER SLOTS)"));
    }
    freeReplyObject(*reply);
    if (ranges.empty()) continue;
    std::vector<std::pair<const Range*, Node*>> owners;
    for (const Range& range : ranges) owners.emplace_back(&range, NodeFor(range.address));
    absl::MutexLock lock(&map_mu_);
    slot_owner_.fill(-1);
    for (const auto& [range, owner] : owners) {
      if (owner == nullptr) continue;
      for (int slot = std::max(0, range->start);
           slot <= std::min(kRedisClusterSlots - 1, range->end); ++slot) {
        slot_owner_[slot] = owner->index;
      }
    }
    last_refresh_ = absl::Now();
    refresh_wanted_ = false;
    slot_refreshes_.fetch_add(1, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  return last;
}

RedisCluster::Reach RedisCluster::CheckReach() {
  Reach reach;
  const absl::Status refreshed = RefreshSlots();
  std::vector<Node*> candidates;  // the masters, else every node known (the seeds)
  std::vector<int> slots_of;      // by candidate
  {
    absl::MutexLock lock(&map_mu_);
    std::vector<int> owned(nodes_.size(), 0);
    for (const int32_t owner : slot_owner_) {
      if (owner >= 0) ++owned[owner];
    }
    for (size_t i = 0; i < nodes_.size(); ++i) {
      if (refreshed.ok() && owned[i] == 0) continue;
      candidates.push_back(nodes_[i].get());
      slots_of.push_back(owned[i]);
    }
  }
  if (refreshed.ok()) reach.masters = static_cast<int>(candidates.size());
  for (size_t i = 0; i < candidates.size(); ++i) {
    Node* node = candidates[i];
    absl::StatusOr<redisReply*> pong = NodeCommand(node, "PING", absl::InfiniteFuture());
    const bool answered = pong.ok() && (*pong)->type == REDIS_REPLY_STATUS;
    if (pong.ok()) freeReplyObject(*pong);
    if (answered && refreshed.ok()) {
      ++reach.masters_reached;
      reach.slots_covered += slots_of[i];
    }
    {
      absl::MutexLock lock(&node->mu);
      if (node->credentials_refused) ++reach.credentials_refused;
    }
    if (!answered) {
      // A node that failed during the refresh rests now: its own failure says more than that.
      absl::MutexLock lock(&node->failure_mu);
      reach.problems.push_back(
          !node->last_failure.empty()
              ? absl::StrCat("Redis node ", node->address, ": ", node->last_failure)
          : pong.ok() ? absl::StrCat("Redis node ", node->address, " answered PING with an error")
                      : std::string(pong.status().message()));
    }
  }
  return reach;
}

// One batch, across its rounds: its commands, what becomes of each, and the caller's deadline.
struct RedisCluster::Batch {
  bool bounded() const { return deadline != absl::InfiniteFuture(); }

  std::vector<Command>& commands;
  const absl::FunctionRef<absl::Status(size_t index, const redisReply& reply)> on_reply;
  std::vector<absl::Status>& results;  // by command
  const absl::Time deadline;
  const absl::Status past_deadline =
      absl::DeadlineExceededError("the caller's deadline passed before Redis answered");
  std::vector<size_t> next = {};         // commands redirected this round, for the next one
  const ValueMaker* value_of = nullptr;  // SetAsMade's: values made while the batch is written
  StringSink* sink = nullptr;            // Get's: string replies go to its visitor as parsed
};

namespace {

// Appends `argv` and, when `has_value`, the value made of `value`'s pieces as its last argument to
// the context's output buffer, after an ASKING when `asking`. RESP frames every argument with its
// length, so the pieces go into the buffer one after another: a value is copied once, there.
void AppendCommand(redisContext* context, absl::Span<const absl::string_view> argv, bool has_value,
                   absl::Span<const absl::string_view> value, bool asking) {
  if (asking) redisAppendCommand(context, "ASKING");
  std::string framing = absl::StrCat("*", argv.size() + (has_value ? 1 : 0), "\r\n");
  for (const absl::string_view arg : argv)
    absl::StrAppend(&framing, "$", arg.size(), "\r\n", arg, "\r\n");
  if (has_value) {
    size_t value_bytes = 0;
    for (const absl::string_view piece : value) value_bytes += piece.size();
    absl::StrAppend(&framing, "$", value_bytes, "\r\n");
  }
  redisAppendFormattedCommand(context, framing.data(), framing.size());
  if (!has_value) return;
  for (const absl::string_view piece : value) {
    if (!piece.empty()) redisAppendFormattedCommand(context, piece.data(), piece.size());
  }
  redisAppendFormattedCommand(context, "\r\n", 2);
}

// Reads a command's reply into *reply, after its ASKING's (dropped) when it was sent one. False
// when the connection failed.
bool ReadReply(redisContext* context, bool asking, redisReply** reply) {
  if (asking) {
    const bool lost = redisGetReply(context, reinterpret_cast<void**>(reply)) != REDIS_OK;
    if (*reply != nullptr) freeReplyObject(*reply);
    *reply = nullptr;
    if (lost) return false;
  }
  return redisGetReply(context, reinterpret_cast<void**>(reply)) == REDIS_OK;
}

absl::Status SetReply(size_t, const redisReply& reply) {
  return reply.type == REDIS_REPLY_STATUS
             ? absl::OkStatus()
             : absl::InternalError("Redis answered SET with something other than OK");
}

}  // namespace

void RedisCluster::Run(
    std::vector<Command>& commands,
    absl::FunctionRef<absl::Status(size_t index, const redisReply& reply)> on_reply,
    std::vector<absl::Status>& results, absl::Time deadline, const ValueMaker* value_of,
    StringSink* sink) {
  results.assign(commands.size(), absl::UnavailableError("not sent"));
  Batch batch{.commands = commands,
              .on_reply = on_reply,
              .results = results,
              .deadline = deadline,
              .value_of = value_of,
              .sink = sink};
  std::vector<size_t> pending(commands.size());
  for (size_t i = 0; i < pending.size(); ++i) pending[i] = i;
  while (!pending.empty()) {
    if (batch.bounded() && absl::Now() >= deadline) {
      for (size_t i : pending) results[i] = batch.past_deadline;  // redirected, with no time left
      return;
    }
    MaybeRefreshSlots(deadline);
    std::vector<NodeBatch> parts = GroupByNode(batch, pending);
    LockNodes(batch, parts);
    // Pipelines of at most max_pipeline_bytes per node: every node's next chunk is written,
    // then every node's replies to it are read.
    bool more = true;
    while (more) {
      more = false;
      if (batch.value_of != nullptr) {
        more = WriteChunksInOrder(batch, parts);
      } else {
        for (NodeBatch& part : parts) more |= WriteChunk(batch, part);
      }
      for (NodeBatch& part : parts) ReadReplies(batch, part);
    }
    for (NodeBatch& part : parts) Release(part.node);
    pending = std::exchange(batch.next, {});
  }
}

std::vector<RedisCluster::NodeBatch> RedisCluster::GroupByNode(Batch& batch,
                                                               const std::vector<size_t>& pending) {
  // By node index: the order every batch locks nodes in.
  std::map<int, NodeBatch> by_node;
  for (size_t i : pending) {
    const Command& command = batch.commands[i];
    Node* node = command.target != nullptr ? command.target : SlotOwner(command.slot);
    if (node == nullptr) {
      batch.results[i] =
          absl::UnavailableError(absl::StrCat("no Redis node is known for slot ", command.slot));
      continue;
    }
    NodeBatch& part = by_node[node->index];
    part.node = node;
    part.members.push_back(i);
  }
  std::vector<NodeBatch> parts;
  parts.reserve(by_node.size());
  for (auto& [index, part] : by_node) parts.push_back(std::move(part));
  return parts;
}

void RedisCluster::LockNodes(Batch& batch, std::vector<NodeBatch>& parts) {
  for (auto it = parts.begin(); it != parts.end();) {
    Node* node = it->node;
    // A resting node (or one being probed) is skipped without waiting for it. A node another
    // batch holds (the mover's, on a slow node) is waited for only until the deadline; its keys
    // are then the caller's misses.
    enum class Outcome { kHeld, kSkipped, kPastDeadline } outcome = Outcome::kSkipped;
    while (!Resting(*node)) {
      if (!batch.bounded()) {
        node->mu.Lock();
        outcome = Outcome::kHeld;
        break;
      }
      if (node->mu.TryLock()) {
        outcome = Outcome::kHeld;
        break;
      }
      if (absl::Now() >= batch.deadline) {
        outcome = Outcome::kPastDeadline;
        break;
      }
      absl::SleepFor(absl::Microseconds(100));
    }
    // It may have tripped while this batch waited for it.
    if (outcome == Outcome::kHeld && Admit(node) == Admission::kSkip) {
      Release(node);
      outcome = Outcome::kSkipped;
    }
    if (outcome == Outcome::kHeld) {
      ++it;
      continue;
    }
    for (size_t i : it->members) {
      batch.results[i] = outcome == Outcome::kSkipped ? SkippedStatus(node) : batch.past_deadline;
    }
    it = parts.erase(it);
  }
}

bool RedisCluster::StartChunk(Batch& batch, NodeBatch& part) {
  part.chunk_begin = part.written;
  if (!part.usable || part.written >= part.members.size()) return false;
  const absl::Status connected = EnsureConnected(part.node, batch.deadline);
  if (connected.ok()) return true;
  for (size_t k = part.written; k < part.members.size(); ++k) {
    batch.results[part.members[k]] = connected;
  }
  part.usable = false;
  return false;
}

bool RedisCluster::ChunkTakesNext(const Batch& batch, const NodeBatch& part, uint64_t bytes) const {
  if (part.written >= part.members.size()) return false;
  return part.written == part.chunk_begin ||
         bytes + batch.commands[part.members[part.written]].weight <= options_.max_pipeline_bytes;
}

void RedisCluster::AppendNext(Batch& batch, NodeBatch& part, uint64_t& bytes) {
  const size_t i = part.members[part.written++];
  Command& command = batch.commands[i];
  bytes += command.weight;
  if (command.value_pending) {
    command.value_pending = false;
    absl::StatusOr<absl::string_view> value = batch.value_of->value(i);
    if (!value.ok()) {
      batch.results[i] = value.status();
      command.withheld = true;
      return;
    }
    command.value = {*value};
  }
  AppendCommand(part.node->context, command.argv, command.has_value, command.value, command.asking);
  commands_.fetch_add(1, std::memory_order_relaxed);
}

void RedisCluster::Flush(NodeBatch& part) {
  int done = 0;
  while (done == 0 && part.node->context->err == 0) {
    if (redisBufferWrite(part.node->context, &done) != REDIS_OK) break;
  }
}

bool RedisCluster::WriteChunk(Batch& batch, NodeBatch& part) {
  if (StartChunk(batch, part)) {
    uint64_t bytes = 0;
    while (ChunkTakesNext(batch, part, bytes)) AppendNext(batch, part, bytes);
    Flush(part);
  }
  return part.usable && part.written < part.members.size();
}

bool RedisCluster::WriteChunksInOrder(Batch& batch, std::vector<NodeBatch>& parts) {
  std::vector<bool> open(parts.size());
  std::vector<uint64_t> bytes(parts.size(), 0);
  for (size_t p = 0; p < parts.size(); ++p) open[p] = StartChunk(batch, parts[p]);
  while (true) {
    // The part whose next command comes first in the batch: the maker makes values in order.
    size_t next = parts.size();
    for (size_t p = 0; p < parts.size(); ++p) {
      if (!open[p] || !ChunkTakesNext(batch, parts[p], bytes[p])) continue;
      if (next == parts.size() ||
          parts[p].members[parts[p].written] < parts[next].members[parts[next].written]) {
        next = p;
      }
    }
    if (next == parts.size()) break;
    const size_t i = parts[next].members[parts[next].written];
    if (batch.commands[i].value_pending && !batch.value_of->made(i)) {
      // What is written travels while this value is made.
      for (size_t p = 0; p < parts.size(); ++p) {
        if (open[p] && parts[p].usable) Flush(parts[p]);
      }
    }
    AppendNext(batch, parts[next], bytes[next]);
  }
  for (size_t p = 0; p < parts.size(); ++p) {
    if (open[p] && parts[p].usable) Flush(parts[p]);
  }
  bool more = false;
  for (const NodeBatch& part : parts) more |= part.usable && part.written < part.members.size();
  return more;
}

void RedisCluster::ReadReplies(Batch& batch, NodeBatch& part) {
  // Within the caller's deadline: a read timeout that ends before io_timeout is the deadline's.
  bool deadline_bound = false;
  if (batch.bounded() && part.usable && part.chunk_begin < part.written) {
    const absl::Duration left = std::max(batch.deadline - absl::Now(), absl::Milliseconds(1));
    deadline_bound = left < options_.io_timeout;
    if (deadline_bound) redisSetTimeout(part.node->context, absl::ToTimeval(left));
  }
  const absl::Time reading_since = absl::Now();
  bool answered = false;  // any reply to this chunk
  bool tripped = false;
  for (size_t k = part.chunk_begin; k < part.written && part.usable; ++k) {
    const size_t i = part.members[k];
    if (batch.commands[i].withheld) continue;  // never sent
    redisReply* reply = nullptr;
    if (batch.sink != nullptr) {
      batch.sink->index = i;
      batch.sink->visited = false;
    }
    part.node->context->reader->privdata = batch.sink;
    const bool lost = !ReadReply(part.node->context, batch.commands[i].asking, &reply);
    // Another batch's replies are its own.
    if (part.node->context != nullptr) part.node->context->reader->privdata = nullptr;
    if (lost || reply == nullptr) {
      const bool cut = deadline_bound && absl::Now() >= batch.deadline;
      absl::Status failed = batch.past_deadline;
      if (NoReplyTrips(cut, answered, absl::Now() - reading_since)) {
        // Lost, timed out on io_timeout, or silent for the whole of the caller's deadline: a
        // node that is down or hung, rested so that the next calls skip it.
        const char* why = cut                                  ? "no reply within the deadline"
                          : part.node->context->errstr[0] != 0 ? part.node->context->errstr
                                                               : "no reply";
        if (!cut) {
          failed =
              absl::UnavailableError(absl::StrCat("Redis node ", part.node->address, ": ", why));
        }
        MarkFailed(part.node, why);
        tripped = true;
      } else {
        redisFree(part.node->context);  // replies still owed: the connection is out of step
        part.node->context = nullptr;
      }
      for (size_t rest = k; rest < part.members.size(); ++rest) {
        batch.results[part.members[rest]] = failed;
      }
      part.usable = false;
      break;
    }
    answered = true;
    if (reply->type == REDIS_REPLY_ERROR) {
      OnErrorReply(batch, i, part.node, absl::string_view(reply->str, reply->len));
    } else {
      part.node->credentials_refused = false;  // a NOAUTH node that no longer wants a password
      batch.results[i] = batch.on_reply(i, *reply);
    }
    freeReplyObject(reply);
  }
  if (answered && !tripped) MarkAnswered(part.node);
  if (deadline_bound && part.node->context != nullptr) {
    redisSetTimeout(part.node->context, absl::ToTimeval(options_.io_timeout));
  }
}

void RedisCluster::OnErrorReply(Batch& batch, size_t i, Node* from, absl::string_view error) {
  std::optional<Redirect> redirect = ParseRedirect(error);
  if (!redirect.has_value() && ErrorClass(error) == "NOAUTH") {
    batch.results[i] = CredentialsRefused(from, "NOAUTH");
    return;
  }
  if (!redirect.has_value()) {
    const bool transient = absl::StartsWith(error, "TRYAGAIN") ||
                           absl::StartsWith(error, "CLUSTERDOWN") ||
                           absl::StartsWith(error, "LOADING");
    batch.results[i] = transient ? absl::UnavailableError(absl::StrCat("Redis: ", error))
                                 : absl::InternalError(absl::StrCat("Redis: ", error));
    return;
  }
  if (absl::StartsWith(redirect->address, ":")) redirect->address = from->host + redirect->address;
  Command& command = batch.commands[i];
  Node* to = NodeFor(redirect->address);
  if (redirect->ask) {
    ask_.fetch_add(1, std::memory_order_relaxed);
    command.target = to;
    command.asking = true;
  } else {
    moved_.fetch_add(1, std::memory_order_relaxed);
    command.target = nullptr;
    command.asking = false;
    absl::MutexLock lock(&map_mu_);
    if (to != nullptr) slot_owner_[redirect->slot] = to->index;
    refresh_wanted_ = true;  // a moved slot rarely moves alone
  }
  if (to != nullptr && ++command.redirects <= options_.max_redirects) {
    batch.next.push_back(i);
  } else {
    batch.results[i] = absl::UnavailableError(absl::StrCat(
        "Redis key of slot ", command.slot, " redirected ", command.redirects, " times"));
  }
}

std::vector<absl::Status> RedisCluster::Get(absl::Span<const std::string> keys, ValueVisitor found,
                                            absl::Time deadline) {
  std::vector<Command> commands(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    commands[i].argv = {"GET", keys[i]};
    commands[i].slot = KeySlot(keys[i]);
  }
  std::vector<absl::Status> results;
  // Each value straight from hiredis' read buffer, not from a reply object made of it.
  StringSink sink{.visitor = &found};
  Run(
      commands,
      [&](size_t index, const redisReply& reply) -> absl::Status {
        if (reply.type == REDIS_REPLY_NIL) return absl::NotFoundError("no such key");
        if (reply.type != REDIS_REPLY_STRING) {
          return absl::InternalError("Redis answered GET with something other than a string");
        }
        if (!sink.visited) found(index, absl::string_view(reply.str, reply.len));
        return absl::OkStatus();
      },
      results, deadline, nullptr, &sink);
  return results;
}

std::vector<absl::StatusOr<std::string>> RedisCluster::Get(absl::Span<const std::string> keys) {
  std::vector<std::string> values(keys.size());
  const std::vector<absl::Status> statuses =
      Get(keys, [&](size_t index, absl::string_view value) { values[index] = std::string(value); });
  std::vector<absl::StatusOr<std::string>> results;
  results.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (statuses[i].ok()) {
      results.emplace_back(std::move(values[i]));
    } else {
      results.emplace_back(statuses[i]);
    }
  }
  return results;
}

std::vector<absl::Status> RedisCluster::Set(
    absl::Span<const std::pair<std::string, std::string>> entries) {
  std::vector<SetEntry> pieces(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    pieces[i] = {.key = entries[i].first, .value = {entries[i].second}};
  }
  return SetFromPieces(pieces);
}

std::vector<absl::Status> RedisCluster::SetFromPieces(absl::Span<const SetEntry> entries) {
  std::vector<Command> commands(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    commands[i].argv = {"SET", entries[i].key};
    commands[i].has_value = true;
    commands[i].value = entries[i].value;
    commands[i].slot = KeySlot(entries[i].key);
    for (const absl::string_view piece : entries[i].value) commands[i].weight += piece.size();
  }
  std::vector<absl::Status> results;
  Run(commands, SetReply, results);
  return results;
}

std::vector<absl::Status> RedisCluster::SetAsMade(absl::Span<const std::string> keys,
                                                  absl::Span<const uint64_t> sizes,
                                                  const ValueMaker& maker) {
  std::vector<Command> commands(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    commands[i].argv = {"SET", keys[i]};
    commands[i].has_value = true;
    commands[i].slot = KeySlot(keys[i]);
    commands[i].weight = sizes[i];
    commands[i].value_pending = true;
  }
  std::vector<absl::Status> results;
  Run(commands, SetReply, results, absl::InfiniteFuture(), &maker);
  return results;
}

std::vector<absl::Status> RedisCluster::Delete(absl::Span<const std::string> keys) {
  std::vector<Command> commands(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    commands[i].argv = {"DEL", keys[i]};
    commands[i].slot = KeySlot(keys[i]);
  }
  std::vector<absl::Status> results;
  Run(
      commands,
      [](size_t, const redisReply& reply) {
        return reply.type == REDIS_REPLY_INTEGER
                   ? absl::OkStatus()
                   : absl::InternalError("Redis answered DEL with something other than a count");
      },
      results);
  return results;
}

RedisClusterCounters RedisCluster::counters() const {
  return RedisClusterCounters{.moved = moved_.load(),
                              .ask = ask_.load(),
                              .connects = connects_.load(),
                              .node_failures = node_failures_.load(),
                              .skipped = skipped_.load(),
                              .stale_reconnects = stale_reconnects_.load(),
                              .slot_refreshes = slot_refreshes_.load(),
                              .commands = commands_.load()};
}

}  // namespace kvcache
