#include "cache/tier_events.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "cache/pool.h"

namespace kvcache {

TierEvents::TierEvents(KvEventLog* events, uint32_t pool_index, HashAlgorithm hash_algorithm,
                       uint32_t block_size)
    : events_(events),
      pool_index_(pool_index),
      hash_algorithm_(hash_algorithm),
      no_extras_digest_(BlockHasher(hash_algorithm).ExtrasDigest(ExtraKeys{}, 0, block_size)) {}

RecordChangeListener TierEvents::ListenerFor(std::shared_ptr<TierEvents> self, std::string medium) {
  return [self = std::move(self), medium = std::move(medium)](
             absl::Span<const RecordChange> changes) { self->Announce(medium, changes); };
}

bool TierEvents::StartsItsPrompt(const BlockRecordIdentity& record) const {
  if (record.extras_digest != no_extras_digest_) return false;
  return BlockHasher(hash_algorithm_)
             .PrefixDigest(record.namespace_digest, record.tokens, ExtraKeys{}, 0) ==
         record.prefix_digest;
}

std::optional<std::string> TierEvents::RecoverPageKey(const BlockRecordIdentity& record) const {
  const size_t token_bytes = record.tokens.size() * sizeof(uint32_t);
  std::string bytes(token_bytes, '\0');
  if (token_bytes > 0) std::memcpy(bytes.data(), record.tokens.data(), token_bytes);
  const size_t longest = std::min(token_bytes, kMaxPageKeyBytes);
  // A page's tokens are zero past its key; a token block's rarely are past 64 bytes.
  if (bytes.find_first_not_of('\0', longest) != std::string::npos) return std::nullopt;
  const size_t last_nonzero = bytes.find_last_not_of('\0', longest == 0 ? 0 : longest - 1);
  // The key may end in zero bytes: every length from its last non-zero byte up is a candidate.
  size_t shortest = last_nonzero == std::string::npos ? 1 : last_nonzero + 1;
  BlockHasher hasher(hash_algorithm_);
  for (size_t length = shortest; length <= longest; ++length) {
    const absl::string_view key(bytes.data(), length);
    if (hasher.PageKeyDigest(record.namespace_digest, key) == record.prefix_digest) {
      return std::string(key);
    }
  }
  return std::nullopt;
}

KvEventLog::Announcement TierEvents::Resolve(const BlockRecordIdentity& record) const {
  std::optional<KvEventLog::Announcement> announced =
      events_->FindAnnounced(pool_index_, record.hash);
  if (announced.has_value()) return *std::move(announced);
  if (std::optional<std::string> key = RecoverPageKey(record); key.has_value()) {
    return KvEventLog::Announcement{
        .tenant = "", .parent_hash = std::nullopt, .page = PageName{.key = *std::move(key)}};
  }
  return KvEventLog::Announcement{.tenant = "",
                                  .parent_hash = StartsItsPrompt(record)
                                                     ? std::nullopt
                                                     : std::optional<Hash128>(record.parent_hash)};
}

void TierEvents::Announce(absl::string_view medium, absl::Span<const RecordChange> changes,
                          KvEventRetention retention) {
  // Consecutive changes of one kind go out together, in order; a store continues the pending
  // chain when it is its last block's child of the same tenant.
  std::vector<StoredBlock> chain;
  KvEventLog::Announcement chain_start;
  std::vector<Hash128> removed;
  const auto flush = [&] {
    if (!chain.empty()) {
      events_->BlocksStoredIn(pool_index_, medium, chain_start.tenant, chain_start.parent_hash,
                              std::move(chain), retention);
      chain.clear();
    }
    if (!removed.empty()) {
      events_->BlocksRemovedFrom(pool_index_, medium, removed);
      removed.clear();
    }
  };
  for (const RecordChange& change : changes) {
    const BlockRecordIdentity& record = change.record;
    if (change.kind == RecordChange::Kind::kRemoved) {
      if (!chain.empty()) flush();
      removed.push_back(record.hash);
      continue;
    }
    if (!removed.empty()) flush();
    KvEventLog::Announcement announced = Resolve(record);
    if (announced.page.has_value()) {
      flush();
      events_->PageStoredIn(
          pool_index_, medium, announced.tenant,
          StoredBlock{.hash = record.hash, .token_ids = {}, .extras_digest = record.extras_digest},
          *std::move(announced.page), retention);
      continue;
    }
    const bool continues = !chain.empty() && announced.tenant == chain_start.tenant &&
                           announced.parent_hash == chain.back().hash;
    if (!continues) {
      flush();
      chain_start = std::move(announced);
    }
    chain.push_back(
        StoredBlock{.hash = record.hash,
                    .token_ids = BlockTokenIds(record.tokens.begin(), record.tokens.end()),
                    .extras_digest = record.extras_digest});
  }
  flush();
}

void TierEvents::AnnounceRestored(absl::string_view medium,
                                  std::vector<BlockRecordIdentity> records) {
  absl::flat_hash_map<Hash128, size_t> by_hash;
  by_hash.reserve(records.size());
  for (size_t i = 0; i < records.size(); ++i) by_hash.emplace(records[i].hash, i);
  std::vector<bool> placed(records.size(), false);
  std::vector<RecordChange> ordered;
  ordered.reserve(records.size());
  std::vector<size_t> path;
  for (size_t i = 0; i < records.size(); ++i) {
    // Up to the first ancestor already placed or not on disk, then back down. The length bound
    // stops a cycle, which only colliding test-weakened hashes could make.
    path.clear();
    for (size_t at = i; !placed[at] && path.size() < records.size();) {
      path.push_back(at);
      auto parent = by_hash.find(records[at].parent_hash);
      if (parent == by_hash.end()) break;
      at = parent->second;
    }
    for (auto it = path.rbegin(); it != path.rend(); ++it) {
      if (placed[*it]) continue;
      placed[*it] = true;
      ordered.push_back(RecordChange{RecordChange::Kind::kStored, std::move(records[*it])});
    }
  }
  Announce(medium, ordered);
}

}  // namespace kvcache
