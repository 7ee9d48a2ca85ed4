// SlotTable: free slots first, then LRU eviction; pinned slots off the LRU and never evicted; the
// last unpin back at the most recent end (or, for a copy, before the cursor); drop and free.
// Every test ends with the table's invariants checked.
#include "tiers/slot_table.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using State = SlotTable::State;
constexpr uint32_t kNoSlot = SlotTable::kNoSlot;

Hash128 HashOf(uint64_t n) { return Hash128{n, n * 7 + 1}; }

class SlotTableTest : public ::testing::Test {
 protected:
  void TearDown() override { EXPECT_OK(table_.CheckInvariants("test table")); }

  // Takes a slot and publishes hash n in it; returns the slot.
  uint32_t Store(uint64_t n) {
    const SlotTable::Taken taken = table_.Take();
    EXPECT_NE(taken.slot, kNoSlot);
    if (taken.slot != kNoSlot) table_.Publish(taken.slot, HashOf(n));
    return taken.slot;
  }

  // The LRU's slots, least recently used first.
  std::vector<uint32_t> Lru() const {
    std::vector<uint32_t> slots;
    for (uint32_t slot = table_.Oldest(); slot != kNoSlot; slot = table_.Newer(slot)) {
      slots.push_back(slot);
    }
    return slots;
  }

  SlotTable table_{4};
};

TEST_F(SlotTableTest, FreeSlotsAreTakenLowestFirstBeforeAnyEviction) {
  EXPECT_EQ(table_.size(), 4u);
  EXPECT_EQ(table_.free_slots(), 4u);
  for (uint32_t expected = 0; expected < 4; ++expected) {
    const SlotTable::Taken taken = table_.Take();
    EXPECT_EQ(taken.slot, expected);
    EXPECT_FALSE(taken.evicted);
    EXPECT_EQ(table_.state(taken.slot), State::kFilling);
    EXPECT_OK(table_.CheckInvariants("test table"));
  }
  // Every slot filling: nothing to take, nothing on the LRU.
  EXPECT_EQ(table_.Take().slot, kNoSlot);
  EXPECT_THAT(Lru(), IsEmpty());
  for (uint32_t slot = 0; slot < 4; ++slot) table_.Publish(slot, HashOf(slot + 10));
  EXPECT_EQ(table_.records(), 4u);
  EXPECT_EQ(table_.Find(HashOf(12)), 2u);
  EXPECT_EQ(table_.Find(HashOf(99)), kNoSlot);
  EXPECT_THAT(Lru(), ElementsAre(0, 1, 2, 3));
}

TEST_F(SlotTableTest, FullTableEvictsTheLeastRecentlyUsed) {
  for (uint64_t n = 0; n < 4; ++n) Store(n);
  // A use of 0 (pin and unpin) makes it the most recent: 1 is the oldest now.
  table_.Pin(0);
  table_.Unpin(0);
  EXPECT_THAT(Lru(), ElementsAre(1, 2, 3, 0));
  SlotTable::Taken taken = table_.Take();
  EXPECT_EQ(taken.slot, 1u);
  EXPECT_TRUE(taken.evicted);
  EXPECT_FALSE(table_.Contains(HashOf(1)));
  EXPECT_EQ(table_.state(1), State::kFilling);
  table_.Publish(1, HashOf(4));
  EXPECT_THAT(Lru(), ElementsAre(2, 3, 0, 1));
  taken = table_.Take();
  EXPECT_EQ(taken.slot, 2u);
  EXPECT_TRUE(taken.evicted);
  table_.Free(2);  // the store failed: the slot is free again, and taken next
  EXPECT_EQ(table_.free_slots(), 1u);
  taken = table_.Take();
  EXPECT_EQ(taken.slot, 2u);
  EXPECT_FALSE(taken.evicted);
  table_.Publish(2, HashOf(5));
}

TEST_F(SlotTableTest, PinnedSlotsLeaveTheLruAndAreNeverEvicted) {
  for (uint64_t n = 0; n < 4; ++n) Store(n);
  table_.Pin(0);
  table_.Pin(0);  // two loads of one record
  table_.Pin(2);
  EXPECT_EQ(table_.pins(0), 2u);
  EXPECT_THAT(Lru(), ElementsAre(1, 3));
  EXPECT_OK(table_.CheckInvariants("test table"));
  // Eviction takes the oldest unpinned records, never a pinned one.
  EXPECT_EQ(table_.Take().slot, 1u);
  EXPECT_EQ(table_.Take().slot, 3u);
  EXPECT_EQ(table_.Take().slot, kNoSlot);
  EXPECT_TRUE(table_.Contains(HashOf(0)));
  EXPECT_TRUE(table_.Contains(HashOf(2)));
  table_.Publish(1, HashOf(10));
  table_.Publish(3, HashOf(11));
  // The first unpin of two leaves it pinned and off the LRU.
  table_.Unpin(0);
  EXPECT_THAT(Lru(), ElementsAre(1, 3));
  table_.Unpin(0);
  table_.Unpin(2);
  EXPECT_THAT(Lru(), ElementsAre(1, 3, 0, 2));
}

TEST_F(SlotTableTest, LastUnpinRejoinsAtTheMostRecentEnd) {
  for (uint64_t n = 0; n < 4; ++n) Store(n);
  table_.Pin(1);
  table_.Pin(0);
  table_.Unpin(0);
  table_.Unpin(1);
  // In unpin order, after every record that stayed on the LRU.
  EXPECT_THAT(Lru(), ElementsAre(2, 3, 0, 1));
  EXPECT_EQ(table_.Take().slot, 2u);
  table_.Publish(2, HashOf(20));
}

