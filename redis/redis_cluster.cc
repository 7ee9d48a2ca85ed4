#include "redis/redis_cluster.h"

#include <hiredis/hiredis.h>
#include <poll.h>
#include <signal.h>
#include <sys/time.h>

#include <algorithm>
#include <string>
#include <utility>

#include "absl/base/call_once.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "redis/redis_cluster_internal.h"

namespace kvcache {
namespace {

// A refresh of the slot map is wanted after every failure; a dead cluster must not get one per
// batch.
constexpr absl::Duration kMinRefreshInterval = absl::Milliseconds(100);

// A node that sent nothing at all for this long when a caller's deadline cut the wait is taken
// for hung (a Redis node on a network answers in well under a millisecond) and rested; a shorter
// cut says nothing of the node, only that the caller had little time left.
constexpr absl::Duration kSilenceThatTrips = absl::Milliseconds(5);

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

}  // namespace

namespace redis_internal {

absl::string_view ErrorClass(absl::string_view error) {
  const absl::string_view word = error.substr(0, error.find(' '));
  const bool upper = !word.empty() && std::all_of(word.begin(), word.end(),
                                                  [](char c) { return c >= 'A' && c <= 'Z'; });
  return upper ? word : "error";
}

bool NoReplyTrips(bool cut_by_deadline, bool answered, absl::Duration waited) {
  return !cut_by_deadline || (!answered && waited >= kSilenceThatTrips);
}

}  // namespace redis_internal

using redis_internal::ErrorClass;
using redis_internal::NoReplyTrips;

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

}  // namespace kvcache
