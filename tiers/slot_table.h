// SlotTable: the bookkeeping of a lower tier's fixed slots (HostTier's memory, DiskTier's file):
// each slot's state and pins, the hash -> slot index, the free list and the LRU. The tier keeps
// what a slot holds (its record's identity, its bytes) in arrays of its own, by slot number.
//
// A slot is free, filling (taken by a store, private to it until published or freed), stored
// (indexed under its record's hash) or dropped (out of the index, still pinned: freed by its
// last unpin). Only stored, unpinned slots are on the LRU, as in LevelDB's cache (util/cache.cc,
// in_use_ vs lru_): a pin takes a slot off it, so eviction never has to step over pinned slots,
// and the last unpin puts it back at the most recently used end. Take is "a free slot, else the
// least recently used record's".
//
// One exception to "the last unpin makes it the most recent", for a pin that only copies a record
// (the host tier's copy down to the tier below: not a hit): unless a use pinned it too, the slot
// goes back just before the cursor, the owner's place in a walk of the LRU from its oldest end,
// which is where that walk found it. The cursor is kept on the LRU: when its slot leaves, it moves
// to the next newer one.
//
// Thread safety: thread-compatible; the owning tier's mutex guards it.
#ifndef KVCACHE_TIERS_SLOT_TABLE_H_
#define KVCACHE_TIERS_SLOT_TABLE_H_

#include <cstdint>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/block_hash.h"
#include "common/index_list.h"

namespace kvcache {

class SlotTable {
 public:
  static constexpr uint32_t kNoSlot = ~uint32_t{0};
  enum class State : uint8_t { kFree, kFilling, kStored, kDropped };

  // `slots` free slots, taken lowest first. REQUIRES: 0 < slots < kNoSlot.
  explicit SlotTable(uint32_t slots);

  uint32_t size() const { return static_cast<uint32_t>(slots_.size()); }
  uint32_t free_slots() const { return free_.size(); }
  uint32_t records() const { return static_cast<uint32_t>(index_.size()); }  // stored slots
  State state(uint32_t slot) const { return slots_[slot].state; }
  uint32_t pins(uint32_t slot) const { return slots_[slot].pins; }

  // The stored slot under `hash`, or kNoSlot.
  uint32_t Find(const Hash128& hash) const {
    auto it = index_.find(hash);
    return it == index_.end() ? kNoSlot : it->second;
  }
  bool Contains(const Hash128& hash) const { return index_.contains(hash); }

  // The LRU, oldest first: Oldest(), then Newer(slot) until kNoSlot.
  uint32_t Oldest() const { return lru_.front(); }
  uint32_t Newer(uint32_t slot) const { return slots_[slot].links.next; }

  // A free slot, else the least recently used record's (evicted: out of the index; the caller
  // still has its identity in its own arrays), now filling. kNoSlot when no slot is free and every
  // record is pinned.
  struct Taken {
    uint32_t slot = kNoSlot;
    bool evicted = false;
  };
  Taken Take();
  // Publishes a filling slot under `hash` as the most recently used record.
  // REQUIRES: `hash` is not indexed.
  void Publish(uint32_t slot, const Hash128& hash);
  // Returns a filling slot to the free list.
  void Free(uint32_t slot);
  // Stores a record found in a free slot (a restart's scan) as the most recently used one.
  // REQUIRES: `hash` is not indexed.
  void Restore(uint32_t slot, const Hash128& hash);

  // Pins a stored slot: off the LRU until its last Unpin. `use`: the pin reads the record for a
  // hit, which makes it the most recently used; otherwise see the header comment.
  void Pin(uint32_t slot, bool use = true);
  // The last unpin frees a dropped slot and puts a stored one back on the LRU: at the most recent
  // end, or before the cursor when no pin since it left was a use.
  void Unpin(uint32_t slot);
  // Takes a stored record out of the index (and the LRU): its slot is free now, or at its last
  // Unpin while pinned.
  void Drop(uint32_t slot);

  // A walk's place in the LRU (see the header comment): a slot on it, or kNoSlot (past its end).
  uint32_t cursor() const { return cursor_; }
  void set_cursor(uint32_t slot) { cursor_ = slot; }

  // States, pins, index, free list, LRU and cursor agree. O(slots). `name` prefixes messages.
  absl::Status CheckInvariants(absl::string_view name) const;

 private:
  using List = IndexList<uint32_t, kNoSlot>;
  struct Slot {
    State state = State::kFree;
    bool used = false;  // a use pinned it since it left the LRU
    uint32_t pins = 0;
    List::Links links;  // on the free list (free) or the LRU (stored, unpinned)
    Hash128 hash;       // stored or dropped: its record's
  };

  auto LinksOf() {
    return [this](uint32_t slot) -> List::Links& { return slots_[slot].links; };
  }
  void LruRemove(uint32_t slot);

  std::vector<Slot> slots_;
  absl::flat_hash_map<Hash128, uint32_t> index_;  // stored records
  List free_;                                     // taken from the front: freed last, or lowest
  List lru_;                                      // least recently used at the front
  uint32_t cursor_ = kNoSlot;
};

}  // namespace kvcache

#endif  // KVCACHE_TIERS_SLOT_TABLE_H_
