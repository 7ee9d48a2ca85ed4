// Pool: one pool's sequences over its BlockPool — the DESIGN §3 contract. Opens sequences
// with the longest verified cached prefix, extends them, commits written blocks into the prefix
// index, releases tail first, forks, and answers lookups without acquiring.
//
// Sequence ids are opaque to clients; their low 8 bits name the pool (see PoolIndexOf) so the
// CacheManager routes a request to its pool in O(1).
//
// Error codes: INVALID_ARGUMENT for malformed input, NOT_FOUND for a sequence that is unknown or
// belongs to another session, ABORTED when the session has ended, RESOURCE_EXHAUSTED when the
// pool has too few blocks or the session's tenant would pass a quota (max_referenced_blocks of
// this pool, max_open_sequences; nothing changes then), FAILED_PRECONDITION when the session's
// (or a Lookup's) compatibility manifest contradicts the pool's layout (nothing opens),
// UNAVAILABLE once a device fault has latched.
//
// Tenants: every block a sequence holds belongs to the sequence's tenant (blocks are never shared
// across tenants: the tenant is part of every hash root), so a tenant's referenced blocks are the
// blocks its sequences hold. A tenant only ever takes free or evictable blocks; another tenant's
// referenced blocks are out of its reach whatever its quota.
//
// Device faults: a failure of the pool's memory (DeviceFaultLatch::IsDeviceFault) latches in the
// pool's DeviceFaultLatch, which a CacheManager shares among its pools. From then on every call
// that hands out, publishes, copies or reads blocks (Open, Extend, Commit, Fork, Lookup,
// BlockChecksum, ReadBlock, WriteBlock) answers the latched UNAVAILABLE without touching memory,
// the call that hit the fault included. Release and ReleaseSession still work: they only drop
// references, and ending sessions must keep returning their blocks.
//
// Events and residency: every hash entering or leaving the prefix index is reported to the
// KvEventLog given at creation (stored as a chain per commit, removed per eviction batch), and
// every eviction and hit is timed into the residency histograms (vLLM's semantics: lifetime from
// allocation to eviction, idle from the last release to eviction, reuse gap between consecutive
// accesses — an allocation or a hit). The lower tiers' records are announced too, each tier with
// its medium (cache/tier_events.h): tier 2 CPU_PINNED, the disk tier DISK (its restored records
// at creation), the cluster tier EXTERNAL (live only).
//
// Lower tiers (PoolOptions: host_tier_bytes, disk_tier_path, cluster_tier): the pool owns a
// LowerTiers (cache/lower_tiers.h) and keeps DESIGN §10's contract with it: Open and Lookup
// continue the verified walk below tier 1, loads land outside mu_ in blocks only the opening
// sequence holds and publish only what verified, and a request that would evict blocks no tier
// holds passes them down itself first (PassDownVictimsLocked; docs/tiers.md has the details).
//
// Thread safety: thread-safe. Hashing runs outside mu_; a fork's byte copy runs outside mu_ with
// its source block pinned; so do the mover's copies (offload pin) and the loads from below (into
// blocks only the opening sequence holds). Lock order: mu_, then LowerTiers' (its stores', then
// the mover's wake mutex).
#ifndef KVCACHE_CACHE_POOL_H_
#define KVCACHE_CACHE_POOL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "cache/block_pool.h"
#include "cache/device_fault_latch.h"
#include "cache/kv_event_log.h"
#include "cache/lower_tiers.h"
#include "cache/page_counters.h"
#include "cache/pool_memory.h"
#include "cache/pool_options.h"
#include "cache/session.h"
#include "cache/tenant_quotas.h"
#include "cache/tier_stats.h"
#include "common/block_hash.h"
#include "common/clock.h"
#include "common/compatibility_manifest.h"
#include "common/histogram.h"
#include "common/page_parts.h"

