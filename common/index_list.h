// IndexList: a doubly linked list threaded through the entries of a table by index — the LRUs
// whose entries live in fixed arrays (BlockPool's blocks, the lower tiers' SlotTable). Each entry
// holds its Links; the list holds its ends and length and reaches an entry's links through a
// callable `links(id) -> Links&`. Every operation is O(1) and allocates nothing.
//
// Thread safety: none; the owner serializes.
#ifndef KVCACHE_COMMON_INDEX_LIST_H_
#define KVCACHE_COMMON_INDEX_LIST_H_

#include <cstdint>

namespace kvcache {

template <typename Id, Id kNil>
class IndexList {
 public:
  struct Links {
    Id prev = kNil;
    Id next = kNil;
  };

  Id front() const { return head_; }
  Id back() const { return tail_; }
  uint32_t size() const { return size_; }

  template <typename LinksOf>
  void PushBack(Id id, LinksOf&& links) {
    Links& entry = links(id);
    entry.prev = tail_;
    entry.next = kNil;
    if (tail_ != kNil) {
      links(tail_).next = id;
    } else {
      head_ = id;
    }
    tail_ = id;
    ++size_;
  }

  template <typename LinksOf>
  void PushFront(Id id, LinksOf&& links) {
    if (head_ == kNil) {
      PushBack(id, links);
    } else {
      InsertBefore(id, head_, links);
    }
  }

  // REQUIRES: `next` is on the list.
  template <typename LinksOf>
  void InsertBefore(Id id, Id next, LinksOf&& links) {
    Links& entry = links(id);
    Links& after = links(next);
    entry.next = next;
    entry.prev = after.prev;
    if (after.prev != kNil) {
      links(after.prev).next = id;
    } else {
      head_ = id;
    }
    after.prev = id;
    ++size_;
  }

  // REQUIRES: `id` is on the list.
  template <typename LinksOf>
  void Remove(Id id, LinksOf&& links) {
    Links& entry = links(id);
    if (entry.prev != kNil) {
      links(entry.prev).next = entry.next;
    } else {
      head_ = entry.next;
    }
    if (entry.next != kNil) {
      links(entry.next).prev = entry.prev;
    } else {
      tail_ = entry.prev;
    }
    entry.prev = entry.next = kNil;
    --size_;
  }

 private:
  Id head_ = kNil;  // the front: the least recently used of an LRU
  Id tail_ = kNil;
  uint32_t size_ = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_COMMON_INDEX_LIST_H_
