// KvEventLog: the daemon's one sequence of KV events — blocks stored in a pool's prefix index,
// blocks removed from it, pools cleared — for KV-aware routers (WatchEvents over gRPC, and the
// ZeroMQ publisher in vLLM's wire format, events/). Sequence numbers start at 0, which is the
// AllBlocksCleared every daemon starts with, and grow by one per event.
//
// Pools append under their own mutex, so the log's order is the order the index changed in
// (lock order: a pool's mutex, then the log's). The log keeps the last `capacity` events for
// watchers to resume from, and its own compact copy of every indexed block (tenant, parent,
// extras digest, tokens packed as the pool packs them, page name) so that a watcher too far
// behind gets a snapshot exactly as of one sequence number, atomically across pools, stopping
// them only while it copies that compact index (TakeSnapshot). It keeps no event for the index:
// an indexed block costs about 96 bytes (a 48-byte entry, 36 bytes of tokens, a 4-byte index
// slot at most half full).
//
// Removal: a pool reports a hash as removed only when it leaves the pool's index (eviction), not
// when a block holding a duplicate of it is freed; the log drops hashes it never announced.
//
// Media: a block may be held by a pool's tier 1 and by its lower tiers at once (docs/design.md
// §10), each announced with its own medium (kKvMedium*), so the log keys its index by (pool,
// medium, hash): a block stored in tier 2 and evicted from tier 1 stays announced with tier 2's
// medium, and a snapshot carries one BlocksStored per (pool, medium, hash). A store announced
// kLiveOnly (the cluster tier: its removals are never seen) is sent to watchers but not indexed,
// so it is neither in a snapshot nor ever removed.
//
// Thread safety: thread-safe.
#ifndef KVCACHE_CACHE_KV_EVENT_LOG_H_
#define KVCACHE_CACHE_KV_EVENT_LOG_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/container/inlined_vector.h"
#include "absl/hash/hash.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cache/packed_tokens.h"
#include "common/block_hash.h"
#include "common/clock.h"

namespace kvcache {

enum class KvEventKind : uint8_t { kBlocksStored, kBlocksRemoved, kAllBlocksCleared };

// A stored block's tokens, held inline up to 16 (vLLM's default block size, and the daemon's):
// the event buffer keeps up to 10,000 events of 128 blocks, and a heap vector a block cost one
// allocation per block stored and freed, and 40 bytes more each (block_memory_bench).
using BlockTokenIds = absl::InlinedVector<uint32_t, 16>;

struct StoredBlock {
  Hash128 hash;
  BlockTokenIds token_ids;  // the pool's block_size of them; none for a page
  uint64_t extras_digest = 0;
};

struct KvEvent {
  uint64_t sequence = 0;
  absl::Time time;
  KvEventKind kind = KvEventKind::kAllBlocksCleared;
  std::string pool;  // empty for an AllBlocksCleared of every pool
  std::string tenant;
  std::string medium;  // kKvMedium*: where the blocks are
  uint32_t block_size = 0;
  // kBlocksStored: a chain, each block the child of the one before; the first one's parent, or
  // nullopt when it starts its prompt.
  std::optional<Hash128> parent_hash;
  std::vector<StoredBlock> blocks;
  std::vector<Hash128> removed;  // kBlocksRemoved
  // Pages (DESIGN §13) carry the engine's key, for routers that match the engine's own events
  // by it. Held here, not in StoredBlock, so token blocks, the log's bulk, pay one empty vector
  // per event rather than a string per block. Empty when no block of the event is a page; else
  // one per block (kBlocksStored) or per removed hash (kBlocksRemoved), empty for a token block.
  std::vector<std::string> page_keys;
  // kBlocksStored of a page: the digest of the manifest its session was bound to (32 hex
  // digits); empty when unknown (a page a restarted daemon found on disk) or not a page.
  std::string manifest_digest;
};

// How a stored page is named, for its BlocksStored: the engine's key and its manifest's digest.
struct PageName {
  std::string key;
  std::string manifest_digest;
};

// Which events a watcher sees: one tenant's or all, one pool's or all. AllBlocksCleared of every
// pool reaches everyone.
struct KvEventFilter {
  std::string tenant;  // empty: every tenant
  std::string pool;    // empty: every pool
  bool Matches(const KvEvent& event) const;
};

// The media of KV events, as vLLM's and SGLang's publishers name them (SGLang's StorageMedium),
// which llm-d and Dynamo map to tiers. Tier 1: GPU for a CUDA pool, CPU for host memory.
inline constexpr absl::string_view kKvMediumGpu = "GPU";
inline constexpr absl::string_view kKvMediumCpu = "CPU";
// Tier 2, the host tier: SGLang's L2 host medium, and a name apart from tier 1's CPU even under a
// host pool, so that a router keeps the two apart.
inline constexpr absl::string_view kKvMediumCpuPinned = "CPU_PINNED";
inline constexpr absl::string_view kKvMediumDisk = "DISK";  // tier 3, local disk
// The cluster tier: a store shared by every node (SGLang's "L4: shared / remote pool").
inline constexpr absl::string_view kKvMediumExternal = "EXTERNAL";

enum class KvEventRetention : uint8_t {
  kIndexed,   // in the log's index and snapshots until removed
  kLiveOnly,  // sent to watchers only: nothing will ever announce its removal
};

// Who reads the log, for the counters the metrics export.
enum class KvEventSink : uint8_t { kGrpc = 0, kZmq = 1 };

// Consumers (WatchEvents, ZeroMQ) send events in bursts, each event at most kKvEventMaxDelay
// after it was recorded (docs/operations.md). A burst is read at the flush deadline of its first
// event, kKvEventFlushDelay after that event was recorded (not after the consumer woke up for
// it), which leaves kKvEventSendAllowance of the bound to read, encode and send it.
inline constexpr absl::Duration kKvEventMaxDelay = absl::Milliseconds(25);
inline constexpr absl::Duration kKvEventSendAllowance = absl::Milliseconds(5);
inline constexpr absl::Duration kKvEventFlushDelay = absl::Milliseconds(20);  // max less allowance
inline constexpr size_t kNumKvEventSinks = 2;

class KvEventLog {
 public:
  static constexpr size_t kDefaultCapacity = 10000;  // vLLM's buffer_steps

