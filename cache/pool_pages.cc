// Pool's pages named by an engine's keys (DESIGN §13): a page sequence is a sequence whose blocks
// are each a root of their own, identified by the key's hash and verified by the key's bytes
// and digest, carrying a part mask. The rest (capacity, quotas, pass-down, loads from below,
// publication, events, release) is the machinery token sequences use too (cache/pool.cc and
// cache/pool_sequences.cc).
#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/pool.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

// The key's first 4 x block_size bytes, zero-padded, as a block's tokens: a hit compares them,
// and the key digest and hash cover the whole key.
void AppendPageTokens(absl::string_view key, uint32_t block_size, std::vector<uint32_t>* tokens) {
  const size_t start = tokens->size();
  tokens->resize(start + block_size, 0);
  std::memcpy(tokens->data() + start, key.data(),
              std::min<size_t>(key.size(), size_t{block_size} * sizeof(uint32_t)));
}

uint32_t MaskOf(const std::vector<uint64_t>& extras_digests, size_t i) {
  return PartMaskIn(extras_digests[i]);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Pool::Sequence>> Pool::NewPageSequence(
    const Session& session, absl::Span<const std::string> keys,
    absl::Span<const uint32_t> part_masks) const {
  if (session.manifest == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pages live in a namespace of the tenant and a compatibility manifest: session ",
        session.id, " was opened without a manifest"));
  }
  auto sequence = std::make_unique<Sequence>();
  sequence->pages = true;
  sequence->session_id = session.id;
  RETURN_IF_ERROR(SetRoot(session.tenant, "", session.manifest.get(), sequence.get()));
  sequence->manifest_digest = session.manifest->Digest(options_.hash_algorithm).ToHex();
  sequence->page_keys.assign(keys.begin(), keys.end());
  BlockHasher hasher(options_.hash_algorithm, options_.testing_hash_bits);
  sequence->chain.reserve(keys.size());
  sequence->prefix_digests.reserve(keys.size());
  sequence->extras_digests.reserve(keys.size());
  sequence->tokens.reserve(keys.size() * options_.layout.block_size);
  for (size_t i = 0; i < keys.size(); ++i) {
    sequence->chain.push_back(hasher.Page(sequence->root, keys[i]));
    sequence->prefix_digests.push_back(hasher.PageKeyDigest(sequence->namespace_digest, keys[i]));
    sequence->extras_digests.push_back(part_masks.empty() ? kAnyPartMask : part_masks[i]);
    AppendPageTokens(keys[i], options_.layout.block_size, &sequence->tokens);
  }
  return sequence;
}

BlockIdentity Pool::PageIdentity(const Sequence& sequence, size_t i) const {
  return BlockIdentity{.hash = sequence.chain[i],
                       .parent_hash = sequence.root,
                       .parent_block = kNoBlock,
                       .extras_digest = sequence.extras_digests[i],
                       .namespace_digest = sequence.namespace_digest,
                       .prefix_digest = sequence.prefix_digests[i]};
}

BlockId Pool::FindPageLocked(const Sequence& sequence, size_t i) const {
  const BlockId indexed = pool_.Indexed(sequence.chain[i]);
  if (indexed == kNoBlock) return kNoBlock;
  BlockIdentity expected = PageIdentity(sequence, i);
  expected.extras_digest = pool_.ExtrasDigestOf(indexed);  // any parts
  const BlockId block = pool_.FindVerified(expected, BlockTokensOf(sequence, i));
  if (block == kNoBlock) collisions_caught_.fetch_add(1, std::memory_order_relaxed);
  return block;
}

void Pool::SupersedeLocked(BlockId present, BlockId own, uint64_t identity_extras) {
  if (present == kNoBlock || present == own) return;
  const uint32_t ours = PartMaskIn(identity_extras);
  const uint32_t theirs = PartMaskIn(pool_.ExtrasDigestOf(present));
  if ((theirs & ours) == ours || !pool_.IsEvictable(present)) return;
  removed_.clear();
  pool_.Evict(present, &removed_);
  tenants_[block_tenant_[present]].counters.evictions += removed_.size();
  if (events_ != nullptr) evicted_.insert(evicted_.end(), removed_.begin(), removed_.end());
  ReportEvictionsLocked();  // before the new copy is announced under the same hash
}

