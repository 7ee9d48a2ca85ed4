#include "tiers/slot_table.h"

#include "absl/strings/str_cat.h"

namespace kvcache {

SlotTable::SlotTable(uint32_t slots) : slots_(slots) {
  index_.reserve(slots);
  for (uint32_t slot = 0; slot < slots; ++slot) free_.PushBack(slot, LinksOf());
}

SlotTable::Taken SlotTable::Take() {
  Taken taken;
  if (free_.size() > 0) {
    taken.slot = free_.front();
    free_.Remove(taken.slot, LinksOf());
  } else if (lru_.size() > 0) {
    taken.slot = lru_.front();
    taken.evicted = true;
    LruRemove(taken.slot);
    index_.erase(slots_[taken.slot].hash);
  } else {
    return taken;
  }
  slots_[taken.slot].state = State::kFilling;
  return taken;
}

void SlotTable::Publish(uint32_t slot, const Hash128& hash) {
  Slot& s = slots_[slot];
  s.state = State::kStored;
  s.hash = hash;
  index_.emplace(hash, slot);
  lru_.PushBack(slot, LinksOf());
}

void SlotTable::Restore(uint32_t slot, const Hash128& hash) {
  free_.Remove(slot, LinksOf());
  Publish(slot, hash);
}

void SlotTable::Pin(uint32_t slot, bool use) {
  Slot& s = slots_[slot];
  if (s.pins++ == 0) LruRemove(slot);
  s.used = s.used || use;
}

void SlotTable::Unpin(uint32_t slot) {
  Slot& s = slots_[slot];
  if (--s.pins > 0) return;
  if (s.state == State::kDropped) {
    Free(slot);
  } else if (s.used || cursor_ == kNoSlot) {
    lru_.PushBack(slot, LinksOf());
  } else {
    lru_.InsertBefore(slot, cursor_, LinksOf());
  }
  s.used = false;
}

void SlotTable::Drop(uint32_t slot) {
  Slot& s = slots_[slot];
  index_.erase(s.hash);
  if (s.pins > 0) {
    s.state = State::kDropped;
    return;
  }
  LruRemove(slot);
  Free(slot);
}

void SlotTable::LruRemove(uint32_t slot) {
  if (slot == cursor_) cursor_ = slots_[slot].links.next;
  lru_.Remove(slot, LinksOf());
}

void SlotTable::Free(uint32_t slot) {
  slots_[slot] = Slot{};
  free_.PushFront(slot, LinksOf());
}

absl::Status SlotTable::CheckInvariants(absl::string_view name) const {
  auto fail = [name](auto&&... parts) {
    return absl::InternalError(absl::StrCat(name, ": ", parts...));
  };
  // Which list each slot is on, from walking both.
  enum : uint8_t { kOnNone, kOnFree, kOnLru };
  std::vector<uint8_t> on(slots_.size(), kOnNone);
  auto walk = [&](const List& list, uint8_t mark, absl::string_view what) -> absl::Status {
    uint32_t length = 0;
    uint32_t previous = kNoSlot;
    for (uint32_t slot = list.front(); slot != kNoSlot; slot = slots_[slot].links.next) {
      if (slot >= slots_.size() || on[slot] != kOnNone) {
        return fail(what, " reaches slot ", slot, " twice or out of range");
      }
      if (slots_[slot].links.prev != previous) return fail(what, " link broken at ", slot);
      on[slot] = mark;
      previous = slot;
      ++length;
    }
    if (previous != list.back() || length != list.size()) {
      return fail(what, " holds ", length, " slots but counts ", list.size());
    }
    return absl::OkStatus();
  };
  if (absl::Status status = walk(free_, kOnFree, "free list"); !status.ok()) return status;
  if (absl::Status status = walk(lru_, kOnLru, "LRU"); !status.ok()) return status;
  uint64_t stored = 0;
  for (uint32_t slot = 0; slot < slots_.size(); ++slot) {
    const Slot& s = slots_[slot];
    switch (s.state) {
      case State::kFree:
      case State::kFilling:
        if (s.pins != 0) return fail("unstored slot ", slot, " is pinned");
        if ((on[slot] == kOnFree) != (s.state == State::kFree) || on[slot] == kOnLru) {
          return fail("slot ", slot, " is free or filling but on the wrong list");
        }
        break;
      case State::kStored: {
        ++stored;
        if (Find(s.hash) != slot) {
          return fail("slot ", slot, " holds hash ", s.hash.ToHex(), " not indexed to it");
        }
        // On the LRU exactly when unpinned.
        if ((on[slot] == kOnLru) != (s.pins == 0) || on[slot] == kOnFree) {
          return fail("stored slot ", slot, " with ", s.pins, " pins is on the wrong list");
        }
        break;
      }
      case State::kDropped:
        if (s.pins == 0) return fail("dropped slot ", slot, " is not pinned");
        if (on[slot] != kOnNone) return fail("dropped slot ", slot, " is on a list");
        if (Find(s.hash) == slot) return fail("dropped slot ", slot, " is still indexed");
        break;
    }
    if (s.used && s.pins == 0) return fail("unpinned slot ", slot, " marked used");
  }
  if (index_.size() != stored) {
    return fail("index holds ", index_.size(), " hashes but ", stored, " slots");
  }
  if (cursor_ != kNoSlot && (cursor_ >= slots_.size() || on[cursor_] != kOnLru)) {
    return fail("cursor ", cursor_, " is off the LRU");
  }
  return absl::OkStatus();
}

}  // namespace kvcache
