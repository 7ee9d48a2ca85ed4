// Pool's machinery that token sequences (cache/pool_sequences.cc) and pages named by keys
// (cache/pool_pages.cc) share: creation, tenants and quotas, a block's acquire, allocation and
// release, the sequence table, the hash chain and the verified walk of the prefix index,
// capacity, the mover's hooks, block bytes, stats and invariants.
#include "cache/pool.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "common/status_macros.h"

namespace kvcache {

absl::StatusOr<std::unique_ptr<Pool>> Pool::Create(const PoolOptions& options, uint32_t pool_index,
                                                   std::unique_ptr<PoolMemory> memory,
                                                   std::shared_ptr<DeviceFaultLatch> faults,
                                                   TenantQuotas* quotas, KvEventLog* events,
                                                   const Clock* clock) {
  RETURN_IF_ERROR(options.layout.Validate());
  RETURN_IF_ERROR(ValidatePoolName(options.name));
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
  if (faults == nullptr) faults = std::make_shared<DeviceFaultLatch>();
  ASSIGN_OR_RETURN(
      std::unique_ptr<LowerTiers> tiers,
      LowerTiers::Create(options, pool_index, memory.get(), faults.get(), events, clock));
  return std::unique_ptr<Pool>(new Pool(options, pool_index, std::move(memory), std::move(faults),
                                        quotas, events, clock, std::move(tiers)));
}

Pool::Pool(const PoolOptions& options, uint32_t pool_index, std::unique_ptr<PoolMemory> memory,
           std::shared_ptr<DeviceFaultLatch> faults, TenantQuotas* quotas, KvEventLog* events,
           const Clock* clock, std::unique_ptr<LowerTiers> tiers)
    : options_(options),
      parts_(options.parts.empty() ? SinglePagePart(options.layout.BlockBytes()) : options.parts),
      token_parts_(!options.parts.empty()),
      pool_index_(pool_index),
      layout_fingerprint_(options.layout.Fingerprint()),
      memory_(std::move(memory)),
      faults_(std::move(faults)),
      own_quotas_(quotas == nullptr ? std::make_unique<TenantQuotas>() : nullptr),
      quotas_(quotas == nullptr ? own_quotas_.get() : quotas),
      events_(events),
      clock_(clock),
      created_at_(clock->Now()),
      pool_(options.num_blocks, options.layout.block_size),
      block_tenant_(options.num_blocks, 0),
      allocated_at_(options.num_blocks),
      last_access_(options.num_blocks),
      released_at_(options.num_blocks),
      tiers_(std::move(tiers)) {
  tiers_->Start(this);  // last: the mover may call PickOffload at once
}

// The mover calls into this pool until it stops.
Pool::~Pool() { tiers_->Stop(); }

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

PoolTicks Pool::NowTicks() const {
  return static_cast<PoolTicks>(absl::ToInt64Milliseconds(clock_->Now() - created_at_));
}

PoolResidency Pool::Residency() const {
  absl::ReaderMutexLock lock(&mu_);
  return PoolResidency{.lifetime = lifetime_.Snapshot(),
                       .idle_before_evict = idle_before_evict_.Snapshot(),
                       .reuse_gap = reuse_gap_.Snapshot()};
}

void Pool::AcquireLocked(BlockId block, uint32_t tenant, bool prefix_hit, PoolTicks now) {
  reuse_gap_.Observe(now - last_access_[block]);
  last_access_[block] = now;
  // The mover's offload pin is no tenant's reference.
  if (pool_.RefCount(block) == (pool_.IsOffloadPinned(block) ? 1u : 0u)) {
    block_tenant_[block] = tenant;
    ++tenants_[tenant].referenced;
    if (prefix_hit && pool_.IsEvictable(block)) ++tenants_[tenant].counters.resurrections;
  }
  pool_.Acquire(block, prefix_hit);
}

BlockId Pool::AllocateLocked(uint32_t tenant, PoolTicks now) {
  // A victim no tier holds is lost on the way down (PassDownVictimsLocked passes them down).
  const BlockId victim =
      pool_.num_free() == 0 && tiers_->takes_blocks() ? pool_.LruFront() : kNoBlock;
  if (victim != kNoBlock && !pool_.IsOffloaded(victim) &&
      !tiers_->HoldsBelow(pool_.HashOf(victim), pool_.ExtrasDigestOf(victim),
                          pool_.IsInCluster(victim))) {
    ++evicted_unsaved_;
  }
  removed_.clear();
  const BlockId block = pool_.AllocateFresh(&removed_);
  if (!removed_.empty()) {
    // The mover's cursor is one block closer to the LRU's front.
    if (offload_scanned_ > 0) --offload_scanned_;
    // block_tenant_ still names the owner of the evicted block's hash; the descendants that went
    // with it hang off the same chain root, so they are the same tenant's.
    tenants_[block_tenant_[block]].counters.evictions += removed_.size();
    lifetime_.Observe(now - allocated_at_[block]);
    idle_before_evict_.Observe(now - released_at_[block]);
    if (events_ != nullptr) evicted_.insert(evicted_.end(), removed_.begin(), removed_.end());
  }
  allocated_at_[block] = now;
  last_access_[block] = now;
  block_tenant_[block] = tenant;
  ++tenants_[tenant].referenced;
  MaybeWakeMoverLocked();
  return block;
}

void Pool::ReleaseBlockLocked(BlockId block, PoolTicks now) {
  pool_.Release(block);
  if (pool_.RefCount(block) == (pool_.IsOffloadPinned(block) ? 1u : 0u)) {
    --tenants_[block_tenant_[block]].referenced;
    released_at_[block] = now;
    if (pool_.IsEvictable(block)) MaybeWakeMoverLocked();
  }
}

void Pool::WaitOutOffloadLocked(size_t needed) {
  if (offload_pins_.empty() || pool_.num_free() + pool_.num_evictable() >= needed) return;
  // Copies down hold blocks this request may need: wait for them (a batch of copies) rather
  // than fail as if they were referenced. Nothing has been looked at yet, so nothing goes stale
  // while mu_ is released.
  ++offload_waits_;
  mu_.Await(absl::Condition(
      +[](absl::flat_hash_set<BlockId>* pins) { return pins->empty(); }, &offload_pins_));
}

bool Pool::PassDownVictimsLocked(size_t allocations, absl::Span<const BlockId> hits,
                                 absl::Span<const BelowRecord> loading) {
  if (!tiers_->takes_blocks() || allocations <= pool_.num_free()) return false;
  size_t evictions = allocations - pool_.num_free();
  // The request's evictable hits leave the LRU before it allocates: they are no victims.
  std::vector<BlockId> resurrected;
  for (BlockId block : hits) {
    if (pool_.IsEvictable(block)) resurrected.push_back(block);
  }
  std::sort(resurrected.begin(), resurrected.end());
  std::vector<OffloadCandidate> batch;
  for (BlockId block = pool_.LruFront(); block != kNoBlock && evictions > 0;) {
    const BlockId next = pool_.LruNext(block);
    if (!std::binary_search(resurrected.begin(), resurrected.end(), block)) {
      --evictions;
      if (!pool_.IsOffloaded(block) &&
          !tiers_->HoldsBelow(pool_.HashOf(block), pool_.ExtrasDigestOf(block),
                              pool_.IsInCluster(block))) {
        TakeForOffloadLocked(block, &batch);
      }
    }
    block = next;
  }
  if (batch.empty()) return false;
  // Pinned and published, so their bytes hold still while mu_ is released; a request that needs
  // them meanwhile waits for them (WaitOutOffloadLocked).
  mu_.Unlock();
  tiers_->PassDown(batch, loading);
  mu_.Lock();
  FinishOffloadLocked(batch);
  return true;
}

void Pool::MaybeWakeMoverLocked() {
  if (!tiers_->has_mover() || pool_.num_free() >= tiers_->offload_window() ||
      pool_.num_evictable() == 0) {
    return;
  }
  // One wake per kOffloadBatch events (a release, an allocation) while the window has slack:
  // a wake per event cost a futex wake and a pass per request (rpc_bench). Small evictable sets
  // (under twice a batch) are woken for at once, so nothing waits for events that may not come.
  if (++mover_events_ < LowerTiers::kOffloadBatch &&
      pool_.num_evictable() >= 2 * LowerTiers::kOffloadBatch) {
    return;
  }
  mover_events_ = 0;
  tiers_->WakeMover();
}

bool Pool::PickOffload(size_t max, std::vector<OffloadCandidate>* batch) {
  absl::MutexLock lock(&mu_);
  const uint32_t window = tiers_->offload_window();
  if (pool_.num_free() >= window) {
    offload_cursor_ = kNoBlock;
    return false;
  }
  // The oldest offload_window() evictable blocks: those the next evictions take (no eager
  // mirror of the whole LRU). The scan resumes at its cursor — the first block it has not
  // looked at, offload_scanned_ blocks from the front (evictions from the front bring it
  // closer) — so each block is looked at once per pass; it restarts from the front when the
  // cursor left the LRU (evicted, resurrected). At most kMaxOffloadScan links per lock hold.
  BlockId block = offload_cursor_;
  if (block == kNoBlock || !pool_.IsEvictable(block)) {
    block = pool_.LruFront();
    offload_scanned_ = 0;
  }
  for (uint32_t steps = 0; block != kNoBlock && offload_scanned_ < window && batch->size() < max &&
                           steps < kMaxOffloadScan;
       ++steps, ++offload_scanned_) {
    const BlockId next = pool_.LruNext(block);
    if (!pool_.IsOffloaded(block)) TakeForOffloadLocked(block, batch);
    block = next;
  }
  offload_cursor_ = block;
  // An empty batch past the window or the LRU's end: this pass is done.
  return !batch->empty() || (block != kNoBlock && offload_scanned_ < window);
}

void Pool::TakeForOffloadLocked(BlockId block, std::vector<OffloadCandidate>* batch) {
  const BlockIdentity identity = pool_.IdentityOf(block);
  const bool in_cluster = pool_.IsInCluster(block);
  if (!tiers_->NeedsOffload(identity.hash, identity.extras_digest, in_cluster)) {
    pool_.SetOffloaded(block);  // already below (loaded from there, or stored before)
    return;
  }
  std::vector<uint32_t> tokens = pool_.TokensOf(block);
  batch->push_back(
      OffloadCandidate{.block = block,
                       .record = BlockRecordIdentity{.hash = identity.hash,
                                                     .parent_hash = identity.parent_hash,
                                                     .namespace_digest = identity.namespace_digest,
                                                     .extras_digest = identity.extras_digest,
                                                     .prefix_digest = identity.prefix_digest,
                                                     .tokens = std::move(tokens),
                                                     .tenant = tenants_[block_tenant_[block]].name},
                       .checksum = pool_.CachedChecksum(block),
                       .to_cluster = tiers_->has_cluster() && !in_cluster,
                       .reused = pool_.IsReused(block)});
  pool_.PinForOffload(block);
  offload_pins_.insert(block);
}

void Pool::FinishOffload(absl::Span<const OffloadCandidate> batch) {
  absl::MutexLock lock(&mu_);
  FinishOffloadLocked(batch);
}

void Pool::FinishOffloadLocked(absl::Span<const OffloadCandidate> batch) {
  // Back to the front in the order they were taken from it.
  for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
    pool_.UnpinOffloaded(it->block, it->below);
    offload_pins_.erase(it->block);
  }
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
  ReleaseLocked(sequence, NowTicks());
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

absl::Status Pool::SetRoot(absl::string_view tenant, absl::string_view cache_salt,
                           const CompatibilityManifest* manifest, Sequence* sequence) const {
  HashNamespace ns{options_.model_id, layout_fingerprint_, tenant, cache_salt};
  if (manifest != nullptr) {
    RETURN_IF_ERROR(manifest->CheckFits(options_.layout, options_.name, options_.parts));
    ns.manifest_digest = manifest->Digest(options_.hash_algorithm);
  }
  BlockHasher hasher(options_.hash_algorithm, options_.testing_hash_bits);
  sequence->root = hasher.Root(ns);
  sequence->namespace_digest = hasher.NamespaceDigest(ns);
  sequence->tenant_name = std::string(tenant);
  return absl::OkStatus();
}

void Pool::HashNewBlocks(Sequence* sequence) const {
  BlockHasher hasher(options_.hash_algorithm, options_.testing_hash_bits);
  const uint32_t block_size = options_.layout.block_size;
  const size_t first_new = sequence->chain.size();
  hasher.ExtendChain(sequence->root, sequence->namespace_digest, sequence->tokens, block_size,
                     sequence->extras, &sequence->chain, &sequence->prefix_digests);
  // With no multimodal items a block's extras are the LoRA id alone, the same for every block:
  // one digest serves them all.
  const bool same_for_every_block = sequence->extras.multimodal_items.empty();
  const uint64_t shared_digest =
      same_for_every_block ? hasher.ExtrasDigest(sequence->extras, 0, 0) : 0;
  for (size_t i = first_new; i < sequence->chain.size(); ++i) {
    const uint32_t start = static_cast<uint32_t>(i * block_size);
    sequence->extras_digests.push_back(
        same_for_every_block ? shared_digest
                             : hasher.ExtrasDigest(sequence->extras, start, start + block_size));
  }
  if (token_parts_) {
    // Until a commit says otherwise, a block holds every part.
    const uint32_t all_parts = AllPartsMask(parts_.size());
    for (size_t i = first_new; i < sequence->chain.size(); ++i) {
      sequence->extras_digests[i] = WithPartMask(sequence->extras_digests[i], all_parts);
    }
  }
}

BlockId Pool::FindPresentLocked(const Sequence& sequence, size_t i, const BlockIdentity& identity,
                                absl::Span<const uint32_t> tokens) const {
  if (sequence.pages) return FindPageLocked(sequence, i);
  if (!token_parts_) return pool_.FindVerified(identity, tokens);
  BlockIdentity any_parts = identity;
  any_parts.extras_digest =
      ExpectedExtrasLocked(identity.extras_digest, pool_.Indexed(identity.hash));
  return pool_.FindVerified(any_parts, tokens);
}

uint64_t Pool::ExpectedExtrasLocked(uint64_t ours, BlockId indexed) const {
  if (!token_parts_ || indexed == kNoBlock) return ours;
  const uint64_t theirs = pool_.ExtrasDigestOf(indexed);
  return SameExtraKeys(ours, theirs) ? theirs : ours;
}

void Pool::ExpectAnyPartsFrom(Sequence* sequence, size_t first) const {
  for (size_t i = first; i < sequence->extras_digests.size(); ++i) {
    sequence->extras_digests[i] = kAnyPartMask;
  }
}

size_t Pool::RestorableBlocks(const Sequence& sequence, absl::Span<const uint64_t> own,
                              size_t found, uint32_t wanted) const {
  // A record learned below with other extra keys (a prefix-digest collision) ends the hit.
  size_t kept = 0;
  while (kept < found && SameExtraKeys(sequence.extras_digests[kept], own[kept])) ++kept;
  return RestorablePages(parts_, wanted, PartMasksOf(sequence, kept));
}

std::vector<uint32_t> Pool::PartMasksOf(const Sequence& sequence, size_t blocks) const {
  std::vector<uint32_t> masks(blocks);
  for (size_t i = 0; i < blocks; ++i) masks[i] = PartMaskIn(sequence.extras_digests[i]);
  return masks;
}

std::vector<BlockId> Pool::WalkLocked(Sequence* sequence, size_t max_blocks) const {
  std::vector<BlockId> hits;
  const size_t limit = std::min(max_blocks, sequence->chain.size());
  const bool learn_parts = token_parts_;
  for (size_t i = 0; i < limit; ++i) {
    BlockIdentity expected{
        .hash = sequence->chain[i],
        .parent_hash = i == 0 ? sequence->root : sequence->chain[i - 1],
        .parent_block = i == 0 ? kNoBlock : hits.back(),
        .extras_digest = sequence->extras_digests[i],
        .namespace_digest = sequence->namespace_digest,
        .prefix_digest = sequence->prefix_digests[i],
    };
    if (learn_parts) {
      expected.extras_digest =
          ExpectedExtrasLocked(expected.extras_digest, pool_.Indexed(expected.hash));
    }
    const BlockId block = pool_.FindVerified(expected, BlockTokensOf(*sequence, i));
    if (block == kNoBlock) {
      if (pool_.Indexed(expected.hash) != kNoBlock) {
        collisions_caught_.fetch_add(1, std::memory_order_relaxed);
      }
      break;
    }
    if (learn_parts) sequence->extras_digests[i] = expected.extras_digest;
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
        .extras_digest = ExpectedExtrasLocked(sequence.extras_digests[j], block),
        .namespace_digest = sequence.namespace_digest,
        .prefix_digest = sequence.prefix_digests[j],
    };
    if (pool_.FindVerified(expected, BlockTokensOf(sequence, j)) != block) {
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

void Pool::ReleaseLocked(const Sequence& sequence, PoolTicks now) {
  // Tail first, so a chain's tail is evicted before its prefix.
  for (auto it = sequence.blocks.rbegin(); it != sequence.blocks.rend(); ++it) {
    ReleaseBlockLocked(*it, now);
  }
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
  FillTierStatsLocked(&stats);
  return stats;
}

void Pool::FillTierStatsLocked(PoolStatsSnapshot* stats) const {
  stats->host_tier = tiers_->HostStats();
  if (stats->host_tier.has_value()) {
    stats->host_tier->evicted_from_above = pool_.counters().evicted_offloaded;
    stats->host_tier->request_waits = offload_waits_;
    stats->host_tier->evicted_unsaved = evicted_unsaved_;
  }
  stats->disk_tier = tiers_->DiskStats();
  stats->cluster_tier = tiers_->ClusterStats();
  stats->tiers = TierStatsRows(stats->host_tier, stats->disk_tier, stats->cluster_tier);
}

PoolStatsSnapshot Pool::Stats(absl::string_view tenant) const {
  absl::ReaderMutexLock lock(&mu_);
  PoolStatsSnapshot stats{.free = pool_.num_free(), .evictable = pool_.num_evictable()};
  FillTierStatsLocked(&stats);  // pool-wide, a stranger's view included
  // But for the records that did not open: the tenant's own (whose key was asked).
  for (TierStatsRow& row : stats.tiers) row.open_failures = tiers_->OpenFailures(row.tier, tenant);
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
  RETURN_IF_ERROR(tiers_->CheckInvariants());
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