namespace kvcache {

inline constexpr uint32_t kMaxPools = 256;
inline constexpr size_t kMaxCacheSaltBytes = 256;
inline constexpr size_t kMaxLoraIdBytes = 256;
inline constexpr size_t kMaxMultimodalItems = 1024;
inline constexpr size_t kMaxContentHashBytes = 128;

// How long ExistsPages waits for the cluster tier's answer (real time); what has not come back
// by then is not counted.
inline constexpr absl::Duration kClusterProbeBound = absl::Milliseconds(500);

struct PagesFound {
  uint32_t num_pages = 0;  // leading keys restorable under the hit rule
  PagesByTier by_tier;
};

struct ReservedPages {
  uint64_t sequence_id = 0;
  std::vector<BlockId> block_ids;  // per key; kNoBlock: present already (a duplicate)
};

struct CommittedPages {
  uint32_t num_published = 0;
  uint32_t num_duplicates = 0;
};

struct AcquiredPages {
  uint64_t sequence_id = 0;
  std::vector<BlockId> block_ids;    // the pages the hit rule gave, from the first key
  std::vector<uint32_t> part_masks;  // parallel to block_ids
  PagesByTier by_tier;
};

struct SequenceSpec {
  absl::Span<const uint32_t> tokens;
  absl::string_view cache_salt;
  ExtraKeys extra_keys;
  // Open only: how long loading matched blocks from lower tiers may take (0: no bound). A load
  // under way when the bound passes completes; what remains is left to compute.
  uint32_t max_load_ms = 0;
  // Open and Lookup: the parts the caller restores (a mask over Pool::parts()); 0: every part.
  // The hit is the greatest block endpoint where each of them restores (RestorablePages).
  uint32_t wanted_parts = 0;
};

// What Open allocates besides the verified cached prefix.
enum class OpenMode {
  kCompute,    // a prompt to compute: hit capped to leave one token, fresh blocks for the rest
  kPut,        // bytes arriving for the full blocks: no cap, fresh blocks for the missing ones
  kPinCached,  // pin the cached full-block prefix only; allocates nothing
};

struct OpenedSequence {
  uint64_t sequence_id = 0;
  std::vector<BlockId> block_ids;
  uint32_t num_cached_tokens = 0;
  uint32_t num_host_tier_tokens = 0;     // of num_cached_tokens, loaded from tier 2 by this call
  uint32_t num_disk_tier_tokens = 0;     // of num_cached_tokens, loaded from tier 3 by this call
  uint32_t num_cluster_tier_tokens = 0;  // of num_cached_tokens, loaded from the cluster tier
  // Each cached block's part mask; empty for a pool without declared parts (every part).
  std::vector<uint32_t> part_masks;
};

struct ExtendedSequence {
  std::vector<BlockId> new_block_ids;
  uint32_t num_tokens = 0;
};

struct CommitResult {
  uint32_t num_committed_blocks = 0;
  uint32_t num_published_blocks = 0;
};

struct ForkedSequence {
  uint64_t sequence_id = 0;
  std::vector<BlockId> block_ids;
  BlockId copied_from_block = kNoBlock;  // kNoBlock: the parent ended on a block boundary
};

// Milliseconds on a pool's clock since its creation (Pool::NowTicks).
using PoolTicks = uint32_t;

// Residency of the pool's blocks, in seconds (see the class comment).
struct PoolResidency {
  HistogramSnapshot lifetime;
  HistogramSnapshot idle_before_evict;
  HistogramSnapshot reuse_gap;
};

// Block bytes moved by the data streams (PutBlocks, GetBlocks), counted by the server.
struct PoolTransferCounters {
  std::atomic<uint64_t> put_bytes{0};
  std::atomic<uint64_t> got_bytes{0};
  std::atomic<uint64_t> put_failures{0};  // streams that ended with an error
  std::atomic<uint64_t> get_failures{0};
};

struct LookupResult {
  uint32_t num_cached_blocks = 0;
  uint32_t num_cached_tokens = 0;
  uint32_t num_host_tier_tokens = 0;  // of num_cached_tokens, found in tier 2 (not loaded)
  uint32_t num_disk_tier_tokens = 0;  // of num_cached_tokens, found in tier 3 (not loaded)
  std::vector<uint32_t> part_masks;   // as OpenedSequence's
};

// A pool's figures, or one tenant's share of them (Stats(tenant)): then `referenced`, the
// request figures, `open_sequences` and the pool counters count only that tenant's blocks and
// sequences (evictions: its blocks evicted), while `free` and `evictable` stay the pool's, the
// capacity every tenant draws on.
struct PoolStatsSnapshot {
  uint32_t free = 0;
  uint32_t evictable = 0;
  uint32_t referenced = 0;
  uint64_t prompt_tokens = 0;
  uint64_t hit_tokens = 0;
  uint64_t hit_blocks = 0;
  uint64_t miss_blocks = 0;
  uint32_t open_sequences = 0;
  BlockPoolCounters pool;
  std::optional<PoolHostTierStats> host_tier;        // set when the pool has a tier 2
  std::optional<PoolDiskTierStats> disk_tier;        // set when the pool has a tier 3
  std::optional<PoolClusterTierStats> cluster_tier;  // set when the pool has a cluster tier
  // The same, one row per tier: pool-wide, but for a tenant's share its open_failures are the
  // tenant's own.
  std::vector<TierStatsRow> tiers;
};

// INVALID_ARGUMENT unless salt and extra keys are within limits and every multimodal item lies
// inside a prompt of `num_tokens` tokens.
absl::Status ValidateSequenceKeys(absl::string_view cache_salt, const ExtraKeys& extras,
                                  size_t num_tokens);

// Where a page lookup found each leading page: tier 1's block, or (kNoBlock there) a record
// below, in `below` with its page in `below_pages`.
struct PageWalk {
  std::vector<BlockId> tier1;
  std::vector<BelowRecord> below;
  std::vector<size_t> below_pages;

