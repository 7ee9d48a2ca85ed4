// KvEventLog: the daemon's one sequence of KV events — blocks stored in a pool's prefix index,
// blocks removed from it, pools cleared — for KV-aware routers (WatchEvents over gRPC, and the
// ZeroMQ publisher in vLLM's wire format, events/). Sequence numbers start at 0, which is the
// AllBlocksCleared every daemon starts with, and grow by one per event.
//
// Pools append under their own mutex, so the log's order is the order the index changed in
// (lock order: a pool's mutex, then the log's). The log keeps the last `capacity` events for
// watchers to resume from, and its own copy of every indexed block (pool, tenant, tokens,
// parent) so that a watcher too far behind gets a snapshot exactly as of one sequence number,
// atomically across pools, without stopping them.
//
// Removal: a pool reports a hash as removed only when it leaves the pool's index (eviction), not
// when a block holding a duplicate of it is freed; the log drops hashes it never announced.
//
// Thread safety: thread-safe.
#ifndef KVCACHE_CACHE_KV_EVENT_LOG_H_
#define KVCACHE_CACHE_KV_EVENT_LOG_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/block_hash.h"
#include "common/clock.h"

namespace kvcache {

enum class KvEventKind : uint8_t { kBlocksStored, kBlocksRemoved, kAllBlocksCleared };

struct StoredBlock {
  Hash128 hash;
  std::vector<uint32_t> token_ids;  // the pool's block_size of them
  uint64_t extras_digest = 0;
};

struct KvEvent {
  uint64_t sequence = 0;
  absl::Time time;
  KvEventKind kind = KvEventKind::kAllBlocksCleared;
  std::string pool;  // empty for an AllBlocksCleared of every pool
  std::string tenant;
  std::string medium;  // "GPU" or "CPU"
  uint32_t block_size = 0;
  // kBlocksStored: a chain, each block the child of the one before; the first one's parent, or
  // nullopt when it starts its prompt.
  std::optional<Hash128> parent_hash;
  std::vector<StoredBlock> blocks;
  std::vector<Hash128> removed;  // kBlocksRemoved
};

// Which events a watcher sees: one tenant's or all, one pool's or all. AllBlocksCleared of every
// pool reaches everyone.
struct KvEventFilter {
  std::string tenant;  // empty: every tenant
  std::string pool;    // empty: every pool
  bool Matches(const KvEvent& event) const;
};

// Who reads the log, for the counters the metrics export.
enum class KvEventSink : uint8_t { kGrpc = 0, kZmq = 1 };
inline constexpr size_t kNumKvEventSinks = 2;

class KvEventLog {
 public:
  static constexpr size_t kDefaultCapacity = 10000;  // vLLM's buffer_steps

  // REQUIRES: capacity > 0. `clock` stamps events and must outlive the log.
  explicit KvEventLog(size_t capacity = kDefaultCapacity, const Clock* clock = RealClock::Get());

  KvEventLog(const KvEventLog&) = delete;
  KvEventLog& operator=(const KvEventLog&) = delete;

  // Called by the CacheManager for each pool before it serves.
  void AddPool(uint32_t pool_index, std::string name, std::string medium, uint32_t block_size);

  // The pool's calls, made under its own mutex. `blocks` is a chain (see KvEvent).
  void BlocksStored(uint32_t pool_index, absl::string_view tenant,
                    std::optional<Hash128> parent_hash, std::vector<StoredBlock> blocks);
  // One event per tenant among the hashes' owners; hashes never announced are dropped.
  void BlocksRemoved(uint32_t pool_index, absl::Span<const Hash128> hashes);

  // The next sequence number to be assigned: every event below it has happened.
  uint64_t next_sequence() const;
  // The oldest sequence number still held.
  uint64_t first_sequence() const;

