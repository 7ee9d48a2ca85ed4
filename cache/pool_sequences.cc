// Pool's calls on sequences named by their tokens: Open (with loads from the lower tiers and the
// hit rule), Extend, Commit and the publication of what was written, Release, Fork, Lookup and a
// session's end. The machinery they share with pages (blocks, tenants and quotas, the sequence
// table, the hash chain and the verified walk of the prefix index, capacity, the mover's hooks,
// stats, invariants) is in cache/pool.cc; pages named by keys are in cache/pool_pages.cc.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cache/pool.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

size_t BlocksFor(size_t num_tokens, uint32_t block_size) {
  return (num_tokens + block_size - 1) / block_size;
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
        extras.multimodal_items.size(), " multimodal items; at most ", kMaxMultimodalItems));
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
  RETURN_IF_ERROR(SetRoot(session.tenant, spec.cache_salt, session.manifest.get(), sequence.get()));
  sequence->extras = spec.extra_keys;
  const size_t kept_tokens =
      mode == OpenMode::kCompute ? spec.tokens.size() : total_blocks * block_size;
  sequence->tokens.assign(spec.tokens.begin(), spec.tokens.begin() + kept_tokens);
  HashNewBlocks(sequence.get());

  // When computing, at least one prompt token is left: the worker needs its logits.
  const size_t max_hit_blocks =
      mode == OpenMode::kCompute ? (spec.tokens.size() - 1) / block_size : total_blocks;
  std::vector<BelowRecord> below;  // tier-2 and tier-3 records continuing the tier-1 hits
  // With declared parts: the hit rule's parts, and the sequence's own extras digests, which the
  // walk and the probe overwrite with what they find.
  const uint32_t wanted = wanted_parts(spec);
  std::vector<uint64_t> own;
  if (token_parts_) own = sequence->extras_digests;
  size_t num_hits = 0;
  size_t cluster_end = 0;  // records the cluster is asked for, after `below`'s (none: 0)
  const size_t requested_blocks = total_blocks;
  for (int pass_downs = 0;;) {
    absl::MutexLock lock(&mu_);
    ExpirePinsLocked();
    total_blocks = requested_blocks;
    WaitOutOffloadLocked(total_blocks);
    if (session.closed.load(std::memory_order_acquire)) {
      return absl::AbortedError(absl::StrCat("session ", session.id, " has ended"));
    }
    const PoolTicks now = NowTicks();
    if (token_parts_) sequence->extras_digests = own;  // a pass-down's retry learns again
    std::vector<BlockId> hits = WalkLocked(sequence.get(), max_hit_blocks);
    num_hits = hits.size();
    if (token_parts_) ExpectAnyPartsFrom(sequence.get(), num_hits);
    below = tiers_->Probe([&](size_t i) { return ExpectedRecord(*sequence, num_hits + i); },
                          max_hit_blocks - num_hits);
    // Whether every block found restores (the walk may then go on in the cluster).
    bool all_restore = true;
    if (token_parts_) {
      for (size_t i = 0; i < below.size(); ++i) {
        sequence->extras_digests[num_hits + i] = below[i].expected.extras_digest;
      }
      const size_t found = num_hits + below.size();
      const size_t end = RestorableBlocks(*sequence, own, found, wanted);
      all_restore = end == found;
      // Blocks past the endpoint are computed: neither held nor loaded.
      if (end < num_hits) hits.resize(end);
      num_hits = hits.size();
      below.resize(end - num_hits);
    }
    size_t evictable_hits = 0;
    for (BlockId block : hits) evictable_hits += pool_.IsEvictable(block) ? 1 : 0;
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
    // What this open evicts goes down first; the copies release mu_, so look again.
    if (pass_downs < kMaxPassDowns && PassDownVictimsLocked(total_blocks - num_hits, hits, below)) {
      ++pass_downs;
      // A copy down that hit a device fault latched it: this open fails like every call after.
      RETURN_IF_ERROR(faults_->status());
      continue;
    }
    sequence->tenant = TenantSlotLocked(session.tenant);
    // Hits on evictable blocks become the tenant's referenced blocks too.
    RETURN_IF_ERROR(ReserveLocked(sequence->tenant, total_blocks - num_hits + evictable_hits, 1));
    for (BlockId block : hits) {
      // Only a compute open's hits count as hits (FinishOpenLocked), and so as resurrections.
      AcquireLocked(block, sequence->tenant, /*prefix_hit=*/mode == OpenMode::kCompute, now);
      // A hit after the block went down to tier 2: its record there is reused too (once).
      if (!pool_.IsReused(block) && pool_.IsOffloaded(block)) {
        tiers_->MarkReused(pool_.HashOf(block));
      }
      pool_.SetReused(block);
    }
    sequence->blocks = std::move(hits);
    sequence->committed_blocks = static_cast<uint32_t>(num_hits);
    while (sequence->blocks.size() < total_blocks) {
      sequence->blocks.push_back(AllocateLocked(sequence->tenant, now));
    }
    ReportEvictionsLocked();
    // The cluster is asked only by a compute open whose walk may go on past what the node has:
    // its fresh blocks are where the cluster's blocks land.
    if (tiers_->has_cluster() && mode == OpenMode::kCompute && all_restore &&
        num_hits + below.size() < max_hit_blocks) {
      cluster_end = max_hit_blocks - num_hits;
    }
    if (below.empty() && cluster_end == 0) {
      return FinishOpenLocked(std::move(sequence), spec.tokens.size(), mode, num_hits, {}, wanted,
                              own, below);
    }
    loading_.insert(sequence.get());
    break;
  }
  // Only this sequence holds the blocks, and nobody can see the sequence yet.
  const TierLoaded loaded = tiers_->Load(
      below, [&](size_t i) { return ExpectedRecord(*sequence, num_hits + i); }, cluster_end,
      absl::MakeConstSpan(sequence->blocks).subspan(num_hits), spec.max_load_ms);
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(EndLoadLocked(session, *sequence, "open"));
  return FinishOpenLocked(std::move(sequence), spec.tokens.size(), mode, num_hits, loaded, wanted,
                          own, below);
}

