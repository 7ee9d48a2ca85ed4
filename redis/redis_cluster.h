// RedisCluster: a client of a Redis Cluster (or Valkey, which speaks the same protocol) for the
// cluster tier (DESIGN §10): keys hashed to slots as the cluster does (CRC16 of the key or of its
// {hash tag}, mod 16384), the slot map read with CLUSTER SLOTS, MOVED and ASK redirections
// followed, lost connections reopened, and the commands of a batch pipelined on each node — all
// nodes' commands are written before any reply is read, so a batch costs about one round trip.
// Built on hiredis (Debian libhiredis-dev), synchronous, with a timeout on every connect, write
// and read.
//
// The cluster is a cache: a missing key is NOT_FOUND, and a node that cannot be reached or does
// not answer in time makes its keys UNAVAILABLE (the caller computes instead) without holding up
// the other nodes' keys. Each node has a circuit breaker: a node that failed — refused or lost a
// connection, timed out, or said nothing at all for the whole of a caller's deadline (a hung
// process) — rests for `retry_down_after`, during which its commands are skipped (UNAVAILABLE,
// counted) without waiting for it, so a dead or hung node costs one timeout, not one per call.
// After the rest, the first batch to reach it probes it (other batches still skip it meanwhile):
// a reply closes the breaker, a failure rests it again. A failure also makes the next batch read
// the slot map again (a replica may have taken over). Create never fails for an unreachable
// cluster: the map is read when the first batch needs it (CheckReach reads it at once).
//
// Bounds: a batch writes at most `max_pipeline_bytes` of SET values to one node before it reads
// that node's replies, so neither side buffers more than that for one batch.
//
// The password never appears in a status message or a log.
//
// Thread safety: thread-safe. Each node's connection is used by one batch at a time (batches lock
// the nodes they use in a fixed order); batches on different nodes run in parallel.
#ifndef KVCACHE_REDIS_REDIS_CLUSTER_H_
#define KVCACHE_REDIS_REDIS_CLUSTER_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/inlined_vector.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

struct redisContext;
struct redisReadTask;
struct redisReply;

namespace kvcache {

inline constexpr int kRedisClusterSlots = 16384;

struct RedisClusterOptions {
  std::vector<std::string> seeds;  // "host:port" of any nodes; the slot map names the rest
  std::string username;            // Redis 6 ACL user; empty: AUTH with the password alone
  std::string password;            // empty: no AUTH
  absl::Duration connect_timeout = absl::Milliseconds(200);
  absl::Duration io_timeout = absl::Milliseconds(500);
  absl::Duration retry_down_after = absl::Seconds(1);
  uint64_t max_pipeline_bytes = uint64_t{32} << 20;
  int max_redirects = 3;  // per key and batch
  // Told, once per node until the node accepts them again, that it refused the credentials
  // (WRONGPASS, or a password given to a node that has none) or wants some (NOAUTH): an
  // operator's mistake that no retry mends, for the caller to log. The line names the node and
  // the error's class, never the password nor Redis' own text. Called with a node's lock held:
  // it must not call back into the client. Null: not told.
  std::function<void(const std::string& line)> on_credentials_refused;
};

struct RedisClusterCounters {
  uint64_t moved = 0;     // MOVED replies followed
  uint64_t ask = 0;       // ASK replies followed
  uint64_t connects = 0;  // connections opened (the first ones and every reconnect)
  // Times a node's breaker opened (it then rests for retry_down_after): connects refused or
  // timed out, connections lost or timed out, a node silent for a caller's whole deadline, a
  // failed probe after a rest.
  uint64_t node_failures = 0;
  uint64_t skipped = 0;           // commands not sent because their node was resting or probed
  uint64_t stale_reconnects = 0;  // idle connections the node had closed (a restart), replaced
  uint64_t slot_refreshes = 0;
  uint64_t commands = 0;
};

class RedisCluster {
 public:
  // INVALID_ARGUMENT for no seeds or a seed that is not HOST:PORT. Sets SIGPIPE to be ignored
  // if the process left it at its default (which would end the process when a node closes a
  // connection hiredis then writes to).
  static absl::StatusOr<std::unique_ptr<RedisCluster>> Create(RedisClusterOptions options);
  ~RedisCluster();
  RedisCluster(const RedisCluster&) = delete;
  RedisCluster& operator=(const RedisCluster&) = delete;

