// What the seeded simulations of the cache core share (tests/cache/simulation_test.cc says what
// they check): the content model of token blocks (Model, keyed by content, not hashes), the
// runs' sizes and the totals they add up.
#ifndef KVCACHE_TESTS_CACHE_SIM_COMMON_H_
#define KVCACHE_TESTS_CACHE_SIM_COMMON_H_

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <list>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/algorithm/container.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "cache/cache_manager.h"
#include "cache/pool.h"
#include "common/block_hash.h"
#include "common/compatibility_manifest.h"
#include "common/page_parts.h"
#include "common/status_macros.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/pool_memories.h"
#include "tests/testing/small_pool_options.h"
#include "tests/testing/test_files.h"

namespace kvcache {
namespace simulation {

using ::kvcache::testing::FakeClock;

inline constexpr uint64_t kEpoch = 7;
inline constexpr absl::string_view kTenants[] = {"red", "green", "blue"};
inline constexpr absl::string_view kSalts[] = {"", "s1"};

// Operations per seed by default: fewer under the sanitizers (CI's Debug ASan + UBSan build runs
// some 20 times slower), the same 10,000 seeds either way. The tier run keeps 120 operations (its
// tier-2 hits need a commit, an offload, an eviction and a reopen: 30 operations make 10 in 2,000
// seeds) and takes a quarter of its seeds there instead.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
inline constexpr bool kSanitized = true;
#else
inline constexpr bool kSanitized = false;
#endif
#else
inline constexpr bool kSanitized = false;
#endif
inline constexpr uint64_t kDefaultOps = kSanitized ? 30 : 120;
inline constexpr uint64_t kTierOps = 120;
inline constexpr uint64_t kTierSeeds = kSanitized ? 500 : 2'000;
// The disk runs' I/O (a file per seed, an fdatasync per offload that passes records down, a
// restart's scan) costs more per operation.
inline constexpr uint64_t kDiskSeeds = 100;

// The content a full block's KV is computed from: its namespace (tenant, salt, lora) and every
// token from the prompt's start through the block's end.
struct Key {
  std::string ns;
  std::vector<uint32_t> tokens;
  friend bool operator<(const Key& a, const Key& b) {
    return std::tie(a.ns, a.tokens) < std::tie(b.ns, b.tokens);
  }
  friend bool operator==(const Key& a, const Key& b) {
    return a.ns == b.ns && a.tokens == b.tokens;
  }
};

inline std::string Describe(const Key& key) {
  return absl::StrCat("[", key.ns, "|", absl::StrJoin(key.tokens, ","), "]");
}

inline Key KeyOf(const std::string& ns, const std::vector<uint32_t>& tokens, size_t block,
                 uint32_t block_size) {
  return Key{ns, std::vector<uint32_t>(tokens.begin(), tokens.begin() + (block + 1) * block_size)};
}

// The reference cache: blocks by id, indexed by content. See the file comment for where it is

class Model {
 public:
  explicit Model(uint32_t num_blocks) : blocks_(num_blocks) {
    for (BlockId block = 0; block < num_blocks; ++block) free_.insert(block);
  }

  uint32_t num_free() const { return static_cast<uint32_t>(free_.size()); }
  uint32_t num_evictable() const { return num_evictable_; }
  uint32_t num_referenced() const {
    return static_cast<uint32_t>(blocks_.size()) - num_free() - num_evictable_;
  }
  bool IsEvictable(BlockId block) const { return blocks_[block].ref == 0 && IsOnLru(block); }
  const BlockPoolCounters& counters() const { return counters_; }
  uint32_t ReferencedBy(const std::string& tenant) const {
    uint32_t count = 0;
    for (const MBlock& block : blocks_) count += block.ref > 0 && block.tenant == tenant ? 1 : 0;
    return count;
  }

  // The cached blocks of the request's first `max_blocks` full blocks, in order.
  std::vector<BlockId> Walk(const std::string& ns, const std::vector<uint32_t>& tokens,
                            uint32_t block_size, size_t max_blocks) const {
    std::vector<BlockId> hits;
    const size_t limit = std::min(max_blocks, tokens.size() / block_size);
    for (size_t i = 0; i < limit; ++i) {
      auto it = index_.find(KeyOf(ns, tokens, i, block_size));
      if (it == index_.end()) break;
      hits.push_back(it->second);
    }
    return hits;
  }

  // `prefix_hit`: a compute open's hit, the only pin that counts as a resurrection.
  void Acquire(BlockId block, const std::string& tenant, bool prefix_hit) {
    MBlock& meta = blocks_[block];
    if (meta.ref == 0) {
      LruRemove(block);
      if (prefix_hit) ++counters_.resurrections;
      meta.tenant = tenant;
    }
    ++meta.ref;
  }

  // The pool handed out `got` for a fresh block: it must be free, else the LRU front.
  absl::Status Allocate(BlockId got, const std::string& tenant) {
    if (got >= blocks_.size())
      return absl::InternalError(absl::StrCat("block ", got, " is out of range"));
    if (!free_.empty()) {
      if (free_.erase(got) == 0) {
        return absl::InternalError(absl::StrCat(
            "allocated block ", got, " but the free blocks are ", absl::StrJoin(free_, ",")));
      }
    } else {
      if (lru_.empty()) return absl::InternalError("allocated a block with none free or evictable");
      std::set<BlockId>& front = lru_.front();
      if (front.erase(got) == 0) {
        return absl::InternalError(absl::StrCat("evicted block ", got, " but the LRU front is {",
                                                absl::StrJoin(front, ","), "}"));
      }
      if (front.empty()) lru_.pop_front();
      --num_evictable_;
      Evict(got);
    }
    blocks_[got].ref = 1;
    blocks_[got].tenant = tenant;
    return absl::OkStatus();
  }

