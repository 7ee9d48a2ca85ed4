#include "cache/kv_event_log.h"

#include <cassert>
#include <utility>

#include "absl/container/flat_hash_set.h"

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

void KvEventLog::AddPool(uint32_t pool_index, std::string name, std::string medium,
                         uint32_t block_size) {
  absl::MutexLock lock(&mu_);
  pools_[pool_index] =
      PoolInfo{.name = std::move(name), .media = {std::move(medium)}, .block_size = block_size};
}

const KvEventLog::PoolInfo& KvEventLog::PoolLocked(uint32_t pool_index) const {
  auto it = pools_.find(pool_index);
  assert(it != pools_.end());
  return it->second;
}

uint32_t KvEventLog::MediumLocked(uint32_t pool_index, absl::string_view medium) {
  auto it = pools_.find(pool_index);
  assert(it != pools_.end());
  std::vector<std::string>& media = it->second.media;
  for (uint32_t i = 0; i < media.size(); ++i) {
    if (media[i] == medium) return i;
  }
  media.emplace_back(medium);
  return static_cast<uint32_t>(media.size() - 1);
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

void KvEventLog::PageStored(uint32_t pool_index, absl::string_view tenant, StoredBlock block,
                            PageName name) {
  auto event = NewPageEvent(tenant, std::move(block), std::move(name));
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
  const PoolInfo& pool = PoolLocked(pool_index);
  event->pool = pool.name;
  event->medium = pool.media[medium];
  event->block_size = pool.block_size;
  if (retention == KvEventRetention::kIndexed) {
    for (uint32_t position = 0; position < event->blocks.size(); ++position) {
      index_.insert_or_assign(IndexKey{pool_index, medium, event->blocks[position].hash},
                              IndexEntry{.stored_in = event, .position = position});
    }
  }
  AppendLocked(std::move(event));
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
  const PoolInfo& pool = PoolLocked(pool_index);
  // Usually one tenant; keep the owners in first-seen order so events are deterministic.
  std::vector<std::shared_ptr<KvEvent>> by_tenant;
  for (const Hash128& hash : hashes) {
    auto it = index_.find(IndexKey{pool_index, medium, hash});
    if (it == index_.end()) continue;
    std::shared_ptr<KvEvent>* owner = nullptr;
    const std::string& block_tenant = it->second.stored_in->tenant;
    for (auto& event : by_tenant) {
      if (event->tenant == block_tenant) owner = &event;
    }
    if (owner == nullptr) {
      auto event = std::make_shared<KvEvent>();
      event->kind = KvEventKind::kBlocksRemoved;
      event->pool = pool.name;
      event->tenant = block_tenant;
      event->medium = pool.media[medium];
      event->block_size = pool.block_size;
      by_tenant.push_back(std::move(event));
      owner = &by_tenant.back();
    }
    KvEvent& removed = **owner;
    removed.removed.push_back(hash);
    // The key a router stored the page by, from the event that announced it: only pages pay.
    const std::string& page_key = it->second.page_key();
    if (!page_key.empty() || !removed.page_keys.empty()) {
      removed.page_keys.resize(removed.removed.size() - 1);  // "" for the token blocks before
      removed.page_keys.push_back(page_key);
    }
    index_.erase(it);
  }
  for (auto& event : by_tenant) AppendLocked(std::move(event));
}

const KvEventLog::IndexSlot* KvEventLog::FindLocked(uint32_t pool_index, uint32_t preferred,
                                                    const Hash128& hash) const {
  auto it = index_.find(IndexKey{pool_index, preferred, hash});
  if (it != index_.end()) return &*it;
  const uint32_t media = static_cast<uint32_t>(PoolLocked(pool_index).media.size());
  for (uint32_t medium = 0; medium < media; ++medium) {
    if (medium == preferred) continue;
    it = index_.find(IndexKey{pool_index, medium, hash});
    if (it != index_.end()) return &*it;
  }
  return nullptr;
}

std::optional<KvEventLog::Announcement> KvEventLog::FindAnnounced(uint32_t pool_index,
                                                                  const Hash128& hash) const {
  absl::MutexLock lock(&mu_);
  const IndexSlot* found = FindLocked(pool_index, 0, hash);
  if (found == nullptr) return std::nullopt;
  Announcement announcement{.tenant = found->second.stored_in->tenant,
                            .parent_hash = found->second.parent_hash()};
  if (const std::string& key = found->second.page_key(); !key.empty()) {
    announcement.page =
        PageName{.key = key, .manifest_digest = found->second.stored_in->manifest_digest};
  }
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
  Snapshot snapshot;
  absl::MutexLock lock(&mu_);
  snapshot.next_sequence = next_sequence_;
  const uint64_t sequence = next_sequence_ - 1;
  const absl::Time now = clock_->Now();
  // A parent before its children: emit each entry after its parent, when the parent is indexed
  // (in the child's medium if it is there, else in another: a block in tier 2 whose parent is
  // still in tier 1 only).
  absl::flat_hash_set<IndexKey> emitted;
  emitted.reserve(index_.size());
  std::vector<const IndexSlot*> chain;
  for (const auto& entry : index_) {
    chain.clear();
    const IndexSlot* current = &entry;
    // The length bound stops a cycle, which only colliding test-weakened hashes could make.
    while (current != nullptr && !emitted.contains(current->first) &&
           chain.size() < index_.size()) {
      chain.push_back(current);
      const std::optional<Hash128> parent = current->second.parent_hash();
      if (!parent.has_value()) break;
      current = FindLocked(current->first.pool_index, current->first.medium, *parent);
    }
    for (auto it = chain.rbegin(); it != chain.rend(); ++it) {
      const auto& [key, value] = **it;
      emitted.insert(key);
      const PoolInfo& pool = PoolLocked(key.pool_index);
      if (!filter.pool.empty() && filter.pool != pool.name) continue;
      const std::string& tenant = value.stored_in->tenant;
      if (!filter.tenant.empty() && filter.tenant != tenant) continue;
      KvEvent event;
      event.sequence = sequence;
      event.time = now;
      event.kind = KvEventKind::kBlocksStored;
      event.pool = pool.name;
      event.tenant = tenant;
      event.medium = pool.media[key.medium];
      event.block_size = pool.block_size;
      event.parent_hash = value.parent_hash();
      event.blocks.push_back(value.block());
      if (const std::string& key = value.page_key(); !key.empty()) {
        event.page_keys.push_back(key);
        event.manifest_digest = value.stored_in->manifest_digest;
      }
      snapshot.events.push_back(std::move(event));
    }
  }
  return snapshot;
}

size_t KvEventLog::indexed_blocks() const {
  absl::MutexLock lock(&mu_);
  return index_.size();
}

}  // namespace kvcache
