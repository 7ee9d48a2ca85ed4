// LowerTiers: everything below a pool's tier 1 — tier 2 (tiers/host_tier.h), tier 3
// (tiers/disk_tier.h), the cluster tier (tiers/cluster_tier.h), the mover thread that passes
// blocks down ahead of their eviction, and the probe and load of a prefix's records from below
// (docs/design.md, "Tiers"). A Pool owns one and asks it two things: what of this prefix lies
// below (Probe), and bring these up (Load). The mover takes its batches from tier 1 through
// OffloadSource, which the pool implements: pick and pin under the pool's mutex, copy down
// outside it, hand back. A request that must evict blocks the mover has not reached passes them
// down itself the same way (PassDown), so no admitted block is lost to a large batch.
//
// It lives in cache/, not tiers/: it moves bytes between tier 1's PoolMemory and the stores of
// tiers/, which sit below cache/.
//
// Superseding (DESIGN §13): in a pool with declared parts, a tier-1 block with more parts than
// the copy a tier below holds (a block committed again with them, which superseded tier 1's
// copy) has somewhere to go: each tier takes it in place of the poorer copy (HostTier, DiskTier:
// Supersedes), and the cluster is sent only copies with more parts than the one it holds
// (ClusterTier::StoredExtras). A pool without declared parts asks only whether a hash is there.
//
// Any failure below is a miss: a load that fails or runs past max_load_ms ends the loaded run and
// the rest is computed; a store the tier refuses is not retried. A device fault during a copy
// latches in the pool's DeviceFaultLatch.
//
// Thread safety: thread-safe; the stores synchronize themselves and the counters are atomic.
// Probe runs under the pool's mutex (the walk sees one state); Load and the mover's copies run
// outside it, into or from blocks that only the caller holds or pins. Lock order: the pool's
// mutex, then the stores', then the mover's wake mutex or the cluster backlog's.
#ifndef KVCACHE_CACHE_LOWER_TIERS_H_
#define KVCACHE_CACHE_LOWER_TIERS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "cache/block_pool.h"
#include "cache/device_fault_latch.h"
#include "cache/kv_event_log.h"
#include "cache/pool_memory.h"
#include "cache/pool_options.h"
#include "cache/tier_events.h"
#include "cache/tier_stats.h"
#include "common/clock.h"
#include "common/histogram.h"
#include "tiers/block_record.h"
#include "tiers/cluster_tier.h"
#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"

namespace kvcache {

// How long opens spent loading their prefix from each lower tier, in seconds: one sample per open
// that loaded (or tried to load) from the tier — the whole run, verified — so a slow disk or a
// slow Redis node shows as the latency requests paid.
struct PoolTierLoadLatency {
  Histogram host{LatencyBucketsSeconds()};
  Histogram disk{LatencyBucketsSeconds()};
  Histogram cluster{LatencyBucketsSeconds()};
};

// A record below tier 1 that continues a prefix's verified walk, and the tier that holds it.
struct BelowRecord {
  enum class Tier : uint8_t { kHost, kDisk };
  BlockRecordIdentity expected;
  Tier tier = Tier::kHost;
};

// What a load brought up, per tier, consecutive from the first record.
struct TierLoaded {
  size_t host = 0;
  size_t disk = 0;
  size_t cluster = 0;
  // The extras digests of the cluster's records, in order: the part masks of pages whose loads
  // expected kAnyPartMask (BlockRecordIdentity).
  std::vector<uint64_t> cluster_extras;
  size_t total() const { return host + disk + cluster; }
};

// A tier-1 block the mover copies down, pinned by the pool until it is handed back.
struct OffloadCandidate {
  BlockId block = kNoBlock;
  BlockRecordIdentity record;
  std::optional<uint64_t> checksum;  // tier 1's checksum of the bytes, when it has one
  bool to_cluster = false;           // not in the cluster yet
  bool reused = false;               // hit at least once (DiskAdmission::kReused)
  // Set by the copy: the block is below now (in tier 2; without one, sent to the cluster).
  bool below = false;
  std::string cluster_copy;  // the bytes the cluster is sent
};

// Tier 1 as the mover sees it. Implemented by Pool.
class OffloadSource {
 public:
  // Under tier 1's lock: pins up to `max` of the oldest evictable blocks that are not below yet
  // (LowerTiers::NeedsOffload) and appends them to `batch`. False when the pass is done (nothing
  // to do until the next wake); true with an empty batch when the scan goes on next round.
  virtual bool PickOffload(size_t max, std::vector<OffloadCandidate>* batch) = 0;
  // Unpins a picked batch, each block marked below or not.
  virtual void FinishOffload(absl::Span<const OffloadCandidate> batch) = 0;

