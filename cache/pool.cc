#include "cache/pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

size_t BlocksFor(size_t num_tokens, uint32_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
}

absl::Span<const uint32_t> BlockTokens(absl::Span<const uint32_t> tokens, size_t block,
                                       uint32_t block_size) {
  return tokens.subspan(block * block_size, block_size);
}

}  // namespace

absl::Status ValidateSequenceKeys(absl::string_view cache_salt, const ExtraKeys& extras,
                                  size_t num_tokens) {
  if (cache_salt.size() > kMaxCacheSaltBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("cache_salt has ", cache_salt.size(), " bytes; at most ", kMaxCacheSaltBytes));
  }
  if (extras.lora_id.size() > kMaxLoraIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("lora_id has ", extras.lora_id.size(), " bytes; at most ", kMaxLoraIdBytes));
  }
  if (extras.multimodal_items.size() > kMaxMultimodalItems) {
    return absl::InvalidArgumentError(absl::StrCat(
        "", extras.multimodal_items.size(), " multimodal items; at most ", kMaxMultimodalItems));
  }
  for (size_t i = 0; i < extras.multimodal_items.size(); ++i) {
    const MultimodalItem& item = extras.multimodal_items[i];
    if (item.content_hash.empty() || item.content_hash.size() > kMaxContentHashBytes) {
      return absl::InvalidArgumentError(absl::StrCat("multimodal item ", i, " content_hash has ",
                                                     item.content_hash.size(), " bytes; want 1 to ",
                                                     kMaxContentHashBytes));
    }
    if (item.length == 0 || uint64_t{item.offset} + item.length > num_tokens) {
      return absl::InvalidArgumentError(
          absl::StrCat("multimodal item ", i, " covers [", item.offset, ", ",
                       uint64_t{item.offset} + item.length, ") which is empty or outside the ",
                       num_tokens, "-token prompt"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Pool>> Pool::Create(const PoolOptions& options, uint32_t pool_index,
                                                   std::unique_ptr<PoolMemory> memory,
                                                   std::shared_ptr<DeviceFaultLatch> faults,
                                                   TenantQuotas* quotas, KvEventLog* events,
                                                   const Clock* clock) {
  RETURN_IF_ERROR(options.layout.Validate());
  if (options.name.empty() || options.name.size() > 64 ||
      options.name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
                                     "0123456789_-.") != std::string::npos) {
    return absl::InvalidArgumentError(absl::StrCat(
        "pool name '", options.name, "' must be 1 to 64 characters of [A-Za-z0-9_.-]"));
  }
  if (options.num_blocks == 0 || options.num_blocks >= kNoBlock) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool '", options.name, "' needs 1 to ", kNoBlock - 1, " blocks"));
  }
  if (options.testing_hash_bits > 127) {
    return absl::InvalidArgumentError("testing_hash_bits must be 0 (all) or 1 to 127");
  }
  if (pool_index >= kMaxPools) {
    return absl::InvalidArgumentError(absl::StrCat("at most ", kMaxPools, " pools"));
  }
  if (memory == nullptr || memory->num_blocks() != options.num_blocks ||
      memory->block_bytes() != options.layout.BlockBytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool '", options.name, "' memory does not match its layout"));
  }
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
    // memory outlives the tier (declared before it in Pool).
    PoolMemory* const pool_memory = memory.get();
    absl::StatusOr<std::unique_ptr<HostTier>> tier = HostTier::Create(
        options.host_tier_bytes, options.layout.BlockBytes(), listener(kKvMediumCpuPinned),
        HostMemoryRegistrar{
            .register_memory =
                [pool_memory](void* base, uint64_t size) {
                  return pool_memory->RegisterHostMemory(base, size);
                },
            .unregister_memory =
                [pool_memory](void* base) { pool_memory->UnregisterHostMemory(base); }});
    if (!tier.ok()) {
      return absl::Status(tier.status().code(),
                          absl::StrCat("pool '", options.name, "': ", tier.status().message()));
    }
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
                         .on_change = listener(kKvMediumDisk)};
    if (options.testing_disk_tier_options) options.testing_disk_tier_options(&disk);
    absl::StatusOr<std::unique_ptr<DiskTier>> tier = DiskTier::Open(std::move(disk));
    if (!tier.ok()) {
      return absl::Status(
          tier.status().code(),
          absl::StrCat("pool '", options.name, "' disk_tier: ", tier.status().message()));
    }
    disk_tier = *std::move(tier);
    // A router that connects after a warm restart learns what the disk still serves.
    if (tier_events != nullptr) tier_events->AnnounceRestored(kKvMediumDisk, disk_tier->Records());
  }
  std::unique_ptr<ClusterTier> cluster_tier;
  if (options.cluster_tier.has_value()) {
    absl::StatusOr<std::unique_ptr<ClusterTier>> tier =
        ClusterTier::Create(ClusterTierOptions{.redis = *options.cluster_tier,
                                               .pool = identity,
                                               .tokens_per_block = options.layout.block_size});
    if (!tier.ok()) {
      return absl::Status(tier.status().code(),
                          absl::StrCat("pool '", options.name, "': ", tier.status().message()));
    }
    cluster_tier = *std::move(tier);
  }
  if (faults == nullptr) faults = std::make_shared<DeviceFaultLatch>();
  return std::unique_ptr<Pool>(new Pool(
      options, pool_index, std::move(memory), std::move(faults), quotas, events, clock,
      std::move(host_tier), std::move(disk_tier), std::move(cluster_tier), std::move(tier_events)));
}

Pool::Pool(const PoolOptions& options, uint32_t pool_index, std::unique_ptr<PoolMemory> memory,
           std::shared_ptr<DeviceFaultLatch> faults, TenantQuotas* quotas, KvEventLog* events,
           const Clock* clock, std::unique_ptr<HostTier> host_tier,
           std::unique_ptr<DiskTier> disk_tier, std::unique_ptr<ClusterTier> cluster_tier,
           std::shared_ptr<TierEvents> tier_events)
    : options_(options),
      pool_index_(pool_index),
      layout_fingerprint_(options.layout.Fingerprint()),
      memory_(std::move(memory)),
      faults_(std::move(faults)),
      own_quotas_(quotas == nullptr ? std::make_unique<TenantQuotas>() : nullptr),
      quotas_(quotas == nullptr ? own_quotas_.get() : quotas),
      events_(events),
      clock_(clock),
      pool_(options.num_blocks, options.layout.block_size),
      block_tenant_(options.num_blocks, 0),
      allocated_at_(options.num_blocks),
      last_access_(options.num_blocks),
      released_at_(options.num_blocks),
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
      tier_events_(std::move(tier_events)) {
  if ((host_tier_ != nullptr || cluster_tier_ != nullptr) && !options.testing_manual_offload) {
    mover_ = std::thread([this] { MoverLoop(); });
  }
}

Pool::~Pool() {
  {
    absl::MutexLock lock(&mover_mu_);
    mover_stopping_ = true;
    mover_cv_.Signal();
  }
  if (mover_.joinable()) mover_.join();
}

uint32_t Pool::TenantSlotLocked(absl::string_view tenant) {
  auto [it, inserted] = tenant_slots_.try_emplace(tenant, static_cast<uint32_t>(tenants_.size()));
  if (inserted) tenants_.push_back(TenantUsage{.name = std::string(tenant)});
  return it->second;
}