  // Releases `blocks` in order; those reaching ref 0 that are published join the LRU's back one
  // by one.
  void Release(const std::vector<BlockId>& blocks) {
    for (BlockId block : blocks) {
      MBlock& meta = blocks_[block];
      if (--meta.ref > 0) continue;
      if (!meta.published) {
        free_.insert(block);
      } else {
        lru_.push_back({block});
        ++num_evictable_;
      }
    }
  }

  // Publishes blocks [from, to) of a sequence as Pool::Commit does; returns how many.
  uint32_t Commit(const std::string& ns, const std::vector<uint32_t>& tokens,
                  const std::vector<BlockId>& blocks, uint32_t block_size, uint32_t from,
                  uint32_t to) {
    uint32_t published = 0;
    for (uint32_t i = from; i < to; ++i) {
      // A block without a cached parent could never be reached: it stays private.
      if (i > 0 && index_.count(KeyOf(ns, tokens, i - 1, block_size)) == 0) continue;
      MBlock& meta = blocks_[blocks[i]];
      if (meta.published) continue;
      Key key = KeyOf(ns, tokens, i, block_size);
      if (index_.count(key) > 0) {
        ++counters_.duplicates;  // the first copy stays cached; this one private
        continue;
      }
      meta.published = true;
      meta.key = key;
      index_.emplace(std::move(key), blocks[i]);
      ++counters_.published;
      ++published;
    }
    return published;
  }

 private:
  struct MBlock {
    uint32_t ref = 0;
    bool published = false;
    Key key;
    std::string tenant;  // while ref > 0
  };

  bool IsOnLru(BlockId block) const {
    for (const auto& group : lru_) {
      if (group.count(block) > 0) return true;
    }
    return false;
  }
  void LruRemove(BlockId block) {
    for (auto it = lru_.begin(); it != lru_.end(); ++it) {
      if (it->erase(block) > 0) {
        if (it->empty()) lru_.erase(it);
        --num_evictable_;
        return;
      }
    }
  }
  // Drops `block`'s content and every cached extension of it from the index (a cached block's
  // parent is always cached, so they hang off it); evictable extensions become free.
  void Evict(BlockId block) {
    const Key key = blocks_[block].key;
    auto it = index_.lower_bound(key);
    while (it != index_.end() && it->first.ns == key.ns &&
           it->first.tokens.size() >= key.tokens.size() &&
           std::equal(key.tokens.begin(), key.tokens.end(), it->first.tokens.begin())) {
      const BlockId gone = it->second;
      blocks_[gone].published = false;
      blocks_[gone].key = Key{};
      ++counters_.evictions;
      if (gone != block && blocks_[gone].ref == 0) {
        LruRemove(gone);
        free_.insert(gone);
      }
      it = index_.erase(it);
    }
  }

  std::vector<MBlock> blocks_;
  std::set<BlockId> free_;
  std::list<std::set<BlockId>> lru_;  // front: evicted first
  uint32_t num_evictable_ = 0;
  std::map<Key, BlockId> index_;
  BlockPoolCounters counters_;
};

// A discrepancy between the pool and what the run expected: the run stops there.
inline absl::Status Fail(absl::string_view what) { return absl::InternalError(what); }

// OK when `result` (a Status or StatusOr) has the code the model predicts, else a discrepancy
// naming the operation.
template <typename T>
absl::Status ExpectCode(const T& result, absl::StatusCode want, absl::string_view op) {
  absl::Status status;
  if constexpr (std::is_same_v<T, absl::Status>) {
    status = result;
  } else {
    status = result.status();
  }
  if (status.code() == want) return absl::OkStatus();
  return Fail(absl::StrCat(op, ": got ", status.ToString(), ", model says ",
                           absl::StatusCodeToString(want)));
}

struct SimTotals {
  uint64_t seeds = 0;
  uint64_t operations = 0;
  uint64_t hit_blocks = 0;
  uint64_t evictions = 0;
  uint64_t collisions_caught = 0;
  uint64_t tier_hit_blocks = 0;
  uint64_t offloaded_blocks = 0;
  uint64_t disk_hit_blocks = 0;
  uint64_t demoted_blocks = 0;
  uint64_t restarts = 0;
  uint64_t restored_records = 0;
  uint64_t restart_found_blocks = 0;  // prompt blocks found on disk by lookups after restarts
  // The page runs (PageSimulation).
  uint64_t exact_steps = 0;      // operations checked against the model's exact tier 1
  uint64_t partial_hits = 0;     // exists answers the hit rule cut short of the present pages
  uint64_t ended_mid_put = 0;    // puts whose session ended before their commit
  uint64_t ambiguous_walks = 0;  // walks reaching a page tier 1 holds past one from below
  // Records tier 2 and the disk replaced with a copy of more parts (DESIGN §13).
  uint64_t superseded = 0;
};

}  // namespace simulation
}  // namespace kvcache

#endif  // KVCACHE_TESTS_CACHE_SIM_COMMON_H_