  // Keeps the first `pages` pages.
  void Trim(size_t pages) {
    if (tier1.size() > pages) tier1.resize(pages);
    while (!below_pages.empty() && below_pages.back() >= pages) {
      below_pages.pop_back();
      below.pop_back();
    }
  }
  // The tier-1 pages, in page order.
  std::vector<BlockId> Hits() const {
    std::vector<BlockId> hits;
    for (BlockId block : tier1) {
      if (block != kNoBlock) hits.push_back(block);
    }
    return hits;
  }
  // The evictable tier-1 pages, each block once (a batch may name a key twice).
  size_t EvictableHits(const BlockPool& pool) const {
    absl::flat_hash_set<BlockId> evictable;
    for (BlockId block : tier1) {
      if (block != kNoBlock && pool.IsEvictable(block)) evictable.insert(block);
    }
    return evictable.size();
  }
};

class Pool final : private OffloadSource {
 public:
  // INVALID_ARGUMENT for a bad layout or block count; RESOURCE_EXHAUSTED if memory can't be had.
  // `faults` is where this pool latches its memory's faults and whose status gates its calls;
  // null: a latch of the pool's own. `quotas` holds the tenants' limits and counts their open
  // sequences (it must outlive the pool); null: quotas of the pool's own, without limits.
  // `events` receives the index's changes (it must outlive the pool; null: none are reported);
  // `clock` times residency.
  static absl::StatusOr<std::unique_ptr<Pool>> Create(
      const PoolOptions& options, uint32_t pool_index, std::unique_ptr<PoolMemory> memory,
      std::shared_ptr<DeviceFaultLatch> faults = nullptr, TenantQuotas* quotas = nullptr,
      KvEventLog* events = nullptr, const Clock* clock = RealClock::Get());

  ~Pool();
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  static uint32_t PoolIndexOf(uint64_t sequence_id) { return sequence_id % kMaxPools; }
  // LRU links the mover follows per hold of the pool mutex.
  static constexpr uint32_t kMaxOffloadScan = 256;

  const PoolOptions& options() const { return options_; }
  uint32_t pool_index() const { return pool_index_; }
  PoolResidency Residency() const;
  const PoolTierLoadLatency& tier_load_latency() const { return tiers_->load_latency(); }
  PoolTransferCounters& transfers() { return transfers_; }
  const PoolTransferCounters& transfers() const { return transfers_; }
  // Pages served per tenant and manifest, counted by the page calls (server/page_calls.cc).
  PageCounters& page_counters() { return page_counters_; }
  const PageCounters& page_counters() const { return page_counters_; }
  uint64_t layout_fingerprint() const { return layout_fingerprint_; }
  // The raw memory, for its description and for tests. Request paths move bytes with ReadBlock
  // and WriteBlock, which latch device faults.
  PoolMemory& memory() { return *memory_; }
  // The tiers below (LowerTiers), and the parts tests and the daemon's start-up line read.
  LowerTiers& lower_tiers() { return *tiers_; }
  const LowerTiers& lower_tiers() const { return *tiers_; }
  HostTier* host_tier() { return tiers_->host_tier(); }
  DiskTier* disk_tier() { return tiers_->disk_tier(); }
  uint32_t offload_window() const { return tiers_->offload_window(); }
  uint32_t demotion_window() const { return tiers_->demotion_window(); }
  // LowerTiers::OffloadForTesting (PoolOptions::testing_manual_offload).
  size_t OffloadForTesting() { return tiers_->OffloadForTesting(); }