absl::Status Pool::ReserveLocked(uint32_t tenant, size_t new_blocks, uint32_t new_sequences) {
  const TenantUsage& usage = tenants_[tenant];
  const uint64_t limit = quotas_->LimitsOf(usage.name).max_referenced_blocks;
  if (new_blocks > limit || usage.referenced > limit - new_blocks) {
    return TenantQuotas::Exceeded(
        usage.name, absl::StrCat("max_referenced_blocks (pool '", options_.name, "')"), limit,
        usage.referenced, new_blocks);
  }
  if (new_sequences == 0) return absl::OkStatus();
  return quotas_->TryAcquire(usage.name, QuotaResource::kOpenSequences, new_sequences);
}

void Pool::AcquireLocked(BlockId block, uint32_t tenant) {
  const absl::Time now = clock_->Now();
  residency_.reuse_gap.Observe(absl::ToDoubleSeconds(now - last_access_[block]));
  last_access_[block] = now;
  // The mover's offload pin is no tenant's reference.
  if (pool_.RefCount(block) == (pool_.IsOffloadPinned(block) ? 1u : 0u)) {
    block_tenant_[block] = tenant;
    ++tenants_[tenant].referenced;
    if (pool_.IsEvictable(block)) ++tenants_[tenant].counters.resurrections;
  }
  pool_.Acquire(block);
}

BlockId Pool::AllocateLocked(uint32_t tenant) {
  std::vector<Hash128> removed;
  const BlockId block = pool_.AllocateFresh(&removed);
  const absl::Time now = clock_->Now();
  if (!removed.empty()) {
    // The mover's cursor is one block closer to the LRU's front.
    if (offload_scanned_ > 0) --offload_scanned_;
    // block_tenant_ still names the owner of the evicted block's hash; the descendants that went
    // with it hang off the same chain root, so they are the same tenant's.
    tenants_[block_tenant_[block]].counters.evictions += removed.size();
    residency_.lifetime.Observe(absl::ToDoubleSeconds(now - allocated_at_[block]));
    residency_.idle_before_evict.Observe(absl::ToDoubleSeconds(now - released_at_[block]));
    if (events_ != nullptr) evicted_.insert(evicted_.end(), removed.begin(), removed.end());
  }
  allocated_at_[block] = now;
  last_access_[block] = now;
  block_tenant_[block] = tenant;
  ++tenants_[tenant].referenced;
  MaybeWakeMoverLocked();
  return block;
}

void Pool::ReleaseBlockLocked(BlockId block) {
  pool_.Release(block);
  if (pool_.RefCount(block) == (pool_.IsOffloadPinned(block) ? 1u : 0u)) {
    --tenants_[block_tenant_[block]].referenced;
    released_at_[block] = clock_->Now();
    if (pool_.IsEvictable(block)) MaybeWakeMoverLocked();
  }
}

void Pool::WaitOutOffloadLocked(size_t needed) {
  if (offload_pins_.empty() || pool_.num_free() + pool_.num_evictable() >= needed) return;
  // The mover's batch holds blocks this request may need: wait for it (one batch of copies)
  // rather than fail as if they were referenced. Nothing has been looked at yet, so nothing
  // goes stale while mu_ is released.
  ++offload_waits_;
  mu_.Await(absl::Condition(
      +[](std::vector<BlockId>* pins) { return pins->empty(); }, &offload_pins_));
}

void Pool::MaybeWakeMoverLocked() {
  if (!mover_.joinable() || pool_.num_free() >= offload_window_ || pool_.num_evictable() == 0) {
    return;
  }
  // One wake per kOffloadBatch events (a release, an allocation) while the window has slack:
  // a wake per event cost a futex wake and a pass per request (rpc_bench). Small evictable sets
  // (under twice a batch) are woken for at once, so nothing waits for events that may not come.
  if (++mover_events_ < kOffloadBatch && pool_.num_evictable() >= 2 * kOffloadBatch) return;
  mover_events_ = 0;
  if (mover_wanted_.exchange(true, std::memory_order_acq_rel)) return;
  absl::MutexLock lock(&mover_mu_);
  mover_cv_.Signal();
}