  // REQUIRES: capacity > 0. `clock` stamps events and must outlive the log.
  explicit KvEventLog(size_t capacity = kDefaultCapacity, const Clock* clock = RealClock::Get());

  KvEventLog(const KvEventLog&) = delete;
  KvEventLog& operator=(const KvEventLog&) = delete;

  // Called by the CacheManager for each pool before the pool is created (a pool's disk tier
  // announces what it restored while the pool is created). `medium` is tier 1's.
  void AddPool(uint32_t pool_index, std::string name, std::string medium, uint32_t block_size);

  // The pool's calls for tier 1, made under its own mutex. `blocks` is a chain (see KvEvent).
  void BlocksStored(uint32_t pool_index, absl::string_view tenant,
                    std::optional<Hash128> parent_hash, std::vector<StoredBlock> blocks);
  // Pages of one call, in its key order, each named by its key (`keys`, one per block) and the
  // session's `manifest_digest`: one event with no parent, and no parent per page either (an
  // engine key names its prefix itself), as vLLM announces a batch of offloaded blocks.
  void PagesStored(uint32_t pool_index, absl::string_view tenant, std::vector<StoredBlock> blocks,
                   std::vector<std::string> keys, std::string manifest_digest);
  // One event per tenant among the hashes' owners; hashes never announced are dropped.
  void BlocksRemoved(uint32_t pool_index, absl::Span<const Hash128> hashes);

  // The same for a lower tier's `medium` (not tier 1's).
  void BlocksStoredIn(uint32_t pool_index, absl::string_view medium, absl::string_view tenant,
                      std::optional<Hash128> parent_hash, std::vector<StoredBlock> blocks,
                      KvEventRetention retention = KvEventRetention::kIndexed);
  void PageStoredIn(uint32_t pool_index, absl::string_view medium, absl::string_view tenant,
                    StoredBlock block, PageName name,
                    KvEventRetention retention = KvEventRetention::kIndexed);
  void BlocksRemovedFrom(uint32_t pool_index, absl::string_view medium,
                         absl::Span<const Hash128> hashes);

