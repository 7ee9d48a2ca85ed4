// HostTier: tier 2 of a pool (DESIGN §10) — a store of block records in one host-memory
// allocation of fixed slots, each slot one block's bytes, indexed by chain hash with the record's
// identity (tiers/block_record.h), and its own LRU. The pool's mover stores blocks into it ahead
// of their eviction from tier 1; a prefix walk that ends in tier 1 continues here, loading each
// record into a fresh tier-1 block.
//
// At most one record per hash: a second Store under a stored hash is ALREADY_EXISTS and changes
// nothing (the first stays, as in tier 1) — unless it supersedes the stored record (Supersedes,
// tiers/block_record.h: the same block with more parts, DESIGN §13). A superseding copy is
// written into a slot of its own and then replaces the stored record in the index, whose slot is
// freed at once or, while a load reads it, at that load's end: a slot being read is never
// overwritten, and the load gets the poorer record whole, as it found it. A full tier evicts its
// least recently stored or loaded record to make room; that is its back-pressure on the mover — the
// mover never waits on it. A record being read (Load) or written (Store) is pinned and not evicted;
// when every slot is pinned, Store is RESOURCE_EXHAUSTED (counted).
//
// Loads verify twice: the identity against the request's expectation (RecordMismatch) before the
// copy, the checksum over the copied bytes after it. Either failure is a miss, counted, never
// bytes returned as good; a checksum failure also drops the record.
//
// The seam for the tier below (tier 3, the disk tier): the pool's mover passes records down before
// they are evicted, the same way tier 1 passes blocks here (docs/design.md, "Tiers"):
// PinForDemotion pins the oldest records not yet below while few slots are free, the mover
// copies them down, FinishDemotion marks them below and unpins them. Store reports the record it
// evicted (StoreResult::evicted, identity only; its bytes are already overwritten), so the owner
// can tell whether the tier below holds it.
//
// What the tier holds is reported to the listener given at Create (tiers/record_changes.h): a
// record stored (a superseding one too: no removal precedes it, the block never left), a record
// evicted or dropped (checksum failure on load or on demotion), in order,
// outside the tier's mutex; the pool announces them as KV events with tier 2's medium.
//
// Thread safety: thread-safe. Bytes are copied outside the tier's mutex with the slot pinned.
#ifndef KVCACHE_TIERS_HOST_TIER_H_
#define KVCACHE_TIERS_HOST_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/block_hash.h"
#include "tiers/block_record.h"
#include "tiers/record_changes.h"
#include "tiers/slot_table.h"

namespace kvcache {

struct HostTierCounters {
  uint64_t stored = 0;            // records written
  uint64_t loaded = 0;            // records copied out and verified
  uint64_t evicted = 0;           // records dropped to make room
  uint64_t misses = 0;            // loads that returned nothing: absent, mismatched or corrupt
  uint64_t mismatches = 0;        // of the misses: a record under the hash with another identity
  uint64_t verify_failures = 0;   // of the misses: checksum of the copied bytes differed
  uint64_t store_rejections = 0;  // stores refused because every slot was pinned
  uint64_t superseded = 0;        // records replaced by a copy of the same block with more parts
  uint64_t demoted = 0;           // records marked as held by the tier below
  uint64_t demotion_scanned = 0;  // records PinForDemotion looked at (its work)
  uint64_t records = 0;           // records held now
  uint64_t bytes_used = 0;        // records * block_bytes
  uint64_t capacity_bytes = 0;    // slots * block_bytes
};

// What a probe of the tier found under a hash.
enum class TierProbe : uint8_t { kAbsent, kMatch, kMismatch };

// Lends the tier's memory to a device pool's copies — page-locks it (PoolMemory::
// RegisterHostMemory) after it is mapped, and unlocks it before it is unmapped. Empty functions:
// plain memory.
struct HostMemoryRegistrar {
  std::function<absl::Status(void* base, uint64_t size)> register_memory;
  std::function<void(void* base)> unregister_memory;
};

class HostTier {
 public:
  // A tier of capacity_bytes / block_bytes slots. INVALID_ARGUMENT when that is not at least one
  // block; RESOURCE_EXHAUSTED when the memory cannot be mapped; `registrar`'s error when it fails.
  // `on_change` (may be empty) hears of every record stored and removed.
  static absl::StatusOr<std::unique_ptr<HostTier>> Create(uint64_t capacity_bytes,
                                                          uint64_t block_bytes,
                                                          RecordChangeListener on_change = {},
                                                          HostMemoryRegistrar registrar = {});
  ~HostTier();

  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  uint64_t block_bytes() const { return block_bytes_; }
  uint32_t num_slots() const { return num_slots_; }