OpenedSequence Pool::FinishOpenLocked(std::unique_ptr<Sequence> sequence, size_t prompt_tokens,
                                      OpenMode mode, size_t num_hits, TierLoaded loaded,
                                      uint32_t wanted, absl::Span<const uint64_t> own,
                                      absl::Span<const BelowRecord> below) {
  const uint32_t block_size = options_.layout.block_size;
  size_t cached = num_hits + loaded.total();
  if (token_parts_)
    ApplyHitRuleToLoadLocked(sequence.get(), mode, wanted, own, below, &num_hits, &loaded, &cached);
  if (mode == OpenMode::kPinCached) {
    // A read returns the cached prefix only: blocks whose load did not happen go back.
    const PoolTicks now = NowTicks();
    while (sequence->blocks.size() > cached) {
      ReleaseBlockLocked(sequence->blocks.back(), now);
      sequence->blocks.pop_back();
    }
    sequence->tokens.resize(cached * block_size);
    sequence->chain.resize(cached);
    sequence->extras_digests.resize(cached);
    sequence->prefix_digests.resize(cached);
  }
  if (loaded.total() > 0) {
    CommitResult ignored;
    PublishWrittenLocked(sequence.get(), static_cast<uint32_t>(cached), &ignored);
    sequence->committed_blocks = static_cast<uint32_t>(cached);
    // Loaded from below: a hit, like a tier-1 one.
    for (size_t i = num_hits; i < cached; ++i) pool_.SetReused(sequence->blocks[i]);
    if (tiers_->has_cluster()) {
      // What came up from a lower tier or the cluster is there already: the mover sent the lower
      // tiers' records to the cluster when it passed them down. Not written back (every node
      // hitting a shared prefix would write it again).
      for (size_t i = num_hits; i < cached; ++i) pool_.SetInCluster(sequence->blocks[i]);
    }
    tiers_->CountHits(loaded);
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
      .num_host_tier_tokens = static_cast<uint32_t>(loaded.host * block_size),
      .num_disk_tier_tokens = static_cast<uint32_t>(loaded.disk * block_size),
      .num_cluster_tier_tokens = static_cast<uint32_t>(loaded.cluster * block_size)};
  if (token_parts_) opened.part_masks = PartMasksOf(*sequence, cached);
  opened.sequence_id = AddLocked(std::move(sequence));
  return opened;
}