  // How an indexed block of the pool was announced, in any medium (tier 1's first): a lower tier
  // announces a record with the tenant and parent its block had above, which the record does
  // not carry.
  struct Announcement {
    std::string tenant;
    std::optional<Hash128> parent_hash;
    std::optional<PageName> page;  // a page's key and manifest digest
  };
  std::optional<Announcement> FindAnnounced(uint32_t pool_index, const Hash128& hash) const;

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
  // When a consumer should read the burst that begins at `start`: kKvEventFlushDelay after event
  // `start` was recorded; now when the log does not hold it (not yet, or no longer).
  absl::Time FlushDeadline(uint64_t start) const;
  // Sleeps until FlushDeadline(start) on the log's clock (returns at once when it has passed).
  void WaitForFlush(uint64_t start) const;

  struct Snapshot {
    uint64_t next_sequence = 0;  // the snapshot holds every event below it, none from it
    // One BlocksStored per block, a parent before its children, each with sequence
    // next_sequence - 1.
    std::vector<KvEvent> events;
  };
  // The index as of one point of the sequence, filtered. Under the log's mutex (and so beside
  // every pool's next event, which waits for it under the pool's own mutex) only a copy of the
  // compact index is made; the events are built from the copy after.
  Snapshot TakeSnapshot(const KvEventFilter& filter) const;
  // TEST ONLY: `hook` runs at each stage of every snapshot: kShaped once the copy's sizes are
  // read and its memory is ready (the log's mutex free), kLocked once the mutex is taken for the
  // copy, kCopied after the copy and before the events' building (the mutex free).
  enum class SnapshotStage : uint8_t { kShaped, kLocked, kCopied };
  void SetSnapshotHookForTesting(std::function<void(SnapshotStage)> hook) {
    snapshot_hook_for_testing_ = std::move(hook);
  }
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
  // One indexed block of a pool, in one medium.
  struct Entry {
    Hash128 hash;
    Hash128 parent_hash;  // when has_parent: the block before it in its chain
    uint64_t extras_digest = 0;
    uint32_t tenant = 0;  // into tenants_
    uint8_t medium = 0;   // into PoolInfo::media
    bool in_use : 1 = false;
    bool has_parent : 1 = false;
    bool is_page : 1 = false;     // named in PoolInfo::pages
    bool packed : 1 = false;      // tokens in the pool's token chunks; else in odd_tokens
    bool has_tokens : 1 = false;  // false: no tokens (a page's)
  };
  static_assert(sizeof(Entry) == 48, "the class comment and block_memory_bench count 48 bytes");
  // An entry's key: its medium and hash (the pool is the PoolInfo holding it).
  struct EntryKey {
    uint32_t medium = 0;
    Hash128 hash;
  };
  // The index of a pool's entries: a set of entry ids hashed by their key, looked up by one.
  struct EntryHash {
    using is_transparent = void;
    const std::vector<Entry>* entries;
    size_t operator()(const EntryKey& key) const {
      return absl::Hash<std::pair<uint32_t, Hash128>>()({key.medium, key.hash});
    }
    size_t operator()(uint32_t entry) const {
      const Entry& e = (*entries)[entry];
      return (*this)(EntryKey{e.medium, e.hash});
    }
  };
  struct EntryEq {
    using is_transparent = void;
    const std::vector<Entry>* entries;
    bool operator()(uint32_t a, uint32_t b) const { return a == b; }
    bool operator()(uint32_t a, const EntryKey& b) const { return Matches((*entries)[a], b); }
    bool operator()(const EntryKey& a, uint32_t b) const { return Matches((*entries)[b], a); }
    static bool Matches(const Entry& e, const EntryKey& key) {
      return e.medium == key.medium && e.hash == key.hash;
    }
  };
  // A page entry's name: its key, and its manifest digest as an id into manifests_ (a session's
  // pages share one, and a string of its 32 digits per page cost an allocation each).
  struct IndexedPage {
    std::string key;
    uint32_t manifest = 0;
  };
  // Tokens of entries `kTokenChunk` at a time: each chunk packs at its own width, so a wide
  // token repacks one chunk, not the pool.
  static constexpr uint32_t kTokenChunk = 4096;

  // Not movable: the index's functors point at `entries`.
  struct PoolInfo {
    PoolInfo(std::string name, std::string medium, uint32_t block_size);
    PoolInfo(const PoolInfo&) = delete;
    PoolInfo& operator=(const PoolInfo&) = delete;