void Pool::MoverLoop() {
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

size_t Pool::OffloadForTesting() {
  const uint64_t before = offloaded_blocks_.load(std::memory_order_relaxed);
  while (MoverRound()) {
  }
  return offloaded_blocks_.load(std::memory_order_relaxed) - before;
}

bool Pool::MoverRound() {
  // Both stages each round: what tier 1 passes down fills tier 2, which passes its oldest on.
  const bool offloading = OffloadBatch();
  const bool demoting = DemoteBatch();
  return offloading || demoting;
}

bool Pool::OffloadBatch() {
  if (host_tier_ == nullptr && cluster_tier_ == nullptr) return false;
  struct Candidate {
    BlockId block = kNoBlock;
    BlockRecordIdentity record;
    std::optional<uint64_t> checksum;
    bool below = false;
    bool to_cluster = false;
    bool reused = false;
    std::string cluster_copy;
  };
  std::vector<Candidate> batch;
  {
    absl::MutexLock lock(&mu_);
    if (pool_.num_free() >= offload_window_) {
      offload_cursor_ = kNoBlock;
      return false;
    }
    // The oldest offload_window_ evictable blocks: those the next evictions take (no eager
    // mirror of the whole LRU). The scan resumes at its cursor — the first block it has not
    // looked at, offload_scanned_ blocks from the front (evictions from the front bring it
    // closer) — so each block is looked at once per pass; it restarts from the front when the
    // cursor left the LRU (evicted, resurrected). At most kMaxOffloadScan links per lock hold.
    BlockId block = offload_cursor_;
    if (block == kNoBlock || !pool_.IsEvictable(block)) {
      block = pool_.LruFront();
      offload_scanned_ = 0;
    }
    for (uint32_t steps = 0; block != kNoBlock && offload_scanned_ < offload_window_ &&
                             batch.size() < kOffloadBatch && steps < kMaxOffloadScan;
         ++steps, ++offload_scanned_) {
      const BlockId next = pool_.LruNext(block);
      if (!pool_.IsOffloaded(block)) {
        const BlockIdentity& identity = pool_.IdentityOf(block);
        const bool to_cluster = cluster_tier_ != nullptr && !pool_.IsInCluster(block);
        if (!to_cluster && (host_tier_ == nullptr || host_tier_->Contains(identity.hash))) {
          pool_.SetOffloaded(block);  // already below (loaded from there, or stored before)
        } else {
          const absl::Span<const uint32_t> tokens = pool_.TokensOf(block);
          batch.push_back(
              Candidate{.block = block,
                        .record = BlockRecordIdentity{.hash = identity.hash,
                                                      .parent_hash = identity.parent_hash,
                                                      .namespace_digest = identity.namespace_digest,
                                                      .extras_digest = identity.extras_digest,
                                                      .prefix_digest = identity.prefix_digest,
                                                      .tokens = {tokens.begin(), tokens.end()}},
                        .checksum = pool_.CachedChecksum(block),
                        .to_cluster = to_cluster,
                        .reused = pool_.IsReused(block)});
          pool_.PinForOffload(block);
          offload_pins_.push_back(block);
        }
      }
      block = next;
    }
    offload_cursor_ = block;
    if (batch.empty()) {
      // Past the window or the LRU's end: this pass is done.
      if (block == kNoBlock || offload_scanned_ >= offload_window_) return false;
      return true;  // the scan continues after letting requests in
    }
  }
  const uint64_t block_bytes = options_.layout.BlockBytes();
  // Pinned and published: the bytes cannot change during the copies. Tier 2's slots are filled
  // in one batch (a device pool's D2H copies, one synchronization).
  std::vector<std::optional<HostTier::PendingStore>> pending(batch.size());
  std::vector<PoolMemory::HostCopy> copies;
  const bool host_memory = memory_->HostBlock(0) != nullptr;
  for (size_t i = 0; i < batch.size(); ++i) {
    Candidate& candidate = batch[i];
    if (host_tier_ != nullptr) {
      absl::StatusOr<HostTier::PendingStore> slot = host_tier_->BeginStore(candidate.record.hash);
      // ALREADY_EXISTS: below already (loaded from there, or a concurrent load from the disk
      // tier put it there).
      candidate.below = absl::IsAlreadyExists(slot.status());
      if (slot.ok()) {
        copies.push_back(PoolMemory::HostCopy{.block = candidate.block, .host = slot->bytes});
        pending[i] = *std::move(slot);
        continue;
      }
    }
    if (candidate.to_cluster && !host_memory) {
      // Only for the cluster: device bytes staged in the copy itself.
      candidate.cluster_copy.resize(block_bytes);
      copies.push_back(
          PoolMemory::HostCopy{.block = candidate.block,
                               .host = reinterpret_cast<uint8_t*>(candidate.cluster_copy.data())});
    }
  }
  const absl::Status copied = CheckMemory(memory_->CopyToHost(copies));
  // The cluster's copies are taken while the blocks are pinned, and sent after they are unpinned:
  // a request that needs a pinned block waits for this batch, and must not wait on the network.
  for (size_t i = 0; i < batch.size(); ++i) {
    Candidate& candidate = batch[i];
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
      const absl::Status stored =
          host_tier_->FinishStore(*pending[i], candidate.record, candidate.reused, true);
      candidate.below = stored.ok() || absl::IsAlreadyExists(stored);
      if (stored.ok()) offloaded_blocks_.fetch_add(1, std::memory_order_relaxed);
      // Saved only if durable on disk (a record accepted for writing may yet fail its write).
      if (stored.ok() && pending[i]->evicted.has_value() && disk_tier_ != nullptr &&
          disk_tier_->Find(pending[i]->evicted->hash).ok()) {
        evicted_below_.fetch_add(1, std::memory_order_relaxed);
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    // Back to the front in the order they were taken from it.
    for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
      pool_.UnpinOffloaded(it->block, it->below);
    }
    offload_pins_.clear();
  }
  // What leaves the node goes to the cluster too, in one pipelined batch. A cluster that is down
  // or slow costs the mover its timeout (back-pressure), never a request.
  std::vector<ClusterTier::Record> to_cluster;
  for (const Candidate& candidate : batch) {
    if (candidate.to_cluster) {
      to_cluster.push_back(ClusterTier::Record{candidate.record, candidate.cluster_copy});
    }
  }
  if (!to_cluster.empty()) {
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
  return true;
}

bool Pool::DemoteBatch() {
  if (disk_tier_ == nullptr) return false;
  const std::vector<HostTier::Demotion> batch = host_tier_->PinForDemotion(
      demotion_window_, kOffloadBatch, options_.disk_admission == DiskAdmission::kReused);
  bool more = !batch.empty();
  for (const HostTier::Demotion& demotion : batch) {
    absl::Status stored = absl::UnavailableError("the disk tier refused this round");
    if (more) {
      // Stores only queue (a copy of the bytes); the disk tier's writer does the I/O.
      stored = disk_tier_->Store(demotion.identity,
                                 absl::MakeConstSpan(reinterpret_cast<const char*>(demotion.bytes),
                                                     host_tier_->block_bytes()));
      if (stored.ok()) demoted_blocks_.fetch_add(1, std::memory_order_relaxed);
      // A full queue or a stopped disk is the disk's back-pressure: the rest of the batch goes
      // back unmarked (offered again next pass, or evicted from tier 2 unsaved), and the mover
      // stops passing down for this round.
      more = !absl::IsResourceExhausted(stored) && !absl::IsUnavailable(stored);
    }
    host_tier_->FinishDemotion(demotion.slot, stored);
  }
  return more;
}

void Pool::ReportEvictionsLocked() {
  if (evicted_.empty()) return;
  events_->BlocksRemoved(pool_index_, evicted_);
  evicted_.clear();
}

void Pool::EraseLocked(uint64_t sequence_id) {
  auto it = sequences_.find(sequence_id);
  if (it == sequences_.end()) return;
  const Sequence& sequence = *it->second;
  ReleaseLocked(sequence);
  auto owner = by_session_.find(sequence.session_id);
  if (owner != by_session_.end()) {
    owner->second.erase(sequence_id);
    if (owner->second.empty()) by_session_.erase(owner);
  }
  TenantUsage& usage = tenants_[sequence.tenant];
  --usage.open_sequences;
  quotas_->Release(usage.name, QuotaResource::kOpenSequences, 1);
  sequences_.erase(it);
}

void Pool::SetRoot(absl::string_view tenant, absl::string_view cache_salt,
                   Sequence* sequence) const {
  BlockHasher hasher(options_.hash_algorithm, options_.testing_hash_bits);
  const HashNamespace ns{options_.model_id, layout_fingerprint_, tenant, cache_salt};
  sequence->root = hasher.Root(ns);
  sequence->namespace_digest = hasher.NamespaceDigest(ns);
}

void Pool::HashNewBlocks(Sequence* sequence) const {
  BlockHasher hasher(options_.hash_algorithm, options_.testing_hash_bits);
  const uint32_t block_size = options_.layout.block_size;
  const size_t first_new = sequence->chain.size();
  hasher.ExtendChain(sequence->root, sequence->namespace_digest, sequence->tokens, block_size,
                     sequence->extras, &sequence->chain, &sequence->prefix_digests);
  for (size_t i = first_new; i < sequence->chain.size(); ++i) {
    const uint32_t start = static_cast<uint32_t>(i * block_size);
    sequence->extras_digests.push_back(
        hasher.ExtrasDigest(sequence->extras, start, start + block_size));
  }
}

std::vector<BlockId> Pool::WalkLocked(const Sequence& sequence, size_t max_blocks) const {
  std::vector<BlockId> hits;
  const size_t limit = std::min(max_blocks, sequence.chain.size());
  for (size_t i = 0; i < limit; ++i) {
    const BlockIdentity expected{
        .hash = sequence.chain[i],
        .parent_hash = i == 0 ? sequence.root : sequence.chain[i - 1],
        .parent_block = i == 0 ? kNoBlock : hits.back(),
        .extras_digest = sequence.extras_digests[i],
        .namespace_digest = sequence.namespace_digest,
        .prefix_digest = sequence.prefix_digests[i],
    };
    const BlockId block =
        pool_.FindVerified(expected, BlockTokens(sequence.tokens, i, options_.layout.block_size));
    if (block == kNoBlock) {
      if (pool_.Indexed(expected.hash) != kNoBlock) {
        collisions_caught_.fetch_add(1, std::memory_order_relaxed);
      }
      break;
    }
    hits.push_back(block);
  }
  return hits;
}

BlockId Pool::IndexedOwnPrefixLocked(const Sequence& sequence, size_t i) const {
  const BlockId indexed = pool_.Indexed(sequence.chain[i]);
  BlockId block = indexed;
  for (size_t j = i + 1; j-- > 0;) {
    if (block == kNoBlock) return kNoBlock;
    // The sequence's own block holds its prefix, and its links were verified when it was
    // published or hit.
    if (block == sequence.blocks[j]) return indexed;
    const BlockIdentity expected{
        .hash = sequence.chain[j],
        .parent_hash = j == 0 ? sequence.root : sequence.chain[j - 1],
        .parent_block = pool_.ParentOf(block),
        .extras_digest = sequence.extras_digests[j],
        .namespace_digest = sequence.namespace_digest,
        .prefix_digest = sequence.prefix_digests[j],
    };
    if (pool_.FindVerified(expected, BlockTokens(sequence.tokens, j, options_.layout.block_size)) !=
        block) {
      return kNoBlock;
    }
    block = expected.parent_block;
  }
  return indexed;
}

absl::Status Pool::CheckCapacityLocked(size_t needed, size_t reclaimable_hits,
                                       absl::string_view what) const {
  const size_t available = pool_.num_free() + pool_.num_evictable() - reclaimable_hits;
  if (needed <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(
      absl::StrCat("pool '", options_.name, "': ", what, " needs ", needed, " new blocks but only ",
                   pool_.num_free(), " are free and ", pool_.num_evictable() - reclaimable_hits,
                   " evictable (pool has ", pool_.num_blocks(), ")"));
}

absl::StatusOr<Pool::Sequence*> Pool::FindLocked(const Session& session, uint64_t sequence_id) {
  if (session.closed.load(std::memory_order_acquire)) {
    return absl::AbortedError(absl::StrCat("session ", session.id, " has ended"));
  }
  auto it = sequences_.find(sequence_id);
  // Another session's sequence is reported as unknown, so ids cannot be probed across sessions.
  if (it == sequences_.end() || it->second->session_id != session.id) {
    return absl::NotFoundError(
        absl::StrCat("sequence ", sequence_id, " not found in session ", session.id));
  }
  return it->second.get();
}

uint64_t Pool::AddLocked(std::unique_ptr<Sequence> sequence) {
  const uint64_t id = next_sequence_++ * kMaxPools + pool_index_;
  sequence->id = id;
  by_session_[sequence->session_id].insert(id);
  ++tenants_[sequence->tenant].open_sequences;
  sequences_.emplace(id, std::move(sequence));
  return id;
}

void Pool::ReleaseLocked(const Sequence& sequence) {
  // Tail first, so a chain's tail is evicted before its prefix.
  for (auto it = sequence.blocks.rbegin(); it != sequence.blocks.rend(); ++it) {
    ReleaseBlockLocked(*it);
  }
}

absl::StatusOr<OpenedSequence> Pool::Open(const Session& session, const SequenceSpec& spec,
                                          OpenMode mode) {
  RETURN_IF_ERROR(faults_->status());
  const uint32_t block_size = options_.layout.block_size;
  const size_t full_blocks = spec.tokens.size() / block_size;
  if (spec.tokens.empty()) return absl::InvalidArgumentError("prompt has no tokens");
  if (mode == OpenMode::kPut && full_blocks == 0) {
    return absl::InvalidArgumentError(absl::StrCat("a put of ", spec.tokens.size(),
                                                   " tokens holds no full block of ", block_size));
  }
  size_t total_blocks =
      mode == OpenMode::kCompute ? BlocksFor(spec.tokens.size(), block_size) : full_blocks;
  if (mode == OpenMode::kPinCached) {
    // A read allocates nothing, so the size check belongs to the other modes: it returns the
    // cached prefix, which no pool holds longer than itself (so a 1M-token prompt hashes only
    // that much).
    total_blocks = std::min<size_t>(total_blocks, options_.num_blocks);
  } else if (total_blocks > options_.num_blocks) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pool '", options_.name, "': a ", spec.tokens.size(), "-token prompt needs ",
                     total_blocks, " blocks; the pool has ", options_.num_blocks));
  }
  RETURN_IF_ERROR(ValidateSequenceKeys(spec.cache_salt, spec.extra_keys, spec.tokens.size()));

  auto sequence = std::make_unique<Sequence>();
  sequence->session_id = session.id;
  SetRoot(session.tenant, spec.cache_salt, sequence.get());
  sequence->extras = spec.extra_keys;
  const size_t kept_tokens =
      mode == OpenMode::kCompute ? spec.tokens.size() : total_blocks * block_size;
  sequence->tokens.assign(spec.tokens.begin(), spec.tokens.begin() + kept_tokens);
  HashNewBlocks(sequence.get());

  // When computing, at least one prompt token is left: the worker needs its logits.
  const size_t max_hit_blocks =
      mode == OpenMode::kCompute ? (spec.tokens.size() - 1) / block_size : total_blocks;
  std::vector<BelowRecord> below;  // tier-2 and tier-3 records continuing the tier-1 hits
  size_t num_hits = 0;
  bool from_cluster = false;
  {
    absl::MutexLock lock(&mu_);
    WaitOutOffloadLocked(total_blocks);
    if (session.closed.load(std::memory_order_acquire)) {
      return absl::AbortedError(absl::StrCat("session ", session.id, " has ended"));
    }
    std::vector<BlockId> hits = WalkLocked(*sequence, max_hit_blocks);
    num_hits = hits.size();
    size_t evictable_hits = 0;
    for (BlockId block : hits) evictable_hits += pool_.IsEvictable(block) ? 1 : 0;
    below = ProbeBelowLocked(*sequence, num_hits, max_hit_blocks);
    if (mode == OpenMode::kPinCached) {
      // A read loads only into blocks it can have without failing.
      const size_t available = pool_.num_free() + pool_.num_evictable() - evictable_hits;
      if (below.size() > available) below.resize(available);
      total_blocks = num_hits + below.size();
    }
    RETURN_IF_ERROR(
        CheckCapacityLocked(total_blocks - num_hits, evictable_hits,
                            absl::StrCat("a ", spec.tokens.size(), "-token prompt with ",
                                         num_hits * block_size, " cached tokens")));
    sequence->tenant = TenantSlotLocked(session.tenant);
    // Hits on evictable blocks become the tenant's referenced blocks too.
    RETURN_IF_ERROR(ReserveLocked(sequence->tenant, total_blocks - num_hits + evictable_hits, 1));
    for (BlockId block : hits) {
      AcquireLocked(block, sequence->tenant);
      // A hit after the block went down to tier 2: its record there is reused too (once).
      if (!pool_.IsReused(block) && pool_.IsOffloaded(block) && host_tier_ != nullptr) {
        host_tier_->MarkReused(pool_.IdentityOf(block).hash);
      }
      pool_.SetReused(block);
    }
    sequence->blocks = std::move(hits);
    sequence->committed_blocks = static_cast<uint32_t>(num_hits);
    while (sequence->blocks.size() < total_blocks) {
      sequence->blocks.push_back(AllocateLocked(sequence->tenant));
    }
    ReportEvictionsLocked();
    // The cluster is asked only by a compute open whose walk may go on past what the node has:
    // its fresh blocks are where the cluster's blocks land.
    from_cluster = cluster_tier_ != nullptr && mode == OpenMode::kCompute &&
                   num_hits + below.size() < max_hit_blocks;
    if (below.empty() && !from_cluster) {
      return FinishOpenLocked(std::move(sequence), spec.tokens.size(), mode, num_hits, {}, 0);
    }
    loading_.insert(sequence.get());
  }
  const absl::Time load_start = clock_->Now();
  const BelowLoaded loaded =
      LoadFromBelow(*sequence, num_hits, below, load_start, spec.max_load_ms);
  size_t cluster_loaded = 0;
  // The budget left, as a real-time deadline for the network (the pool's clock may be a test's).
  const absl::Duration budget_left =
      spec.max_load_ms == 0 ? absl::InfiniteDuration()
                            : absl::Milliseconds(spec.max_load_ms) - (clock_->Now() - load_start);
  if (from_cluster && loaded.total() == below.size() && budget_left > absl::ZeroDuration()) {
    const absl::Time begin = absl::Now();
    cluster_loaded =
        LoadFromCluster(*sequence, num_hits + loaded.total(), max_hit_blocks, begin + budget_left);
    tier_load_latency_.cluster.Observe(absl::ToDoubleSeconds(absl::Now() - begin));
  }
  absl::MutexLock lock(&mu_);
  loading_.erase(sequence.get());
  const absl::Status device = faults_->status();
  if (session.closed.load(std::memory_order_acquire) || !device.ok()) {
    // Undone here: the session's sweep ran during the load and could not see this sequence, or a
    // copy from below hit a device fault, and this open fails like every call after it.
    ReleaseLocked(*sequence);
    quotas_->Release(tenants_[sequence->tenant].name, QuotaResource::kOpenSequences, 1);
    if (!device.ok()) return device;
    return absl::AbortedError(absl::StrCat("session ", session.id, " ended during the open"));
  }
  return FinishOpenLocked(std::move(sequence), spec.tokens.size(), mode, num_hits, loaded,
                          cluster_loaded);
}