PageWalk Pool::FindPagesLocked(Sequence* sequence) const {
  PageWalk walk;
  for (size_t i = 0; i < sequence->chain.size(); ++i) {
    // Tier 1 first: pages are independent, so a page tier 1 still holds may follow one that
    // went below (an older page is evicted first).
    const BlockId block = FindPageLocked(*sequence, i);
    if (block != kNoBlock) {
      sequence->extras_digests[i] = pool_.ExtrasDigestOf(block);
      walk.tier1.push_back(block);
      continue;
    }
    sequence->extras_digests[i] = kAnyPartMask;  // learned from the record the probe finds
    std::vector<BelowRecord> record =
        tiers_->Probe([&](size_t) { return ExpectedRecord(*sequence, i); }, 1);
    if (record.empty()) break;
    sequence->extras_digests[i] = record[0].expected.extras_digest;
    walk.tier1.push_back(kNoBlock);
    walk.below.push_back(std::move(record[0]));
    walk.below_pages.push_back(i);
  }
  return walk;
}

void Pool::CountPagesByTier(const PageWalk& walk, size_t pages, PagesByTier* by_tier) {
  size_t record = 0;
  for (size_t i = 0; i < pages; ++i) {
    if (i >= walk.tier1.size()) {
      ++by_tier->cluster;
    } else if (walk.tier1[i] != kNoBlock) {
      ++by_tier->pool;
    } else {
      ++(walk.below[record++].tier == BelowRecord::Tier::kHost ? by_tier->host : by_tier->disk);
    }
  }
}

absl::StatusOr<PagesFound> Pool::ExistsPages(const Session& session,
                                             absl::Span<const std::string> keys, uint32_t wanted) {
  // A hit promises bytes this daemon can no longer vouch for or serve.
  RETURN_IF_ERROR(faults_->status());
  RETURN_IF_ERROR(ValidatePageKeys(keys));
  ASSIGN_OR_RETURN(std::unique_ptr<Sequence> sequence, NewPageSequence(session, keys, {}));
  ExpirePins();
  PageWalk walk;
  std::vector<uint32_t> masks;
  {
    absl::ReaderMutexLock lock(&mu_);
    walk = FindPagesLocked(sequence.get());
    for (size_t i = 0; i < walk.tier1.size(); ++i) {
      masks.push_back(MaskOf(sequence->extras_digests, i));
    }
  }
  const size_t known = masks.size();
  // The cluster, outside mu_, for the keys after the node's pages when those all restore (as
  // AcquirePages asks it then): a page passed down by another node exists here too.
  if (tiers_->has_cluster() && known < keys.size() &&
      RestorablePages(parts_, wanted, masks) == known) {
    const std::vector<uint64_t> extras =
        tiers_->ProbeCluster([&](size_t i) { return ExpectedRecord(*sequence, known + i); },
                             keys.size() - known, absl::Now() + kClusterProbeBound);
    for (uint64_t extra : extras) masks.push_back(static_cast<uint32_t>(extra));
  }
  PagesFound found;
  found.num_pages = static_cast<uint32_t>(RestorablePages(parts_, wanted, masks));
  CountPagesByTier(walk, found.num_pages, &found.by_tier);
  return found;
}