  struct ReadResult {
    std::vector<std::shared_ptr<const KvEvent>> events;  // in sequence order, from `start`
    uint64_t next_sequence = 0;  // after the last event returned (or `start` when none)
    bool lost = false;           // `start` is older than the log holds: nothing returned
  };
  // Up to `max_events` events with sequence >= start (none when start >= next_sequence()).
  ReadResult Read(uint64_t start, size_t max_events) const;

  // Waits up to `timeout` until an event with sequence >= start exists; true if one does.
  bool WaitFor(uint64_t start, absl::Duration timeout) const;

  struct Snapshot {
    uint64_t next_sequence = 0;  // the snapshot holds every event below it, none from it
    // One BlocksStored per block, a parent before its children, each with sequence
    // next_sequence - 1.
    std::vector<KvEvent> events;
  };
  // The index as of one point of the sequence, filtered.
  Snapshot TakeSnapshot(const KvEventFilter& filter) const;
  // Blocks in the log's copy of the index (every pool, every tenant).
  size_t indexed_blocks() const;

  // Counters for the metrics: events a sink skipped (fell out of the buffer before it read
  // them), replay requests it served, snapshots sent.
  void CountDropped(KvEventSink sink, uint64_t events) {
    dropped_[static_cast<size_t>(sink)].fetch_add(events, std::memory_order_relaxed);
  }
  void CountReplay(KvEventSink sink) {
    replays_[static_cast<size_t>(sink)].fetch_add(1, std::memory_order_relaxed);
  }
  void CountSnapshot() { snapshots_.fetch_add(1, std::memory_order_relaxed); }
  uint64_t dropped(KvEventSink sink) const {
    return dropped_[static_cast<size_t>(sink)].load(std::memory_order_relaxed);
  }
  uint64_t replays(KvEventSink sink) const {
    return replays_[static_cast<size_t>(sink)].load(std::memory_order_relaxed);
  }
  uint64_t snapshots() const { return snapshots_.load(std::memory_order_relaxed); }

 private:
  struct PoolInfo {
    std::string name;
    std::string medium;
    uint32_t block_size = 0;
  };
  struct IndexKey {
    uint32_t pool_index = 0;
    Hash128 hash;
    friend bool operator==(const IndexKey& a, const IndexKey& b) {
      return a.pool_index == b.pool_index && a.hash == b.hash;
    }
    template <typename H>
    friend H AbslHashValue(H state, const IndexKey& key) {
      return H::combine(std::move(state), key.pool_index, key.hash);
    }
  };
  // The BlocksStored event that announced the block, and the block's place in it: the tenant,
  // tokens, extras digest and parent (the block before it, or the event's parent) are read from
  // there, so recording a block copies nothing. An event lives while any of its blocks is
  // indexed, so the index holds at most its block count of events.
  struct IndexEntry {
    std::shared_ptr<const KvEvent> stored_in;
    uint32_t position = 0;
    const StoredBlock& block() const { return stored_in->blocks[position]; }
    std::optional<Hash128> parent_hash() const {
      return position == 0 ? stored_in->parent_hash : stored_in->blocks[position - 1].hash;
    }
  };

  void AppendLocked(std::shared_ptr<KvEvent> event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  const PoolInfo& PoolLocked(uint32_t pool_index) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::shared_ptr<const KvEvent>> buffer_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, PoolInfo> pools_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<IndexKey, IndexEntry> index_ ABSL_GUARDED_BY(mu_);

  std::array<std::atomic<uint64_t>, kNumKvEventSinks> dropped_{};
  std::array<std::atomic<uint64_t>, kNumKvEventSinks> replays_{};
  std::atomic<uint64_t> snapshots_{0};
};

// "GPU" for a CUDA pool, "CPU" for host memory: the medium vLLM-format consumers map to a tier.
absl::string_view KvEventMediumOf(absl::string_view memory_kind);

}  // namespace kvcache

#endif  // KVCACHE_CACHE_KV_EVENT_LOG_H_