void Pool::ApplyHitRuleToLoadLocked(Sequence* sequence, OpenMode mode, uint32_t wanted,
                                    absl::Span<const uint64_t> own,
                                    absl::Span<const BelowRecord> below, size_t* num_hits,
                                    TierLoaded* loaded, size_t* cached) {
  // The cluster's records tell their parts as they load; then the rule again over what verified.
  const size_t from_below = loaded->host + loaded->disk;
  for (size_t j = 0; j < loaded->cluster; ++j) {
    sequence->extras_digests[*num_hits + from_below + j] = loaded->cluster_extras[j];
  }
  const size_t end = RestorableBlocks(*sequence, own, *cached, wanted);
  if (end < *cached) {
    // Loaded blocks past the endpoint stay unpublished, fresh for the caller to compute.
    const size_t kept = end > *num_hits ? end - *num_hits : 0;
    TierLoaded trimmed;
    for (size_t j = 0; j < kept && j < from_below; ++j) {
      ++(below[j].tier == BelowRecord::Tier::kHost ? trimmed.host : trimmed.disk);
    }
    trimmed.cluster = kept > from_below ? kept - from_below : 0;
    trimmed.cluster_extras.assign(loaded->cluster_extras.begin(),
                                  loaded->cluster_extras.begin() + trimmed.cluster);
    *loaded = std::move(trimmed);
    if (end < *num_hits) {
      // A load that fell short can leave tier-1 hits past the endpoint: they are computed
      // again, into fresh blocks (a published block is never written). A read releases them.
      if (mode != OpenMode::kPinCached) {
        const PoolTicks now = NowTicks();
        for (size_t i = end; i < *num_hits; ++i) {
          ReleaseBlockLocked(sequence->blocks[i], now);
          sequence->blocks[i] = AllocateLocked(sequence->tenant, now);
        }
        ReportEvictionsLocked();
      }
      *num_hits = end;
      sequence->committed_blocks = static_cast<uint32_t>(end);
    }
    *cached = end;
  }
  // Blocks past the hit are the caller's: they hold what its commit will say.
  for (size_t i = *cached; i < own.size(); ++i) sequence->extras_digests[i] = own[i];
}

absl::Status Pool::EndLoadLocked(const Session& session, const Sequence& sequence,
                                 absl::string_view call) {
  loading_.erase(&sequence);
  const absl::Status device = faults_->status();
  if (!session.closed.load(std::memory_order_acquire) && device.ok()) return absl::OkStatus();
  // Undone here: the session's sweep ran during the load and could not see this sequence, or a
  // copy from below hit a device fault, and this call fails like every call after it.
  ReleaseLocked(sequence, NowTicks());
  quotas_->Release(tenants_[sequence.tenant].name, QuotaResource::kOpenSequences, 1);
  if (!device.ok()) return device;
  return absl::AbortedError(absl::StrCat("session ", session.id, " ended during the ", call));
}

BlockRecordIdentity Pool::ExpectedRecord(const Sequence& sequence, size_t i) const {
  const absl::Span<const uint32_t> tokens = BlockTokensOf(sequence, i);
  return BlockRecordIdentity{
      .hash = sequence.chain[i],
      .parent_hash = i == 0 || sequence.pages ? sequence.root : sequence.chain[i - 1],
      .namespace_digest = sequence.namespace_digest,
      .extras_digest = sequence.extras_digests[i],
      .prefix_digest = sequence.prefix_digests[i],
      .tokens = {tokens.begin(), tokens.end()},
      .tenant = sequence.tenant_name};
}