absl::StatusOr<ReservedPages> Pool::ReservePages(const Session& session,
                                                 absl::Span<const std::string> keys,
                                                 absl::Span<const uint32_t> part_masks) {
  RETURN_IF_ERROR(faults_->status());
  RETURN_IF_ERROR(ValidatePageKeys(keys));
  const uint32_t all_parts = AllPartsMask(parts_.size());
  std::vector<uint32_t> masks(part_masks.begin(), part_masks.end());
  if (masks.empty()) masks.assign(keys.size(), all_parts);
  if (masks.size() != keys.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(part_masks.size(), " part masks for ", keys.size(), " page keys"));
  }
  for (size_t i = 0; i < masks.size(); ++i) {
    if (masks[i] == 0 || (masks[i] & ~all_parts) != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "page ", i, " has part mask 0x", absl::Hex(masks[i]), "; pool '", options_.name, "' has ",
          parts_.size(), " part(s), mask 0x", absl::Hex(all_parts)));
    }
  }
  ASSIGN_OR_RETURN(std::unique_ptr<Sequence> probe, NewPageSequence(session, keys, masks));
  const uint32_t block_size = options_.layout.block_size;
  for (int pass_downs = 0;;) {
    absl::MutexLock lock(&mu_);
    ExpirePinsLocked();
    WaitOutOffloadLocked(keys.size());
    if (session.closed.load(std::memory_order_acquire)) {
      return absl::AbortedError(absl::StrCat("session ", session.id, " has ended"));
    }
    // A page tier 1 holds with at least these parts is a duplicate: nothing to write.
    std::vector<size_t> fresh;
    for (size_t i = 0; i < keys.size(); ++i) {
      const BlockId present = FindPageLocked(*probe, i);
      if (present == kNoBlock || (pool_.ExtrasDigestOf(present) & masks[i]) != masks[i]) {
        fresh.push_back(i);
      }
    }
    RETURN_IF_ERROR(CheckCapacityLocked(fresh.size(), 0,
                                        absl::StrCat("a put of ", fresh.size(), " new pages")));
    if (pass_downs < kMaxPassDowns && PassDownVictimsLocked(fresh.size(), {})) {
      ++pass_downs;
      RETURN_IF_ERROR(faults_->status());
      continue;
    }
    auto sequence = std::make_unique<Sequence>();
    sequence->pages = true;
    sequence->session_id = session.id;
    sequence->root = probe->root;
    sequence->namespace_digest = probe->namespace_digest;
    sequence->manifest_digest = probe->manifest_digest;
    sequence->tenant = TenantSlotLocked(session.tenant);
    RETURN_IF_ERROR(ReserveLocked(sequence->tenant, fresh.size(), 1));
    sequence->page_duplicates = static_cast<uint32_t>(keys.size() - fresh.size());
    ReservedPages reserved;
    reserved.block_ids.assign(keys.size(), kNoBlock);
    const PoolTicks now = NowTicks();
    for (size_t i : fresh) {
      sequence->chain.push_back(probe->chain[i]);
      sequence->page_keys.push_back(probe->page_keys[i]);
      sequence->prefix_digests.push_back(probe->prefix_digests[i]);
      sequence->extras_digests.push_back(masks[i]);
      sequence->tokens.insert(sequence->tokens.end(), probe->tokens.begin() + i * block_size,
                              probe->tokens.begin() + (i + 1) * block_size);
      sequence->blocks.push_back(AllocateLocked(sequence->tenant, now));
      reserved.block_ids[i] = sequence->blocks.back();
    }
    ReportEvictionsLocked();
    reserved.sequence_id = AddLocked(std::move(sequence));
    return reserved;
  }
}

