// RedisCluster's batches (redis_cluster.h): a batch's commands grouped by the node that owns
// their slots, written to every node before any reply is read, in chunks of at most
// max_pipeline_bytes, redirections followed round by round; and Get, Set and Delete over them.
// Nodes, connections and the slot map are redis_cluster.cc's.
#include <hiredis/hiredis.h>

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "redis/redis_cluster.h"
#include "redis/redis_cluster_internal.h"

namespace kvcache {
namespace {

using redis_internal::ErrorClass;
using redis_internal::NoReplyTrips;

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