  // The cluster's slot of `key`: CRC16 (XMODEM) of the key, or of the part between its first '{'
  // and the next '}' when that part is not empty, mod 16384.
  static uint16_t KeySlot(absl::string_view key);

  // GET of each key. `found(i, value)` is called for each key found, with a view valid only
  // during the call; the result says, per key, OK (found), NOT_FOUND, UNAVAILABLE (its node is
  // down or slow, or the slot has no node) or INTERNAL (Redis answered with an error).
  // With a `deadline`, what has not come back by then is DEADLINE_EXCEEDED: the connections it
  // waited on are dropped (a reconnect follows) but their nodes are not rested, since the budget
  // was the caller's, not a sign the node failed.
  using ValueVisitor = absl::FunctionRef<void(size_t index, absl::string_view value)>;
  std::vector<absl::Status> Get(absl::Span<const std::string> keys, ValueVisitor found,
                                absl::Time deadline = absl::InfiniteFuture());
  // The same, copying the values.
  std::vector<absl::StatusOr<std::string>> Get(absl::Span<const std::string> keys);
  // SET of each key to its value; per key OK, UNAVAILABLE or INTERNAL (e.g. OOM from a node
  // with maxmemory and noeviction).
  std::vector<absl::Status> Set(absl::Span<const std::pair<std::string, std::string>> entries);
  // The same, each value given in pieces that are sent one after another (a record's header and
  // its bytes, never joined in memory: each byte is copied once, into the connection's buffer).
  // The views must stay valid until the call returns.
  struct SetEntry {
    absl::string_view key;
    absl::InlinedVector<absl::string_view, 2> value;
  };
  std::vector<absl::Status> SetFromPieces(absl::Span<const SetEntry> entries);
  // SET of each key to a value still being made when this is called (sealed on other threads).
  // Keys are written in their order across nodes, each value asked for just before it is written;
  // whenever the next is not made yet, what was written so far goes out first, so the values made
  // first travel while the rest are made. A value that could not be made (an error from
  // `maker.value`) is not sent, and is that key's result. `sizes[i]`: key i's value's size (for
  // max_pipeline_bytes). The views `maker.value` returns must stay valid until SetAsMade returns.
  // Results as Set's.
  struct ValueMaker {
    absl::FunctionRef<bool(size_t index)> made;  // whether key i's value is made (never waits)
    // Key i's value, once made (waits until it is).
    absl::FunctionRef<absl::StatusOr<absl::string_view>(size_t index)> value;
  };
  std::vector<absl::Status> SetAsMade(absl::Span<const std::string> keys,
                                      absl::Span<const uint64_t> sizes, const ValueMaker& maker);
  // DEL of each key; per key OK (deleted or absent), UNAVAILABLE or INTERNAL.
  std::vector<absl::Status> Delete(absl::Span<const std::string> keys);

  // Reads the slot map from the first node that answers CLUSTER SLOTS. UNAVAILABLE if none does.
  absl::Status RefreshSlots() { return RefreshSlots(absl::InfiniteFuture()); }
  // How many slots have a node in the map (16384 once the whole cluster is known).
  int MappedSlots() const;

  // How much of the cluster this client reaches now, for a start-up report.
  struct Reach {
    int masters = 0;          // nodes the slot map names as owners of slots
    int masters_reached = 0;  // of those, the ones that answered PING, credentials accepted
    int slots_covered = 0;    // slots owned by a master reached
    // Nodes (masters, or seeds when no slot map could be read) that refused the credentials or
    // wanted some: a configuration error rather than an outage.
    int credentials_refused = 0;
    // "HOST:PORT: why" for each such node and each master not reached; never a secret.
    std::vector<std::string> problems;
  };
  // Reads the slot map and PINGs every master it names (or every seed, when none gives a map).
  Reach CheckReach();

  RedisClusterCounters counters() const;