absl::StatusOr<CommittedPages> Pool::CommitPages(const Session& session, uint64_t sequence_id,
                                                 absl::Span<const uint64_t> writer_checksums) {
  // Publishing pages whose bytes a failed device may never have received would serve them.
  RETURN_IF_ERROR(faults_->status());
  std::vector<BlockId> blocks;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Sequence * sequence, FindLocked(session, sequence_id));
    if (!sequence->pages || sequence->committed_blocks != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sequence ", sequence_id, " is not a page reservation (ReservePages makes one)"));
    }
    blocks = sequence->blocks;
  }
  if (!writer_checksums.empty() && writer_checksums.size() != blocks.size()) {
    return absl::InvalidArgumentError(absl::StrCat(writer_checksums.size(), " page checksums for ",
                                                   blocks.size(), " reserved pages"));
  }
  // Outside mu_: the reservation holds the blocks, which nobody else can see yet.
  std::vector<uint64_t> checksums(writer_checksums.begin(), writer_checksums.end());
  if (checksums.empty()) {
    checksums.resize(blocks.size());
    RETURN_IF_ERROR(CheckMemory(memory_->ChecksumBlocks(blocks, absl::MakeSpan(checksums))));
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Sequence * sequence, FindLocked(session, sequence_id));
  if (sequence->committed_blocks != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("page reservation ", sequence_id, " is being committed by another call"));
  }
  CommitResult result;
  PublishWrittenLocked(sequence, static_cast<uint32_t>(sequence->blocks.size()), &result);
  sequence->committed_blocks = static_cast<uint32_t>(sequence->blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) pool_.SetChecksum(blocks[i], checksums[i]);
  const CommittedPages committed{
      .num_published = result.num_published_blocks,
      .num_duplicates = static_cast<uint32_t>(sequence->page_duplicates + blocks.size() -
                                              result.num_published_blocks)};
  EraseLocked(sequence_id);
  return committed;
}

