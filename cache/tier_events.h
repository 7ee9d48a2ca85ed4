// TierEvents: announces a pool's lower tiers in the KV event log (cache/kv_event_log.h), each with
// its medium — tier 2 kKvMediumCpuPinned, the disk tier kKvMediumDisk, the cluster tier
// kKvMediumExternal — so a KV-aware router learns what a node can load without recomputing.
//
// A record carries no tenant name and no sign that it starts its prompt (its parent hash is then
// the namespace's root, which is never announced), both of which a BlocksStored event needs.
// Each record takes them from its block's announcement in another medium of the pool (tier 1
// while the mover copies it down, tier 2 while the disk writes it); failing that (a record a
// restart found on disk, or one whose block left every other tier meanwhile), the tenant is
// unknown ("": only an unscoped watcher, e.g. a router, sees it) and the record starts its prompt
// when its prefix digest is that of a first block with these tokens and no extra keys
// (BlockHasher::PrefixDigest from the namespace digest) — a first block with extra keys (LoRA,
// multimodal) is then announced under its root, which a router skips.
//
// Pages (DESIGN §13) are announced as tier 1 announces them: one page an event, no parent, no
// tokens, named by the engine's key (KvEvent::page_keys) and manifest digest, both taken from
// the page's announcement in another medium. A page record a restart found on disk has none:
// its key is read back from its tokens (the key's first bytes, zero-padded) at the length whose
// PageKeyDigest matches the record's prefix digest; its manifest digest stays unknown.
//
// Thread safety: thread-safe (the log is); holds no lock of its own.
#ifndef KVCACHE_CACHE_TIER_EVENTS_H_
#define KVCACHE_CACHE_TIER_EVENTS_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cache/kv_event_log.h"
#include "common/block_hash.h"
#include "tiers/block_record.h"
#include "tiers/record_changes.h"

namespace kvcache {

class TierEvents {
 public:
  // `events` must outlive this object and every listener made from it.
  TierEvents(KvEventLog* events, uint32_t pool_index, HashAlgorithm hash_algorithm,
             uint32_t block_size);

  // A tier's listener: its records announced with `medium`. Keeps `self` alive.
  static RecordChangeListener ListenerFor(std::shared_ptr<TierEvents> self, std::string medium);

  // Records stored or removed, in order: runs of stores that form a chain are one event.
  void Announce(absl::string_view medium, absl::Span<const RecordChange> changes,
                KvEventRetention retention = KvEventRetention::kIndexed);
  // Records a tier already held when the pool was created (the disk tier after a restart), in
  // an order where a parent found among them comes before its children.
  void AnnounceRestored(absl::string_view medium, std::vector<BlockRecordIdentity> records);

 private:
  // The tenant and the event parent of a record (see the header comment).
  KvEventLog::Announcement Resolve(const BlockRecordIdentity& record) const;
  bool StartsItsPrompt(const BlockRecordIdentity& record) const;
  // A page record's engine key, read back from its tokens; nullopt for a token block's record.
  std::optional<std::string> RecoverPageKey(const BlockRecordIdentity& record) const;

  KvEventLog* const events_;
  const uint32_t pool_index_;
  const HashAlgorithm hash_algorithm_;
  const uint64_t no_extras_digest_;  // ExtrasDigest of a first block without extra keys
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_TIER_EVENTS_H_