  struct StoreResult {
    std::optional<BlockRecordIdentity> evicted;  // the record this store displaced, if any
  };
  // Copies block_bytes from `bytes` into a slot recorded under `identity` (whose checksum must be
  // that of the bytes). ALREADY_EXISTS when the hash is stored and `identity` does not supersede
  // its record (which stays); RESOURCE_EXHAUSTED when every slot is pinned.
  // `reused`: the block was a hit above (see PinForDemotion's `reused_only`).
  absl::StatusOr<StoreResult> Store(const BlockRecordIdentity& identity, const uint8_t* bytes,
                                    bool reused = false);

  // Store in two steps, for a caller that fills the slot itself (a device pool's batched D2H copy
  // into this tier's memory): BeginStore takes a slot for a copy of `identity` (its checksum
  // unused; evicting as Store does) that stays private to the caller, and FinishStore publishes
  // it under `identity` — whose checksum must be that of the bytes the caller put there — or,
  // with `filled` false, frees it. Errors as Store's, ALREADY_EXISTS from either step (a
  // concurrent store of the hash won). Until the caller fills them, `bytes` still hold the
  // evicted record's, so it can pass that one down.
  struct PendingStore {
    uint32_t slot = 0;
    uint8_t* bytes = nullptr;                    // block_bytes to fill
    std::optional<BlockRecordIdentity> evicted;  // as StoreResult::evicted
    bool evicted_below = false;   // the tier below had taken `evicted` (FinishDemotion)
    bool evicted_reused = false;  // `evicted` was reused (see PinForDemotion's `reused_only`)
  };
  absl::StatusOr<PendingStore> BeginStore(const BlockRecordIdentity& identity);
  // `identity` is taken by value: a caller done with it moves it in (no copy per record).
  absl::Status FinishStore(const PendingStore& pending, BlockRecordIdentity identity, bool reused,
                           bool filled);

  // The identity stored under `hash`, if any. Changes nothing.
  std::optional<BlockRecordIdentity> Find(const Hash128& hash) const;
  // Whether a record under expected.hash matches `expected` (RecordMismatch). Changes nothing:
  // Lookup counts tier-2 hits with it without loading.
  TierProbe Probe(const BlockRecordIdentity& expected) const;
  bool Contains(const Hash128& hash) const;
  // Whether a store of a copy under `hash` with `extras_digest` would leave the stored record in
  // place: one is stored, and the copy does not have more parts (HasMoreParts). Changes nothing:
  // the mover asks it per block of a pool with declared parts (Contains for one without).
  bool ContainsCopyOf(const Hash128& hash, uint64_t extras_digest) const;

  // Copies the record matching `expected` (all of it but the checksum) into `out` (block_bytes),
  // then verifies the copy's checksum against the record's. NOT_FOUND when no record matches;
  // DATA_LOSS when the copy's checksum differs (the record is dropped). Every failure counts a
  // miss; `out` then holds no bytes to use. On success the record becomes most recently used.
  absl::Status Load(const BlockRecordIdentity& expected, uint8_t* out);

  // Load in two steps, for a caller that copies the bytes itself (a device pool's batched H2D
  // copy): PinForLoad pins the record matching `expected` (NOT_FOUND as Load's, counted), whose
  // bytes stay as they are until FinishLoad. FinishLoad takes the caller's verdict — whether the
  // checksum of what it copied (or of `bytes`, which cannot change while pinned) equals
  // `checksum`: kVerified counts a load; kCorrupt is DATA_LOSS, a counted miss, and drops the
  // record; kNotCopied (the copy itself failed) only unpins.
  struct PinnedRecord {
    uint32_t slot = 0;
    const uint8_t* bytes = nullptr;
    uint64_t checksum = 0;
    Hash128 hash;
  };
  absl::StatusOr<PinnedRecord> PinForLoad(const BlockRecordIdentity& expected);
  enum class LoadVerdict : uint8_t { kVerified, kCorrupt, kNotCopied };
  absl::Status FinishLoad(const PinnedRecord& pinned, LoadVerdict verdict);