// A pin that only copies the record (use = false) puts it back before the cursor, where a walk
// from the oldest end found it, unless a use pinned it meanwhile.
TEST_F(SlotTableTest, CopyPinRejoinsBeforeTheCursor) {
  for (uint64_t n = 0; n < 4; ++n) Store(n);
  table_.set_cursor(2);
  table_.Pin(0, /*use=*/false);
  table_.Pin(1, /*use=*/false);
  EXPECT_THAT(Lru(), ElementsAre(2, 3));
  table_.Unpin(0);
  table_.Unpin(1);
  EXPECT_THAT(Lru(), ElementsAre(0, 1, 2, 3));
  // A use while copied: the most recent end.
  table_.Pin(0, /*use=*/false);
  table_.Pin(0);
  table_.Unpin(0);
  table_.Unpin(0);
  EXPECT_THAT(Lru(), ElementsAre(1, 2, 3, 0));
  // No cursor (the walk is past the LRU's end): the most recent end.
  table_.set_cursor(kNoSlot);
  table_.Pin(1, /*use=*/false);
  table_.Unpin(1);
  EXPECT_THAT(Lru(), ElementsAre(2, 3, 0, 1));
}

TEST_F(SlotTableTest, CursorMovesToTheNextNewerWhenItsSlotLeaves) {
  for (uint64_t n = 0; n < 4; ++n) Store(n);
  table_.set_cursor(1);
  table_.Pin(1);  // pinned: off the LRU
  EXPECT_EQ(table_.cursor(), 2u);
  table_.Drop(2);  // dropped
  EXPECT_EQ(table_.cursor(), 3u);
  table_.set_cursor(0);
  EXPECT_EQ(table_.Take().slot, 2u);  // the free slot first
  EXPECT_EQ(table_.Take().slot, 0u);  // then the oldest, evicted
  EXPECT_EQ(table_.cursor(), 3u);
  table_.Take();  // 3, the last on the LRU
  EXPECT_EQ(table_.cursor(), kNoSlot);
  table_.Unpin(1);
  table_.Free(0);
  table_.Free(2);
  table_.Free(3);
  EXPECT_THAT(Lru(), ElementsAre(1));
}

TEST_F(SlotTableTest, DropFreesAnUnpinnedSlotAtOnceAndAPinnedOneAtItsLastUnpin) {
  for (uint64_t n = 0; n < 3; ++n) Store(n);
  table_.Drop(1);
  EXPECT_FALSE(table_.Contains(HashOf(1)));
  EXPECT_EQ(table_.state(1), State::kFree);
  EXPECT_EQ(table_.records(), 2u);
  EXPECT_THAT(Lru(), ElementsAre(0, 2));
  // A pinned record leaves the index at once; its slot stays taken until the last unpin.
  table_.Pin(0);
  table_.Drop(0);
  EXPECT_EQ(table_.state(0), State::kDropped);
  EXPECT_EQ(table_.Find(HashOf(0)), kNoSlot);
  EXPECT_EQ(table_.free_slots(), 2u);
  EXPECT_OK(table_.CheckInvariants("test table"));
  // The same hash may be stored again meanwhile, in another slot: the most recently freed.
  EXPECT_EQ(Store(0), 1u);
  table_.Unpin(0);
  EXPECT_EQ(table_.state(0), State::kFree);
  EXPECT_THAT(Lru(), ElementsAre(2, 1));
  // Freed slots are taken most recently freed first.
  EXPECT_EQ(table_.Take().slot, 0u);
  EXPECT_EQ(table_.Take().slot, 3u);
  table_.Free(3);
  table_.Free(0);
}

// What the tiers turn into RESOURCE_EXHAUSTED (host tier) or a dropped store (disk tier).
TEST_F(SlotTableTest, FullTableWithEveryRecordPinnedHasNoSlot) {
  for (uint64_t n = 0; n < 4; ++n) Store(n);
  for (uint32_t slot = 0; slot < 4; ++slot) table_.Pin(slot);
  EXPECT_THAT(Lru(), IsEmpty());
  const SlotTable::Taken taken = table_.Take();
  EXPECT_EQ(taken.slot, kNoSlot);
  EXPECT_FALSE(taken.evicted);
  EXPECT_EQ(table_.records(), 4u);
  table_.Unpin(3);
  EXPECT_EQ(table_.Take().slot, 3u);
  table_.Free(3);
  for (uint32_t slot = 0; slot < 3; ++slot) table_.Unpin(slot);
}

TEST_F(SlotTableTest, RestoredRecordsAreOnTheLruInRestoreOrderAndOffTheFreeList) {
  table_.Restore(2, HashOf(2));
  table_.Restore(0, HashOf(0));
  EXPECT_THAT(Lru(), ElementsAre(2, 0));
  EXPECT_EQ(table_.Find(HashOf(2)), 2u);
  EXPECT_EQ(table_.Take().slot, 1u);  // the free ones, lowest first
  EXPECT_EQ(table_.Take().slot, 3u);
  const SlotTable::Taken taken = table_.Take();
  EXPECT_EQ(taken.slot, 2u);
  EXPECT_TRUE(taken.evicted);
  table_.Free(1);
  table_.Free(2);
  table_.Free(3);
}

}  // namespace
}  // namespace kvcache