  // kPut and kPinCached sequences cover only the prompt's full blocks (kPinCached: only the
  // cached ones) and leave the hit/miss statistics alone; release them like any other.
  absl::StatusOr<OpenedSequence> Open(const Session& session, const SequenceSpec& spec,
                                      OpenMode mode = OpenMode::kCompute);
  absl::StatusOr<ExtendedSequence> Extend(const Session& session, uint64_t sequence_id,
                                          absl::Span<const uint32_t> tokens);
  // `part_masks`: empty (every part), or one per full block written, from block 0, each naming
  // only the pool's parts and every all-pages part (INVALID_ARGUMENT otherwise, nothing
  // published); a block committed before keeps its mask. A block whose hash tier 1 holds with
  // fewer parts supersedes that copy when nobody holds it (SupersedeLocked).
  absl::StatusOr<CommitResult> Commit(const Session& session, uint64_t sequence_id,
                                      uint32_t num_written_tokens,
                                      absl::Span<const uint32_t> part_masks = {});
  absl::Status Release(const Session& session, uint64_t sequence_id);
  absl::StatusOr<ForkedSequence> Fork(const Session& session, uint64_t sequence_id);
  // `manifest`: the one the looked-up blocks' sessions were bound to (null: none).
  absl::StatusOr<LookupResult> Lookup(absl::string_view tenant, const SequenceSpec& spec,
                                      const CompatibilityManifest* manifest = nullptr);

  // Pages named by an engine's keys (DESIGN §13), in the namespace of the session's tenant and
  // manifest (FAILED_PRECONDITION without one, or with one that does not fit the pool). Keys
  // are each page's identity, compared in full on every hit; pages are not chained. `wanted`:
  // the parts a lookup restores (a mask over parts()). Implemented in cache/pool_pages.cc.
  //
  // The pool's parts: as declared, or the one part "kv" of a pool declared without.
  const std::vector<PagePartLayout>& parts() const { return parts_; }
  // The hit rule's count of leading keys over tier 1 and the node's lower tiers. Holds nothing.
  absl::StatusOr<PagesFound> ExistsPages(const Session& session, absl::Span<const std::string> keys,
                                         uint32_t wanted);
  // Fresh blocks for the keys tier 1 does not hold with at least `part_masks[i]` (empty: every
  // part), held by a new sequence of the session until CommitPages or Release.
  absl::StatusOr<ReservedPages> ReservePages(const Session& session,
                                             absl::Span<const std::string> keys,
                                             absl::Span<const uint32_t> part_masks);
  // Checksums the reserved pages' bytes, publishes them and ends the sequence. A page another
  // put published meanwhile is a duplicate.
  // `writer_checksums`: the reserved pages' checksums, in reservation order, from whoever wrote
  // their bytes as they were written (PutPages, which verified the client's; a same-node writer,
  // which can write any bytes there anyway: a wrong checksum fails every later read of its page,
  // never serves other KV); empty: computed here (PoolMemory::ChecksumBlocks, on the device for
  // a device pool). INVALID_ARGUMENT for another count.
  absl::StatusOr<CommittedPages> CommitPages(const Session& session, uint64_t sequence_id,
                                             absl::Span<const uint64_t> writer_checksums = {});
  // Pins the pages the hit rule gives for `wanted`, loading those below tier 1 into fresh
  // blocks (verified, then published), in a new sequence of the session; Release unpins.
  absl::StatusOr<AcquiredPages> AcquirePages(const Session& session,
                                             absl::Span<const std::string> keys, uint32_t wanted,
                                             uint32_t max_load_ms);

  // Holds the leading present pages (loading them from below) until `ttl` has passed on the
  // pool's clock or the session ends; a ttl of 0 only touches them (most recently used). Returns
  // how many. INVALID_ARGUMENT past kMaxPinTtl or kMaxPinPriority.
  // `priority`: when the tenant's quota refuses the pin (RESOURCE_EXHAUSTED), the tenant's live
  // pins of lower priority are released to make room, the lowest first and among equals the one
  // ending first, one at a time until the pin fits; it is refused only when none is left (those
  // released meanwhile stay released: a pin is a hint). Pins of equal or higher priority, other
  // tenants' pins and every other call's holds are never displaced.
  absl::StatusOr<uint32_t> PinPages(const Session& session, absl::Span<const std::string> keys,
                                    absl::Duration ttl, uint32_t priority = 0);
  static constexpr absl::Duration kMaxPinTtl = absl::Hours(24);
  static constexpr uint32_t kMaxPinPriority = 7;
  // Releases the pins whose TTL has passed on the pool's clock. Besides every call that
  // allocates, the daemon's reaper runs it each period, and Lookup, ExistsPages and GetStats
  // first, so a pin's blocks are released soon after its TTL whether or not the pool is busy.
  // An atomic read when no pin has expired.
  void ExpirePins();