OpenedSequence Pool::FinishOpenLocked(std::unique_ptr<Sequence> sequence, size_t prompt_tokens,
                                      OpenMode mode, size_t num_hits, BelowLoaded below_loaded,
                                      size_t cluster_loaded) {
  const uint32_t block_size = options_.layout.block_size;
  const size_t loaded = below_loaded.total() + cluster_loaded;
  const size_t cached = num_hits + loaded;
  if (mode == OpenMode::kPinCached) {
    // A read returns the cached prefix only: blocks whose load did not happen go back.
    while (sequence->blocks.size() > cached) {
      ReleaseBlockLocked(sequence->blocks.back());
      sequence->blocks.pop_back();
    }
    sequence->tokens.resize(cached * block_size);
    sequence->chain.resize(cached);
    sequence->extras_digests.resize(cached);
    sequence->prefix_digests.resize(cached);
  }
  if (loaded > 0) {
    CommitResult ignored;
    PublishWrittenLocked(sequence.get(), static_cast<uint32_t>(cached), &ignored);
    sequence->committed_blocks = static_cast<uint32_t>(cached);
    // Loaded from below: a hit, like a tier-1 one.
    for (size_t i = num_hits; i < cached; ++i) pool_.SetReused(sequence->blocks[i]);
    if (cluster_tier_ != nullptr) {
      // What came up from a lower tier or the cluster is there already: the mover sent the lower
      // tiers' records to the cluster when it passed them down. Not written back (every node
      // hitting a shared prefix would write it again).
      for (size_t i = num_hits; i < cached; ++i) pool_.SetInCluster(sequence->blocks[i]);
    }
    tier_hit_blocks_ += below_loaded.host;
    disk_hit_blocks_.fetch_add(below_loaded.disk, std::memory_order_relaxed);
    cluster_hit_blocks_.fetch_add(cluster_loaded, std::memory_order_relaxed);
  }
  const size_t total_blocks = sequence->blocks.size();
  if (mode == OpenMode::kCompute) {
    TenantUsage& usage = tenants_[sequence->tenant];
    prompt_tokens_ += prompt_tokens;
    hit_blocks_ += cached;
    miss_blocks_ += total_blocks - cached;
    usage.prompt_tokens += prompt_tokens;
    usage.hit_blocks += cached;
    usage.miss_blocks += total_blocks - cached;
  }
  OpenedSequence opened{
      .block_ids = sequence->blocks,
      .num_cached_tokens = static_cast<uint32_t>(cached * block_size),
      .num_host_tier_tokens = static_cast<uint32_t>(below_loaded.host * block_size),
      .num_disk_tier_tokens = static_cast<uint32_t>(below_loaded.disk * block_size),
      .num_cluster_tier_tokens = static_cast<uint32_t>(cluster_loaded * block_size)};
  opened.sequence_id = AddLocked(std::move(sequence));
  return opened;
}

