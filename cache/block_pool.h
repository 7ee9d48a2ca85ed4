// BlockPool: the bookkeeping of one pool's fixed set of blocks — reference counts, the prefix
// index (hash -> block), the free list and the evictable LRU.
//
// Every block is in exactly one state:
//   free        ref 0, no hash; on the free list
//   evictable   ref 0, hashed (still findable); on the LRU, least recently released at the front
//   referenced  ref > 0, hashed or not
// A block's hash is set only by Publish() (its contents are written) and dropped only by eviction.
// A published block's parent link (BlockIdentity::parent_block) always names a published block
// indexed under its parent hash: evicting a block also unpublishes the blocks published under it
// (their KV hangs off a parent that is gone, so no walk could reach them), evictable ones going
// to the free list. Normally children are evicted first (they are released first); a child
// published under another sequence's copy of its parent can outlive it, and is dropped with it.
// Allocation takes the free list first and evicts the LRU front only when the free list is empty.
// Every operation is O(1) or O(tokens of one block); nothing scans the pool, but for the
// widenings of the token store a token id past 2^18, then 2^24, causes (PackedTokens: at most two
// in the pool's life, none for any common vocabulary).
//
// Memory (docs/design.md "Block metadata"): per block a BlockMeta (80 bytes: its hash, digests,
// links), its tokens packed (PackedTokens: 36 bytes at 16 tokens of up to 18 bits), and one
// 4-byte slot of the index (a set of block ids hashed by their BlockMeta's hash, at most half
// full). The free list is threaded through the LRU links, and a chain's root hash is kept only
// for blocks without a parent block (roots_): a child's parent hash is its parent block's hash.
//
// Thread safety: none. The owning Pool serializes all calls under its mutex.
#ifndef KVCACHE_CACHE_BLOCK_POOL_H_
#define KVCACHE_CACHE_BLOCK_POOL_H_

#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/hash/hash.h"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "cache/packed_tokens.h"
#include "common/block_hash.h"
#include "common/index_list.h"

namespace kvcache {

using BlockId = uint32_t;
inline constexpr BlockId kNoBlock = std::numeric_limits<BlockId>::max();

// What a published block is, kept so every hit can be verified against the request: a hash
// collision then costs a miss, never wrong KV.
struct BlockIdentity {
  Hash128 hash;
  Hash128 parent_hash;              // h_{i-1}; the chain root for a sequence's first block
  BlockId parent_block = kNoBlock;  // the indexed block holding h_{i-1}; kNoBlock for block 0
  uint64_t extras_digest = 0;
  // BlockHasher::NamespaceDigest of the chain's namespace: block 0's parent_hash is the root, and
  // a root collision between two tenants or cache salts must not share their blocks.
  uint64_t namespace_digest = 0;
  // BlockHasher::PrefixDigest through this block. Tier 1 verifies a prefix through parent_block
  // already; the mover copies it into the block's record, which has no parent block to check
  // (tiers/block_record.h).
  uint64_t prefix_digest = 0;
};

struct BlockPoolCounters {
  uint64_t evictions = 0;
  // Of the evictions, victims taken from the LRU front that the mover had already copied to the
  // tier below (BlockPool::PinForOffload): nothing was lost. Descendants unpublished with a
  // victim are not counted here.
  uint64_t evicted_offloaded = 0;
  // Prefix hits of prompts to compute on evictable blocks (a subset of the pool's hit blocks).
  uint64_t resurrections = 0;
  uint64_t published = 0;
  uint64_t duplicates = 0;
};

class BlockPool {
 public:
  BlockPool(uint32_t num_blocks, uint32_t block_size);

  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  uint32_t num_blocks() const { return static_cast<uint32_t>(blocks_.size()); }
  uint32_t block_size() const { return block_size_; }
  uint32_t num_free() const { return num_free_; }
  uint32_t num_evictable() const { return lru_.size(); }
  uint32_t num_referenced() const { return num_blocks() - num_free() - lru_.size(); }
  const BlockPoolCounters& counters() const { return counters_; }