  // A record being copied to the tier below; `bytes` stay valid until FinishDemotion.
  struct Demotion {
    uint32_t slot = 0;
    BlockRecordIdentity identity;
    const uint8_t* bytes = nullptr;
  };
  // Only while fewer than `window` slots are free: pins up to `max` records not yet below among
  // the `window` least recently used ones (the next victims), oldest first. A pinned record is
  // neither evicted nor freed, so the caller copies its bytes without the tier's mutex; the copy
  // is not a use, so FinishDemotion puts it back where the scan found it. The scan resumes where
  // the last call stopped (each record is looked at once per pass over the window, however
  // large) and looks at most kMaxDemotionScan records per call.
  // `reused_only`: only records stored as reused or loaded from here since (an admission filter
  // that keeps one-off blocks off the tier below).
  std::vector<Demotion> PinForDemotion(uint32_t window, size_t max, bool reused_only = false);
  static constexpr uint32_t kMaxDemotionScan = 256;
  // Marks the record under `hash` reused (its block was hit above after it was stored here).
  void MarkReused(const Hash128& hash);
  // Unpins a record PinForDemotion returned, given what the tier below answered its store. OK or
  // ALREADY_EXISTS: the tier below took it, and it is not offered again. DATA_LOSS: its bytes no
  // longer match its checksum, so it is dropped (a verify failure). Anything else: offered again
  // by the next call, which starts a new pass.
  void FinishDemotion(uint32_t slot, const absl::Status& stored);

  HostTierCounters counters() const;
  // Index, LRU, free slots and byte counts agree. O(slots).
  absl::Status CheckInvariants() const;

  // TEST ONLY (benchmarks): where the record under `hash` keeps its bytes, or null. The pointer
  // is valid until the record is evicted or dropped.
  const uint8_t* RecordBytesForTesting(const Hash128& hash) const;
  // TEST ONLY: flips one byte of the record stored under `hash`; false when there is none.
  bool CorruptForTesting(const Hash128& hash, uint64_t offset);
  // TEST ONLY: called once a load has pinned its record, before the copy (outside the mutex), e.g.
  // to advance a fake clock as a slow copy would.
  void SetLoadHookForTesting(std::function<void(const Hash128&)> hook);
  // TEST ONLY: called once a store has its slot, before the copy (outside the mutex).
  void SetStoreHookForTesting(std::function<void(const Hash128&)> hook);

 private:
  static constexpr uint32_t kNoSlot = SlotTable::kNoSlot;
  // What a slot holds, beside the table's bookkeeping; set when the slot is taken.
  struct Record {
    bool below = false;      // the tier below holds the record too
    bool reused = false;     // stored as reused, or loaded from here since
    uint32_t scan_pass = 0;  // the demotion pass whose scan last passed it
    BlockRecordIdentity identity;
  };

  HostTier(uint8_t* base, uint64_t mapped_bytes, uint64_t block_bytes, uint32_t num_slots,
           RecordChangeListener on_change, std::function<void(void*)> unregister_memory);
  uint8_t* SlotBytes(uint32_t slot) const { return base_ + uint64_t{slot} * block_bytes_; }

  // A stored record leaves (evicted or dropped): announced, then as UncountLocked.
  void RemovedLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A stored record leaves the counts and is no longer one the demotion scan has passed.
  void UncountLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Takes a stored record out of the index and the LRU; its slot is freed now, or by the last
  // unpin when it is pinned.
  void DropLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record no longer counts as passed by the demotion scan (it is about to become the most
  // recent, or to leave).
  void UnmarkScannedLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  uint8_t* const base_;
  const uint64_t mapped_bytes_;
  const uint64_t block_bytes_;
  const uint32_t num_slots_;
  const std::function<void(void*)> unregister_memory_;  // empty: nothing to undo
  RecordChanges changes_;                               // added to under mu_, delivered without it

  mutable absl::Mutex mu_;
  // The LRU's cursor is PinForDemotion's place: a record the scan pins goes back there.
  SlotTable table_ ABSL_GUARDED_BY(mu_);
  std::vector<Record> records_ ABSL_GUARDED_BY(mu_);  // by slot
  HostTierCounters counters_ ABSL_GUARDED_BY(mu_);
  // PinForDemotion's scan resumes where it stopped: at the table's cursor, the first record it
  // has not looked at, demotion_scanned_ records (of pass demotion_pass_) from the LRU's front,
  // counting those it pinned; demotion_restart_: the next call starts a new pass.
  uint32_t demotion_scanned_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t demotion_pass_ ABSL_GUARDED_BY(mu_) = 1;
  bool demotion_restart_ ABSL_GUARDED_BY(mu_) = true;
  std::function<void(const Hash128&)> load_hook_ ABSL_GUARDED_BY(mu_);
  std::function<void(const Hash128&)> store_hook_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_TIERS_HOST_TIER_H_