BlockRecordIdentity Pool::ExpectedRecord(const Sequence& sequence, size_t i) const {
  const absl::Span<const uint32_t> tokens =
      BlockTokens(sequence.tokens, i, options_.layout.block_size);
  return BlockRecordIdentity{.hash = sequence.chain[i],
                             .parent_hash = i == 0 ? sequence.root : sequence.chain[i - 1],
                             .namespace_digest = sequence.namespace_digest,
                             .extras_digest = sequence.extras_digests[i],
                             .prefix_digest = sequence.prefix_digests[i],
                             .tokens = {tokens.begin(), tokens.end()}};
}

std::vector<Pool::BelowRecord> Pool::ProbeBelowLocked(const Sequence& sequence, size_t first,
                                                      size_t limit) const {
  std::vector<BelowRecord> below;
  if (host_tier_ == nullptr) return below;
  for (size_t i = first; i < std::min(limit, sequence.chain.size()); ++i) {
    BlockRecordIdentity expected = ExpectedRecord(sequence, i);
    const TierProbe probe = host_tier_->Probe(expected);
    if (probe == TierProbe::kMatch) {
      below.push_back(BelowRecord{std::move(expected), Below::kHost});
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
    below.push_back(BelowRecord{std::move(expected), Below::kDisk});
  }
  return below;
}

Pool::BelowLoaded Pool::LoadFromBelow(const Sequence& sequence, size_t first,
                                      const std::vector<BelowRecord>& below, absl::Time start,
                                      uint32_t max_load_ms) {
  BelowLoaded loaded;
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
  // Only this sequence holds the blocks, and nobody can see the sequence yet.
  const auto block_at = [&](size_t i) { return sequence.blocks[first + i]; };
  while (loaded.total() < below.size()) {
    const size_t next = loaded.total();
    if (past_bound()) {
      for (size_t i = next; i < below.size(); ++i) {
        (below[i].tier == Below::kHost ? tier_deadline_blocks_ : disk_deadline_blocks_)
            .fetch_add(1, std::memory_order_relaxed);
      }
      break;
    }
    if (below[next].tier == Below::kHost) {
      const RunLoaded run =
          timed(host_time, [&] { return LoadHostRun(below, next, block_at, past_bound); });
      loaded.host += run.loaded;
      if (run.failed) {
        tier_load_failures_.fetch_add(1, std::memory_order_relaxed);
        break;
      }
      continue;
    }
    // A run of disk records, one batch of the disk tier's read depth at a time (the bound is
    // checked between batches).
    size_t end = next;
    while (end < below.size() && below[end].tier == Below::kDisk &&
           end - next < disk_tier_->read_depth()) {
      ++end;
    }
    const size_t verified =
        timed(disk_time, [&] { return LoadDiskBatch(below, next, end, block_at); });
    loaded.disk += verified;
    if (verified < end - next) {
      disk_load_failures_.fetch_add(1, std::memory_order_relaxed);
      break;
    }
  }
  if (host_time) tier_load_latency_.host.Observe(absl::ToDoubleSeconds(*host_time));
  if (disk_time) tier_load_latency_.disk.Observe(absl::ToDoubleSeconds(*disk_time));
  return loaded;
}

Pool::RunLoaded Pool::LoadHostRun(const std::vector<BelowRecord>& below, size_t next,
                                  absl::FunctionRef<BlockId(size_t)> block_at,
                                  absl::FunctionRef<bool()> past_bound) {
  // Pins a run of tier-2 records (the bound checked before each), copies them up in one batch
  // (a device pool's H2D copies, verified on the host meanwhile) and counts the verified prefix.
  RunLoaded run;
  std::vector<HostTier::PinnedRecord> pinned;
  std::vector<PoolMemory::HostCopy> copies;
  for (size_t i = next; i < below.size() && below[i].tier == Below::kHost &&
                        pinned.size() < kLoadBatch && (i == next || !past_bound());
       ++i) {
    absl::StatusOr<HostTier::PinnedRecord> record = host_tier_->PinForLoad(below[i].expected);
    if (!record.ok()) {
      run.failed = true;  // gone since the probe (evicted), counted by the tier
      break;
    }
    copies.push_back(
        PoolMemory::HostCopy{.block = block_at(i), .host = const_cast<uint8_t*>(record->bytes)});
    pinned.push_back(*std::move(record));
  }
  const uint64_t block_bytes = host_tier_->block_bytes();
  std::vector<bool> verified(pinned.size(), false);
  const absl::Status copied = CheckMemory(memory_->CopyFromHost(copies, [&] {
    for (size_t i = 0; i < pinned.size(); ++i) {
      verified[i] = ::kvcache::BlockChecksum(pinned[i].bytes, block_bytes) == pinned[i].checksum;
    }
  }));
  while (run.loaded < pinned.size() && copied.ok() && verified[run.loaded]) ++run.loaded;
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

size_t Pool::LoadDiskBatch(const std::vector<BelowRecord>& below, size_t next, size_t end,
                           absl::FunctionRef<BlockId(size_t)> block_at) {
  const uint64_t block_bytes = options_.layout.BlockBytes();
  const bool host_memory = memory_->HostBlock(0) != nullptr;
  std::vector<DiskTier::LoadRequest> requests;
  std::vector<HostTier::PendingStore> slots;
  std::vector<uint64_t> checksums(end - next);
  for (size_t i = next; i < end; ++i) {
    uint8_t* out = nullptr;
    if (host_memory) {
      // Straight into the fresh tier-1 block.
      out = memory_->MutableHostBlock(block_at(i));
    } else {
      // Device memory: into a tier-2 slot (page-locked), copied up in one batch afterwards.
      absl::StatusOr<HostTier::PendingStore> slot = host_tier_->BeginStore(below[i].expected.hash);
      if (!slot.ok()) break;
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
  if (host_memory) return verified;
  std::vector<PoolMemory::HostCopy> copies;
  for (size_t i = 0; i < verified; ++i) {
    copies.push_back(PoolMemory::HostCopy{.block = block_at(next + i), .host = slots[i].bytes});
  }
  if (!CheckMemory(memory_->CopyFromHost(copies, [] {})).ok()) verified = 0;
  // The copied records stay in tier 2 (they are hot again), under the checksum the disk tier
  // verified their bytes against; the rest of the slots go back.
  for (size_t i = 0; i < slots.size(); ++i) {
    BlockRecordIdentity record = below[next + i].expected;
    record.checksum = checksums[i];
    host_tier_->FinishStore(slots[i], record, /*reused=*/true, i < verified).IgnoreError();
  }
  return verified;
}

size_t Pool::LoadFromCluster(const Sequence& sequence, size_t first, size_t limit,
                             absl::Time deadline) {
  std::vector<BlockRecordIdentity> expected;
  for (size_t i = first; i < std::min(limit, sequence.chain.size()); ++i) {
    expected.push_back(ExpectedRecord(sequence, i));
  }
  std::vector<uint8_t*> out;
  if (memory_->HostBlock(0) != nullptr) {
    // Only this sequence holds the blocks, and nobody can see the sequence yet.
    for (size_t i = 0; i < expected.size(); ++i) {
      out.push_back(memory_->MutableHostBlock(sequence.blocks[first + i]));
    }
    return cluster_tier_->LoadPrefix(expected, out, deadline);
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
      copies.push_back(
          PoolMemory::HostCopy{.block = sequence.blocks[first + loaded + i], .host = out.back()});
    }
    const size_t verified =
        cluster_tier_->LoadPrefix(absl::MakeConstSpan(expected).subspan(loaded, n), out, deadline);
    copies.resize(verified);
    if (!CheckMemory(memory_->CopyFromHost(copies, [] {})).ok()) break;
    loaded += verified;
    if (verified < n) break;
  }
  return loaded;
}

absl::StatusOr<ExtendedSequence> Pool::Extend(const Session& session, uint64_t sequence_id,
                                              absl::Span<const uint32_t> tokens) {
  RETURN_IF_ERROR(faults_->status());
  if (tokens.empty()) return absl::InvalidArgumentError("extend with no tokens");
  absl::MutexLock lock(&mu_);
  WaitOutOffloadLocked(tokens.size() / options_.layout.block_size + 1);
  ASSIGN_OR_RETURN(Sequence * sequence, FindLocked(session, sequence_id));
  const size_t new_length = sequence->tokens.size() + tokens.size();
  const size_t total_blocks = BlocksFor(new_length, options_.layout.block_size);
  if (total_blocks > options_.num_blocks) {
    return absl::ResourceExhaustedError(
        absl::StrCat("pool '", options_.name, "': sequence ", sequence_id, " would grow to ",
                     total_blocks, " blocks; the pool has ", options_.num_blocks));
  }
  const size_t needed = total_blocks - sequence->blocks.size();
  RETURN_IF_ERROR(
      CheckCapacityLocked(needed, 0, absl::StrCat("extending by ", tokens.size(), " tokens")));
  RETURN_IF_ERROR(ReserveLocked(sequence->tenant, needed, 0));
  ExtendedSequence extended;
  for (size_t i = 0; i < needed; ++i) {
    extended.new_block_ids.push_back(AllocateLocked(sequence->tenant));
    sequence->blocks.push_back(extended.new_block_ids.back());
  }
  ReportEvictionsLocked();
  sequence->tokens.insert(sequence->tokens.end(), tokens.begin(), tokens.end());
  HashNewBlocks(sequence);
  extended.num_tokens = static_cast<uint32_t>(new_length);
  return extended;
}

absl::StatusOr<CommitResult> Pool::Commit(const Session& session, uint64_t sequence_id,
                                          uint32_t num_written_tokens) {
  // Publishing blocks whose bytes a failed device may never have received would serve them.
  RETURN_IF_ERROR(faults_->status());
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Sequence * sequence, FindLocked(session, sequence_id));
  if (num_written_tokens > sequence->tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("commit of ", num_written_tokens,
                                                   " tokens but sequence ", sequence_id, " has ",
                                                   sequence->tokens.size()));
  }
  const uint32_t written_blocks = num_written_tokens / options_.layout.block_size;
  CommitResult result;
  PublishWrittenLocked(sequence, written_blocks, &result);
  sequence->committed_blocks = std::max(sequence->committed_blocks, written_blocks);
  result.num_committed_blocks = sequence->committed_blocks;
  return result;
}

void Pool::PublishWrittenLocked(Sequence* sequence, uint32_t written_blocks, CommitResult* result) {
  const uint32_t block_size = options_.layout.block_size;
  const BlockPoolCounters before = pool_.counters();
  // Newly indexed blocks, reported as chains: a run of consecutive ones is one event.
  std::vector<StoredBlock> run;
  std::optional<Hash128> run_parent;
  const auto report_run = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (events_ != nullptr && !run.empty()) {
      events_->BlocksStored(pool_index_, tenants_[sequence->tenant].name, run_parent,
                            std::move(run));
    }
    run.clear();
  };
  for (uint32_t i = sequence->committed_blocks; i < written_blocks; ++i) {
    // The parent link is the indexed block of h_{i-1}: this sequence's own, or the first copy
    // when its own was a duplicate. With no indexed parent the block could never be reached by a
    // walk, so it stays private. So it does when h_{i-1} indexes other content (a collision):
    // linked there, its KV would be served to that content's continuations.
    const BlockId parent = i == 0 ? kNoBlock : IndexedOwnPrefixLocked(*sequence, i - 1);
    if (i > 0 && parent == kNoBlock) {
      if (pool_.Indexed(sequence->chain[i - 1]) != kNoBlock) {
        collisions_caught_.fetch_add(1, std::memory_order_relaxed);
      }
      report_run();
      continue;
    }
    const BlockIdentity identity{
        .hash = sequence->chain[i],
        .parent_hash = i == 0 ? sequence->root : sequence->chain[i - 1],
        .parent_block = parent,
        .extras_digest = sequence->extras_digests[i],
        .namespace_digest = sequence->namespace_digest,
        .prefix_digest = sequence->prefix_digests[i],
    };
    const BlockId block = sequence->blocks[i];
    const bool was_published = pool_.IsPublished(block);
    const absl::Span<const uint32_t> tokens = BlockTokens(sequence->tokens, i, block_size);
    const bool published = pool_.Publish(block, identity, tokens);
    if (!published && pool_.FindVerified(identity, tokens) == kNoBlock) {
      // The hash is indexed for other content: this block stays private.
      collisions_caught_.fetch_add(1, std::memory_order_relaxed);
    }
    if (published && !was_published && pool_.IsPublished(block)) {
      ++result->num_published_blocks;
      if (run.empty()) {
        run_parent = i == 0 ? std::nullopt : std::optional<Hash128>(sequence->chain[i - 1]);
      }
      run.push_back(StoredBlock{.hash = identity.hash,
                                .token_ids = std::vector<uint32_t>(tokens.begin(), tokens.end()),
                                .extras_digest = identity.extras_digest});
    } else {
      report_run();
    }
  }
  report_run();
  BlockPoolCounters& counters = tenants_[sequence->tenant].counters;
  counters.published += pool_.counters().published - before.published;
  counters.duplicates += pool_.counters().duplicates - before.duplicates;
}