  // How many sequences `session_id` holds in this pool.
  uint32_t SequencesOfSession(uint64_t session_id) const;
  // Releases every sequence of `session_id`, oldest first, each tail first; returns how many.
  // Idempotent.
  uint32_t ReleaseSession(uint64_t session_id);

  // XXH3-64 of a block's bytes, computed once per publication (GetBlocks sends it with every
  // read). REQUIRES: the caller holds a reference to `block`, so it cannot be reused meanwhile.
  absl::StatusOr<uint64_t> BlockChecksum(BlockId block);
  // PoolMemory::Write / Read of a block, with the device fault latch. OUT_OF_RANGE outside the
  // block. REQUIRES: the caller holds a reference to `block`.
  absl::Status WriteBlock(BlockId block, uint64_t offset, absl::string_view bytes);
  absl::Status ReadBlock(BlockId block, uint64_t offset, uint64_t size, char* out);

  PoolStatsSnapshot Stats() const;
  // One tenant's share (see PoolStatsSnapshot); all zero but the capacity for a stranger.
  PoolStatsSnapshot Stats(absl::string_view tenant) const;
  // Every tenant that has used the pool, in first-use order.
  std::vector<std::string> Tenants() const;
  absl::Status CheckInvariants() const;

  // Hash matches that verification refused: a walk that found a block under the next hash whose
  // stored identity or tokens differ from the request's, or a commit whose hash was already
  // indexed for other content. Each is a hash collision caught (a miss, never wrong KV); with
  // full-width hashes it stays 0 in practice. Tests force collisions with testing_hash_bits.
  uint64_t collisions_caught() const {
    return collisions_caught_.load(std::memory_order_relaxed) + tiers_->collisions_caught();
  }

 private:
  struct Sequence {
    uint64_t id = 0;
    uint64_t session_id = 0;
    uint32_t tenant = 0;      // slot in tenants_
    std::string tenant_name;  // the same tenant's name (SetRoot): what records below carry
    Hash128 root;
    uint64_t namespace_digest = 0;
    ExtraKeys extras;
    std::vector<uint32_t> tokens;
    std::vector<BlockId> blocks;
    std::vector<Hash128> chain;            // hash of each full block
    std::vector<uint64_t> extras_digests;  // per full block, parallel to chain
    std::vector<uint64_t> prefix_digests;  // per full block, parallel to chain
    uint32_t committed_blocks = 0;         // leading full blocks whose KV is written
    // Pages named by keys (DESIGN §13): each block's parent is the root, never the block
    // before; tokens hold each key's bytes (PageTokens), prefix_digests its PageKeyDigest and
    // extras_digests its part mask (kAnyPartMask while a lookup has not found it yet).
    bool pages = false;
    uint32_t page_duplicates = 0;  // a reservation's keys that were present already
    // Pages: each block's engine key, parallel to chain, and the session's manifest digest (32
    // hex digits), which name the page in its KV events.
    std::vector<std::string> page_keys;
    std::string manifest_digest;
  };
  // The tokens of the sequence's block `i`.
  absl::Span<const uint32_t> BlockTokensOf(const Sequence& sequence, size_t i) const {
    const uint32_t block_size = options_.layout.block_size;
    return absl::MakeConstSpan(sequence.tokens).subspan(i * block_size, block_size);
  }

  // One tenant's share of the pool.
  struct TenantUsage {
    std::string name;
    uint32_t referenced = 0;  // blocks with ref > 0 that belong to the tenant
    uint32_t open_sequences = 0;
    uint64_t prompt_tokens = 0;
    uint64_t hit_blocks = 0;
    uint64_t miss_blocks = 0;
    BlockPoolCounters counters;
  };

  Pool(const PoolOptions& options, uint32_t pool_index, std::unique_ptr<PoolMemory> memory,
       std::shared_ptr<DeviceFaultLatch> faults, TenantQuotas* quotas, KvEventLog* events,
       const Clock* clock, std::unique_ptr<LowerTiers> tiers);
  // The result of a memory operation, a device fault turned into the latched status.
  absl::Status CheckMemory(absl::Status result) { return faults_->Check(result, options_.name); }