 private:
  static constexpr int64_t kNotResting = INT64_MIN;
  struct Node {
    std::string address;
    std::string host;
    int port = 0;
    int index = 0;  // in nodes_: the order batches lock nodes in
    absl::Mutex mu;
    redisContext* context ABSL_GUARDED_BY(mu) = nullptr;
    bool credentials_refused ABSL_GUARDED_BY(mu) = false;  // and told; until accepted again
    // The breaker, read without `mu` so that a batch skips a resting node at once rather than
    // queue behind the batch holding it. Closed: kNotResting. Open: the node rests until then.
    // Half-open: the rest is over and `probing` says a batch has claimed the probe (under mu).
    std::atomic<int64_t> resting_until_ns{kNotResting};
    std::atomic<bool> probing{false};
    // Why it last failed (never a secret), for what a skipped call is told: a leaf lock, so that
    // a batch that skips the node need not wait for the batch holding `mu`.
    absl::Mutex failure_mu ABSL_ACQUIRED_AFTER(mu);
    std::string last_failure ABSL_GUARDED_BY(failure_mu);
  };
  // What a batch may do with a node now.
  enum class Admission { kUse, kProbe, kSkip };
  // One command of a batch: argv, which key it is for, and where it goes.
  struct Command;
  // One batch, across its rounds: its commands, what becomes of each, and the caller's deadline.
  struct Batch;
  // Where a Get's string replies go as hiredis parses them (the reader's privdata): to the
  // caller's visitor, straight from the read buffer, rather than into reply objects the visitor
  // would copy from again (CreateStringOrSink, hiredis' createString for every connection).
  struct StringSink;
  static void* CreateStringOrSink(const redisReadTask* task, char* str, size_t len);
  static void UseStringSinks(redisContext* context);
  // One node's part of a round: its commands in order, how far they have been written, and the
  // chunk (members[chunk_begin, written)) whose replies are read next.
  struct NodeBatch {
    Node* node = nullptr;
    std::vector<size_t> members;  // indices into the batch's commands
    size_t chunk_begin = 0;
    size_t written = 0;
    bool usable = true;  // false once the node failed or the deadline passed; the rest have results
  };

  explicit RedisCluster(RedisClusterOptions options);

