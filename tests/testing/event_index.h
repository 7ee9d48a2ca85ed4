// EventIndex: what a KV-aware router builds from KV events — hashes with their parent and tokens —
// and answers a prompt's cached prefix from, walking chains by tokens as llm-d's indexer does.
// Tests replay the daemon's events into it and compare with the daemon's own Lookup. It also
// flags a stream that doubles (stores a hash it holds) or misses (removes one it does not hold).
// Header-only; knows nothing of protobuf or gRPC.
#ifndef KVCACHE_TESTS_TESTING_EVENT_INDEX_H_
#define KVCACHE_TESTS_TESTING_EVENT_INDEX_H_

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/block_hash.h"

namespace kvcache::testing {

class EventIndex {
 public:
  void Store(const std::string& pool, const std::string& tenant, std::optional<Hash128> parent,
             const Hash128& hash, absl::Span<const uint32_t> token_ids) {
    std::vector<uint32_t> tokens(token_ids.begin(), token_ids.end());
    const Key key{pool, hash};
    if (blocks_.contains(key)) AddViolation(absl::StrCat("stored twice: ", hash.ToHex()));
    if (parent.has_value() && !blocks_.contains(Key{pool, *parent})) {
      AddViolation(absl::StrCat("child before its parent: ", hash.ToHex()));
    }
    children_[ChildKeyOf(pool, tenant, parent, tokens)] = hash;
    blocks_[key] = Block{tenant, parent, std::move(tokens)};
  }
  void Remove(const std::string& pool, const Hash128& hash) {
    auto it = blocks_.find(Key{pool, hash});
    if (it == blocks_.end()) {
      AddViolation(absl::StrCat("removed but not held: ", hash.ToHex()));
      return;
    }
    children_.erase(ChildKeyOf(pool, it->second.tenant, it->second.parent, it->second.tokens));
    blocks_.erase(it);
  }
  // Every block of `pool`, or of every pool when empty.
  void Clear(const std::string& pool) {
    if (pool.empty()) {
      blocks_.clear();
      children_.clear();
      return;
    }
    absl::erase_if(blocks_, [&](const auto& entry) { return entry.first.pool == pool; });
    absl::erase_if(children_, [&](const auto& entry) { return std::get<0>(entry.first) == pool; });
  }

  // Leading full blocks of `tokens` the index holds as one chain from a prompt's start.
  uint32_t CachedBlocks(const std::string& pool, const std::string& tenant,
                        absl::Span<const uint32_t> tokens, uint32_t block_size) const {
    std::optional<Hash128> parent;
    uint32_t blocks = 0;
    for (size_t start = 0; start + block_size <= tokens.size(); start += block_size) {
      std::vector<uint32_t> chunk(tokens.begin() + start, tokens.begin() + start + block_size);
      auto it = children_.find(ChildKeyOf(pool, tenant, parent, std::move(chunk)));
      if (it == children_.end()) break;
      parent = it->second;
      ++blocks;
    }
    return blocks;
  }

  size_t size() const { return blocks_.size(); }
  const std::vector<std::string>& violations() const { return violations_; }

 private:
  struct Key {
    std::string pool;
    Hash128 hash;
    friend bool operator==(const Key& a, const Key& b) {
      return a.pool == b.pool && a.hash == b.hash;
    }
    template <typename H>
    friend H AbslHashValue(H state, const Key& key) {
      return H::combine(std::move(state), key.pool, key.hash);
    }
  };
  struct Block {
    std::string tenant;
    std::optional<Hash128> parent;
    std::vector<uint32_t> tokens;
  };
  // (pool, tenant, has parent, parent, tokens)
  using ChildKey = std::tuple<std::string, std::string, bool, Hash128, std::vector<uint32_t>>;
  static ChildKey ChildKeyOf(const std::string& pool, const std::string& tenant,
                             const std::optional<Hash128>& parent, std::vector<uint32_t> tokens) {
    return ChildKey{pool, tenant, parent.has_value(), parent.value_or(Hash128{}),
                    std::move(tokens)};
  }

  void AddViolation(std::string what) {
    if (violations_.size() < 20) violations_.push_back(std::move(what));
  }

  absl::flat_hash_map<Key, Block> blocks_;
  absl::flat_hash_map<ChildKey, Hash128> children_;
  std::vector<std::string> violations_;
};

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_EVENT_INDEX_H_