    // What a snapshot's copy of the pool needs room for, read under the log's mutex.
    struct CopyShape {
      std::string name;
      std::string medium;  // tier 1's
      uint32_t block_size = 0;
      size_t entries = 0;
      std::vector<uint32_t> chunk_widths;  // of each token chunk
    };
    CopyShape ShapeForCopy() const;
    // An empty PoolInfo with room for a copy of `shape` (and some growth) allocated and
    // resident: made without the log's mutex, so that the copy under it faults no page in.
    static std::unique_ptr<PoolInfo> ReadyForCopy(const CopyShape& shape);
    // Copies what a snapshot reads (entries, tokens, page names, media) into `copy` (from
    // ReadyForCopy; it grows where the pool grew since), its index left empty: under the log's
    // mutex, at about memcpy's speed. IndexInUse then fills the copy's index.
    void CopyForSnapshot(PoolInfo& copy) const;
    void IndexInUse();

    std::string name;
    std::vector<std::string> media;  // [0]: tier 1's; then lower tiers' as they first appear
    uint32_t block_size = 0;
    std::vector<Entry> entries;  // by entry id
    std::vector<uint32_t> free_entries;
    absl::flat_hash_set<uint32_t, EntryHash, EntryEq> index;
    std::vector<std::unique_ptr<PackedTokens>> token_chunks;  // block_size tokens per entry
    // Tokens of entries whose count is neither 0 nor block_size (not seen from a pool).
    absl::flat_hash_map<uint32_t, std::vector<uint32_t>> odd_tokens;
    absl::flat_hash_map<uint32_t, IndexedPage> pages;  // the entries that are pages
  };

  void AppendLocked(std::shared_ptr<KvEvent> event) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PoolInfo& PoolLocked(uint32_t pool_index) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  uint32_t MediumLocked(uint32_t pool_index, absl::string_view medium)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t TenantLocked(absl::string_view tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint32_t ManifestLocked(absl::string_view digest) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  PageName PageNameLocked(const PoolInfo& pool, uint32_t entry) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  static PageName PageNameIn(const PoolInfo& pool, uint32_t entry,
                             const std::vector<std::string>& manifests);
  void StoredLocked(uint32_t pool_index, uint32_t medium, std::shared_ptr<KvEvent> event,
                    KvEventRetention retention) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Indexes (or re-announces) block `position` of `event`, a BlocksStored of the pool's.
  void IndexLocked(PoolInfo& pool, uint32_t medium, uint32_t tenant, uint32_t manifest,
                   const KvEvent& event, uint32_t position) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EraseLocked(PoolInfo& pool, uint32_t entry) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemovedLocked(uint32_t pool_index, uint32_t medium, absl::Span<const Hash128> hashes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The entry of the pool's block under `hash`, in `preferred` medium if it is there, else in
  // the first medium that has it; kNoEntry when none does.
  static constexpr uint32_t kNoEntry = ~uint32_t{0};
  static uint32_t FindEntry(const PoolInfo& pool, uint32_t preferred, const Hash128& hash);
  static BlockTokenIds TokensOf(const PoolInfo& pool, uint32_t entry);
  const std::string& PageKeyOf(const PoolInfo& pool, uint32_t entry) const;

  const size_t capacity_;
  const Clock* const clock_;

  mutable absl::Mutex mu_;
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<std::shared_ptr<const KvEvent>> buffer_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint32_t, std::unique_ptr<PoolInfo>> pools_ ABSL_GUARDED_BY(mu_);
  // Every tenant an indexed block has had, by the id entries hold.
  std::vector<std::string> tenants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> tenant_ids_ ABSL_GUARDED_BY(mu_);
  // Every manifest digest a page has been announced with, by the id IndexedPage holds.
  std::vector<std::string> manifests_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> manifest_ids_ ABSL_GUARDED_BY(mu_);

  std::function<void(SnapshotStage)> snapshot_hook_for_testing_;  // set before any snapshot
  std::array<std::atomic<uint64_t>, kNumKvEventSinks> dropped_{};
  std::array<std::atomic<uint64_t>, kNumKvEventSinks> replays_{};
  std::atomic<uint64_t> snapshots_{0};
};

// Tier 1's medium: kKvMediumGpu for a CUDA pool, kKvMediumCpu for host memory.
absl::string_view KvEventMediumOf(absl::string_view memory_kind);

}  // namespace kvcache

#endif  // KVCACHE_CACHE_KV_EVENT_LOG_H_