  // The block that `expected.hash` maps to, if its stored identity and tokens equal `expected`
  // and `tokens`; kNoBlock otherwise. Changes nothing.
  BlockId FindVerified(const BlockIdentity& expected, absl::Span<const uint32_t> tokens) const;
  // The block indexed under `hash` without verification, or kNoBlock.
  BlockId Indexed(const Hash128& hash) const;
  bool IsEvictable(BlockId block) const { return blocks_[block].state == State::kEvictable; }
  bool IsPublished(BlockId block) const { return blocks_[block].published; }
  // What Publish recorded for a published block, and its tokens.
  BlockIdentity IdentityOf(BlockId block) const;
  // IdentityOf(block).hash and .extras_digest, without building the identity.
  const Hash128& HashOf(BlockId block) const { return blocks_[block].hash; }
  uint64_t ExtrasDigestOf(BlockId block) const {
    return blocks_[block].published ? blocks_[block].extras_digest : 0;
  }
  std::vector<uint32_t> TokensOf(BlockId block) const;
  // A published block's parent link (BlockIdentity::parent_block).
  BlockId ParentOf(BlockId block) const { return blocks_[block].parent_block; }
  uint32_t RefCount(BlockId block) const { return blocks_[block].ref_count; }
  // A published block's bytes never change, so their checksum is computed once and kept until
  // the block is reused. SetChecksum ignores unpublished blocks.
  std::optional<uint64_t> CachedChecksum(BlockId block) const {
    const BlockMeta& meta = blocks_[block];
    return meta.published && meta.has_checksum ? std::optional<uint64_t>(meta.checksum)
                                               : std::nullopt;
  }
  void SetChecksum(BlockId block, uint64_t checksum) {
    BlockMeta& meta = blocks_[block];
    if (!meta.published) return;
    meta.checksum = checksum;
    meta.has_checksum = true;
  }

  // ref+1; an evictable block is resurrected (taken off the LRU in O(1)). `prefix_hit`: the pin
  // is a hit of a prompt to compute, and resurrecting counts in counters().resurrections (reads
  // and puts that pin soft-freed blocks are no hits, so their pins count nowhere).
  // REQUIRES: `block` is referenced or evictable.
  void Acquire(BlockId block, bool prefix_hit);
  // A block with ref 1 and no hash: the free list's, else the LRU front's after dropping its hash
  // and its descendants' (then *removed, when given, gets every hash that left the index, the
  // evicted block's first). Returns kNoBlock when every block is referenced; callers check
  // capacity first.
  BlockId AllocateFresh(std::vector<Hash128>* removed = nullptr);
  // Evicts one evictable block out of LRU order (a page superseded by a copy with more parts,
  // DESIGN §13): its hash and its descendants' leave the index (appended to *removed), and it
  // goes to the free list. REQUIRES: IsEvictable(block), not offload-pinned.
  void Evict(BlockId block, std::vector<Hash128>* removed);
  // ref-1. At 0 a published block joins the LRU's back (most recently released), an unpublished
  // one the free list. REQUIRES: RefCount(block) > 0.
  void Release(BlockId block);
  // Records `identity` and `tokens` and indexes the block under identity.hash. Returns false and
  // changes nothing when that hash already maps to another block (the first one stays; this one
  // stays private). Publishing an already published block is a no-op returning true.
  // REQUIRES: RefCount(block) > 0, tokens.size() == block_size().
  bool Publish(BlockId block, const BlockIdentity& identity, absl::Span<const uint32_t> tokens);

  // The offload mover's view (cache/pool.h): the LRU from its eviction end, and a pin that keeps
  // a block's bytes stable while they are copied to the tier below without counting as a hit.
  BlockId LruFront() const { return lru_.front(); }
  BlockId LruNext(BlockId block) const { return blocks_[block].lru.next; }
  // Whether the block's bytes are below (set by UnpinOffloaded; cleared when the block is reused).
  bool IsOffloaded(BlockId block) const { return blocks_[block].offloaded; }
  void SetOffloaded(BlockId block) { blocks_[block].offloaded = blocks_[block].published; }
  bool IsOffloadPinned(BlockId block) const { return blocks_[block].offload_pinned; }
  // Whether the cluster tier already has the block's bytes (it came from a lower tier, which the
  // mover had written to the cluster too, or from the cluster itself): the mover does not write
  // it there again. Cleared like IsOffloaded.
  bool IsInCluster(BlockId block) const { return blocks_[block].in_cluster; }
  // Whether the block was a prefix hit since it was published (the disk tier's admission: a
  // reused block is worth a write to disk, a one-off one is not). Cleared like IsOffloaded.
  bool IsReused(BlockId block) const { return blocks_[block].reused; }
  void SetReused(BlockId block) { blocks_[block].reused = blocks_[block].published; }
  void SetInCluster(BlockId block) { blocks_[block].in_cluster = blocks_[block].published; }
  // Takes an evictable block off the LRU with ref 1 and marks it offload-pinned: it cannot be
  // evicted or reused until UnpinOffloaded. REQUIRES: IsEvictable(block).
  void PinForOffload(BlockId block);
  // Drops the offload pin; `offloaded`: its bytes are now below. At ref 0 a published block
  // rejoins the LRU where it was (before the block that followed it; at the front if that one
  // was evicted or resurrected meanwhile), or at the back if a sequence used it meanwhile, as
  // any release; an unpublished one (its parent was evicted meanwhile) goes to the free list.
  // REQUIRES: IsOffloadPinned(block).
  void UnpinOffloaded(BlockId block, bool offloaded);