  // After a load from below, run outside mu_: takes `sequence` off the loads in flight; when its
  // session ended meanwhile or a copy hit a device fault, releases what it holds and answers
  // why (ABORTED naming `call`, or the latched fault).
  absl::Status EndLoadLocked(const Session& session, const Sequence& sequence,
                             absl::string_view call) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The record block `i` of `sequence` must match below tier 1 (checksum 0: the bytes' to check).
  BlockRecordIdentity ExpectedRecord(const Sequence& sequence, size_t i) const;
  // Publishes the sequence's blocks from committed_blocks up to `written_blocks` (Commit's
  // rule, events included).
  void PublishWrittenLocked(Sequence* sequence, uint32_t written_blocks, CommitResult* result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Open's end under mu_: trims a read to its cached prefix, publishes what was loaded from
  // below, counts and adds the sequence.
  // With declared parts, the hit rule again over what loaded (`wanted`, `own`: Open's).
  OpenedSequence FinishOpenLocked(std::unique_ptr<Sequence> sequence, size_t prompt_tokens,
                                  OpenMode mode, size_t num_hits, TierLoaded loaded,
                                  uint32_t wanted = 0, absl::Span<const uint64_t> own = {},
                                  absl::Span<const BelowRecord> below = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // With declared parts, Open's hit rule over what it holds and loaded: learns the cluster's
  // masks, trims `loaded`, `num_hits` and `cached` to the endpoint (hits past it replaced by
  // fresh blocks), and gives the blocks past it their own digests back.
  void ApplyHitRuleToLoadLocked(Sequence* sequence, OpenMode mode, uint32_t wanted,
                                absl::Span<const uint64_t> own, absl::Span<const BelowRecord> below,
                                size_t* num_hits, TierLoaded* loaded, size_t* cached)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The lower tiers' figures and rows, with tier 1's share of tier 2's.
  void FillTierStatsLocked(PoolStatsSnapshot* stats) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Waits, releasing mu_, until the blocks pinned for copies down are back when they hold blocks
  // that a request needing `needed` blocks could otherwise not have. Call before looking at
  // anything.
  void WaitOutOffloadLocked(size_t needed) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Wakes the mover when blocks are evictable and fewer than offload_window_ are free.
  void MaybeWakeMoverLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Before a request takes `allocations` blocks (past the free ones, evictions of the LRU's
  // front, the request's evictable `hits` aside): pins those victims that no lower tier holds,
  // copies them down with mu_ released (LowerTiers::PassDown) and unpins them, below now.
  // Returns whether mu_ was released: then what the caller looked at may have changed.
  // The tier-2 records of `loading`, which the request loads next, stay in tier 2.
  bool PassDownVictimsLocked(size_t allocations, absl::Span<const BlockId> hits,
                             absl::Span<const BelowRecord> loading = {})
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // An open passes its victims down this many times at most (it looks at the pool again after
  // each); then it evicts what is still not below (counted: PoolHostTierStats::evicted_unsaved).
  static constexpr int kMaxPassDowns = 3;
  // An evictable block not marked below: pinned for offload and appended to `batch` if a lower
  // tier could take it, else marked below (it is there already).
  void TakeForOffloadLocked(BlockId block, std::vector<OffloadCandidate>* batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FinishOffloadLocked(absl::Span<const OffloadCandidate> batch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OffloadSource, for the mover: the oldest offload_window() evictable blocks not below yet,
  // pinned, and handed back.
  bool PickOffload(size_t max, std::vector<OffloadCandidate>* batch) override;
  void FinishOffload(absl::Span<const OffloadCandidate> batch) override;

  // A page sequence for `keys` (part masks: one per key, or kAnyPartMask for all): root, hashes,
  // key tokens and digests. FAILED_PRECONDITION for a session without a manifest.
  absl::StatusOr<std::unique_ptr<Sequence>> NewPageSequence(
      const Session& session, absl::Span<const std::string> keys,
      absl::Span<const uint32_t> part_masks) const;
  // What a page sequence's block `i` must match in tier 1 (its part mask: extras_digest).
  BlockIdentity PageIdentity(const Sequence& sequence, size_t i) const;
  // The tier-1 block holding page `i` of a page sequence, with any parts; kNoBlock if none.
  BlockId FindPageLocked(const Sequence& sequence, size_t i) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Before `own` is published as `identity`: a copy tier 1 holds (`present`, verified with any
  // parts) with fewer parts than it, and that nobody holds, is evicted, so the block gains its
  // parts (a copy in use stays, and ours is then a duplicate); a token block's descendants leave
  // the index with it, as at any eviction. Pages and token blocks alike. Lower tiers keep their
  // copy, with its own parts, until they drop it: a block found there never claims parts it does
  // not hold.
  void SupersedeLocked(BlockId present, BlockId own, uint64_t identity_extras)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The leading pages of `sequence` the node holds, each in tier 1 or below (tier 1 first),
  // with its part mask (filled into sequence->extras_digests).
  PageWalk FindPagesLocked(Sequence* sequence) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Adds where the first `pages` pages of `walk` are (past it: the cluster) to `by_tier`.
  static void CountPagesByTier(const PageWalk& walk, size_t pages, PagesByTier* by_tier);

  // Releases the pins whose TTL has passed. Cheap when there are none.
  void ExpirePinsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sets next_pin_expiry_ from pins_ after a change.
  void NotePinsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases `tenant`'s live pin of the lowest priority below `priority` (among equals, the one
  // ending first); false when it has none.
  bool DisplacePinBelow(absl::string_view tenant, uint32_t priority);

  // Hashes the sequence's full blocks not hashed yet. Touches only `sequence`.
  void HashNewBlocks(Sequence* sequence) const;
  // Sets the sequence's root and namespace digest, `manifest`'s digest among them (null: none).
  // FAILED_PRECONDITION when the manifest contradicts the pool's layout; nothing is set then.
  absl::Status SetRoot(absl::string_view tenant, absl::string_view cache_salt,
                       const CompatibilityManifest* manifest, Sequence* sequence) const;
  // Leading blocks, at most `max_blocks`, whose verified hits form an unbroken chain. With
  // declared parts, each hit's extras digest (its part mask) is learned into `sequence`.
  std::vector<BlockId> WalkLocked(Sequence* sequence, size_t max_blocks) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The tier-1 block that holds block `i` of `sequence` (published as `identity`, `tokens`)
  // with any parts; kNoBlock if none.
  BlockId FindPresentLocked(const Sequence& sequence, size_t i, const BlockIdentity& identity,
                            absl::Span<const uint32_t> tokens) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The extras digest a token block expects of tier 1's block `indexed`: with declared parts,
  // that block's when it has the same extra keys (its parts are whatever it holds); else ours.
  uint64_t ExpectedExtrasLocked(uint64_t ours, BlockId indexed) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // With declared parts: the records below tier 1 continuing the sequence's hit at `first`
  // expect any parts (their masks are learned from the records found); `own` restores the
  // sequence's own digests from `first` on.
  void ExpectAnyPartsFrom(Sequence* sequence, size_t first) const;
  // The leading blocks of `found` (learned digests in sequence->extras_digests from block
  // `first`) that keep the sequence's extra keys (`own`), then the hit rule over them.
  size_t RestorableBlocks(const Sequence& sequence, absl::Span<const uint64_t> own, size_t found,
                          uint32_t wanted) const;
  std::vector<uint32_t> PartMasksOf(const Sequence& sequence, size_t blocks) const;
  uint32_t wanted_parts(const SequenceSpec& spec) const {
    return spec.wanted_parts == 0 ? AllPartsMask(parts_.size()) : spec.wanted_parts;
  }
  // The block indexed under the sequence's hash of block `i` if it holds the sequence's own
  // prefix through block i (its own block, or another copy of the same content); kNoBlock
  // otherwise. O(1) when that block is the sequence's own; else it follows the parent links back
  // to one that is, verifying each.
  BlockId IndexedOwnPrefixLocked(const Sequence& sequence, size_t i) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  absl::Status CheckCapacityLocked(size_t needed, size_t reclaimable_hits,
                                   absl::string_view what) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<Sequence*> FindLocked(const Session& session, uint64_t sequence_id)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  uint64_t AddLocked(std::unique_ptr<Sequence> sequence) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseLocked(const Sequence& sequence, PoolTicks now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the sequence's blocks, its quota and its entry.
  void EraseLocked(uint64_t sequence_id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // The tenant's slot in tenants_, added on first use.
  uint32_t TenantSlotLocked(absl::string_view tenant) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // RESOURCE_EXHAUSTED if `new_blocks` more referenced blocks would pass the tenant's
  // max_referenced_blocks; then the open-sequence quota for `new_sequences` is taken.
  absl::Status ReserveLocked(uint32_t tenant, size_t new_blocks, uint32_t new_sequences)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The residency histograms' clock: milliseconds since the pool's creation, read once per call
  // and passed down (a clock read per block cost more than the block's bookkeeping). Ages are
  // differences modulo 2^32, so only an age over 49.7 days reads wrong, in the +Inf bucket's
  // place.
  PoolTicks NowTicks() const;
  // BlockPool's Acquire / AllocateFresh / Release, keeping each tenant's referenced count (and
  // with `prefix_hit`, its resurrections) and the residency times.
  void AcquireLocked(BlockId block, uint32_t tenant, bool prefix_hit, PoolTicks now)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  BlockId AllocateLocked(uint32_t tenant, PoolTicks now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseBlockLocked(BlockId block, PoolTicks now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reports the hashes evicted since the last call as one BlocksRemoved batch.
  void ReportEvictionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const PoolOptions options_;
  const std::vector<PagePartLayout> parts_;
  // Whether token blocks carry part masks (the pool declared parts; DESIGN §13).
  const bool token_parts_;
  const uint32_t pool_index_;
  const uint64_t layout_fingerprint_;
  const std::unique_ptr<PoolMemory> memory_;
  const std::shared_ptr<DeviceFaultLatch> faults_;  // own synchronization
  std::unique_ptr<TenantQuotas> own_quotas_;        // when none was given
  TenantQuotas* const quotas_;                      // own synchronization
  KvEventLog* const events_;                        // own synchronization; may be null
  const Clock* const clock_;
  const absl::Time created_at_;     // PoolTicks count from here
  PoolTransferCounters transfers_;  // own synchronization
  PageCounters page_counters_;      // own synchronization
  // Walks run under a shared lock, so the count is atomic.
  mutable std::atomic<uint64_t> collisions_caught_{0};
  // When the earliest pin ends (absl::ToUnixNanos; INT64_MAX: none), written under mu_ and read
  // without it by ExpirePins, which takes mu_ only once it has passed.
  std::atomic<int64_t> next_pin_expiry_{std::numeric_limits<int64_t>::max()};

  mutable absl::Mutex mu_;
  BlockPool pool_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  absl::flat_hash_map<uint64_t, std::unique_ptr<Sequence>> sequences_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, absl::flat_hash_set<uint64_t>> by_session_ ABSL_GUARDED_BY(mu_);
  uint64_t prompt_tokens_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t hit_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t miss_blocks_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<TenantUsage> tenants_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, uint32_t> tenant_slots_ ABSL_GUARDED_BY(mu_);
  std::vector<uint32_t> block_tenant_ ABSL_GUARDED_BY(mu_);  // slot of each referenced block
  // Per block, for the residency histograms.
  std::vector<PoolTicks> allocated_at_ ABSL_GUARDED_BY(mu_);
  std::vector<PoolTicks> last_access_ ABSL_GUARDED_BY(mu_);
  std::vector<PoolTicks> released_at_ ABSL_GUARDED_BY(mu_);
  MillisecondHistogram lifetime_ ABSL_GUARDED_BY(mu_){ResidencyBucketsSeconds()};
  MillisecondHistogram idle_before_evict_ ABSL_GUARDED_BY(mu_){ResidencyBucketsSeconds()};
  MillisecondHistogram reuse_gap_ ABSL_GUARDED_BY(mu_){ResidencyBucketsSeconds()};
  std::vector<Hash128> evicted_ ABSL_GUARDED_BY(mu_);  // not yet reported
  // AllocateFresh's hashes leaving the index, kept to spare an allocation per eviction.
  std::vector<Hash128> removed_ ABSL_GUARDED_BY(mu_);
  // PinPages' sequences by the time they end (a sequence released before is skipped).
  struct Pin {
    uint64_t sequence_id = 0;
    uint32_t priority = 0;
  };
  std::multimap<absl::Time, Pin> pins_ ABSL_GUARDED_BY(mu_);
  // Sequences being opened whose blocks are loading from tier 2 (not in sequences_ yet).
  absl::flat_hash_set<const Sequence*> loading_ ABSL_GUARDED_BY(mu_);
  // Blocks pinned for a copy down: the mover's batch and requests' pass-downs in flight.
  absl::flat_hash_set<BlockId> offload_pins_ ABSL_GUARDED_BY(mu_);
  // Where the mover's scan of the LRU resumes, and how many blocks from the front that is.
  BlockId offload_cursor_ ABSL_GUARDED_BY(mu_) = kNoBlock;
  uint32_t offload_scanned_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t offload_waits_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t evicted_unsaved_ ABSL_GUARDED_BY(mu_) = 0;
  uint32_t mover_events_ ABSL_GUARDED_BY(mu_) = 0;  // since the mover was last woken

  // The tiers below. Last: its mover calls PickOffload and FinishOffload until it is stopped,
  // which ~Pool does first.
  const std::unique_ptr<LowerTiers> tiers_;
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_POOL_H_