  // Runs the commands and hands each reply to `on_reply` for the command's result, following
  // redirections; a command that gets no reply gets why. Locks the nodes it uses, a set known
  // only at run time (in index order), which the thread-safety analysis cannot follow.
  // With `value_of` (SetAsMade), the commands' values are made as they are written.
  void Run(std::vector<Command>& commands,
           absl::FunctionRef<absl::Status(size_t index, const redisReply& reply)> on_reply,
           std::vector<absl::Status>& results, absl::Time deadline = absl::InfiniteFuture(),
           const ValueMaker* value_of = nullptr,
           StringSink* sink = nullptr) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Run's steps, each round. The pending commands by the node they go to, in node index order (a
  // command whose slot has no node fails here).
  std::vector<NodeBatch> GroupByNode(Batch& batch, const std::vector<size_t>& pending)
      ABSL_LOCKS_EXCLUDED(map_mu_);
  // Locks each part's node, in order; with a deadline, a node still held by another batch when it
  // passes fails its commands and leaves `parts`.
  void LockNodes(Batch& batch, std::vector<NodeBatch>& parts) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Writes the part's next chunk, at most max_pipeline_bytes of SET values (at least one command);
  // a node that cannot be reached fails the rest. True while commands remain to be written.
  bool WriteChunk(Batch& batch, NodeBatch& part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(part.node->mu);
  // The same for every part at once, command by command in the batch's order, SetAsMade's values
  // asked for in the order they are made; the parts' buffers go out before a value not yet made
  // is waited for, and at the end.
  bool WriteChunksInOrder(Batch& batch,
                          std::vector<NodeBatch>& parts) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // WriteChunk's steps. Begins the part's next chunk, connecting first; false when it has nothing
  // to write or its node cannot be reached (its rest then failed).
  bool StartChunk(Batch& batch, NodeBatch& part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(part.node->mu);
  // Whether the chunk, with `bytes` of values so far, takes the part's next command.
  bool ChunkTakesNext(const Batch& batch, const NodeBatch& part, uint64_t bytes) const;
  // Appends the part's next command to its node's output buffer (asking for its value first).
  void AppendNext(Batch& batch, NodeBatch& part, uint64_t& bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(part.node->mu);
  // Writes out the node's output buffer.
  void Flush(NodeBatch& part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(part.node->mu);
  // Reads the replies to the chunk just written: each to `on_reply`, an error to OnErrorReply. A
  // lost connection fails the part's rest and rests the node, except when the caller's deadline
  // cut a node that had answered or was given less than kSilenceThatTrips: then only the
  // connection is dropped.
  void ReadReplies(Batch& batch, NodeBatch& part) ABSL_EXCLUSIVE_LOCKS_REQUIRED(part.node->mu);
  // A MOVED or ASK is followed (the command goes to the next round, max_redirects times at most);
  // NOAUTH is a credentials error; any other error from `from` is the command's result.
  void OnErrorReply(Batch& batch, size_t i, Node* from, absl::string_view error)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(from->mu) ABSL_LOCKS_EXCLUDED(map_mu_);
  Node* NodeFor(const std::string& address) ABSL_LOCKS_EXCLUDED(map_mu_);
  Node* SlotOwner(uint16_t slot) ABSL_LOCKS_EXCLUDED(map_mu_);
  // Connects `node` if it has no connection (and AUTHs), each step bounded by `deadline` too.
  absl::Status EnsureConnected(Node* node, absl::Time deadline = absl::InfiniteFuture())
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node->mu);
  // Drops the connection and rests the node (`why` is what a call meanwhile is told); wants a
  // fresh slot map.
  void MarkFailed(Node* node, std::string why) ABSL_EXCLUSIVE_LOCKS_REQUIRED(node->mu);
  // Whether a batch that does not hold the node must skip it now: resting, or being probed.
  static bool Resting(const Node& node);
  // Under the node's lock: use it, probe it (its rest is over; the caller is the one probe), or
  // skip it (it rests, or tripped while the caller waited for it).
  static Admission Admit(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(node->mu);
  // Ends a probe claim the holder did not resolve, then unlocks the node.
  static void Release(Node* node) ABSL_UNLOCK_FUNCTION(node->mu);
  // The node answered: its breaker closes.
  static void MarkAnswered(Node* node) ABSL_EXCLUSIVE_LOCKS_REQUIRED(node->mu);
  // What a skipped command is told.
  absl::Status SkippedStatus(Node* node) ABSL_LOCKS_EXCLUDED(node->mu);
  // A credentials error from `node` (`error_class`: WRONGPASS, NOAUTH, ERR): the status its
  // command gets; told once to on_credentials_refused.
  absl::Status CredentialsRefused(Node* node, absl::string_view error_class)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(node->mu);
  // One command on one node outside a batch (CLUSTER SLOTS, PING), under the node's breaker and
  // within `deadline`; a node held by a batch is skipped when the deadline is finite. The reply
  // (freed by the caller), or why there is none.
  absl::StatusOr<redisReply*> NodeCommand(Node* node, const char* command, absl::Time deadline);
  absl::Status RefreshSlots(absl::Time deadline);
  // At most one refresh per kMinRefreshInterval, when one is wanted.
  void MaybeRefreshSlots(absl::Time deadline);

  const RedisClusterOptions options_;

  mutable absl::Mutex map_mu_;
  std::vector<std::unique_ptr<Node>> nodes_ ABSL_GUARDED_BY(map_mu_);  // never shrinks
  absl::flat_hash_map<std::string, Node*> by_address_ ABSL_GUARDED_BY(map_mu_);
  std::array<int32_t, kRedisClusterSlots> slot_owner_ ABSL_GUARDED_BY(map_mu_);  // node index, -1
  absl::Time last_refresh_ ABSL_GUARDED_BY(map_mu_) = absl::InfinitePast();
  bool refresh_wanted_ ABSL_GUARDED_BY(map_mu_) = true;

  std::atomic<uint64_t> moved_{0};
  std::atomic<uint64_t> ask_{0};
  std::atomic<uint64_t> connects_{0};
  std::atomic<uint64_t> node_failures_{0};
  std::atomic<uint64_t> skipped_{0};
  std::atomic<uint64_t> slot_refreshes_{0};
  std::atomic<uint64_t> stale_reconnects_{0};
  std::atomic<uint64_t> commands_{0};
};

}  // namespace kvcache

#endif  // KVCACHE_REDIS_REDIS_CLUSTER_H_
