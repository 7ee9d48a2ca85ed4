#include "cache/block_pool.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"

namespace kvcache {

BlockPool::BlockPool(uint32_t num_blocks, uint32_t block_size)
    : block_size_(block_size),
      blocks_(num_blocks),
      tokens_(num_blocks, block_size),
      index_(/*bucket_count=*/0, IndexHash{&blocks_}, IndexEq{&blocks_, &tokens_}) {
  // Reverse order so that blocks are handed out from id 0 upwards, which keeps tests readable.
  for (uint32_t i = num_blocks; i > 0; --i) PushFree(i - 1);
  index_.reserve(num_blocks);
}

void BlockPool::PushFree(BlockId block) {
  blocks_[block].lru.next = free_head_;
  free_head_ = block;
  ++num_free_;
}

std::vector<uint32_t> BlockPool::TokensOf(BlockId block) const {
  std::vector<uint32_t> tokens(block_size_);
  tokens_.CopyTo(block, tokens.data());
  return tokens;
}

const Hash128& BlockPool::ParentHashOf(BlockId block) const {
  const BlockMeta& meta = blocks_[block];
  if (meta.parent_block != kNoBlock) return blocks_[meta.parent_block].hash;
  return roots_.find(block)->second;
}

BlockIdentity BlockPool::IdentityOf(BlockId block) const {
  const BlockMeta& meta = blocks_[block];
  if (!meta.published) return BlockIdentity{};
  return BlockIdentity{.hash = meta.hash,
                       .parent_hash = ParentHashOf(block),
                       .parent_block = meta.parent_block,
                       .extras_digest = meta.extras_digest,
                       .namespace_digest = meta.namespace_digest,
                       .prefix_digest = meta.prefix_digest};
}

BlockId BlockPool::Indexed(const Hash128& hash) const {
  auto it = index_.find(hash);
  return it == index_.end() ? kNoBlock : *it;
}

BlockId BlockPool::FindVerified(const BlockIdentity& expected,
                                absl::Span<const uint32_t> tokens) const {
  const BlockId block = Indexed(expected.hash);
  if (block == kNoBlock) return kNoBlock;
  const BlockMeta& stored = blocks_[block];
  if (stored.parent_block != expected.parent_block ||
      stored.extras_digest != expected.extras_digest ||
      stored.namespace_digest != expected.namespace_digest ||
      stored.prefix_digest != expected.prefix_digest ||
      ParentHashOf(block) != expected.parent_hash) {
    return kNoBlock;
  }
  if (!tokens_.Equals(block, tokens)) return kNoBlock;
  return block;
}

void BlockPool::Acquire(BlockId block, bool prefix_hit) {
  BlockMeta& meta = blocks_[block];
  assert(meta.state != State::kFree);
  if (meta.state == State::kEvictable) {
    LruRemove(block);
    meta.state = State::kReferenced;
    if (prefix_hit) ++counters_.resurrections;
  }
  if (meta.offload_pinned) meta.used_while_pinned = true;
  ++meta.ref_count;
}

BlockId BlockPool::AllocateFresh(std::vector<Hash128>* removed) {
  BlockId block = kNoBlock;
  if (free_head_ != kNoBlock) {
    block = free_head_;
    free_head_ = blocks_[block].lru.next;
    blocks_[block].lru.next = kNoBlock;
    --num_free_;
  } else if (lru_.front() != kNoBlock) {
    block = lru_.front();
    LruRemove(block);
    if (blocks_[block].offloaded) ++counters_.evicted_offloaded;
    Unpublish(block, removed);
  } else {
    return kNoBlock;
  }
  BlockMeta& meta = blocks_[block];
  meta.state = State::kReferenced;
  meta.ref_count = 1;
  meta.has_checksum = false;
  meta.offloaded = false;
  meta.in_cluster = false;
  meta.reused = false;
  return block;
}

void BlockPool::Evict(BlockId block, std::vector<Hash128>* removed) {
  BlockMeta& meta = blocks_[block];
  assert(meta.state == State::kEvictable && !meta.offload_pinned);
  LruRemove(block);
  Unpublish(block, removed);
  meta.state = State::kFree;
  meta.has_checksum = false;
  PushFree(block);
}

void BlockPool::PinForOffload(BlockId block) {
  BlockMeta& meta = blocks_[block];
  assert(meta.state == State::kEvictable && !meta.offload_pinned);
  const BlockId next = meta.lru.next;
  LruRemove(block);
  meta.lru.next = next;  // where UnpinOffloaded puts it back
  meta.state = State::kReferenced;
  meta.ref_count = 1;
  meta.offload_pinned = true;
  meta.used_while_pinned = false;
}

void BlockPool::UnpinOffloaded(BlockId block, bool offloaded) {
  BlockMeta& meta = blocks_[block];
  assert(meta.offload_pinned && meta.ref_count > 0);
  meta.offload_pinned = false;
  if (offloaded && meta.published) meta.offloaded = true;
  const BlockId next = meta.lru.next;
  meta.lru.next = kNoBlock;
  if (--meta.ref_count > 0) return;
  if (!meta.published) {
    meta.state = State::kFree;
    PushFree(block);
    return;
  }
  meta.state = State::kEvictable;
  if (meta.used_while_pinned || next == kNoBlock) {
    LruPushBack(block);
  } else if (blocks_[next].state == State::kEvictable) {
    LruInsertBefore(block, next);  // back where it was
  } else {
    // Its successor was evicted (so was everything older: it is the oldest now) or resurrected.
    LruPushFront(block);
  }
}

void BlockPool::Release(BlockId block) {
  BlockMeta& meta = blocks_[block];
  assert(meta.ref_count > 0);
  if (--meta.ref_count > 0) return;
  if (meta.published) {
    meta.state = State::kEvictable;
    LruPushBack(block);
  } else {
    meta.state = State::kFree;
    PushFree(block);
  }
}

bool BlockPool::Publish(BlockId block, const BlockIdentity& identity,
                        absl::Span<const uint32_t> tokens) {
  BlockMeta& meta = blocks_[block];
  assert(meta.ref_count > 0 && tokens.size() == block_size_);
  assert(identity.parent_block == kNoBlock ||
         blocks_[identity.parent_block].hash == identity.parent_hash);
  if (meta.published) return true;
  bool inserted = false;
  const auto it = index_.lazy_emplace(identity.hash, [&](const auto& construct) {
    construct(block);
    inserted = true;
  });
  if (!inserted) {
    ++counters_.duplicates;
    return *it == block;
  }
  meta.hash = identity.hash;
  meta.published = true;
  meta.extras_digest = identity.extras_digest;
  meta.namespace_digest = identity.namespace_digest;
  meta.prefix_digest = identity.prefix_digest;
  meta.parent_block = identity.parent_block;
  meta.prev_sibling = kNoBlock;
  meta.next_sibling = kNoBlock;
  if (identity.parent_block != kNoBlock) {
    BlockMeta& parent = blocks_[identity.parent_block];
    meta.next_sibling = parent.first_child;
    if (parent.first_child != kNoBlock) blocks_[parent.first_child].prev_sibling = block;
    parent.first_child = block;
  } else {
    roots_.insert_or_assign(block, identity.parent_hash);
  }
  tokens_.Store(block, tokens, [this](uint32_t slot) { return blocks_[slot].published; });
  ++counters_.published;
  return true;
}

void BlockPool::UnlinkFromParent(BlockId block) {
  const BlockMeta& meta = blocks_[block];
  if (meta.parent_block == kNoBlock) return;
  if (meta.prev_sibling != kNoBlock) {
    blocks_[meta.prev_sibling].next_sibling = meta.next_sibling;
  } else {
    blocks_[meta.parent_block].first_child = meta.next_sibling;
  }
  if (meta.next_sibling != kNoBlock) blocks_[meta.next_sibling].prev_sibling = meta.prev_sibling;
}

void BlockPool::Unpublish(BlockId block, std::vector<Hash128>* removed) {
  UnlinkFromParent(block);
  // A work list, not recursion: a block's descendants can be as many as a prompt's blocks.
  unpublishing_.clear();
  unpublishing_.push_back(block);
  while (!unpublishing_.empty()) {
    const BlockId next = unpublishing_.back();
    unpublishing_.pop_back();
    BlockMeta& meta = blocks_[next];
    // Its children hang off a block that is gone, so no walk could reach them: they go too.
    for (BlockId child = meta.first_child; child != kNoBlock; child = blocks_[child].next_sibling) {
      unpublishing_.push_back(child);
    }
    index_.erase(next);
    if (removed != nullptr) removed->push_back(meta.hash);
    if (meta.parent_block == kNoBlock) roots_.erase(next);
    ++counters_.evictions;
    meta.published = false;
    meta.offloaded = false;
    meta.in_cluster = false;
    meta.reused = false;
    meta.hash = Hash128{};
    meta.parent_block = kNoBlock;
    meta.first_child = kNoBlock;
    if (next != block && meta.state == State::kEvictable) {
      LruRemove(next);
      meta.state = State::kFree;
      PushFree(next);
    }
  }
}

absl::Status BlockPool::CheckInvariants() const {
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  std::vector<uint8_t> on_free_list(blocks_.size(), 0);
  uint32_t free_list_length = 0;
  for (BlockId block = free_head_; block != kNoBlock; block = blocks_[block].lru.next) {
    if (block >= blocks_.size()) return fail("free list holds out-of-range block ", block);
    if (on_free_list[block]++) return fail("block ", block, " is on the free list twice");
    ++free_list_length;
  }
  if (free_list_length != num_free_) {
    return fail("free list holds ", free_list_length, " blocks but num_free is ", num_free_);
  }
  uint32_t lru_length = 0;
  BlockId previous = kNoBlock;
  for (BlockId block = lru_.front(); block != kNoBlock; block = blocks_[block].lru.next) {
    if (++lru_length > blocks_.size()) return fail("evictable LRU has a cycle");
    if (blocks_[block].lru.prev != previous) return fail("LRU back link broken at ", block);
    if (blocks_[block].state != State::kEvictable) return fail("non-evictable ", block, " on LRU");
    previous = block;
  }
  if (previous != lru_.back())
    return fail("LRU tail is ", lru_.back(), ", walk ended at ", previous);
  if (lru_length != lru_.size()) {
    return fail("LRU holds ", lru_length, " blocks but num_evictable is ", lru_.size());
  }
  uint32_t free = 0, evictable = 0, referenced = 0, published = 0, linked = 0;
  for (BlockId block = 0; block < blocks_.size(); ++block) {
    const BlockMeta& meta = blocks_[block];
    switch (meta.state) {
      case State::kFree:
        ++free;
        if (meta.ref_count != 0 || meta.published || !on_free_list[block]) {
          return fail("free block ", block, " has ref ", meta.ref_count, " or a hash, or is lost");
        }
        break;
      case State::kEvictable:
        ++evictable;
        if (meta.ref_count != 0 || !meta.published) {
          return fail("evictable block ", block, " has ref ", meta.ref_count, " or no hash");
        }
        break;
      case State::kReferenced:
        ++referenced;
        if (meta.ref_count == 0 || on_free_list[block]) {
          return fail("referenced block ", block, " has ref 0 or is on the free list");
        }
        break;
    }
    if (meta.offload_pinned && meta.state != State::kReferenced) {
      return fail("offload-pinned block ", block, " is not referenced");
    }
    if (meta.offloaded && !meta.published) {
      return fail("block ", block, " is marked offloaded without a hash");
    }
    if (meta.published) {
      ++published;
      if (Indexed(meta.hash) != block) {
        return fail("block ", block, " hash ", meta.hash.ToHex(), " is not indexed to it");
      }
      const BlockId parent = meta.parent_block;
      if (parent != kNoBlock) {
        ++linked;
        if (!blocks_[parent].published) {
          return fail("block ", block, " hangs off block ", parent, ", which is not published");
        }
      } else if (!roots_.contains(block)) {
        return fail("block ", block, " has neither a parent block nor a root hash");
      }
    }
  }
  if (free != num_free_) return fail(free, " free blocks but free list has ", num_free_);
  if (free + evictable + referenced != blocks_.size()) {
    return fail("free ", free, " + evictable ", evictable, " + referenced ", referenced,
                " != pool size ", blocks_.size());
  }
  if (published != index_.size()) {
    return fail(published, " published blocks but the index holds ", index_.size(), " hashes");
  }
  if (published != linked + roots_.size()) {
    return fail(roots_.size(), " root hashes for ", published - linked, " blocks without a parent");
  }
  // Each listed child hangs off its list's block, so with the counts equal, every published
  // block with a parent block is listed exactly once.
  size_t child_links = 0;
  for (BlockId parent = 0; parent < blocks_.size(); ++parent) {
    BlockId previous_child = kNoBlock;
    for (BlockId child = blocks_[parent].first_child; child != kNoBlock;
         child = blocks_[child].next_sibling) {
      if (++child_links > blocks_.size()) return fail("children of ", parent, " form a cycle");
      if (blocks_[child].parent_block != parent || blocks_[child].prev_sibling != previous_child) {
        return fail("block ", child, " is linked among the children of ", parent,
                    " but does not hang off it");
      }
      previous_child = child;
    }
  }
  if (child_links != linked) {
    return fail(child_links, " child links but ", linked, " published blocks have a parent block");
  }
  return absl::OkStatus();
}

}  // namespace kvcache