namespace {

// Extend, Commit and Fork work on token sequences: a page sequence's blocks are each a root of
// their own, named by keys, with no tokens to extend, commit by count or fork by prefix.
absl::Status RefusePageSequence(uint64_t sequence_id, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("sequence ", sequence_id, " holds pages, which ", what,
                   " does not take (CommitPages publishes a page reservation; "
                   "ReleaseSequence releases any page sequence)"));
}

}  // namespace

absl::StatusOr<ExtendedSequence> Pool::Extend(const Session& session, uint64_t sequence_id,
                                              absl::Span<const uint32_t> tokens) {
  RETURN_IF_ERROR(faults_->status());
  if (tokens.empty()) return absl::InvalidArgumentError("extend with no tokens");
  absl::MutexLock lock(&mu_);
  ExpirePinsLocked();
  // At most this many new blocks (one more than the sequence may need: it is not looked at yet).
  const size_t most_blocks = tokens.size() / options_.layout.block_size + 1;
  WaitOutOffloadLocked(most_blocks);
  // As Open: a copy down releases mu_, and other requests may take free blocks meanwhile, so
  // this extend's victims are looked for again (a victim not passed down is lost on its way).
  for (int pass_downs = 0; pass_downs < kMaxPassDowns && PassDownVictimsLocked(most_blocks, {});
       ++pass_downs) {
    RETURN_IF_ERROR(faults_->status());
    WaitOutOffloadLocked(most_blocks);
  }
  ASSIGN_OR_RETURN(Sequence * sequence, FindLocked(session, sequence_id));
  if (sequence->pages) return RefusePageSequence(sequence_id, "ExtendSequence");
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
  const PoolTicks now = NowTicks();
  for (size_t i = 0; i < needed; ++i) {
    extended.new_block_ids.push_back(AllocateLocked(sequence->tenant, now));
    sequence->blocks.push_back(extended.new_block_ids.back());
  }
  ReportEvictionsLocked();
  sequence->tokens.insert(sequence->tokens.end(), tokens.begin(), tokens.end());
  HashNewBlocks(sequence);
  extended.num_tokens = static_cast<uint32_t>(new_length);
  return extended;
}

absl::StatusOr<CommitResult> Pool::Commit(const Session& session, uint64_t sequence_id,
                                          uint32_t num_written_tokens,
                                          absl::Span<const uint32_t> part_masks) {
  // Publishing blocks whose bytes a failed device may never have received would serve them.
  RETURN_IF_ERROR(faults_->status());
  const uint32_t written_blocks = num_written_tokens / options_.layout.block_size;
  if (!part_masks.empty()) {
    if (part_masks.size() != written_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat(part_masks.size(), " part masks for a commit of ", num_written_tokens,
                       " tokens (", written_blocks, " full blocks of ", options_.layout.block_size,
                       "); want one per full block from block 0"));
    }
    RETURN_IF_ERROR(ValidateBlockPartMasks(parts_, part_masks));
  }
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Sequence * sequence, FindLocked(session, sequence_id));
  if (sequence->pages) return RefusePageSequence(sequence_id, "CommitSequence");
  if (num_written_tokens > sequence->tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat("commit of ", num_written_tokens,
                                                   " tokens but sequence ", sequence_id, " has ",
                                                   sequence->tokens.size()));
  }
  if (token_parts_ && !part_masks.empty()) {
    // Blocks committed before keep theirs: a commit is idempotent.
    for (uint32_t i = sequence->committed_blocks; i < written_blocks; ++i) {
      sequence->extras_digests[i] = WithPartMask(sequence->extras_digests[i], part_masks[i]);
    }
  }
  CommitResult result;
  PublishWrittenLocked(sequence, written_blocks, &result);
  sequence->committed_blocks = std::max(sequence->committed_blocks, written_blocks);
  result.num_committed_blocks = sequence->committed_blocks;
  return result;
}