absl::Status Pool::Release(const Session& session, uint64_t sequence_id) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(FindLocked(session, sequence_id).status());
  EraseLocked(sequence_id);
  return absl::OkStatus();
}

absl::StatusOr<ForkedSequence> Pool::Fork(const Session& session, uint64_t sequence_id) {
  RETURN_IF_ERROR(faults_->status());
  ForkedSequence forked;
  BlockId copy_dst = kNoBlock;
  {
    absl::MutexLock lock(&mu_);
    WaitOutOffloadLocked(1);
    ASSIGN_OR_RETURN(Sequence * parent, FindLocked(session, sequence_id));
    const size_t full_blocks = parent->tokens.size() / options_.layout.block_size;
    const bool has_partial = full_blocks < parent->blocks.size();
    RETURN_IF_ERROR(CheckCapacityLocked(has_partial ? 1 : 0, 0, "forking"));
    RETURN_IF_ERROR(ReserveLocked(parent->tenant, has_partial ? 1 : 0, 1));
    auto child = std::make_unique<Sequence>(*parent);
    child->blocks.resize(full_blocks);
    for (BlockId block : child->blocks) AcquireLocked(block, child->tenant);
    if (has_partial) {
      // The source stays pinned until its bytes are copied, even if the parent is released.
      forked.copied_from_block = parent->blocks.back();
      AcquireLocked(forked.copied_from_block, child->tenant);
      copy_dst = AllocateLocked(child->tenant);
      // And the destination until its bytes land: if the session ends during the copy, the
      // child's release must not free it for another sequence to be handed mid-copy (issue 17).
      pool_.Acquire(copy_dst);
      child->blocks.push_back(copy_dst);
      ReportEvictionsLocked();
    }
    forked.block_ids = child->blocks;
    forked.sequence_id = AddLocked(std::move(child));
  }
  if (copy_dst == kNoBlock) return forked;
  const absl::Status copied = CheckMemory(memory_->CopyBlock(forked.copied_from_block, copy_dst));
  absl::MutexLock lock(&mu_);
  ReleaseBlockLocked(forked.copied_from_block);
  ReleaseBlockLocked(copy_dst);
  if (!copied.ok()) {
    EraseLocked(forked.sequence_id);
    return copied;
  }
  // The sweep of an ended session released the child with the rest of its sequences.
  if (session.closed.load(std::memory_order_acquire)) {
    return absl::AbortedError(absl::StrCat("session ", session.id, " ended during the fork"));
  }
  return forked;
}