 protected:
  ~OffloadSource() = default;
};

class LowerTiers {
 public:
  // The tiers `options` asks for (none is fine: an empty stack). INVALID_ARGUMENT for a disk tier
  // without a host tier, or a tier's bad options; a tier's error when it cannot be made. `memory`
  // and `faults` must outlive the stack; `events` may be null (no announcements).
  static absl::StatusOr<std::unique_ptr<LowerTiers>> Create(const PoolOptions& options,
                                                            uint32_t pool_index, PoolMemory* memory,
                                                            DeviceFaultLatch* faults,
                                                            KvEventLog* events, const Clock* clock);
  ~LowerTiers();

  // Blocks the mover copies per batch, and the most it pins at once. Each batch takes the pool's
  // mutex twice, beside every request: 32 rather than 8 gave an evicting pool with a tier 2 ~7%
  // more calls/s on two cores (rpc_bench alone-tier2, docs/benchmarks.md).
  static constexpr size_t kOffloadBatch = 32;
  // Tier-2 records a load pins and copies up at once (one synchronization for a device pool).
  static constexpr size_t kLoadBatch = 16;
  // Into a host pool with workers (PoolOptions::workers), a batch is up to this many
  // bytes (and at least kLoadBatch records), and one of at least kSlicedCopyMinBytes is copied on
  // the workers too, a slice each: one thread copies and checksums at about half of what memory
  // allows. A slice must outlast handing it to a worker and waiting for it (tens of
  // microseconds where a thread sleeps: 2 MiB batches of 32 KiB blocks, not 512 KiB ones).
  static constexpr uint64_t kParallelLoadBatchBytes = uint64_t{4} << 20;
  // A disk load with no max_load_ms into host memory: batches of this many read depths.
  static constexpr size_t kDiskBatchDepths = 8;
  // A device pool's loads from the cluster stage at most this many blocks (and bytes) at a time.
  static constexpr size_t kClusterStageBlocks = 32;
  static constexpr uint64_t kClusterStageBytes = uint64_t{16} << 20;
  // The default offload window is this fraction of the pool (docs/benchmarks.md: measured).
  static constexpr uint32_t kDefaultOffloadWindowDivisor = 8;

  // Tier 2, or null.
  HostTier* host_tier() const { return host_tier_.get(); }
  // Tier 3, or null.
  DiskTier* disk_tier() const { return disk_tier_.get(); }
  bool has_cluster() const { return cluster_tier_ != nullptr; }
  // Whether tier 1's blocks have somewhere to go: a tier 2 or a cluster tier.
  bool takes_blocks() const { return host_tier_ != nullptr || cluster_tier_ != nullptr; }
  // How close to eviction the mover works: while fewer blocks than this are free, it keeps the
  // oldest this many evictable blocks copied below. PoolOptions::offload_window, or by default
  // num_blocks / kDefaultOffloadWindowDivisor (at least 8), at most num_blocks.
  uint32_t offload_window() const { return offload_window_; }
  // Tier 2 passes records to tier 3 while it has fewer free slots than this: its num_slots /
  // kDefaultOffloadWindowDivisor, at least 8 (0 without a tier 3).
  uint32_t demotion_window() const { return demotion_window_; }
  const PoolTierLoadLatency& load_latency() const { return load_latency_; }
  // Records below whose identity differed from the walk's (hash collisions caught: misses).
  uint64_t collisions_caught() const { return collisions_caught_.load(std::memory_order_relaxed); }

  // Starts the mover over `source` — unless there is no tier 2 or cluster tier to move to, or
  // PoolOptions::testing_manual_offload. REQUIRES: called once, before any other call but the
  // accessors; `source` outlives the mover (Stop).
  void Start(OffloadSource* source);
  // Stops and joins the mover. Idempotent.
  void Stop();
  bool has_mover() const { return mover_.joinable(); }
  // Wakes the mover; cheap when it is awake already.
  void WakeMover();
  // For a request about to evict `batch` (pinned by the pool, which has released its mutex):
  // what the mover would do to it — copies it down as CopyDown does, counted in
  // PoolHostTierStats::passed_down_on_eviction — but the cluster's copies are queued for the
  // mover to send, so the request never waits on the network. Sets each candidate's `below`.
  // The tier-2 records of `loading` (what the request is about to load) are kept: the copies do
  // not evict them to make room.
  void PassDown(std::vector<OffloadCandidate>& batch, absl::Span<const BelowRecord> loading);
  // What the mover does, synchronously, until nothing is left to do; returns the blocks stored
  // into tier 2 (tier 3's stores are queued; DiskTier::Flush makes them visible).
  // For tests and the simulation (PoolOptions::testing_manual_offload).
  size_t OffloadForTesting();

  // Whether a tier-1 block with this hash and extras digest has somewhere to go: the cluster when
  // it is not there yet (`in_cluster`), else tier 2 when it does not hold the hash, or holds it
  // with fewer parts.
  bool NeedsOffload(const Hash128& hash, uint64_t extras_digest, bool in_cluster) const;
  // Whether evicting the block from tier 1 loses nothing: tier 2, the disk or (`in_cluster`) the
  // cluster holds its bytes, with no fewer parts. The mover still copies such a block into tier 2
  // ahead of eviction when tier 2 lacks it (NeedsOffload: a block loaded from disk is hot), but a
  // request passing its victims down does not pay for that copy.
  bool HoldsBelow(const Hash128& hash, uint64_t extras_digest, bool in_cluster) const;
  // A tier-1 hit on a block already offloaded: its tier-2 record counts as reused too (admission).
  void MarkReused(const Hash128& hash);

  // The records continuing a verified prefix below tier 1: record_at(i) for i in [0, count),
  // consecutive, each from whichever of tier 2 and tier 3 holds it, up to the first neither
  // holds. The cluster is not probed (it is asked by Load). Call under the pool's mutex.
  std::vector<BelowRecord> Probe(absl::FunctionRef<BlockRecordIdentity(size_t)> record_at,
                                 size_t count) const;
  // The extras digests (pages' part masks) of the leading records record_at(i), i in [0, count),
  // the cluster holds (ClusterTier::ProbePrefix); empty without a cluster. Network I/O: call
  // outside the pool's mutex.
  std::vector<uint64_t> ProbeCluster(absl::FunctionRef<BlockRecordIdentity(size_t)> record_at,
                                     size_t count, absl::Time deadline);
  // Loads `below` into blocks[0], blocks[1], ... in order — tier-2 runs of kLoadBatch, disk
  // batches of its read depth (kDiskBatchDepths of them without `max_load_ms`) — then, if all of
  // them verified, records [below.size(), cluster_end) from the cluster; stops at the first that
  // fails, and when `max_load_ms` (from the call) has passed. `blocks` are fresh tier-1 blocks only
  // the caller holds (at least max(below.size(), cluster_end) of them), and `record_at` is Probe's.
  TierLoaded Load(absl::Span<const BelowRecord> below,
                  absl::FunctionRef<BlockRecordIdentity(size_t)> record_at, size_t cluster_end,
                  absl::Span<const BlockId> blocks, uint32_t max_load_ms);
  // Counts what an open returned as cached from below (an open that failed returns nothing).
  void CountHits(const TierLoaded& loaded);