void Pool::PublishWrittenLocked(Sequence* sequence, uint32_t written_blocks, CommitResult* result) {
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
  // Newly indexed pages: one event for the call's (an event per page was a quarter of the
  // daemon's work committing 128 pages, most of it allocating events and freeing old ones).
  std::vector<StoredBlock> pages;
  std::vector<std::string> page_keys;
  const auto report_pages = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (events_ != nullptr && !pages.empty()) {
      events_->PagesStored(pool_index_, tenants_[sequence->tenant].name, std::move(pages),
                           std::move(page_keys), sequence->manifest_digest);
    }
    pages.clear();
    page_keys.clear();
  };
  for (uint32_t i = sequence->committed_blocks; i < written_blocks; ++i) {
    // The parent link is the indexed block of h_{i-1}: this sequence's own, or the first copy
    // when its own was a duplicate. With no indexed parent the block could never be reached by a
    // walk, so it stays private. So it does when h_{i-1} indexes other content (a collision):
    // linked there, its KV would be served to that content's continuations.
    // A page's parent is the root: an engine key names its prefix itself.
    const bool first = i == 0 || sequence->pages;
    const BlockId parent = first ? kNoBlock : IndexedOwnPrefixLocked(*sequence, i - 1);
    if (!first && parent == kNoBlock) {
      if (pool_.Indexed(sequence->chain[i - 1]) != kNoBlock) {
        collisions_caught_.fetch_add(1, std::memory_order_relaxed);
      }
      report_run();
      continue;
    }
    const BlockIdentity identity{
        .hash = sequence->chain[i],
        .parent_hash = first ? sequence->root : sequence->chain[i - 1],
        .parent_block = parent,
        .extras_digest = sequence->extras_digests[i],
        .namespace_digest = sequence->namespace_digest,
        .prefix_digest = sequence->prefix_digests[i],
    };
    const BlockId block = sequence->blocks[i];
    const bool was_published = pool_.IsPublished(block);
    const absl::Span<const uint32_t> tokens = BlockTokensOf(*sequence, i);
    if (sequence->pages || token_parts_) {
      const BlockId present = FindPresentLocked(*sequence, i, identity, tokens);
      // A superseded copy's removal is announced now: the pages before it go first, in the
      // order the index changed.
      if (present != kNoBlock && present != block) report_pages();
      SupersedeLocked(present, block, identity.extras_digest);
    }
    const bool published = pool_.Publish(block, identity, tokens);
    // A hash indexed already is a duplicate when it holds the same content (looked up only
    // then: publishing is the common case).
    if (!published && FindPresentLocked(*sequence, i, identity, tokens) == kNoBlock) {
      // The hash is indexed for other content: this block stays private.
      collisions_caught_.fetch_add(1, std::memory_order_relaxed);
    }
    if (published && !was_published && pool_.IsPublished(block)) {
      ++result->num_published_blocks;
      if (events_ == nullptr) continue;  // the run is only for the events
      if (sequence->pages) {
        // Pages are no chain: announced with no parent, named by the engine's key (their
        // tokens, the key's first bytes, mean nothing to a router).
        if (pages.empty()) pages.reserve(written_blocks - i);
        // Made in place: moving a StoredBlock of no tokens copies its inline storage unset.
        StoredBlock& page = pages.emplace_back();
        page.hash = identity.hash;
        page.extras_digest = identity.extras_digest;
        page_keys.push_back(sequence->page_keys[i]);
        continue;
      }
      if (run.empty()) {
        run.reserve(written_blocks - i);
        run_parent = first ? std::nullopt : std::optional<Hash128>(sequence->chain[i - 1]);
      }
      run.push_back(StoredBlock{.hash = identity.hash,
                                .token_ids = BlockTokenIds(tokens.begin(), tokens.end()),
                                .extras_digest = identity.extras_digest});
    } else {
      report_run();
    }
  }
  report_run();
  report_pages();
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
    for (int pass_downs = 0; pass_downs < kMaxPassDowns && PassDownVictimsLocked(1, {});
         ++pass_downs) {
      RETURN_IF_ERROR(faults_->status());
      WaitOutOffloadLocked(1);
    }
    ASSIGN_OR_RETURN(Sequence * parent, FindLocked(session, sequence_id));
    if (parent->pages) return RefusePageSequence(sequence_id, "ForkSequence");
    const size_t full_blocks = parent->tokens.size() / options_.layout.block_size;
    const bool has_partial = full_blocks < parent->blocks.size();
    RETURN_IF_ERROR(CheckCapacityLocked(has_partial ? 1 : 0, 0, "forking"));
    RETURN_IF_ERROR(ReserveLocked(parent->tenant, has_partial ? 1 : 0, 1));
    auto child = std::make_unique<Sequence>(*parent);
    child->blocks.resize(full_blocks);
    const PoolTicks now = NowTicks();
    for (BlockId block : child->blocks) {
      AcquireLocked(block, child->tenant, /*prefix_hit=*/false, now);
    }
    if (has_partial) {
      // The source stays pinned until its bytes are copied, even if the parent is released.
      forked.copied_from_block = parent->blocks.back();
      AcquireLocked(forked.copied_from_block, child->tenant, /*prefix_hit=*/false, now);
      copy_dst = AllocateLocked(child->tenant, now);
      // And the destination until its bytes land: if the session ends during the copy, the
      // child's release must not free it for another sequence to be handed mid-copy.
      pool_.Acquire(copy_dst, /*prefix_hit=*/false);
      child->blocks.push_back(copy_dst);
      ReportEvictionsLocked();
    }
    forked.block_ids = child->blocks;
    forked.sequence_id = AddLocked(std::move(child));
  }
  if (copy_dst == kNoBlock) return forked;
  const absl::Status copied = CheckMemory(memory_->CopyBlock(forked.copied_from_block, copy_dst));
  absl::MutexLock lock(&mu_);
  const PoolTicks now = NowTicks();
  ReleaseBlockLocked(forked.copied_from_block, now);
  ReleaseBlockLocked(copy_dst, now);
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

absl::StatusOr<LookupResult> Pool::Lookup(absl::string_view tenant, const SequenceSpec& spec,
                                          const CompatibilityManifest* manifest) {
  // A hit promises bytes this daemon can no longer vouch for or serve.
  RETURN_IF_ERROR(faults_->status());
  RETURN_IF_ERROR(ValidateSequenceKeys(spec.cache_salt, spec.extra_keys, spec.tokens.size()));
  ExpirePins();
  Sequence probe;
  RETURN_IF_ERROR(SetRoot(tenant, spec.cache_salt, manifest, &probe));
  probe.extras = spec.extra_keys;
  probe.tokens.assign(spec.tokens.begin(), spec.tokens.end());
  HashNewBlocks(&probe);
  std::vector<uint64_t> own;
  if (token_parts_) own = probe.extras_digests;
  absl::ReaderMutexLock lock(&mu_);
  size_t hits = WalkLocked(&probe, probe.chain.size()).size();
  if (token_parts_) ExpectAnyPartsFrom(&probe, hits);
  const auto record_at = [&](size_t i) { return ExpectedRecord(probe, hits + i); };
  std::vector<BelowRecord> below = tiers_->Probe(record_at, probe.chain.size() - hits);
  if (token_parts_) {
    for (size_t i = 0; i < below.size(); ++i) {
      probe.extras_digests[hits + i] = below[i].expected.extras_digest;
    }
    const size_t end = RestorableBlocks(probe, own, hits + below.size(), wanted_parts(spec));
    hits = std::min(hits, end);
    below.resize(end - hits);
  }
  size_t host = 0, disk = 0;
  for (const BelowRecord& record : below) ++(record.tier == BelowRecord::Tier::kHost ? host : disk);
  const uint32_t block_size = options_.layout.block_size;
  const size_t cached = hits + host + disk;
  LookupResult result{.num_cached_blocks = static_cast<uint32_t>(cached),
                      .num_cached_tokens = static_cast<uint32_t>(cached * block_size),
                      .num_host_tier_tokens = static_cast<uint32_t>(host * block_size),
                      .num_disk_tier_tokens = static_cast<uint32_t>(disk * block_size)};
  if (token_parts_) result.part_masks = PartMasksOf(probe, cached);
  return result;
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

}  // namespace kvcache