uint32_t Pool::SequencesOfSession(uint64_t session_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = by_session_.find(session_id);
  return it == by_session_.end() ? 0 : static_cast<uint32_t>(it->second.size());
}

absl::StatusOr<LookupResult> Pool::Lookup(absl::string_view tenant, const SequenceSpec& spec) {
  // A hit promises bytes this daemon can no longer vouch for or serve.
  RETURN_IF_ERROR(faults_->status());
  RETURN_IF_ERROR(ValidateSequenceKeys(spec.cache_salt, spec.extra_keys, spec.tokens.size()));
  Sequence probe;
  SetRoot(tenant, spec.cache_salt, &probe);
  probe.extras = spec.extra_keys;
  probe.tokens.assign(spec.tokens.begin(), spec.tokens.end());
  HashNewBlocks(&probe);
  absl::ReaderMutexLock lock(&mu_);
  const size_t hits = WalkLocked(probe, probe.chain.size()).size();
  size_t host = 0, disk = 0;
  for (const BelowRecord& record : ProbeBelowLocked(probe, hits, probe.chain.size())) {
    ++(record.tier == Below::kHost ? host : disk);
  }
  const uint32_t block_size = options_.layout.block_size;
  const size_t cached = hits + host + disk;
  return LookupResult{.num_cached_blocks = static_cast<uint32_t>(cached),
                      .num_cached_tokens = static_cast<uint32_t>(cached * block_size),
                      .num_host_tier_tokens = static_cast<uint32_t>(host * block_size),
                      .num_disk_tier_tokens = static_cast<uint32_t>(disk * block_size)};
}

uint32_t Pool::ReleaseSession(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto owner = by_session_.find(session_id);
  if (owner == by_session_.end()) return 0;
  std::vector<uint64_t> sequence_ids(owner->second.begin(), owner->second.end());
  // Oldest first (ids grow), each tail first: the eviction order a session's end leaves does
  // not depend on the hash set's iteration order, which varies from process to process.
  std::sort(sequence_ids.begin(), sequence_ids.end());
  for (uint64_t sequence_id : sequence_ids) EraseLocked(sequence_id);
  return static_cast<uint32_t>(sequence_ids.size());
}

absl::StatusOr<uint64_t> Pool::BlockChecksum(BlockId block) {
  RETURN_IF_ERROR(faults_->status());
  {
    absl::ReaderMutexLock lock(&mu_);
    if (std::optional<uint64_t> cached = pool_.CachedChecksum(block)) return *cached;
  }
  // Hashing a block outside the lock: it is pinned by the caller.
  const absl::StatusOr<uint64_t> checksum = memory_->Checksum(block);
  RETURN_IF_ERROR(CheckMemory(checksum.status()));
  absl::MutexLock lock(&mu_);
  pool_.SetChecksum(block, *checksum);
  return *checksum;
}