  // Each tier's figures, or nullopt without it. The host tier's tier-1 figures
  // (evicted_from_above, request_waits) are the pool's to fill in.
  std::optional<PoolHostTierStats> HostStats() const;
  std::optional<PoolDiskTierStats> DiskStats() const;
  std::optional<PoolClusterTierStats> ClusterStats() const;
  // Sealed tiers' records that did not open for `tenant` in tier `tier` ("disk", "cluster"); 0
  // for any other tier, or a tier the pool lacks.
  uint64_t OpenFailures(absl::string_view tier, absl::string_view tenant) const;
  // Every (tier, tenant) with records that did not open, for /metrics.
  struct TenantOpenFailures {
    absl::string_view tier;
    std::string tenant;
    uint64_t count = 0;
  };
  std::vector<TenantOpenFailures> OpenFailuresByTenant() const;
  // Which of the tiers below seal their records: "disk", "cluster" (empty: none).
  std::vector<absl::string_view> SealedTiers() const;
  absl::Status CheckInvariants() const;

 private:
  LowerTiers(const PoolOptions& options, PoolMemory* memory, DeviceFaultLatch* faults,
             const Clock* clock, std::unique_ptr<HostTier> host_tier,
             std::unique_ptr<DiskTier> disk_tier, std::unique_ptr<ClusterTier> cluster_tier,
             std::shared_ptr<TierEvents> tier_events);
  // The result of a memory operation, a device fault turned into the latched status.
  absl::Status CheckMemory(absl::Status result) { return faults_->Check(result, options_.name); }

  void MoverLoop();
  // One batch of each of the mover's stages; false when neither had anything to do.
  bool MoverRound();
  // The mover's first stage: picks a batch from tier 1 (OffloadSource::PickOffload), copies it
  // down (CopyDown), hands it back (FinishOffload) and writes it through to the cluster. False
  // when the pass is done.
  bool OffloadBatch();
  // Copies the picked blocks into tier 2 in batches no larger than it (a device pool's D2H, one
  // synchronization each), and takes the cluster's copies; sets each candidate's `below`.
  // Returns the records tier 2 took.
  size_t CopyDown(absl::Span<OffloadCandidate> batch);
  size_t CopyDownPiece(absl::Span<OffloadCandidate> batch);
  // A tier-2 slot just taken: the record it evicted goes to tier 3 from the slot's bytes, unless
  // tier 3 has it or does not admit it (counted in PoolDiskTierStats::evicted_unsaved when it
  // refuses). Call before the slot is filled. False when the disk certainly lacks the evicted
  // record (its full queue refused it, which it answers only for a record neither indexed nor
  // queued; or it was writing a copy with fewer parts, ABORTED), so the caller need not ask.
  bool PassEvictedDown(const HostTier::PendingStore& slot);
  // Sends the batch's blocks not in the cluster yet, in one pipelined batch, and announces them.
  void WriteThroughToCluster(absl::Span<const OffloadCandidate> batch);
  // Takes out of `records` the copies without every part that the cluster holds with no fewer
  // parts (counted), so that a poorer copy never overwrites a richer one.
  void KeepBackPoorerThanCluster(std::vector<ClusterTier::Record>& records);
  // Whether a tier below holding `hash` (HostTier::Contains, DiskTier::Contains) holds a copy of
  // it that a copy with `extras_digest` would not supersede: with declared parts, one with no
  // fewer parts.
  template <typename Tier>
  bool HoldsCopy(const Tier& tier, const Hash128& hash, uint64_t extras_digest) const {
    return parts_declared_ ? tier.ContainsCopyOf(hash, extras_digest) : tier.Contains(hash);
  }
  // The mover's second stage: passes up to kOffloadBatch of tier 2's oldest records to tier 3.
  // False when there is nothing to pass, or tier 3 refuses (queue full, stopped).
  bool DemoteBatch();
  // Sends what requests' pass-downs queued for the cluster. False when nothing was queued.
  bool DrainClusterBacklog();

  // Load's steps, each loading and verifying a prefix of the records from `next` on.
  // LoadHostRun: tier-2 records while they last, at most LoadBatchRecords(), `past_bound` checked
  // before each but the first; `failed` when a record failed (not when the bound or the run's end
  // stopped it). LoadDiskBatch: the disk records [next, end), a device pool's through fresh
  // tier-2 slots that keep them; returns how many loaded.
  struct RunLoaded {
    size_t loaded = 0;
    bool failed = false;
  };
  RunLoaded LoadHostRun(absl::Span<const BelowRecord> below, size_t next,
                        absl::Span<const BlockId> blocks, absl::FunctionRef<bool()> past_bound);
  size_t LoadDiskBatch(absl::Span<const BelowRecord> below, size_t next, size_t end,
                       absl::Span<const BlockId> blocks);
  // Tier-2 records LoadHostRun pins and copies at once: kLoadBatch, more into a host pool with
  // workers (kParallelLoadBatchBytes).
  size_t LoadBatchRecords() const;
  // memory_->CopyFromHost(copies, checksums), a host pool's batch of kSlicedCopyMinBytes or more
  // cut into slices run on the pool's workers beside this thread.
  absl::Status CopyUpChecksummed(absl::Span<const PoolMemory::HostCopy> copies,
                                 absl::Span<uint64_t> checksums);
  // Loads `expected` into `blocks` from the cluster in one batch (a device pool's in chunks of
  // kClusterStageBlocks, staged on the host), stopping at the first that does not verify or has
  // not come back by `deadline` (real time); returns how many loaded.
  size_t LoadFromCluster(absl::Span<const BlockRecordIdentity> expected,
                         absl::Span<const BlockId> blocks, absl::Time deadline,
                         std::vector<uint64_t>* found_extras);

  // Constant after construction.
  const PoolOptions options_;
  PoolMemory* const memory_;        // the pool's; outlives this
  DeviceFaultLatch* const faults_;  // the pool's; own synchronization
  const Clock* const clock_;
  const bool host_memory_;            // tier 1 is host memory (loads land in it directly)
  const bool parts_declared_;         // blocks carry part masks (PoolOptions::parts)
  PoolTierLoadLatency load_latency_;  // own synchronization
  mutable std::atomic<uint64_t> collisions_caught_{0};
  OffloadSource* source_ = nullptr;  // set by Start

  // Tier 2, or null. Synchronizes itself.
  const std::unique_ptr<HostTier> host_tier_;
  const uint32_t offload_window_;
  std::atomic<uint64_t> host_hit_blocks_{0};
  std::atomic<uint64_t> offloaded_blocks_{0};
  std::atomic<uint64_t> passed_down_blocks_{0};
  std::atomic<uint64_t> host_load_failures_{0};
  std::atomic<uint64_t> host_deadline_blocks_{0};
  // Tier 3, or null. Synchronizes itself.
  const std::unique_ptr<DiskTier> disk_tier_;
  const uint32_t demotion_window_;
  std::atomic<uint64_t> disk_hit_blocks_{0};
  std::atomic<uint64_t> disk_load_failures_{0};
  std::atomic<uint64_t> disk_deadline_blocks_{0};
  std::atomic<uint64_t> demoted_blocks_{0};
  std::atomic<uint64_t> disk_evicted_from_above_{0};
  std::atomic<uint64_t> disk_evicted_unsaved_{0};
  // The cluster tier, or null. Synchronizes itself.
  const std::unique_ptr<ClusterTier> cluster_tier_;
  std::atomic<uint64_t> cluster_hit_blocks_{0};
  std::atomic<uint64_t> cluster_stored_blocks_{0};
  // Requests' pass-downs not sent to the cluster yet (their `cluster_copy` holds the bytes), at
  // most kClusterBacklogBytes of them: past that a pass-down's copies are not sent (a cache),
  // only counted.
  static constexpr uint64_t kClusterBacklogBytes = uint64_t{64} << 20;
  std::atomic<uint64_t> cluster_backlog_dropped_{0};
  std::atomic<uint64_t> cluster_poorer_kept_back_{0};
  absl::Mutex cluster_backlog_mu_;
  std::vector<OffloadCandidate> cluster_backlog_ ABSL_GUARDED_BY(cluster_backlog_mu_);
  uint64_t cluster_backlog_bytes_ ABSL_GUARDED_BY(cluster_backlog_mu_) = 0;
  // Announces the lower tiers' records; null without events. Synchronizes itself.
  const std::shared_ptr<TierEvents> tier_events_;

  // The mover.
  std::atomic<bool> mover_wanted_{false};
  absl::Mutex mover_mu_;
  absl::CondVar mover_cv_;
  bool mover_stopping_ ABSL_GUARDED_BY(mover_mu_) = false;
  std::thread mover_;
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_LOWER_TIERS_H_