  // Full consistency check, O(pool): free + evictable + referenced = pool size, no block both free
  // and referenced, every hash maps to exactly one block and back, LRU and free list well formed.
  absl::Status CheckInvariants() const;

 private:
  using Lru = IndexList<BlockId, kNoBlock>;
  enum class State : uint8_t { kFree, kEvictable, kReferenced };

  // 80 bytes: the flags are bit fields, the parent hash is roots_' or the parent block's.
  struct BlockMeta {
    Hash128 hash;  // BlockIdentity::hash; the index finds blocks by it
    uint64_t extras_digest = 0;
    uint64_t namespace_digest = 0;
    uint64_t prefix_digest = 0;
    uint64_t checksum = 0;
    BlockId parent_block = kNoBlock;
    // The blocks published under this one (parent_block == this), as a list threaded through
    // them: unpublishing a block unlinks it in O(1) with no allocation.
    BlockId first_child = kNoBlock;
    BlockId next_sibling = kNoBlock;
    BlockId prev_sibling = kNoBlock;
    // Doubly linked LRU of evictable blocks, by block id. A free block's `next` links the free
    // list; an offload-pinned block's `next` is its LRU successor when it was pinned.
    Lru::Links lru;
    uint32_t ref_count = 0;
    State state = State::kFree;
    bool published : 1 = false;
    bool has_checksum : 1 = false;
    bool offloaded : 1 = false;          // bytes copied below; see IsOffloaded
    bool in_cluster : 1 = false;         // see IsInCluster
    bool reused : 1 = false;             // see IsReused
    bool offload_pinned : 1 = false;     // see PinForOffload
    bool used_while_pinned : 1 = false;  // acquired by a sequence during the offload pin
  };
  static_assert(sizeof(BlockMeta) == 80, "docs/design.md and block_memory_bench count 80 bytes");

  // The index: a set of block ids, hashed and compared by their BlockMeta's hash, and looked up
  // by a Hash128 directly (a slot is a block id, 4 bytes).
  struct IndexHash {
    using is_transparent = void;
    const std::vector<BlockMeta>* blocks;
    size_t operator()(const Hash128& hash) const { return absl::Hash<Hash128>()(hash); }
    size_t operator()(BlockId block) const { return (*this)((*blocks)[block].hash); }
  };
  // A lookup by hash usually precedes a verification, which compares the candidate's tokens:
  // their load starts with the candidate's hash's rather than after it.
  struct IndexEq {
    using is_transparent = void;
    const std::vector<BlockMeta>* blocks;
    const PackedTokens* tokens;
    bool operator()(BlockId a, BlockId b) const { return a == b; }
    bool operator()(BlockId a, const Hash128& b) const {
      tokens->Prefetch(a);
      return (*blocks)[a].hash == b;
    }
    bool operator()(const Hash128& a, BlockId b) const { return (*this)(b, a); }
  };

  auto LruLinks() {
    return [this](BlockId block) -> Lru::Links& { return blocks_[block].lru; };
  }
  void LruPushBack(BlockId block) { lru_.PushBack(block, LruLinks()); }
  void LruPushFront(BlockId block) { lru_.PushFront(block, LruLinks()); }
  void LruInsertBefore(BlockId block, BlockId next) { lru_.InsertBefore(block, next, LruLinks()); }
  void LruRemove(BlockId block) { lru_.Remove(block, LruLinks()); }
  // Drops `block`'s hash and its descendants' from the index; descendants that are evictable go
  // to the free list. Appends the hashes to `removed` when given.
  void Unpublish(BlockId block, std::vector<Hash128>* removed);
  // Takes a published block out of its parent block's list of children.
  void UnlinkFromParent(BlockId block);
  // BlockIdentity::parent_hash of a published block.
  const Hash128& ParentHashOf(BlockId block) const;
  void PushFree(BlockId block);

  const uint32_t block_size_;
  std::vector<BlockMeta> blocks_;
  PackedTokens tokens_;  // block_size_ tokens per published block, by block id
  // The free list, a stack threaded through BlockMeta::lru.next.
  BlockId free_head_ = kNoBlock;
  uint32_t num_free_ = 0;
  Lru lru_;  // evictable blocks, least recently released at the front: evicted first
  absl::flat_hash_set<BlockId, IndexHash, IndexEq> index_;
  // The parent hash (the chain's root) of each published block without a parent block.
  absl::flat_hash_map<BlockId, Hash128> roots_;
  // Unpublish's work list, kept to spare an allocation per eviction.
  std::vector<BlockId> unpublishing_;
  BlockPoolCounters counters_;
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_BLOCK_POOL_H_