absl::StatusOr<AcquiredPages> Pool::AcquirePages(const Session& session,
                                                 absl::Span<const std::string> keys,
                                                 uint32_t wanted, uint32_t max_load_ms) {
  RETURN_IF_ERROR(faults_->status());
  RETURN_IF_ERROR(ValidatePageKeys(keys));
  ASSIGN_OR_RETURN(std::unique_ptr<Sequence> sequence, NewPageSequence(session, keys, {}));
  const auto masks_upto = [&](size_t end) {
    std::vector<uint32_t> masks;
    for (size_t i = 0; i < end; ++i) masks.push_back(MaskOf(sequence->extras_digests, i));
    return masks;
  };
  PageWalk walk;
  size_t end = 0;              // the pages the hit rule gives over the node's tiers
  size_t cluster_pages = 0;    // keys after `end` the cluster is asked for
  std::vector<BlockId> fresh;  // for walk.below's records, then the cluster's
  for (int pass_downs = 0;;) {
    absl::MutexLock lock(&mu_);
    ExpirePinsLocked();
    WaitOutOffloadLocked(keys.size());
    if (session.closed.load(std::memory_order_acquire)) {
      return absl::AbortedError(absl::StrCat("session ", session.id, " has ended"));
    }
    walk = FindPagesLocked(sequence.get());
    const size_t known = walk.tier1.size();
    end = RestorablePages(parts_, wanted, masks_upto(known));
    // The cluster is asked for the keys after the node's pages when those all restore: its
    // pages' parts are learned as they load, and the hit rule is applied again then.
    cluster_pages = tiers_->has_cluster() && end == known ? keys.size() - known : 0;
    walk.Trim(end);
    size_t evictable_hits = walk.EvictableHits(pool_);
    // A read loads only into blocks it can have without failing.
    const size_t available = pool_.num_free() + pool_.num_evictable() - evictable_hits;
    if (walk.below.size() > available) {
      // The first page left below ends what can be had: the rule again over the pages before
      // it, so that a hit cut short is still one every wanted part restores.
      end = RestorablePages(parts_, wanted, masks_upto(walk.below_pages[available]));
      walk.Trim(end);
      evictable_hits = walk.EvictableHits(pool_);
      cluster_pages = 0;
    }
    cluster_pages = std::min(cluster_pages, available - walk.below.size());
    const size_t loads = walk.below.size() + cluster_pages;
    if (pass_downs < kMaxPassDowns && PassDownVictimsLocked(loads, walk.Hits(), walk.below)) {
      ++pass_downs;
      RETURN_IF_ERROR(faults_->status());
      continue;
    }
    sequence->tenant = TenantSlotLocked(session.tenant);
    RETURN_IF_ERROR(ReserveLocked(sequence->tenant, loads + evictable_hits, 1));
    const PoolTicks now = NowTicks();
    for (BlockId block : walk.Hits()) {
      AcquireLocked(block, sequence->tenant, /*prefix_hit=*/false, now);
      if (!pool_.IsReused(block) && pool_.IsOffloaded(block)) {
        tiers_->MarkReused(pool_.HashOf(block));
      }
      pool_.SetReused(block);
    }
    // Held meanwhile: the tier-1 pages and the fresh blocks (in page order after the load).
    sequence->blocks = walk.Hits();
    for (size_t i = 0; i < loads; ++i) fresh.push_back(AllocateLocked(sequence->tenant, now));
    sequence->blocks.insert(sequence->blocks.end(), fresh.begin(), fresh.end());
    ReportEvictionsLocked();
    if (loads > 0) {
      loading_.insert(sequence.get());
      break;
    }
    AcquiredPages acquired;
    acquired.block_ids = sequence->blocks;
    acquired.part_masks = masks_upto(end);
    acquired.by_tier.pool = static_cast<uint32_t>(end);
    sequence->committed_blocks = static_cast<uint32_t>(end);
    acquired.sequence_id = AddLocked(std::move(sequence));
    return acquired;
  }
  // Only this sequence holds the fresh blocks, and nobody can see the sequence yet. The
  // cluster's records follow the node's pages: key end + i.
  const TierLoaded loaded = tiers_->Load(
      walk.below,
      [&](size_t record) {
        return ExpectedRecord(*sequence, record < walk.below.size()
                                             ? walk.below_pages[record]
                                             : end + (record - walk.below.size()));
      },
      walk.below.size() + cluster_pages, fresh, max_load_ms);
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EndLoadLocked(session, *sequence, "acquire"));
  // The pages present: up to the first record below that did not verify, else the node's and
  // the cluster's.
  const size_t verified = loaded.host + loaded.disk;
  const size_t present =
      verified < walk.below.size() ? walk.below_pages[verified] : end + loaded.cluster;
  for (size_t i = 0; i < loaded.cluster; ++i) {
    sequence->extras_digests[end + i] = loaded.cluster_extras[i];
  }
  // Blocks in page order; what is past `present` goes back.
  std::vector<BlockId> in_order;
  std::vector<bool> used(fresh.size(), false);
  size_t next_fresh = 0;
  for (size_t i = 0; i < present; ++i) {
    if (i < end && walk.tier1[i] != kNoBlock) {
      in_order.push_back(walk.tier1[i]);
    } else {
      used[next_fresh] = true;
      in_order.push_back(fresh[next_fresh++]);
    }
  }
  const PoolTicks now = NowTicks();
  for (size_t i = present; i < end; ++i) {
    if (walk.tier1[i] != kNoBlock) ReleaseBlockLocked(walk.tier1[i], now);
  }
  for (size_t i = 0; i < fresh.size(); ++i) {
    if (!used[i]) ReleaseBlockLocked(fresh[i], now);
  }
  sequence->blocks = std::move(in_order);
  // What verified is published (a page is a page, hit or not; tier 1's are already); the hit
  // rule then decides how many the caller gets, and the rest go back as cached pages.
  sequence->committed_blocks = 0;
  CommitResult ignored;
  PublishWrittenLocked(sequence.get(), static_cast<uint32_t>(present), &ignored);
  for (size_t i = 0; i < present; ++i) {
    if (i < end && walk.tier1[i] != kNoBlock) continue;
    pool_.SetReused(sequence->blocks[i]);
    // What came from below or the cluster is in the cluster already (FinishOpenLocked's rule).
    if (tiers_->has_cluster()) pool_.SetInCluster(sequence->blocks[i]);
  }
  tiers_->CountHits(loaded);
  const size_t hit = RestorablePages(parts_, wanted, masks_upto(present));
  while (sequence->blocks.size() > hit) {
    ReleaseBlockLocked(sequence->blocks.back(), now);
    sequence->blocks.pop_back();
  }
  sequence->committed_blocks = static_cast<uint32_t>(hit);
  AcquiredPages acquired;
  acquired.block_ids = sequence->blocks;
  acquired.part_masks = masks_upto(hit);
  CountPagesByTier(walk, hit, &acquired.by_tier);
  sequence->chain.resize(hit);
  sequence->prefix_digests.resize(hit);
  sequence->extras_digests.resize(hit);
  sequence->tokens.resize(hit * options_.layout.block_size);
  acquired.sequence_id = AddLocked(std::move(sequence));
  return acquired;
}

