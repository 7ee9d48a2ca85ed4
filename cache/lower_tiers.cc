#include "cache/lower_tiers.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "common/page_parts.h"
#include "common/task_workers.h"

namespace kvcache {
namespace {

// A tier's error when it cannot be made, named after its pool.
absl::Status TierError(const absl::Status& status, absl::string_view pool, absl::string_view what) {
  return absl::Status(status.code(),
                      absl::StrCat("pool '", pool, "'", what, ": ", status.message()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<LowerTiers>> LowerTiers::Create(
    const PoolOptions& options, uint32_t pool_index, PoolMemory* memory, DeviceFaultLatch* faults,
    KvEventLog* events, const Clock* clock) {
  // Lower tiers announce their records in the pool's events, each with its medium.
  std::shared_ptr<TierEvents> tier_events;
  if (events != nullptr) {
    tier_events = std::make_shared<TierEvents>(events, pool_index, options.hash_algorithm,
                                               options.layout.block_size);
  }
  const auto listener = [&tier_events](absl::string_view medium) -> RecordChangeListener {
    if (tier_events == nullptr) return nullptr;
    return TierEvents::ListenerFor(tier_events, std::string(medium));
  };
  std::unique_ptr<HostTier> host_tier;
  if (options.host_tier_bytes != 0) {
    // A device pool's copies to and from tier 2 are DMA from page-locked memory. The pool's
    // memory outlives the tier.
    absl::StatusOr<std::unique_ptr<HostTier>> tier = HostTier::Create(
        options.host_tier_bytes, options.layout.BlockBytes(), listener(kKvMediumCpuPinned),
        HostMemoryRegistrar{
            .register_memory =
                [memory](void* base, uint64_t size) {
                  return memory->RegisterHostMemory(base, size);
                },
            .unregister_memory = [memory](void* base) { memory->UnregisterHostMemory(base); }});
    if (!tier.ok()) return TierError(tier.status(), options.name, "");
    host_tier = *std::move(tier);
  }
  const PoolIdentity identity{.model_id = options.model_id,
                              .layout_fingerprint = options.layout.Fingerprint(),
                              .hash_algorithm = options.hash_algorithm,
                              .block_bytes = options.layout.BlockBytes()};
  std::unique_ptr<DiskTier> disk_tier;
  if (!options.disk_tier_path.empty()) {
    if (host_tier == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("pool '", options.name, "': disk_tier needs a host_tier above it"));
    }
    DiskTierOptions disk{.path = options.disk_tier_path,
                         .capacity_bytes = options.disk_tier_bytes,
                         .pool = identity,
                         .tokens_per_block = options.layout.block_size,
                         .on_change = listener(kKvMediumDisk),
                         .keyring = options.tier_keyring,
                         .seal_workers = options.workers};
    if (options.testing_disk_tier_options) options.testing_disk_tier_options(&disk);
    absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(std::move(disk));
    if (!tier.ok()) return TierError(tier.status(), options.name, " disk_tier");
    disk_tier = *std::move(tier);
    // A router that connects after a warm restart learns what the disk still serves.
    if (tier_events != nullptr) tier_events->AnnounceRestored(kKvMediumDisk, disk_tier->Records());
  }
  std::unique_ptr<ClusterTier> cluster_tier;
  if (options.cluster_tier.has_value()) {
    absl::StatusOr<std::unique_ptr<ClusterTier>> tier =
        ClusterTier::Create(ClusterTierOptions{.redis = *options.cluster_tier,
                                               .pool = identity,
                                               .tokens_per_block = options.layout.block_size,
                                               .keyring = options.tier_keyring,
                                               .seal_workers = options.workers});
    if (!tier.ok()) return TierError(tier.status(), options.name, "");
    cluster_tier = *std::move(tier);
  }
  return std::unique_ptr<LowerTiers>(
      new LowerTiers(options, memory, faults, clock, std::move(host_tier), std::move(disk_tier),
                     std::move(cluster_tier), std::move(tier_events)));
}

LowerTiers::LowerTiers(const PoolOptions& options, PoolMemory* memory, DeviceFaultLatch* faults,
                       const Clock* clock, std::unique_ptr<HostTier> host_tier,
                       std::unique_ptr<DiskTier> disk_tier,
                       std::unique_ptr<ClusterTier> cluster_tier,
                       std::shared_ptr<TierEvents> tier_events)
    : options_(options),
      memory_(memory),
      faults_(faults),
      clock_(clock),
      host_memory_(memory->HostBlock(0) != nullptr),
      parts_declared_(!options.parts.empty()),
      host_tier_(std::move(host_tier)),
      offload_window_(
          std::min(options.num_blocks,
                   options.offload_window != 0
                       ? options.offload_window
                       : std::max(8u, options.num_blocks / kDefaultOffloadWindowDivisor))),
      disk_tier_(std::move(disk_tier)),
      demotion_window_(
          disk_tier_ == nullptr
              ? 0
              : std::min(host_tier_->num_slots(),
                         std::max(8u, host_tier_->num_slots() / kDefaultOffloadWindowDivisor))),
      cluster_tier_(std::move(cluster_tier)),
      tier_events_(std::move(tier_events)) {}

LowerTiers::~LowerTiers() { Stop(); }

void LowerTiers::Start(OffloadSource* source) {
  source_ = source;
  if (takes_blocks() && !options_.testing_manual_offload) {
    mover_ = std::thread([this] { MoverLoop(); });
  }
}

void LowerTiers::Stop() {
  {
    absl::MutexLock lock(&mover_mu_);
    mover_stopping_ = true;
    mover_cv_.Signal();
  }
  if (mover_.joinable()) mover_.join();
}

void LowerTiers::WakeMover() {
  if (mover_wanted_.exchange(true, std::memory_order_acq_rel)) return;
  absl::MutexLock lock(&mover_mu_);
  mover_cv_.Signal();
}

void LowerTiers::MoverLoop() {
  while (true) {
    {
      absl::MutexLock lock(&mover_mu_);
      while (!mover_stopping_ && !mover_wanted_.load(std::memory_order_acquire)) {
        mover_cv_.Wait(&mover_mu_);
      }
      if (mover_stopping_) return;
    }
    mover_wanted_.store(false, std::memory_order_release);
    while (MoverRound()) {
      absl::MutexLock lock(&mover_mu_);
      if (mover_stopping_) return;
    }
  }
}

size_t LowerTiers::OffloadForTesting() {
  const uint64_t before = offloaded_blocks_.load(std::memory_order_relaxed);
  while (MoverRound()) {
  }
  return offloaded_blocks_.load(std::memory_order_relaxed) - before;
}

bool LowerTiers::MoverRound() {
  // Both stages each round: what tier 1 passes down fills tier 2, which passes its oldest on.
  const bool offloading = OffloadBatch();
  const bool demoting = DemoteBatch();
  const bool sending = DrainClusterBacklog();
  return offloading || demoting || sending;
}

bool LowerTiers::NeedsOffload(const Hash128& hash, uint64_t extras_digest, bool in_cluster) const {
  if (cluster_tier_ != nullptr && !in_cluster) return true;
  return host_tier_ != nullptr && !HoldsCopy(*host_tier_, hash, extras_digest);
}

bool LowerTiers::HoldsBelow(const Hash128& hash, uint64_t extras_digest, bool in_cluster) const {
  if (cluster_tier_ != nullptr && in_cluster) return true;
  if (host_tier_ != nullptr && HoldsCopy(*host_tier_, hash, extras_digest)) return true;
  return disk_tier_ != nullptr && HoldsCopy(*disk_tier_, hash, extras_digest);
}

void LowerTiers::MarkReused(const Hash128& hash) {
  if (host_tier_ != nullptr) host_tier_->MarkReused(hash);
}

bool LowerTiers::OffloadBatch() {
  if (!takes_blocks()) return false;
  std::vector<OffloadCandidate> batch;
  if (!source_->PickOffload(kOffloadBatch, &batch)) return false;
  if (batch.empty()) return true;  // the scan continues after letting requests in
  const size_t stored = CopyDown(absl::MakeSpan(batch));
  offloaded_blocks_.fetch_add(stored, std::memory_order_relaxed);
  // The cluster's copies were taken while the blocks were pinned, and are sent after they are
  // unpinned: a request that needs a pinned block waits for this batch, and must not wait on the
  // network.
  source_->FinishOffload(batch);
  WriteThroughToCluster(batch);
  // A batch nothing of which went anywhere (tier 2 refused every store) ends the pass: a scan
  // that reached the LRU's end starts over at its front, and would retake the same blocks at
  // once, forever (the fuzzer found the mover spinning so). Evictions pass them down later.
  return stored > 0 || std::any_of(batch.begin(), batch.end(), [](const OffloadCandidate& c) {
           return c.below || c.to_cluster;
         });
}

void LowerTiers::PassDown(std::vector<OffloadCandidate>& batch,
                          absl::Span<const BelowRecord> loading) {
  // Pinned as a load pins them (a use: they are the request's hits), so no store evicts them.
  std::vector<HostTier::PinnedRecord> kept;
  for (const BelowRecord& record : loading) {
    if (record.tier != BelowRecord::Tier::kHost) continue;
    absl::StatusOr<HostTier::PinnedRecord> pinned = host_tier_->PinForLoad(record.expected);
    if (pinned.ok()) kept.push_back(*std::move(pinned));
  }
  passed_down_blocks_.fetch_add(CopyDown(absl::MakeSpan(batch)), std::memory_order_relaxed);
  for (const HostTier::PinnedRecord& pinned : kept) {
    host_tier_->FinishLoad(pinned, HostTier::LoadVerdict::kNotCopied).IgnoreError();
  }
  // A test's disk is flushed where the mover's work is done (OffloadForTesting's callers), so
  // what is durable, hence found, does not depend on the writer's timing: so here.
  if (options_.testing_manual_offload && disk_tier_ != nullptr) disk_tier_->Flush();
  if (cluster_tier_ == nullptr) return;
  {
    absl::MutexLock lock(&cluster_backlog_mu_);
    for (OffloadCandidate& candidate : batch) {
      if (!candidate.to_cluster || candidate.cluster_copy.empty()) continue;
      if (cluster_backlog_bytes_ + candidate.cluster_copy.size() > kClusterBacklogBytes) {
        cluster_backlog_dropped_.fetch_add(1, std::memory_order_relaxed);
        continue;
      }
      cluster_backlog_bytes_ += candidate.cluster_copy.size();
      cluster_backlog_.push_back(
          OffloadCandidate{.record = candidate.record,
                           .to_cluster = true,
                           .cluster_copy = std::move(candidate.cluster_copy)});
    }
  }
  WakeMover();
}

bool LowerTiers::DrainClusterBacklog() {
  std::vector<OffloadCandidate> backlog;
  {
    absl::MutexLock lock(&cluster_backlog_mu_);
    backlog.swap(cluster_backlog_);
    cluster_backlog_bytes_ = 0;
  }
  if (backlog.empty()) return false;
  WriteThroughToCluster(backlog);
  return true;
}

size_t LowerTiers::CopyDown(absl::Span<OffloadCandidate> batch) {
  // In pieces no larger than tier 2: a piece's stores evict the piece before's records (on to
  // the disk), never one another, which tier 2 refuses (every slot is the batch's) and which
  // left those blocks in no tier once tier 1 evicted them.
  const size_t piece =
      host_tier_ != nullptr ? std::max<size_t>(1, host_tier_->num_slots()) : batch.size();
  size_t stored_below = 0;
  for (size_t first = 0; first < batch.size(); first += piece) {
    stored_below += CopyDownPiece(batch.subspan(first, piece));
  }
  return stored_below;
}

size_t LowerTiers::CopyDownPiece(absl::Span<OffloadCandidate> batch) {
  const uint64_t block_bytes = options_.layout.BlockBytes();
  size_t stored_below = 0;
  // Pinned and published: the bytes cannot change during the copies. Tier 2's slots are filled
  // in one batch (a device pool's D2H copies, one synchronization).
  std::vector<std::optional<HostTier::PendingStore>> pending(batch.size());
  // Per slot: whether the record it evicted may be on disk (else the disk is not asked again).
  std::vector<bool> evicted_maybe_on_disk(batch.size());
  std::vector<PoolMemory::HostCopy> copies;
  for (size_t i = 0; i < batch.size(); ++i) {
    OffloadCandidate& candidate = batch[i];
    if (host_tier_ != nullptr) {
      absl::StatusOr<HostTier::PendingStore> slot = host_tier_->BeginStore(candidate.record);
      // ALREADY_EXISTS: below already, with no fewer parts (loaded from there, or a concurrent
      // load from the disk tier put it there).
      candidate.below = absl::IsAlreadyExists(slot.status());
      if (slot.ok()) {
        evicted_maybe_on_disk[i] = PassEvictedDown(*slot);
        copies.push_back(PoolMemory::HostCopy{.block = candidate.block, .host = slot->bytes});
        pending[i] = *std::move(slot);
        continue;
      }
    }
    if (candidate.to_cluster && !host_memory_) {
      // Only for the cluster: device bytes staged in the copy itself.
      candidate.cluster_copy.resize(block_bytes);
      copies.push_back(
          PoolMemory::HostCopy{.block = candidate.block,
                               .host = reinterpret_cast<uint8_t*>(candidate.cluster_copy.data())});
    }
  }
  const absl::Status copied = CheckMemory(memory_->CopyToHost(copies));
  for (size_t i = 0; i < batch.size(); ++i) {
    OffloadCandidate& candidate = batch[i];
    // Tier 2's slot, else the cluster's own copy of a device block, else host memory (null for a
    // device block with neither).
    const uint8_t* bytes = pending[i].has_value() ? pending[i]->bytes
                           : !candidate.cluster_copy.empty()
                               ? reinterpret_cast<const uint8_t*>(candidate.cluster_copy.data())
                               : memory_->HostBlock(candidate.block);
    if (bytes == nullptr || !copied.ok()) {
      // A device pool's failed copy (the fault latched): nothing of it is published.
      if (pending[i].has_value()) {
        host_tier_->FinishStore(*pending[i], candidate.record, candidate.reused, false)
            .IgnoreError();
      }
      continue;
    }
    candidate.record.checksum = candidate.checksum.has_value()
                                    ? *candidate.checksum
                                    : ::kvcache::BlockChecksum(bytes, block_bytes);
    // Copied before tier 2 publishes its slot, which may then be evicted and reused at once.
    if (candidate.to_cluster) {
      if (candidate.cluster_copy.empty()) {
        candidate.cluster_copy.assign(reinterpret_cast<const char*>(bytes), block_bytes);
      }
      // Sent once: a store the cluster then refuses is not retried (it is a cache).
      if (host_tier_ == nullptr) candidate.below = true;
    }
    if (pending[i].has_value()) {
      // Tier 2 keeps the identity; only the cluster's copies need it afterwards.
      const absl::Status stored = host_tier_->FinishStore(
          *pending[i], candidate.to_cluster ? candidate.record : std::move(candidate.record),
          candidate.reused, true);
      candidate.below = stored.ok() || absl::IsAlreadyExists(stored);
      if (stored.ok()) ++stored_below;
      // Saved only if durable on disk (a record accepted for writing may yet fail its write).
      if (stored.ok() && pending[i]->evicted.has_value() && disk_tier_ != nullptr &&
          evicted_maybe_on_disk[i] && disk_tier_->Contains(pending[i]->evicted->hash)) {
        disk_evicted_from_above_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  return stored_below;
}

bool LowerTiers::PassEvictedDown(const HostTier::PendingStore& slot) {
  if (disk_tier_ == nullptr || !slot.evicted.has_value() || slot.evicted_below) return true;
  // The demotion window keeps tier 2's next victims on disk ahead of time; a store that outran
  // it passes its victim down now, from the slot it is about to overwrite.
  if (options_.disk_admission == DiskAdmission::kAll || slot.evicted_reused) {
    // A full queue refuses it at the cost of a lookup (DiskTier::Store): a disk slower than the
    // evictions costs the mover little per record it cannot take.
    const absl::Status stored = disk_tier_->Store(
        *slot.evicted,
        absl::MakeConstSpan(reinterpret_cast<const char*>(slot.bytes), host_tier_->block_bytes()));
    if (stored.ok() || absl::IsAlreadyExists(stored)) {
      demoted_blocks_.fetch_add(stored.ok() ? 1 : 0, std::memory_order_relaxed);
      return true;
    }
    disk_evicted_unsaved_.fetch_add(1, std::memory_order_relaxed);
    // ABORTED: the disk is writing a poorer copy; the evicted one's parts are lost all the same.
    return !absl::IsResourceExhausted(stored) && !absl::IsAborted(stored);
  }
  disk_evicted_unsaved_.fetch_add(1, std::memory_order_relaxed);
  return true;
}

void LowerTiers::WriteThroughToCluster(absl::Span<const OffloadCandidate> batch) {
  // What leaves the node goes to the cluster too, in one pipelined batch. A cluster that is down
  // or slow costs the mover its timeout (back-pressure), never a request.
  std::vector<ClusterTier::Record> to_cluster;
  for (const OffloadCandidate& candidate : batch) {
    if (candidate.to_cluster) {
      to_cluster.push_back(ClusterTier::Record{candidate.record, candidate.cluster_copy});
    }
  }
  if (parts_declared_) KeepBackPoorerThanCluster(to_cluster);
  if (to_cluster.empty()) return;
  const std::vector<absl::Status> stored = cluster_tier_->Store(to_cluster);
  // Announced live only: the cluster evicts silently, so no removal would ever follow.
  // Announced before counted, so whoever sees the count sees the events.
  std::vector<RecordChange> in_cluster;
  uint64_t written = 0;
  for (size_t i = 0; i < stored.size(); ++i) {
    if (!stored[i].ok()) continue;
    ++written;
    if (tier_events_ != nullptr) {
      in_cluster.push_back(RecordChange{RecordChange::Kind::kStored, to_cluster[i].identity});
    }
  }
  if (!in_cluster.empty()) {
    tier_events_->Announce(kKvMediumExternal, in_cluster, KvEventRetention::kLiveOnly);
  }
  cluster_stored_blocks_.fetch_add(written, std::memory_order_relaxed);
}

void LowerTiers::KeepBackPoorerThanCluster(std::vector<ClusterTier::Record>& records) {
  // A copy with every part is never poorer: only the others are looked up, in one pipeline.
  const uint32_t every_part = AllPartsMask(options_.parts.size());
  std::vector<size_t> partial;
  std::vector<BlockRecordIdentity> identities;
  for (size_t i = 0; i < records.size(); ++i) {
    if (PartMaskIn(records[i].identity.extras_digest) == every_part) continue;
    partial.push_back(i);
    identities.push_back(records[i].identity);
  }
  if (partial.empty()) return;
  const std::vector<std::optional<uint64_t>> stored =
      cluster_tier_->StoredExtras(identities, absl::InfiniteFuture());
  std::vector<bool> kept_back(records.size(), false);
  for (size_t k = 0; k < partial.size(); ++k) {
    kept_back[partial[k]] =
        stored[k].has_value() && !HasMoreParts(identities[k].extras_digest, *stored[k]);
  }
  size_t next = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    if (kept_back[i]) continue;
    if (next != i) records[next] = std::move(records[i]);  // never onto itself: that empties it
    ++next;
  }
  cluster_poorer_kept_back_.fetch_add(records.size() - next, std::memory_order_relaxed);
  records.resize(next);
}

bool LowerTiers::DemoteBatch() {
  if (disk_tier_ == nullptr) return false;
  // Paced to the disk's writer: only as many records as its queue takes now are pinned and
  // offered, so none is built to be refused (the writer frees places as its batches land, and
  // the next round offers more).
  const size_t room = std::min<size_t>(kOffloadBatch, disk_tier_->StoreRoom());
  if (room == 0) return false;
  std::vector<HostTier::Demotion> batch = host_tier_->PinForDemotion(
      demotion_window_, room, options_.disk_admission == DiskAdmission::kReused);
  bool more = !batch.empty();
  for (HostTier::Demotion& demotion : batch) {
    absl::Status stored = absl::UnavailableError("the disk tier refused this round");
    if (more) {
      // Stores only queue (a copy of the bytes); the disk tier's writer does the I/O.
      stored = disk_tier_->Store(std::move(demotion.identity),
                                 absl::MakeConstSpan(reinterpret_cast<const char*>(demotion.bytes),
                                                     host_tier_->block_bytes()));
      if (stored.ok()) demoted_blocks_.fetch_add(1, std::memory_order_relaxed);
      // A full queue or a stopped disk is the disk's back-pressure: the rest of the batch goes
      // back unmarked (offered again next pass, or evicted from tier 2 unsaved), and the mover
      // stops passing down for this round. So does a copy with more parts of a record still
      // being written (ABORTED), offered again once the writer has made that one durable.
      more = !absl::IsResourceExhausted(stored) && !absl::IsUnavailable(stored) &&
             !absl::IsAborted(stored);
    }
    host_tier_->FinishDemotion(demotion.slot, stored);
  }
  return more;
}

std::vector<BelowRecord> LowerTiers::Probe(absl::FunctionRef<BlockRecordIdentity(size_t)> record_at,
                                           size_t count) const {
  std::vector<BelowRecord> below;
  if (host_tier_ == nullptr) return below;
  for (size_t i = 0; i < count; ++i) {
    BlockRecordIdentity expected = record_at(i);
    // A page's parts are learned from the record found: the load then expects exactly them.
    const bool learn_parts = expected.extras_digest == kAnyPartMask;
    TierProbe probe = TierProbe::kAbsent;
    if (learn_parts) {
      const std::optional<BlockRecordIdentity> found = host_tier_->Find(expected.hash);
      if (found.has_value()) {
        probe = RecordMismatch(*found, expected).empty() ? TierProbe::kMatch : TierProbe::kMismatch;
        if (probe == TierProbe::kMatch) expected.extras_digest = found->extras_digest;
      }
    } else {
      probe = host_tier_->Probe(expected);
    }
    if (probe == TierProbe::kMatch) {
      below.push_back(BelowRecord{std::move(expected), BelowRecord::Tier::kHost});
      continue;
    }
    if (probe == TierProbe::kMismatch) collisions_caught_.fetch_add(1, std::memory_order_relaxed);
    if (disk_tier_ == nullptr) break;
    // From memory: what the disk tier indexed, durable records only.
    const absl::StatusOr<BlockRecordIdentity> on_disk = disk_tier_->Find(expected.hash);
    if (!on_disk.ok()) break;
    if (!RecordMismatch(*on_disk, expected).empty()) {
      collisions_caught_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
    if (learn_parts) expected.extras_digest = on_disk->extras_digest;
    below.push_back(BelowRecord{std::move(expected), BelowRecord::Tier::kDisk});
  }
  return below;
}

std::vector<uint64_t> LowerTiers::ProbeCluster(
    absl::FunctionRef<BlockRecordIdentity(size_t)> record_at, size_t count, absl::Time deadline) {
  if (cluster_tier_ == nullptr || count == 0) return {};
  std::vector<BlockRecordIdentity> expected;
  expected.reserve(count);
  for (size_t i = 0; i < count; ++i) expected.push_back(record_at(i));
  return cluster_tier_->ProbePrefix(expected, deadline);
}

TierLoaded LowerTiers::Load(absl::Span<const BelowRecord> below,
                            absl::FunctionRef<BlockRecordIdentity(size_t)> record_at,
                            size_t cluster_end, absl::Span<const BlockId> blocks,
                            uint32_t max_load_ms) {
  const absl::Time start = clock_->Now();
  TierLoaded loaded;
  // Real time spent in each tier (the pool's clock may be a test's), one sample per tier tried.
  std::optional<absl::Duration> host_time, disk_time;
  const auto timed = [](std::optional<absl::Duration>& total, auto&& load) {
    const absl::Time begin = absl::Now();
    auto result = load();
    total = total.value_or(absl::ZeroDuration()) + (absl::Now() - begin);
    return result;
  };
  const auto past_bound = [&] {
    return max_load_ms != 0 && clock_->Now() - start >= absl::Milliseconds(max_load_ms);
  };
  while (loaded.total() < below.size()) {
    const size_t next = loaded.total();
    if (past_bound()) {
      for (size_t i = next; i < below.size(); ++i) {
        (below[i].tier == BelowRecord::Tier::kHost ? host_deadline_blocks_ : disk_deadline_blocks_)
            .fetch_add(1, std::memory_order_relaxed);
      }
      break;
    }
    if (below[next].tier == BelowRecord::Tier::kHost) {
      const RunLoaded run =
          timed(host_time, [&] { return LoadHostRun(below, next, blocks, past_bound); });
      loaded.host += run.loaded;
      if (run.failed) {
        host_load_failures_.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      continue;
    }
    // A run of disk records, in batches: with max_load_ms, of the disk tier's read depth (the
    // bound is checked between batches); without, of kDiskBatchDepths times it into host memory,
    // so that LoadMany keeps its reads in flight across what would be several drained batches
    // (a device pool stages each batch in tier-2 slots: the depth, as with a bound).
    const size_t batch =
        disk_tier_->read_depth() * (max_load_ms == 0 && host_memory_ ? kDiskBatchDepths : 1);
    size_t end = next;
    while (end < below.size() && below[end].tier == BelowRecord::Tier::kDisk &&
           end - next < batch) {
      ++end;
    }
    const size_t verified =
        timed(disk_time, [&] { return LoadDiskBatch(below, next, end, blocks); });
    loaded.disk += verified;
    if (verified < end - next) {
      disk_load_failures_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
  }
  if (host_time) load_latency_.host.Observe(absl::ToDoubleSeconds(*host_time));
  if (disk_time) load_latency_.disk.Observe(absl::ToDoubleSeconds(*disk_time));
  // The budget left, as a real-time deadline for the network (the pool's clock may be a test's).
  const absl::Duration budget_left =
      max_load_ms == 0 ? absl::InfiniteDuration()
                       : absl::Milliseconds(max_load_ms) - (clock_->Now() - start);
  if (cluster_tier_ != nullptr && cluster_end > below.size() && loaded.total() == below.size() &&
      budget_left > absl::ZeroDuration()) {
    std::vector<BlockRecordIdentity> expected;
    for (size_t i = below.size(); i < cluster_end; ++i) expected.push_back(record_at(i));
    const absl::Time begin = absl::Now();
    loaded.cluster = LoadFromCluster(expected, blocks.subspan(below.size()), begin + budget_left,
                                     &loaded.cluster_extras);
    load_latency_.cluster.Observe(absl::ToDoubleSeconds(absl::Now() - begin));
  }
  return loaded;
}

LowerTiers::RunLoaded LowerTiers::LoadHostRun(absl::Span<const BelowRecord> below, size_t next,
                                              absl::Span<const BlockId> blocks,
                                              absl::FunctionRef<bool()> past_bound) {
  // Pins a run of tier-2 records (the bound checked before each), copies them up in one batch
  // (a device pool's H2D copies, verified on the host meanwhile) and counts the verified prefix.
  RunLoaded run;
  std::vector<HostTier::PinnedRecord> pinned;
  std::vector<PoolMemory::HostCopy> copies;
  const size_t batch = LoadBatchRecords();
  for (size_t i = next; i < below.size() && below[i].tier == BelowRecord::Tier::kHost &&
                        pinned.size() < batch && (i == next || !past_bound());
       ++i) {
    absl::StatusOr<HostTier::PinnedRecord> record = host_tier_->PinForLoad(below[i].expected);
    if (!record.ok()) {
      run.failed = true;  // gone since the probe (evicted), counted by the tier
      break;
    }
    copies.push_back(
        PoolMemory::HostCopy{.block = blocks[i], .host = const_cast<uint8_t*>(record->bytes)});
    pinned.push_back(*std::move(record));
  }
  std::vector<uint64_t> checksums(pinned.size());
  const absl::Status copied = CheckMemory(CopyUpChecksummed(copies, absl::MakeSpan(checksums)));
  while (run.loaded < pinned.size() && copied.ok() &&
         checksums[run.loaded] == pinned[run.loaded].checksum) {
    ++run.loaded;
  }
  run.failed = run.failed || run.loaded < pinned.size();
  for (size_t i = 0; i < pinned.size(); ++i) {
    // Past the verified prefix nothing is used: the first failure is dropped if it is the
    // record's (a failed copy is no verdict on it), the rest are only unpinned.
    const HostTier::LoadVerdict verdict = i < run.loaded ? HostTier::LoadVerdict::kVerified
                                          : i == run.loaded && copied.ok()
                                              ? HostTier::LoadVerdict::kCorrupt
                                              : HostTier::LoadVerdict::kNotCopied;
    host_tier_->FinishLoad(pinned[i], verdict).IgnoreError();
  }
  return run;
}

size_t LowerTiers::LoadBatchRecords() const {
  if (!host_memory_ || options_.workers == nullptr || options_.workers->threads() == 0) {
    return kLoadBatch;
  }
  return std::max<uint64_t>(kLoadBatch, kParallelLoadBatchBytes / options_.layout.BlockBytes());
}

absl::Status LowerTiers::CopyUpChecksummed(absl::Span<const PoolMemory::HostCopy> copies,
                                           absl::Span<uint64_t> checksums) {
  TaskWorkers* const workers = options_.workers.get();
  // A device pool's batch is one synchronization of its own: not cut.
  if (!host_memory_ || workers == nullptr || workers->threads() == 0 ||
      copies.size() * options_.layout.BlockBytes() < kSlicedCopyMinBytes) {
    return memory_->CopyFromHost(copies, checksums);
  }
  absl::Mutex mu;
  absl::Status first_error;
  RunInSlices(workers, copies.size(), workers->threads() + 1, [&](size_t begin, size_t end) {
    absl::Status copied = memory_->CopyFromHost(copies.subspan(begin, end - begin),
                                                checksums.subspan(begin, end - begin));
    if (copied.ok()) return;
    absl::MutexLock lock(&mu);
    first_error.Update(std::move(copied));
  });
  return first_error;
}

size_t LowerTiers::LoadDiskBatch(absl::Span<const BelowRecord> below, size_t next, size_t end,
                                 absl::Span<const BlockId> blocks) {
  const uint64_t block_bytes = options_.layout.BlockBytes();
  std::vector<DiskTier::LoadRequest> requests;
  std::vector<HostTier::PendingStore> slots;
  std::vector<uint64_t> checksums(end - next);
  for (size_t i = next; i < end; ++i) {
    uint8_t* out = nullptr;
    if (host_memory_) {
      // Straight into the fresh tier-1 block.
      out = memory_->MutableHostBlock(blocks[i]);
    } else {
      // Device memory: into a tier-2 slot (page-locked), copied up in one batch afterwards.
      absl::StatusOr<HostTier::PendingStore> slot = host_tier_->BeginStore(below[i].expected);
      if (!slot.ok()) break;
      PassEvictedDown(*slot);
      out = slot->bytes;
      slots.push_back(*std::move(slot));
    }
    requests.push_back(DiskTier::LoadRequest{.expected = &below[i].expected,
                                             .out = {reinterpret_cast<char*>(out), block_bytes},
                                             .checksum = &checksums[i - next]});
  }
  size_t verified = 0;
  for (const absl::Status& status : disk_tier_->LoadMany(requests)) {
    if (!status.ok()) break;
    ++verified;
  }
  if (host_memory_) return verified;
  std::vector<PoolMemory::HostCopy> copies;
  for (size_t i = 0; i < verified; ++i) {
    copies.push_back(PoolMemory::HostCopy{.block = blocks[next + i], .host = slots[i].bytes});
  }
  if (!CheckMemory(memory_->CopyFromHost(copies, {})).ok()) verified = 0;
  // The copied records stay in tier 2 (they are hot again), under the checksum the disk tier
  // verified their bytes against; the rest of the slots go back.
  for (size_t i = 0; i < slots.size(); ++i) {
    BlockRecordIdentity record = below[next + i].expected;
    record.checksum = checksums[i];
    host_tier_->FinishStore(slots[i], record, /*reused=*/true, i < verified).IgnoreError();
  }
  return verified;
}

size_t LowerTiers::LoadFromCluster(absl::Span<const BlockRecordIdentity> expected,
                                   absl::Span<const BlockId> blocks, absl::Time deadline,
                                   std::vector<uint64_t>* found_extras) {
  std::vector<uint8_t*> out;
  if (host_memory_) {
    // Only the caller holds the blocks, and nobody can see them yet.
    for (size_t i = 0; i < expected.size(); ++i)
      out.push_back(memory_->MutableHostBlock(blocks[i]));
    return cluster_tier_->LoadPrefix(expected, out, deadline, found_extras);
  }
  // Device memory: the cluster holds any, all or none of the prefix, so its records are staged
  // in a buffer of this call's own (not tier 2, whose records a miss would evict for nothing), a
  // chunk at a time, each chunk copied up in one H2D batch.
  const uint64_t block_bytes = options_.layout.BlockBytes();
  const size_t chunk = std::max<uint64_t>(
      1, std::min<uint64_t>(kClusterStageBlocks, kClusterStageBytes / block_bytes));
  std::vector<uint8_t> staging(std::min(chunk, expected.size()) * block_bytes);
  size_t loaded = 0;
  while (loaded < expected.size()) {
    const size_t n = std::min(chunk, expected.size() - loaded);
    out.clear();
    std::vector<PoolMemory::HostCopy> copies;
    for (size_t i = 0; i < n; ++i) {
      out.push_back(staging.data() + i * block_bytes);
      copies.push_back(PoolMemory::HostCopy{.block = blocks[loaded + i], .host = out.back()});
    }
    const size_t verified =
        cluster_tier_->LoadPrefix(expected.subspan(loaded, n), out, deadline, found_extras);
    copies.resize(verified);
    if (!CheckMemory(memory_->CopyFromHost(copies, {})).ok()) break;
    loaded += verified;
    if (verified < n) break;
  }
  return loaded;
}

void LowerTiers::CountHits(const TierLoaded& loaded) {
  host_hit_blocks_.fetch_add(loaded.host, std::memory_order_relaxed);
  disk_hit_blocks_.fetch_add(loaded.disk, std::memory_order_relaxed);
  cluster_hit_blocks_.fetch_add(loaded.cluster, std::memory_order_relaxed);
}

std::optional<PoolHostTierStats> LowerTiers::HostStats() const {
  if (host_tier_ == nullptr) return std::nullopt;
  return PoolHostTierStats{
      .hit_blocks = host_hit_blocks_.load(std::memory_order_relaxed),
      .offloaded_blocks = offloaded_blocks_.load(std::memory_order_relaxed),
      .passed_down_on_eviction = passed_down_blocks_.load(std::memory_order_relaxed),
      .load_failures = host_load_failures_.load(std::memory_order_relaxed),
      .deadline_blocks = host_deadline_blocks_.load(std::memory_order_relaxed),
      .store = host_tier_->counters(),
  };
}

std::optional<PoolDiskTierStats> LowerTiers::DiskStats() const {
  if (disk_tier_ == nullptr) return std::nullopt;
  return PoolDiskTierStats{
      .hit_blocks = disk_hit_blocks_.load(std::memory_order_relaxed),
      .load_failures = disk_load_failures_.load(std::memory_order_relaxed),
      .deadline_blocks = disk_deadline_blocks_.load(std::memory_order_relaxed),
      .demoted_blocks = demoted_blocks_.load(std::memory_order_relaxed),
      .evicted_from_above = disk_evicted_from_above_.load(std::memory_order_relaxed),
      .evicted_unsaved = disk_evicted_unsaved_.load(std::memory_order_relaxed),
      .store = disk_tier_->stats()};
}

std::optional<PoolClusterTierStats> LowerTiers::ClusterStats() const {
  if (cluster_tier_ == nullptr) return std::nullopt;
  return PoolClusterTierStats{
      .hit_blocks = cluster_hit_blocks_.load(std::memory_order_relaxed),
      .stored_blocks = cluster_stored_blocks_.load(std::memory_order_relaxed),
      .backlog_dropped = cluster_backlog_dropped_.load(std::memory_order_relaxed),
      .poorer_kept_back = cluster_poorer_kept_back_.load(std::memory_order_relaxed),
      .store = cluster_tier_->counters(),
      .redis = cluster_tier_->redis().counters()};
}

uint64_t LowerTiers::OpenFailures(absl::string_view tier, absl::string_view tenant) const {
  if (tier == "disk" && disk_tier_ != nullptr) return disk_tier_->open_failures().Of(tenant);
  if (tier == "cluster" && cluster_tier_ != nullptr) {
    return cluster_tier_->open_failures().Of(tenant);
  }
  return 0;
}

std::vector<LowerTiers::TenantOpenFailures> LowerTiers::OpenFailuresByTenant() const {
  std::vector<TenantOpenFailures> failures;
  const auto add = [&failures](absl::string_view tier, const TenantCounters& counters) {
    for (auto& [tenant, count] : counters.Snapshot()) {
      failures.push_back({tier, std::move(tenant), count});
    }
  };
  if (disk_tier_ != nullptr) add("disk", disk_tier_->open_failures());
  if (cluster_tier_ != nullptr) add("cluster", cluster_tier_->open_failures());
  return failures;
}

std::vector<absl::string_view> LowerTiers::SealedTiers() const {
  std::vector<absl::string_view> sealed;
  if (disk_tier_ != nullptr && disk_tier_->sealed()) sealed.push_back("disk");
  if (cluster_tier_ != nullptr && cluster_tier_->sealed()) sealed.push_back("cluster");
  return sealed;
}

absl::Status LowerTiers::CheckInvariants() const {
  if (host_tier_ != nullptr) return host_tier_->CheckInvariants();
  return absl::OkStatus();
}

}  // namespace kvcache