absl::Status Pool::WriteBlock(BlockId block, uint64_t offset, absl::string_view bytes) {
  RETURN_IF_ERROR(faults_->status());
  return CheckMemory(memory_->Write(block, offset, bytes));
}

absl::Status Pool::ReadBlock(BlockId block, uint64_t offset, uint64_t size, char* out) {
  RETURN_IF_ERROR(faults_->status());
  return CheckMemory(memory_->Read(block, offset, size, out));
}

PoolStatsSnapshot Pool::Stats() const {
  absl::ReaderMutexLock lock(&mu_);
  // A block pinned only by the mover is still evictable as far as anyone asking can tell.
  uint32_t pinned_only = 0;
  for (BlockId block : offload_pins_) pinned_only += pool_.RefCount(block) == 1 ? 1 : 0;
  PoolStatsSnapshot stats{
      .free = pool_.num_free(),
      .evictable = pool_.num_evictable() + pinned_only,
      .referenced = pool_.num_referenced() - pinned_only,
      .prompt_tokens = prompt_tokens_,
      .hit_tokens = hit_blocks_ * options_.layout.block_size,
      .hit_blocks = hit_blocks_,
      .miss_blocks = miss_blocks_,
      .open_sequences = static_cast<uint32_t>(sequences_.size()),
      .pool = pool_.counters(),
  };
  stats.host_tier = TierStatsLocked();
  stats.disk_tier = DiskStats();
  stats.cluster_tier = ClusterStats();
  return stats;
}

std::optional<PoolDiskTierStats> Pool::DiskStats() const {
  if (disk_tier_ == nullptr) return std::nullopt;
  return PoolDiskTierStats{.hit_blocks = disk_hit_blocks_.load(std::memory_order_relaxed),
                           .load_failures = disk_load_failures_.load(std::memory_order_relaxed),
                           .deadline_blocks = disk_deadline_blocks_.load(std::memory_order_relaxed),
                           .demoted_blocks = demoted_blocks_.load(std::memory_order_relaxed),
                           .evicted_below = evicted_below_.load(std::memory_order_relaxed),
                           .tier = disk_tier_->stats()};
}

std::optional<PoolClusterTierStats> Pool::ClusterStats() const {
  if (cluster_tier_ == nullptr) return std::nullopt;
  return PoolClusterTierStats{
      .hit_blocks = cluster_hit_blocks_.load(std::memory_order_relaxed),
      .stored_blocks = cluster_stored_blocks_.load(std::memory_order_relaxed),
      .tier = cluster_tier_->counters(),
      .redis = cluster_tier_->redis().counters()};
}

std::optional<PoolTierStats> Pool::TierStatsLocked() const {
  if (host_tier_ == nullptr) return std::nullopt;
  return PoolTierStats{
      .hit_blocks = tier_hit_blocks_,
      .offloaded_blocks = offloaded_blocks_.load(std::memory_order_relaxed),
      .load_failures = tier_load_failures_.load(std::memory_order_relaxed),
      .deadline_blocks = tier_deadline_blocks_.load(std::memory_order_relaxed),
      .evicted_offloaded = pool_.counters().evicted_offloaded,
      .request_waits = offload_waits_,
      .tier = host_tier_->counters(),
  };
}

PoolStatsSnapshot Pool::Stats(absl::string_view tenant) const {
  absl::ReaderMutexLock lock(&mu_);
  PoolStatsSnapshot stats{.free = pool_.num_free(), .evictable = pool_.num_evictable()};
  stats.host_tier = TierStatsLocked();  // pool-wide, a stranger's view included
  stats.disk_tier = DiskStats();
  stats.cluster_tier = ClusterStats();
  auto slot = tenant_slots_.find(tenant);
  if (slot == tenant_slots_.end()) return stats;
  const TenantUsage& usage = tenants_[slot->second];
  stats.referenced = usage.referenced;
  stats.prompt_tokens = usage.prompt_tokens;
  stats.hit_tokens = usage.hit_blocks * options_.layout.block_size;
  stats.hit_blocks = usage.hit_blocks;
  stats.miss_blocks = usage.miss_blocks;
  stats.open_sequences = usage.open_sequences;
  stats.pool = usage.counters;
  return stats;
}

std::vector<std::string> Pool::Tenants() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::string> names;
  names.reserve(tenants_.size());
  for (const TenantUsage& usage : tenants_) names.push_back(usage.name);
  return names;
}

absl::Status Pool::CheckInvariants() const {
  absl::ReaderMutexLock lock(&mu_);
  RETURN_IF_ERROR(pool_.CheckInvariants());
  // Every reference is held by a sequence, open or still loading from tier 2, or by the mover's
  // offload pin (fork pins are transient and released before return).
  absl::flat_hash_map<BlockId, uint32_t> held;
  std::vector<const Sequence*> holders;
  for (const auto& [id, sequence] : sequences_) holders.push_back(sequence.get());
  holders.insert(holders.end(), loading_.begin(), loading_.end());
  for (const Sequence* sequence : holders) {
    for (BlockId block : sequence->blocks) ++held[block];
  }
  absl::flat_hash_map<BlockId, uint32_t> refs = held;
  for (BlockId block : offload_pins_) {
    if (!pool_.IsOffloadPinned(block)) {
      return absl::InternalError(
          absl::StrCat("block ", block, " is in the mover's batch unpinned"));
    }
    ++refs[block];
  }
  for (const auto& [block, count] : refs) {
    if (pool_.RefCount(block) != count) {
      return absl::InternalError(absl::StrCat("block ", block, " has ref ", pool_.RefCount(block),
                                              " but sequences and pins hold it ", count, " times"));
    }
  }
  if (pool_.num_referenced() != refs.size()) {
    return absl::InternalError(absl::StrCat(pool_.num_referenced(), " referenced blocks but ",
                                            refs.size(), " held by sequences and pins"));
  }
  if (host_tier_ != nullptr) RETURN_IF_ERROR(host_tier_->CheckInvariants());
  // Each tenant's referenced count is the blocks its sequences hold, and no block is held by
  // two tenants.
  std::vector<uint32_t> referenced(tenants_.size(), 0);
  std::vector<uint32_t> open(tenants_.size(), 0);
  for (const auto& [id, sequence] : sequences_) ++open[sequence->tenant];
  for (const Sequence* sequence : holders) {
    for (BlockId block : sequence->blocks) {
      if (block_tenant_[block] != sequence->tenant) {
        return absl::InternalError(
            absl::StrCat("block ", block, " of tenant '", tenants_[block_tenant_[block]].name,
                         "' is held by a sequence of '", tenants_[sequence->tenant].name, "'"));
      }
    }
  }
  for (const auto& [block, count] : held) ++referenced[block_tenant_[block]];
  for (size_t i = 0; i < tenants_.size(); ++i) {
    if (tenants_[i].referenced != referenced[i] || tenants_[i].open_sequences != open[i]) {
      return absl::InternalError(absl::StrCat("tenant '", tenants_[i].name, "' counts ",
                                              tenants_[i].referenced, " referenced blocks and ",
                                              tenants_[i].open_sequences, " sequences but holds ",
                                              referenced[i], " and ", open[i]));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvcache
