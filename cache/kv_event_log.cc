#include "cache/kv_event_log.h"

#include <cassert>
#include <utility>

namespace kvcache {

bool KvEventFilter::Matches(const KvEvent& event) const {
  if (event.kind == KvEventKind::kAllBlocksCleared)
    return event.pool.empty() || pool.empty() || pool == event.pool;
  return (pool.empty() || pool == event.pool) && (tenant.empty() || tenant == event.tenant);
}

absl::string_view KvEventMediumOf(absl::string_view memory_kind) {
  return memory_kind == "cuda" ? kKvMediumGpu : kKvMediumCpu;
}

KvEventLog::KvEventLog(size_t capacity, const Clock* clock) : capacity_(capacity), clock_(clock) {
  assert(capacity > 0);
  absl::MutexLock lock(&mu_);
  auto cleared = std::make_shared<KvEvent>();
  cleared->kind = KvEventKind::kAllBlocksCleared;
  AppendLocked(std::move(cleared));
}

KvEventLog::PoolInfo::PoolInfo(std::string name, std::string medium, uint32_t block_size)
    : name(std::move(name)),
      media{std::move(medium)},
      block_size(block_size),
      index(/*bucket_count=*/0, EntryHash{&entries}, EntryEq{&entries}) {}

void KvEventLog::AddPool(uint32_t pool_index, std::string name, std::string medium,
                         uint32_t block_size) {
  absl::MutexLock lock(&mu_);
  pools_[pool_index] = std::make_unique<PoolInfo>(std::move(name), std::move(medium), block_size);
}

KvEventLog::PoolInfo& KvEventLog::PoolLocked(uint32_t pool_index) const {
  auto it = pools_.find(pool_index);
  assert(it != pools_.end());
  return *it->second;
}

uint32_t KvEventLog::MediumLocked(uint32_t pool_index, absl::string_view medium) {
  std::vector<std::string>& media = PoolLocked(pool_index).media;
  for (uint32_t i = 0; i < media.size(); ++i) {
    if (media[i] == medium) return i;
  }
  media.emplace_back(medium);
  assert(media.size() <= 256);  // Entry::medium is a byte: a pool has a handful of tiers
  return static_cast<uint32_t>(media.size() - 1);
}

uint32_t KvEventLog::TenantLocked(absl::string_view tenant) {
  auto [it, inserted] =
      tenant_ids_.try_emplace(std::string(tenant), static_cast<uint32_t>(tenants_.size()));
  if (inserted) tenants_.emplace_back(tenant);
  return it->second;
}

uint32_t KvEventLog::ManifestLocked(absl::string_view digest) {
  if (auto it = manifest_ids_.find(digest); it != manifest_ids_.end()) return it->second;
  const uint32_t id = static_cast<uint32_t>(manifests_.size());
  manifests_.emplace_back(digest);
  manifest_ids_.emplace(std::string(digest), id);
  return id;
}

PageName KvEventLog::PageNameLocked(const PoolInfo& pool, uint32_t entry) const {
  return PageNameIn(pool, entry, manifests_);
}

PageName KvEventLog::PageNameIn(const PoolInfo& pool, uint32_t entry,
                                const std::vector<std::string>& manifests) {
  const IndexedPage& page = pool.pages.find(entry)->second;
  return PageName{.key = page.key, .manifest_digest = manifests[page.manifest]};
}

KvEventLog::PoolInfo::CopyShape KvEventLog::PoolInfo::ShapeForCopy() const {
  CopyShape shape{
      .name = name, .medium = media.front(), .block_size = block_size, .entries = entries.size()};
  shape.chunk_widths.reserve(token_chunks.size());
  for (const std::unique_ptr<PackedTokens>& chunk : token_chunks) {
    shape.chunk_widths.push_back(chunk->width());
  }
  return shape;
}

std::unique_ptr<KvEventLog::PoolInfo> KvEventLog::PoolInfo::ReadyForCopy(const CopyShape& shape) {
  auto copy = std::make_unique<PoolInfo>(shape.name, shape.medium, shape.block_size);
  // Room for the entries indexed between this and the copy; resize writes every one (resident).
  copy->entries.resize(shape.entries + shape.entries / 16 + 1024);
  for (const uint32_t width : shape.chunk_widths) {
    copy->token_chunks.push_back(PackedTokens::Resident(kTokenChunk, shape.block_size, width));
  }
  return copy;
}

void KvEventLog::PoolInfo::CopyForSnapshot(PoolInfo& copy) const {
  copy.media = media;
  copy.entries.assign(entries.begin(), entries.end());  // in place while it has room
  copy.token_chunks.resize(token_chunks.size());
  for (size_t i = 0; i < token_chunks.size(); ++i) {
    if (copy.token_chunks[i] == nullptr || !token_chunks[i]->CopyInto(*copy.token_chunks[i])) {
      copy.token_chunks[i] = token_chunks[i]->Clone();  // a chunk new or widened since
    }
  }
  copy.odd_tokens = odd_tokens;
  copy.pages = pages;
}

void KvEventLog::PoolInfo::IndexInUse() {
  index.reserve(entries.size());
  for (uint32_t id = 0; id < entries.size(); ++id) {
    if (entries[id].in_use) index.insert(id);
  }
}

void KvEventLog::AppendLocked(std::shared_ptr<KvEvent> event) {
  event->sequence = next_sequence_++;
  event->time = clock_->Now();
  buffer_.push_back(std::move(event));
  if (buffer_.size() > capacity_) buffer_.pop_front();
}

namespace {

std::shared_ptr<KvEvent> NewStoredEvent(absl::string_view tenant,
                                        std::optional<Hash128> parent_hash,
                                        std::vector<StoredBlock> blocks) {
  auto event = std::make_shared<KvEvent>();
  event->kind = KvEventKind::kBlocksStored;
  event->tenant = std::string(tenant);
  event->parent_hash = parent_hash;
  event->blocks = std::move(blocks);
  return event;
}

std::shared_ptr<KvEvent> NewPageEvent(absl::string_view tenant, StoredBlock block, PageName name) {
  std::vector<StoredBlock> blocks;
  blocks.push_back(std::move(block));
  auto event = NewStoredEvent(tenant, std::nullopt, std::move(blocks));
  event->page_keys.push_back(std::move(name.key));
  event->manifest_digest = std::move(name.manifest_digest);
  return event;
}

}  // namespace

void KvEventLog::BlocksStored(uint32_t pool_index, absl::string_view tenant,
                              std::optional<Hash128> parent_hash, std::vector<StoredBlock> blocks) {
  if (blocks.empty()) return;
  auto event = NewStoredEvent(tenant, parent_hash, std::move(blocks));
  absl::MutexLock lock(&mu_);
  StoredLocked(pool_index, 0, std::move(event), KvEventRetention::kIndexed);
}

void KvEventLog::PagesStored(uint32_t pool_index, absl::string_view tenant,
                             std::vector<StoredBlock> blocks, std::vector<std::string> keys,
                             std::string manifest_digest) {
  if (blocks.empty()) return;
  auto event = NewStoredEvent(tenant, std::nullopt, std::move(blocks));
  event->page_keys = std::move(keys);
  event->manifest_digest = std::move(manifest_digest);
  absl::MutexLock lock(&mu_);
  StoredLocked(pool_index, 0, std::move(event), KvEventRetention::kIndexed);
}

void KvEventLog::PageStoredIn(uint32_t pool_index, absl::string_view medium,
                              absl::string_view tenant, StoredBlock block, PageName name,
                              KvEventRetention retention) {
  auto event = NewPageEvent(tenant, std::move(block), std::move(name));
  absl::MutexLock lock(&mu_);
  StoredLocked(pool_index, MediumLocked(pool_index, medium), std::move(event), retention);
}

void KvEventLog::BlocksStoredIn(uint32_t pool_index, absl::string_view medium,
                                absl::string_view tenant, std::optional<Hash128> parent_hash,
                                std::vector<StoredBlock> blocks, KvEventRetention retention) {
  if (blocks.empty()) return;
  auto event = NewStoredEvent(tenant, parent_hash, std::move(blocks));
  absl::MutexLock lock(&mu_);
  StoredLocked(pool_index, MediumLocked(pool_index, medium), std::move(event), retention);
}

void KvEventLog::StoredLocked(uint32_t pool_index, uint32_t medium, std::shared_ptr<KvEvent> event,
                              KvEventRetention retention) {
  PoolInfo& pool = PoolLocked(pool_index);
  event->pool = pool.name;
  event->medium = pool.media[medium];
  event->block_size = pool.block_size;
  if (retention == KvEventRetention::kIndexed) {
    const uint32_t tenant = TenantLocked(event->tenant);
    const uint32_t manifest = event->page_keys.empty() ? 0 : ManifestLocked(event->manifest_digest);
    for (uint32_t position = 0; position < event->blocks.size(); ++position) {
      IndexLocked(pool, medium, tenant, manifest, *event, position);
    }
  }
  AppendLocked(std::move(event));
}

void KvEventLog::IndexLocked(PoolInfo& pool, uint32_t medium, uint32_t tenant, uint32_t manifest,
                             const KvEvent& event, uint32_t position) {
  const StoredBlock& block = event.blocks[position];
  uint32_t id = kNoEntry;
  if (auto it = pool.index.find(EntryKey{medium, block.hash}); it != pool.index.end()) {
    id = *it;  // announced again: the new announcement replaces the old
    pool.odd_tokens.erase(id);
    pool.pages.erase(id);
  } else if (!pool.free_entries.empty()) {
    id = pool.free_entries.back();
    pool.free_entries.pop_back();
  } else {
    id = static_cast<uint32_t>(pool.entries.size());
    pool.entries.emplace_back();
    if (id % kTokenChunk == 0) {
      pool.token_chunks.push_back(std::make_unique<PackedTokens>(kTokenChunk, pool.block_size));
    }
  }
  Entry& entry = pool.entries[id];
  const bool indexed = entry.in_use;
  const bool is_page = !event.page_keys.empty() && !event.page_keys[position].empty();
  // A page has no parent, also when its event announces others before it.
  const std::optional<Hash128> parent =
      is_page || position == 0 ? event.parent_hash
                               : std::optional<Hash128>(event.blocks[position - 1].hash);
  entry.hash = block.hash;
  entry.parent_hash = parent.value_or(Hash128{});
  entry.has_parent = parent.has_value();
  entry.extras_digest = block.extras_digest;
  entry.tenant = tenant;
  entry.medium = static_cast<uint8_t>(medium);
  entry.in_use = true;
  entry.has_tokens = !block.token_ids.empty();
  entry.packed = entry.has_tokens && block.token_ids.size() == pool.block_size;
  if (entry.packed) {
    const uint32_t chunk = id / kTokenChunk;
    pool.token_chunks[chunk]->Store(id % kTokenChunk, block.token_ids, [&](uint32_t slot) {
      const size_t other = size_t{chunk} * kTokenChunk + slot;  // the last chunk is not full
      return other < pool.entries.size() && pool.entries[other].in_use &&
             pool.entries[other].packed;
    });
  } else if (entry.has_tokens) {
    pool.odd_tokens[id].assign(block.token_ids.begin(), block.token_ids.end());
  }
  entry.is_page = is_page;
  if (entry.is_page) {
    pool.pages[id] = IndexedPage{.key = event.page_keys[position], .manifest = manifest};
  }
  if (!indexed) pool.index.insert(id);
}

void KvEventLog::EraseLocked(PoolInfo& pool, uint32_t entry) {
  pool.index.erase(entry);
  pool.odd_tokens.erase(entry);
  pool.pages.erase(entry);
  pool.entries[entry].in_use = false;
  pool.free_entries.push_back(entry);
}

BlockTokenIds KvEventLog::TokensOf(const PoolInfo& pool, uint32_t entry) {
  const Entry& e = pool.entries[entry];
  if (!e.has_tokens) return {};
  if (!e.packed) {
    const std::vector<uint32_t>& odd = pool.odd_tokens.find(entry)->second;
    return BlockTokenIds(odd.begin(), odd.end());
  }
  BlockTokenIds tokens(pool.block_size);
  pool.token_chunks[entry / kTokenChunk]->CopyTo(entry % kTokenChunk, tokens.data());
  return tokens;
}

const std::string& KvEventLog::PageKeyOf(const PoolInfo& pool, uint32_t entry) const {
  static const std::string kNone;
  if (!pool.entries[entry].is_page) return kNone;
  return pool.pages.find(entry)->second.key;
}

void KvEventLog::BlocksRemoved(uint32_t pool_index, absl::Span<const Hash128> hashes) {
  if (hashes.empty()) return;
  absl::MutexLock lock(&mu_);
  RemovedLocked(pool_index, 0, hashes);
}

void KvEventLog::BlocksRemovedFrom(uint32_t pool_index, absl::string_view medium,
                                   absl::Span<const Hash128> hashes) {
  if (hashes.empty()) return;
  absl::MutexLock lock(&mu_);
  RemovedLocked(pool_index, MediumLocked(pool_index, medium), hashes);
}

void KvEventLog::RemovedLocked(uint32_t pool_index, uint32_t medium,
                               absl::Span<const Hash128> hashes) {
  PoolInfo& pool = PoolLocked(pool_index);
  // Usually one tenant; keep the owners in first-seen order so events are deterministic.
  std::vector<std::shared_ptr<KvEvent>> by_tenant;
  std::vector<uint32_t> owners;  // by_tenant's tenant ids
  for (const Hash128& hash : hashes) {
    auto it = pool.index.find(EntryKey{medium, hash});
    if (it == pool.index.end()) continue;
    const uint32_t entry = *it;
    const uint32_t block_tenant = pool.entries[entry].tenant;
    size_t owner = 0;
    while (owner < owners.size() && owners[owner] != block_tenant) ++owner;
    if (owner == owners.size()) {
      auto event = std::make_shared<KvEvent>();
      event->kind = KvEventKind::kBlocksRemoved;
      event->pool = pool.name;
      event->tenant = tenants_[block_tenant];
      event->medium = pool.media[medium];
      event->block_size = pool.block_size;
      by_tenant.push_back(std::move(event));
      owners.push_back(block_tenant);
    }
    KvEvent& removed = *by_tenant[owner];
    removed.removed.push_back(hash);
    // The key a router stored the page by, from the event that announced it: only pages pay.
    const std::string& page_key = PageKeyOf(pool, entry);
    if (!page_key.empty() || !removed.page_keys.empty()) {
      removed.page_keys.resize(removed.removed.size() - 1);  // "" for the token blocks before
      removed.page_keys.push_back(page_key);
    }
    EraseLocked(pool, entry);
  }
  for (auto& event : by_tenant) AppendLocked(std::move(event));
}

uint32_t KvEventLog::FindEntry(const PoolInfo& pool, uint32_t preferred, const Hash128& hash) {
  auto it = pool.index.find(EntryKey{preferred, hash});
  if (it != pool.index.end()) return *it;
  for (uint32_t medium = 0; medium < pool.media.size(); ++medium) {
    if (medium == preferred) continue;
    it = pool.index.find(EntryKey{medium, hash});
    if (it != pool.index.end()) return *it;
  }
  return kNoEntry;
}

std::optional<KvEventLog::Announcement> KvEventLog::FindAnnounced(uint32_t pool_index,
                                                                  const Hash128& hash) const {
  absl::MutexLock lock(&mu_);
  const PoolInfo& pool = PoolLocked(pool_index);
  const uint32_t found = FindEntry(pool, 0, hash);
  if (found == kNoEntry) return std::nullopt;
  const Entry& entry = pool.entries[found];
  Announcement announcement{
      .tenant = tenants_[entry.tenant],
      .parent_hash = entry.has_parent ? std::optional<Hash128>(entry.parent_hash) : std::nullopt};
  if (entry.is_page) announcement.page = PageNameLocked(pool, found);
  return announcement;
}

uint64_t KvEventLog::next_sequence() const {
  absl::MutexLock lock(&mu_);
  return next_sequence_;
}

uint64_t KvEventLog::first_sequence() const {
  absl::MutexLock lock(&mu_);
  return buffer_.front()->sequence;
}

KvEventLog::ReadResult KvEventLog::Read(uint64_t start, size_t max_events) const {
  ReadResult result;
  result.next_sequence = start;
  absl::MutexLock lock(&mu_);
  const uint64_t first = buffer_.front()->sequence;
  if (start < first) {
    result.lost = true;
    return result;
  }
  for (uint64_t sequence = start; sequence < next_sequence_ && result.events.size() < max_events;
       ++sequence) {
    result.events.push_back(buffer_[sequence - first]);
  }
  result.next_sequence = start + result.events.size();
  return result;
}

bool KvEventLog::WaitFor(uint64_t start, absl::Duration timeout) const {
  absl::MutexLock lock(&mu_);
  auto arrived = [this, start]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return next_sequence_ > start; };
  return mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
}

absl::Time KvEventLog::FlushDeadline(uint64_t start) const {
  absl::MutexLock lock(&mu_);
  if (buffer_.empty() || start < buffer_.front()->sequence || start >= next_sequence_) {
    return clock_->Now();
  }
  return buffer_[start - buffer_.front()->sequence]->time + kKvEventFlushDelay;
}

void KvEventLog::WaitForFlush(uint64_t start) const {
  absl::SleepFor(FlushDeadline(start) - clock_->Now());
}

KvEventLog::Snapshot KvEventLog::TakeSnapshot(const KvEventFilter& filter) const {
  // Under mu_, only copies of the pools' compact indexes: a pool's events wait for mu_ under the
  // pool's own mutex, and building one event per block here stalled every pool for as long
  // (0.7 s per million indexed blocks). The copies' memory is made resident before: page faults
  // were most of the copy's time under mu_.
  std::vector<std::pair<uint32_t, PoolInfo::CopyShape>> shapes;
  {
    absl::ReaderMutexLock lock(&mu_);
    for (const auto& [pool_index, pool_info] : pools_) {
      if (!filter.pool.empty() && filter.pool != pool_info->name) continue;
      shapes.emplace_back(pool_index, pool_info->ShapeForCopy());
    }
  }
  std::vector<std::unique_ptr<PoolInfo>> pools;
  for (const auto& [pool_index, shape] : shapes) pools.push_back(PoolInfo::ReadyForCopy(shape));
  if (snapshot_hook_for_testing_) snapshot_hook_for_testing_(SnapshotStage::kShaped);
  Snapshot snapshot;
  std::vector<std::string> tenants;
  std::vector<std::string> manifests;
  absl::Time now;
  {
    absl::MutexLock lock(&mu_);
    if (snapshot_hook_for_testing_) snapshot_hook_for_testing_(SnapshotStage::kLocked);
    snapshot.next_sequence = next_sequence_;
    now = clock_->Now();
    for (size_t i = 0; i < shapes.size(); ++i) {
      PoolLocked(shapes[i].first).CopyForSnapshot(*pools[i]);  // pools are never removed
    }
    tenants = tenants_;
    manifests = manifests_;
  }
  if (snapshot_hook_for_testing_) snapshot_hook_for_testing_(SnapshotStage::kCopied);
  const uint64_t sequence = snapshot.next_sequence - 1;
  for (const std::unique_ptr<PoolInfo>& pool_copy : pools) {
    PoolInfo& pool = *pool_copy;
    pool.IndexInUse();
    // A parent before its children: emit each entry after its parent, when the parent is
    // indexed (in the child's medium if it is there, else in another: a block in tier 2 whose
    // parent is still in tier 1 only).
    std::vector<bool> emitted(pool.entries.size(), false);
    std::vector<uint32_t> chain;
    for (uint32_t id : pool.index) {
      chain.clear();
      uint32_t current = id;
      // The length bound stops a cycle, which only colliding test-weakened hashes could make.
      while (current != kNoEntry && !emitted[current] && chain.size() < pool.index.size()) {
        chain.push_back(current);
        const Entry& entry = pool.entries[current];
        if (!entry.has_parent) break;
        current = FindEntry(pool, entry.medium, entry.parent_hash);
      }
      for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
        emitted[*it] = true;
        const Entry& entry = pool.entries[*it];
        const std::string& tenant = tenants[entry.tenant];
        if (!filter.tenant.empty() && filter.tenant != tenant) continue;
        KvEvent event;
        event.sequence = sequence;
        event.time = now;
        event.kind = KvEventKind::kBlocksStored;
        event.pool = pool.name;
        event.tenant = tenant;
        event.medium = pool.media[entry.medium];
        event.block_size = pool.block_size;
        if (entry.has_parent) event.parent_hash = entry.parent_hash;
        event.blocks.push_back(StoredBlock{.hash = entry.hash,
                                           .token_ids = TokensOf(pool, *it),
                                           .extras_digest = entry.extras_digest});
        if (entry.is_page) {
          PageName name = PageNameIn(pool, *it, manifests);
          event.page_keys.push_back(std::move(name.key));
          event.manifest_digest = std::move(name.manifest_digest);
        }
        snapshot.events.push_back(std::move(event));
      }
    }
  }
  return snapshot;
}

size_t KvEventLog::indexed_blocks() const {
  absl::MutexLock lock(&mu_);
  size_t blocks = 0;
  for (const auto& [pool_index, pool] : pools_) blocks += pool->index.size();
  return blocks;
}

}  // namespace kvcache