absl::StatusOr<uint32_t> Pool::PinPages(const Session& session, absl::Span<const std::string> keys,
                                        absl::Duration ttl, uint32_t priority) {
  if (ttl < absl::ZeroDuration() || ttl > kMaxPinTtl) {
    return absl::InvalidArgumentError(absl::StrCat("pin TTL ", absl::FormatDuration(ttl),
                                                   "; at most ", absl::FormatDuration(kMaxPinTtl)));
  }
  if (priority > kMaxPinPriority) {
    return absl::InvalidArgumentError(
        absl::StrCat("pin priority ", priority, "; at most ", kMaxPinPriority));
  }
  // No part asked for: the leading pages present, whatever parts they hold.
  absl::StatusOr<AcquiredPages> acquired = AcquirePages(session, keys, /*wanted=*/0, 0);
  while (absl::IsResourceExhausted(acquired.status()) &&
         DisplacePinBelow(session.tenant, priority)) {
    acquired = AcquirePages(session, keys, /*wanted=*/0, 0);
  }
  RETURN_IF_ERROR(acquired.status());
  absl::MutexLock lock(&mu_);
  if (ttl == absl::ZeroDuration()) {
    EraseLocked(acquired->sequence_id);  // a touch: released now, the most recently used
  } else {
    pins_.emplace(clock_->Now() + ttl,
                  Pin{.sequence_id = acquired->sequence_id, .priority = priority});
    NotePinsLocked();
  }
  return static_cast<uint32_t>(acquired->block_ids.size());
}

bool Pool::DisplacePinBelow(absl::string_view tenant, uint32_t priority) {
  absl::MutexLock lock(&mu_);
  const auto slot = tenant_slots_.find(tenant);
  if (slot == tenant_slots_.end()) return false;
  // O(pins): only a refused pin comes here.
  auto lowest = pins_.end();
  for (auto it = pins_.begin(); it != pins_.end(); ++it) {
    const auto sequence = sequences_.find(it->second.sequence_id);
    if (sequence == sequences_.end() || sequence->second->tenant != slot->second ||
        it->second.priority >= priority) {
      continue;
    }
    if (lowest == pins_.end() || it->second.priority < lowest->second.priority) lowest = it;
  }
  if (lowest == pins_.end()) return false;
  EraseLocked(lowest->second.sequence_id);
  pins_.erase(lowest);
  NotePinsLocked();
  return true;
}

void Pool::ExpirePinsLocked() {
  if (pins_.empty()) return;
  const absl::Time now = clock_->Now();
  while (!pins_.empty() && pins_.begin()->first <= now) {
    EraseLocked(pins_.begin()->second.sequence_id);
    pins_.erase(pins_.begin());
  }
  NotePinsLocked();
}

void Pool::NotePinsLocked() {
  next_pin_expiry_.store(
      pins_.empty() ? std::numeric_limits<int64_t>::max() : absl::ToUnixNanos(pins_.begin()->first),
      std::memory_order_relaxed);
}

void Pool::ExpirePins() {
  const int64_t next = next_pin_expiry_.load(std::memory_order_relaxed);
  // No pin at all (the common case) costs no clock read.
  if (next == std::numeric_limits<int64_t>::max() || absl::ToUnixNanos(clock_->Now()) < next) {
    return;
  }
  absl::MutexLock lock(&mu_);
  ExpirePinsLocked();
}

}  // namespace kvcache
