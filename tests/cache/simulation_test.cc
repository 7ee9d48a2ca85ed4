// Deterministic simulation of the cache core (issue 17): thousands of seeded random operation
// sequences drive a CacheManager's pool (open, extend, commit, release, fork, lookup, put, get,
// session close, lease expiry on a FakeClock, KeepAlive) under eviction pressure, with several
// tenants and cache salts, and every answer is checked after every operation.
//
// Two references check the pool:
//  - Model: an independent, deliberately simple cache keyed by content (namespace and every token
//    up to a block's end), not by hashes. It predicts every status code, every hit length, the
//    block ids of every hit (two sequences sharing a cached prefix get the same blocks), which
//    block an allocation may take (a free one, else the LRU front: eviction order is exact), the
//    free / evictable / referenced counts (pool-wide and per tenant), open sequences, commit
//    results and the pool's evictions / resurrections / published / duplicates counters.
//    Where it is coarser than the pool, on purpose: it does not model the free list's order
//    (any free block is accepted: which free block comes next is not part of the contract).
//    Every release is ordered exactly, a session's end included (oldest sequence first, each
//    tail first) and an expiry sweep's (oldest session first), so a replayed seed makes the same
//    calls and gets the same answers.
//  - Shadow KV: what each block holds, as the worker would have written it (set when a sequence
//    commits a block it computed). Every hit must return blocks holding exactly the requested
//    prefix: this holds with or without the model.
// After every operation: Pool::CheckInvariants and free + evictable + referenced = pool size.
//
// The weak-hash run (PoolOptions::testing_hash_bits) keeps only 4 to 8 bits of every chain hash,
// so collisions are common; hashing then makes the pool miss where the content model would hit,
// so that run checks status codes the model can know without hits (argument, session and size
// errors), the shadow KV of every hit (a collision is a miss, never wrong KV), the invariants,
// and counts the collisions the pool caught.
//
// The tier run (PoolOptions::host_tier_bytes, issue 18) gives the pool a small tier 2 and moves
// blocks into it with Pool::OffloadForTesting() at random points (testing_manual_offload: no
// mover thread, so a seed replays exactly). The worker's bytes are real there: every committed
// block is written with bytes derived from its content, and every hit — from tier 1 or loaded
// from tier 2 — is read back from the pool's memory and compared, so the shadow KV follows the
// bytes through tier 2 and back. The model does not model what tier 2 holds; it predicts the
// tier-1 part of every hit exactly (an offload leaves the LRU's order and the counters alone),
// asks tier 2 (HostTier::Find, by the hashes and prefix digests it computes itself) how far the
// walk goes on there, treats the loaded blocks as fresh allocations published by the open
// (Pool::Open's rule) and so keeps every count and status exact. Tier-2 counters are checked
// against the run's own sums (hits, stores; no load failures, nothing left to max_load_ms).
//
// The weak-hash tier run does the same with 6-bit chain hashes and without the model. Tier 1
// verifies a hit through its parent block; a tier-2 record has none, and its chain fields check
// one link (parent hash and tokens), so a parent-hash collision once loaded another prefix's
// bytes (seed 2000035 served [3,2]'s KV for [3,2,2,2,3,2]). Each record now carries a full-width
// digest of its whole prefix (tiers/block_record.h); the run checks the bytes of every hit.
//
// The disk runs (PoolOptions::disk_tier_path) put a disk tier of 1 to 2x the pool's blocks, a file
// in a temporary directory, below a tier 2 of at most the pool (its demotion window is then all of
// it: every record it stores is passed down), and flush the disk after each offload, so what is
// durable, hence visible, is the same in every run of a seed. In the model run each Open and
// Lookup predicts where every block past the tier-1 hits comes back from, computing the chain
// hashes and prefix digests itself: tier 2 where it holds the block's record, else the disk,
// ending at the first block neither holds; the counts of blocks loaded from each must match
// (nothing fails to load). Every record on disk must be a block this run wrote, under its own
// identity. Disk hits are counted by the pool and by the tier. A restart (2% per operation)
// destroys the manager and its pool and creates them again over the same file: every session,
// tier 1 and tier 2 are gone; the disk must index again exactly the records it held, and a
// Lookup of every recent prompt in every namespace must find on disk exactly the blocks whose
// records the old pool left there (the restart's expectation, from the records alone); then a
// new session computes two recent prompts, loading what the disk holds of them. The weak-hash
// disk run does the same with 6-bit chain hashes without the model (the records' 64-bit prefix
// digests keep the restart's expectation exact). With KVCACHE_SIM_REPLAY_EVERY=N every Nth seed
// of a disk run is run twice and the traces compared (session ids, which are random, by opening
// order); off by default because of a race in the disk tier (RunSeeds says which).
//
// Environment: KVCACHE_SIM_SEEDS (seeds per run, default 10000), KVCACHE_SIM_SEED (replay one
// seed, printing its trace), KVCACHE_SIM_OPS (operations per seed, default 120; 30 under ASan).
// The tier runs take 2,000 seeds of 120 operations by default, 500 under ASan; the disk runs 100
// (I/O: a file per seed, an fdatasync per offload that passes records down, restarts);
// KVCACHE_SIM_SEEDS and KVCACHE_SIM_OPS set every run's.
//
// The page runs (PageSimulation, issue 31: keys, parts and the hit rule) are described where
// they are defined, below; they take the tier runs' seeds and operations (about 5 s and 4 s here,
// 19 s and 8 s under ASan).
#include <gtest/gtest.h>

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
namespace {

using ::kvcache::testing::FakeClock;

constexpr uint64_t kEpoch = 7;
constexpr absl::string_view kTenants[] = {"red", "green", "blue"};
constexpr absl::string_view kSalts[] = {"", "s1"};

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

std::string Describe(const Key& key) {
  return absl::StrCat("[", key.ns, "|", absl::StrJoin(key.tokens, ","), "]");
}

Key KeyOf(const std::string& ns, const std::vector<uint32_t>& tokens, size_t block,
          uint32_t block_size) {
  return Key{ns, std::vector<uint32_t>(tokens.begin(), tokens.begin() + (block + 1) * block_size)};
}

// The reference cache: blocks by id, indexed by content. See the file comment for where it is
// coarser than the pool.
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

// One seed's run. Returns the first discrepancy; `trace` holds every operation so far.
class Simulation {
 public:
  // `disk`: a disk tier below tier 2 (which `tier` then must ask for).
  // `staged`: the pool's memory is host bytes behind the device interface
  // (tests/testing/pool_memories.h), so every tier copy takes a device pool's batched path.
  // `parts`: the pool declares a block of two parts, "kv" and a one-block trailing "state"; the
  // commits name none, so every block holds both and the model's answers stand (DESIGN §13).
  Simulation(uint64_t seed, uint32_t hash_bits, bool tier, bool disk, int num_ops,
             bool staged = false, bool parts = false)
      : rng_(seed),
        hash_bits_(hash_bits),
        tier_(tier || disk),
        disk_(disk),
        staged_(staged),
        parts_(parts),
        num_ops_(num_ops) {}

  absl::Status Run(SimTotals* totals) {
    block_size_ = Pick({1u, 2u, 4u});
    num_blocks_ = Uniform(3, 24);
    PoolOptions options;
    options.name = "sim";
    options.model_id = "sim-model";
    options.layout = PoolLayout{.num_layers = 1,
                                .num_kv_heads = 1,
                                .head_dim = 2,
                                .block_size = block_size_,
                                .dtype = DType::kFloat16};
    options.num_blocks = num_blocks_;
    options.testing_hash_bits = hash_bits_;
    if (parts_) {
      const uint64_t bytes = options.layout.BlockBytes();
      ASSIGN_OR_RETURN(options.parts,
                       ParsePageParts(absl::StrCat("kv/", bytes - 2, "+state/2/trailing1"), bytes));
    }
    if (tier_) {
      // From one block to twice the pool, so tier 2 evicts its own records too; over a disk
      // tier at most the pool, so records are passed down (and evicted) often.
      options.host_tier_bytes =
          uint64_t{Uniform(1, (disk_ ? 1 : 2) * num_blocks_)} * options.layout.BlockBytes();
      options.offload_window = Uniform(0, num_blocks_);  // 0: the default
      options.testing_manual_offload = true;
    }
    if (disk_) {
      // From one record to twice the pool, so the disk evicts too. A slot is a header page and
      // the block rounded up to pages.
      const uint64_t slot_bytes = 4096 + (options.layout.BlockBytes() + 4095) / 4096 * 4096;
      disk_dir_.emplace();
      options.disk_tier_path = disk_dir_->File("pool.tier");
      options.disk_tier_bytes = uint64_t{Uniform(1, 2 * num_blocks_)} * slot_bytes;
      // Room for every store of one OffloadForTesting: a full queue would refuse stores
      // depending on how fast the writer thread drains it, and the seed would not replay. One
      // call passes down at most what tier 2 held (at most the pool) and what it stores from
      // tier 1 (each block once): 48 records. Each queued record has a buffer, allocated at open.
      options.testing_disk_tier_options = [](DiskTierOptions* disk) {
        disk->max_queued_stores = 48;
      };
    }
    block_bytes_ = options.layout.BlockBytes();
    options_ = options;
    RETURN_IF_ERROR(StartPool());
    trace_.push_back(absl::StrCat(
        "pool: ", num_blocks_, " blocks of ", block_size_, " tokens, hash bits ",
        hash_bits_ == 0 ? 128 : hash_bits_, ", tier 2 ", options.host_tier_bytes / block_bytes_,
        " blocks, offload window ", pool_->offload_window(),
        disk_ ? absl::StrCat(", disk ", DiskStats().store.slots, " records, demotion window ",
                             pool_->demotion_window())
              : ""));

    for (int op = 0; op < num_ops_; ++op) {
      ++totals->operations;
      if (tier_ && Chance(20)) {
        RETURN_IF_ERROR(Offload());
        RETURN_IF_ERROR(CheckAccounting());
      }
      if (disk_ && Chance(2)) {
        RETURN_IF_ERROR(Restart(totals));
        RETURN_IF_ERROR(CheckAccounting());
      }
      RETURN_IF_ERROR(Step());
      RETURN_IF_ERROR(CheckAccounting());
    }
    // Every session ends; everything is released.
    for (uint64_t id : session_order_) {
      if (!sessions_.at(id).ended) RETURN_IF_ERROR(CloseSession(id));
    }
    RETURN_IF_ERROR(CheckAccounting());
    if (pool_->Stats().referenced != 0)
      return absl::InternalError("blocks held after every session ended");
    return AddTotals(totals);
  }

  const std::vector<std::string>& trace() const { return trace_; }
  // The trace with each session id (random: SessionRegistry draws them) replaced by its place in
  // opening order, so that two runs of a seed can be compared.
  std::vector<std::string> ComparableTrace() const {
    std::vector<std::pair<std::string, std::string>> names;
    for (size_t i = 0; i < opened_sessions_.size(); ++i) {
      names.emplace_back(absl::StrCat(opened_sessions_[i]), absl::StrCat("S", i));
    }
    std::vector<std::string> trace;
    for (const std::string& line : trace_) trace.push_back(absl::StrReplaceAll(line, names));
    return trace;
  }

 private:
  struct SessionInfo {
    std::shared_ptr<Session> session;
    std::string tenant;
    std::string principal;
    absl::Time deadline;
    bool ended = false;
  };
  struct SeqInfo {
    uint64_t session_id = 0;
    std::string tenant;
    std::string ns;
    std::vector<uint32_t> tokens;
    std::vector<BlockId> blocks;
    uint32_t committed = 0;
  };

  // A lower tier's record as the simulation names it: chain hash and prefix digest.
  using RecordKey = std::tuple<uint64_t, uint64_t, uint64_t>;
  static RecordKey RecordKeyOf(const Hash128& hash, uint64_t prefix_digest) {
    return {hash.hi, hash.lo, prefix_digest};
  }
  // The chain hashes and prefix digests of every full block of `tokens` in namespace `ns`
  // ("tenant/salt/lora"), computed here as a client would, not taken from the pool.
  struct Chain {
    std::vector<Hash128> hashes;
    std::vector<uint64_t> digests;
  };
  Chain ChainOf(const std::string& ns, const std::vector<uint32_t>& tokens) const {
    const std::vector<std::string> parts = absl::StrSplit(ns, '/');
    BlockHasher hasher(options_.hash_algorithm, hash_bits_);
    const HashNamespace space{options_.model_id, pool_->layout_fingerprint(), parts[0], parts[1]};
    ExtraKeys extras;
    extras.lora_id = parts[2];
    Chain chain;
    hasher.ExtendChain(hasher.Root(space), hasher.NamespaceDigest(space), tokens, block_size_,
                       extras, &chain.hashes, &chain.digests);
    return chain;
  }

  // A new pool (and manager: a new daemon) with empty tiers 1 and 2, over the disk file if any.
  absl::Status StartPool() {
    auto memory = testing::CreatePoolMemory(
        staged_ ? testing::PoolMemoryKind::kStaged : testing::PoolMemoryKind::kHost, block_bytes_,
        num_blocks_);
    if (!memory.ok()) return memory.status();
    manager_ = std::make_unique<CacheManager>(SessionLimits{}, &clock_, epoch_);
    RETURN_IF_ERROR(manager_->AddPool(options_, *std::move(memory)));
    pool_ = manager_->pools().front();
    shadow_.assign(num_blocks_, std::nullopt);
    if (hash_bits_ == 0) model_.emplace(num_blocks_);
    return absl::OkStatus();
  }

  // Adds this pool's figures to `totals` and starts counting afresh (at the end and at a
  // restart).
  absl::Status AddTotals(SimTotals* totals) {
    const PoolStatsSnapshot stats = pool_->Stats();
    totals->hit_blocks += hit_blocks_;
    totals->evictions += stats.pool.evictions;
    totals->collisions_caught += pool_->collisions_caught();
    totals->tier_hit_blocks += tier_hit_blocks_;
    totals->offloaded_blocks += offloaded_blocks_;
    totals->disk_hit_blocks += disk_hit_blocks_;
    if (stats.disk_tier.has_value()) totals->demoted_blocks += stats.disk_tier->demoted_blocks;
    hit_blocks_ = tier_hit_blocks_ = offloaded_blocks_ = disk_hit_blocks_ = 0;
    if (hash_bits_ == 0 && pool_->collisions_caught() != 0) {
      return absl::InternalError(
          absl::StrCat(pool_->collisions_caught(), " collisions caught with full-width hashes"));
    }
    return absl::OkStatus();
  }

  PoolDiskTierStats DiskStats() const {
    return pool_->Stats().disk_tier.value_or(PoolDiskTierStats{});
  }

  // What the disk tier indexes now, sorted.
  std::vector<RecordKey> DiskRecords() const {
    std::vector<RecordKey> records;
    for (const BlockRecordIdentity& record : pool_->disk_tier()->Records()) {
      records.push_back(RecordKeyOf(record.hash, record.prefix_digest));
    }
    std::sort(records.begin(), records.end());
    return records;
  }

  // Every record on disk is a block this run wrote, under its own identity.
  absl::Status CheckDiskRecords() {
    for (const BlockRecordIdentity& record : pool_->disk_tier()->Records()) {
      auto it = written_identities_.find(RecordKeyOf(record.hash, record.prefix_digest));
      if (it == written_identities_.end()) {
        return Fail(absl::StrCat("disk holds record ", record.hash.ToHex(), " never written"));
      }
      const std::vector<uint32_t>& tokens = it->second.tokens;
      if (!std::equal(record.tokens.begin(), record.tokens.end(), tokens.end() - block_size_,
                      tokens.end()) ||
          record.tokens.size() != block_size_) {
        return Fail(absl::StrCat("disk record for ", Describe(it->second), " holds tokens ",
                                 absl::StrJoin(record.tokens, ",")));
      }
    }
    return absl::OkStatus();
  }

  // Where blocks [first, limit) of `tokens` come back from below tier 1 (the model run: full
  // hashes): 'h' from tier 2 where it holds the block's record, else 'd' from the disk tier's
  // durable ones; the walk ends at the first block neither holds.
  std::string PredictBelow(const std::string& ns, const std::vector<uint32_t>& tokens, size_t first,
                           size_t limit) const {
    std::string tiers;
    const Chain chain = ChainOf(ns, tokens);
    for (size_t i = first; i < std::min(limit, chain.hashes.size()); ++i) {
      const std::optional<BlockRecordIdentity> host = pool_->host_tier()->Find(chain.hashes[i]);
      if (host.has_value() && host->prefix_digest == chain.digests[i]) {
        tiers.push_back('h');
        continue;
      }
      if (!disk_) break;
      const absl::StatusOr<BlockRecordIdentity> disk = pool_->disk_tier()->Find(chain.hashes[i]);
      if (!disk.ok() || disk->prefix_digest != chain.digests[i]) break;
      tiers.push_back('d');
    }
    return tiers;
  }

  // A daemon restart over the same disk file: tiers 1 and 2 and every session are gone; the disk
  // indexes again exactly the records it held (each offload was flushed: all durable).
  absl::Status Restart(SimTotals* totals) {
    pool_->disk_tier()->Flush();
    const std::vector<RecordKey> before = DiskRecords();
    RETURN_IF_ERROR(AddTotals(totals));
    ++totals->restarts;
    trace_.push_back(absl::StrCat("restart with ", before.size(), " records on disk"));
    pool_ = nullptr;
    manager_.reset();  // the pool, its tiers and its lock on the file
    ++epoch_;
    sessions_.clear();
    session_order_.clear();
    seqs_.clear();
    dead_seqs_.clear();
    RETURN_IF_ERROR(StartPool());
    const PoolStatsSnapshot stats = pool_->Stats();
    const DiskTierStats& disk = stats.disk_tier->store;
    totals->restored_records += disk.restart_records;
    if (disk.restart_records != before.size() || disk.restart_torn != 0 ||
        disk.restart_foreign != 0 || disk.restart_old_format != 0 || disk.restart_duplicates != 0) {
      return Fail(absl::StrCat("restart: restored/torn/foreign/old/duplicates ",
                               disk.restart_records, "/", disk.restart_torn, "/",
                               disk.restart_foreign, "/", disk.restart_old_format, "/",
                               disk.restart_duplicates, "; the disk held ", before.size()));
    }
    if (DiskRecords() != before) return Fail("restart: the disk indexes other records");
    if (stats.host_tier->store.records != 0) return Fail("restart: tier 2 is not empty");
    RETURN_IF_ERROR(CheckDiskRecords());
    // Tiers 1 and 2 are empty: every recent prompt, in every namespace, is found on disk exactly
    // as far as the records the old pool left there continue its chain.
    const std::set<RecordKey> held(before.begin(), before.end());
    for (const std::vector<uint32_t>& tokens : prompts_) {
      for (absl::string_view tenant : kTenants) {
        for (absl::string_view salt : kSalts) {
          const Chain chain = ChainOf(Namespace(std::string(tenant), salt, ""), tokens);
          size_t want = 0;
          while (want < chain.hashes.size() &&
                 held.count(RecordKeyOf(chain.hashes[want], chain.digests[want])) > 0) {
            ++want;
          }
          auto found = pool_->Lookup(tenant, SequenceSpec{tokens, salt, {}});
          if (!found.ok() || found->num_cached_blocks != want ||
              found->num_disk_tier_tokens != want * block_size_) {
            return Fail(absl::StrCat("restart: lookup ", tenant, "/", salt, " tokens ",
                                     absl::StrJoin(tokens, ","), " -> ",
                                     found.ok()
                                         ? absl::StrCat(found->num_cached_blocks, " blocks, ",
                                                        found->num_disk_tier_tokens, " disk tokens")
                                         : found.status().ToString(),
                                     "; the old pool left ", want, " blocks of it on disk"));
          }
          totals->restart_found_blocks += want;
        }
      }
    }
    // A new session computes two recent prompts again: what the disk holds of them is loaded.
    RETURN_IF_ERROR(OpenSession());
    for (int i = 0; i < 2 && !prompts_.empty(); ++i) {
      const std::vector<uint32_t> prompt = prompts_[Uniform(0, prompts_.size() - 1)];
      RETURN_IF_ERROR(OpenSequence(OpenMode::kCompute, /*composite=*/true, &prompt));
    }
    return absl::OkStatus();
  }

  uint32_t Uniform(uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng_);
  }
  bool Chance(int percent) { return Uniform(0, 99) < static_cast<uint32_t>(percent); }
  template <typename T>
  T Pick(std::initializer_list<T> items) {
    return *(items.begin() + Uniform(0, static_cast<uint32_t>(items.size()) - 1));
  }

  absl::Status Fail(absl::string_view what) { return absl::InternalError(what); }
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

  std::vector<uint32_t> NewPrompt() {
    std::vector<uint32_t> tokens;
    if (!prompts_.empty() && Chance(70)) {
      const std::vector<uint32_t>& base = prompts_[Uniform(0, prompts_.size() - 1)];
      tokens.assign(base.begin(),
                    base.begin() + (Chance(50) ? base.size() : Uniform(0, base.size())));
    }
    const uint32_t extra = Chance(3) ? num_blocks_ * block_size_ + 1 : Uniform(0, 3 * block_size_);
    // A tiny alphabet: equal blocks under different prefixes are common.
    for (uint32_t i = 0; i < extra; ++i) tokens.push_back(Uniform(1, 3));
    if (!tokens.empty()) {
      if (prompts_.size() < 12) {
        prompts_.push_back(tokens);
      } else {
        prompts_[Uniform(0, prompts_.size() - 1)] = tokens;
      }
    }
    return tokens;
  }

  std::string Namespace(const std::string& tenant, absl::string_view salt, absl::string_view lora) {
    return absl::StrCat(tenant, "/", salt, "/", lora);
  }

  // A session to act in: mostly a live one; sometimes one that has ended.
  uint64_t PickSession() {
    // In opening order: session ids are random, and the run must depend on the seed alone.
    std::vector<uint64_t> live, ended;
    for (uint64_t id : session_order_) (sessions_.at(id).ended ? ended : live).push_back(id);
    if (!ended.empty() && (live.empty() || Chance(5))) return ended[Uniform(0, ended.size() - 1)];
    if (live.empty()) return 0;
    return live[Uniform(0, live.size() - 1)];
  }
  // A sequence to act on, with the session to send: mostly its own, live one; sometimes a
  // released id or another session.
  std::pair<uint64_t, uint64_t> PickSequence() {
    if ((seqs_.empty() || Chance(4)) && !dead_seqs_.empty()) {
      return {PickSession(), dead_seqs_[Uniform(0, dead_seqs_.size() - 1)]};
    }
    if (seqs_.empty()) return {0, 0};
    auto it = seqs_.begin();
    std::advance(it, Uniform(0, seqs_.size() - 1));
    if (Chance(4)) return {PickSession(), it->first};
    return {it->second.session_id, it->first};
  }

  // The status a sequence call gets before anything about blocks: ABORTED for an ended session,
  // NOT_FOUND for a sequence that is not the session's.
  absl::StatusCode SequenceAccess(uint64_t session_id, uint64_t sequence_id) const {
    if (sessions_.at(session_id).ended) return absl::StatusCode::kAborted;
    auto it = seqs_.find(sequence_id);
    if (it == seqs_.end() || it->second.session_id != session_id)
      return absl::StatusCode::kNotFound;
    return absl::StatusCode::kOk;
  }

  // A hit must hold exactly the requested prefix: by the shadow, and in the tier run by the
  // bytes in the pool's memory.
  absl::Status CheckHit(BlockId block, const Key& want, absl::string_view op) {
    if (block >= shadow_.size() || !shadow_[block].has_value()) {
      return Fail(absl::StrCat(op, ": hit block ", block, " holds no committed KV"));
    }
    if (!(*shadow_[block] == want)) {
      return Fail(absl::StrCat(op, ": WRONG KV: hit block ", block, " holds ",
                               Describe(*shadow_[block]), " for ", Describe(want)));
    }
    return tier_ ? CheckBytes(block, want, op) : absl::OkStatus();
  }

  // The bytes the worker writes for a block of content `key`: its digest, repeated (a block is at
  // least 8 bytes).
  std::string BytesOf(const Key& key) const {
    const uint64_t digest = std::hash<std::string>{}(Describe(key));
    std::string bytes(block_bytes_, '\0');
    for (size_t b = 0; b < bytes.size(); ++b) {
      bytes[b] = static_cast<char>((digest >> (8 * (b % 8))) ^ (b / 8));
    }
    return bytes;
  }

  // The pool's memory holds `key`'s bytes in `block`.
  absl::Status CheckBytes(BlockId block, const Key& key, absl::string_view op) {
    std::string bytes(block_bytes_, '\0');
    RETURN_IF_ERROR(pool_->ReadBlock(block, 0, block_bytes_, bytes.data()));
    if (bytes != BytesOf(key)) {
      auto it = written_.find(bytes);
      return Fail(absl::StrCat(op, ": WRONG BYTES: block ", block, " holds ",
                               it == written_.end() ? "bytes never written" : Describe(it->second),
                               " for ", Describe(key)));
    }
    return absl::OkStatus();
  }

  uint64_t PassedDownOnEviction() const {
    const PoolStatsSnapshot stats = pool_->Stats();
    return stats.host_tier.has_value() ? stats.host_tier->passed_down_on_eviction : 0;
  }

  // What the mover would do now, done synchronously.
  absl::Status Offload() {
    const size_t stored = pool_->OffloadForTesting();
    offloaded_blocks_ += stored;
    trace_.push_back(absl::StrCat("offload -> ", stored));
    if (!disk_) return absl::OkStatus();
    // What was passed down becomes durable, hence visible, now: not when the writer gets to it.
    pool_->disk_tier()->Flush();
    const PoolDiskTierStats disk = DiskStats();
    trace_.back() += absl::StrCat(", passed down ", disk.demoted_blocks, " in all, disk holds ",
                                  disk.store.records, " (evicted ", disk.store.evictions, ")");
    return CheckDiskRecords();
  }

  absl::Status Step() {
    const uint32_t dice = Uniform(0, 99);
    if (sessions_.size() < 2 || dice < 6) return OpenSession();
    if (dice < 30)
      return OpenSequence(
          Pick({OpenMode::kCompute, OpenMode::kCompute, OpenMode::kPut, OpenMode::kPinCached}),
          /*composite=*/dice >= 24);
    if (dice < 40) return Extend();
    if (dice < 56) return Commit();
    if (dice < 68) return Release();
    if (dice < 74) return Fork();
    if (dice < 82) return Lookup();
    if (dice < 86) {
      const uint64_t session = PickSession();
      return session == 0 ? absl::OkStatus() : CloseSession(session);
    }
    if (dice < 93) return AdvanceAndExpire();
    return KeepAlive();
  }

  absl::Status OpenSession() {
    // Mostly one tenant, so prompts repeat within it.
    const std::string tenant(kTenants[Chance(60) ? 0 : Uniform(1, 2)]);
    const absl::Duration ttl = absl::Milliseconds(Uniform(1, 4) * 500);
    const std::string principal = absl::StrCat("uid:", tenant);
    auto session = manager_->sessions().Open(principal, tenant, "sim", ttl);
    trace_.push_back(absl::StrCat("open-session ", tenant, " ttl ", absl::FormatDuration(ttl)));
    if (!session.ok()) return session.status();
    trace_.back() += absl::StrCat(" -> ", (*session)->id);
    sessions_[(*session)->id] =
        SessionInfo{*session, tenant, principal, clock_.Now() + ttl, /*ended=*/false};
    session_order_.push_back((*session)->id);
    opened_sessions_.push_back((*session)->id);
    return absl::OkStatus();
  }

  // Opens a sequence. `composite` with kCompute: commits every token and releases (a finished
  // request); with kPut: the same (what PutBlocks does); with kPinCached: checks the hits and
  // releases (GetBlocks). `prompt`: these tokens rather than a new prompt.
  absl::Status OpenSequence(OpenMode mode, bool composite,
                            const std::vector<uint32_t>* prompt = nullptr) {
    const uint64_t session_id = PickSession();
    if (session_id == 0) return absl::OkStatus();
    const SessionInfo& session = sessions_.at(session_id);
    std::vector<uint32_t> tokens = prompt != nullptr ? *prompt : NewPrompt();
    const std::string salt(kSalts[Chance(80) ? 0 : 1]);
    const std::string lora = Chance(5) ? "lora-a" : "";
    const std::string ns = Namespace(session.tenant, salt, lora);
    ExtraKeys extras;
    extras.lora_id = lora;
    static constexpr const char* kModeNames[] = {"compute", "put", "pin"};
    trace_.push_back(absl::StrCat("open ", kModeNames[static_cast<int>(mode)], composite ? "+" : "",
                                  " session ", session_id, " ns ", ns, " tokens ",
                                  absl::StrJoin(tokens, ",")));

    // What the model can say without hits.
    const size_t full_blocks = tokens.size() / block_size_;
    size_t total_blocks =
        mode == OpenMode::kCompute ? (tokens.size() + block_size_ - 1) / block_size_ : full_blocks;
    absl::StatusCode want = absl::StatusCode::kOk;
    if (tokens.empty() || (mode == OpenMode::kPut && full_blocks == 0)) {
      want = absl::StatusCode::kInvalidArgument;
    } else if (mode != OpenMode::kPinCached && total_blocks > num_blocks_) {
      want = absl::StatusCode::kResourceExhausted;
    } else if (session.ended) {
      want = absl::StatusCode::kAborted;
    }
    if (mode == OpenMode::kPinCached) total_blocks = std::min<size_t>(total_blocks, num_blocks_);
    const size_t max_hits = mode == OpenMode::kCompute
                                ? (tokens.empty() ? 0 : (tokens.size() - 1) / block_size_)
                                : total_blocks;
    std::vector<BlockId> model_hits;
    std::string below;  // with tiers: where each block after the tier-1 hits comes from
    if (want == absl::StatusCode::kOk && model_) {
      model_hits = model_->Walk(ns, tokens, block_size_, max_hits);
      size_t evictable_hits = 0;
      for (BlockId block : model_hits) evictable_hits += model_->IsEvictable(block) ? 1 : 0;
      if (tier_) below = PredictBelow(ns, tokens, model_hits.size(), max_hits);
      if (mode == OpenMode::kPinCached) {
        // A read loads only into blocks it can have without failing.
        below.resize(std::min<size_t>(
            below.size(), model_->num_free() + model_->num_evictable() - evictable_hits));
        total_blocks = model_hits.size() + below.size();
      }
      if (total_blocks - model_hits.size() >
          model_->num_free() + model_->num_evictable() - evictable_hits) {
        want = absl::StatusCode::kResourceExhausted;
      }
    }

    const uint64_t passed_down_before = PassedDownOnEviction();
    auto opened = pool_->Open(*session.session, SequenceSpec{tokens, salt, extras}, mode);
    // An open that evicted blocks no tier held passed them down first, and the stores that took
    // them may have evicted records of the tiers below that `below` counted on (tier 2 keeps the
    // open's own; the disk does not): then it loads at most what was predicted.
    const bool passed_down = PassedDownOnEviction() != passed_down_before;
    trace_.back() += absl::StrCat(passed_down ? " (passed down victims)" : "", " -> ",
                                  opened.ok() ? "" : opened.status().ToString());
    if (!model_ && want == absl::StatusCode::kOk && absl::IsResourceExhausted(opened.status())) {
      // Without the model, capacity depends on hits the weak hash may have lost.
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(ExpectCode(opened, want, "open"));
    if (!opened.ok()) return absl::OkStatus();
    trace_.back() +=
        absl::StrCat("seq ", opened->sequence_id, " blocks ", absl::StrJoin(opened->block_ids, ","),
                     " cached ", opened->num_cached_tokens,
                     tier_ ? absl::StrCat(" (", opened->num_host_tier_tokens, " from tier 2, ",
                                          opened->num_disk_tier_tokens, " from disk)")
                           : "");

    const size_t hits = opened->num_cached_tokens / block_size_;
    // The last `loaded` hits came from below (the walk continues there where tier 1 ends).
    const size_t from_host = opened->num_host_tier_tokens / block_size_;
    const size_t from_disk = opened->num_disk_tier_tokens / block_size_;
    const size_t loaded = from_host + from_disk;
    if (opened->num_cached_tokens % block_size_ != 0 || hits > max_hits) {
      return Fail("open: cached tokens not whole blocks or past the cap");
    }
    if (opened->num_host_tier_tokens % block_size_ != 0 ||
        opened->num_disk_tier_tokens % block_size_ != 0 || loaded > hits ||
        (!tier_ && from_host > 0) || (!disk_ && from_disk > 0)) {
      return Fail(absl::StrCat("open: ", opened->num_host_tier_tokens, " tokens from tier 2, ",
                               opened->num_disk_tier_tokens, " from disk"));
    }
    if (model_ && !passed_down &&
        (from_host != static_cast<size_t>(absl::c_count(below, 'h')) ||
         from_disk != static_cast<size_t>(absl::c_count(below, 'd')))) {
      return Fail(absl::StrCat("open: loaded ", from_host, " blocks from tier 2 and ", from_disk,
                               " from disk; the tiers hold \"", below, "\" after the tier-1 hits"));
    }
    if (model_ && passed_down && loaded > below.size()) {
      return Fail(absl::StrCat("open: loaded ", loaded, " blocks after passing its victims down; ",
                               "the tiers held \"", below, "\" after the tier-1 hits"));
    }
    const size_t tier1_hits = hits - loaded;
    if (mode == OpenMode::kPinCached) total_blocks = hits;
    if (opened->block_ids.size() != total_blocks) {
      return Fail(absl::StrCat("open: ", opened->block_ids.size(), " blocks, want ", total_blocks));
    }
    // A loaded block was a fresh one: it must now hold the requested content's bytes, as a
    // worker would have written them when it was computed.
    for (size_t i = tier1_hits; i < hits; ++i) {
      const Key key = KeyOf(ns, tokens, i, block_size_);
      RETURN_IF_ERROR(CheckBytes(opened->block_ids[i], key, "open from tier 2"));
      shadow_[opened->block_ids[i]] = key;
    }
    for (size_t i = 0; i < hits; ++i) {
      RETURN_IF_ERROR(CheckHit(opened->block_ids[i], KeyOf(ns, tokens, i, block_size_), "open"));
    }
    hit_blocks_ += hits;
    tier_hit_blocks_ += from_host;
    disk_hit_blocks_ += from_disk;
    if (model_) {
      if (tier1_hits != model_hits.size() ||
          !std::equal(model_hits.begin(), model_hits.end(), opened->block_ids.begin())) {
        return Fail(absl::StrCat(
            "open: hit blocks ",
            absl::StrJoin(opened->block_ids.begin(), opened->block_ids.begin() + tier1_hits, ","),
            " (and ", loaded, " from below), model says ", absl::StrJoin(model_hits, ",")));
      }
      for (BlockId block : model_hits) {
        model_->Acquire(block, session.tenant, mode == OpenMode::kCompute);
      }
      for (size_t i = tier1_hits; i < total_blocks; ++i) {
        RETURN_IF_ERROR(model_->Allocate(opened->block_ids[i], session.tenant));
      }
      // The open publishes what it loaded, by Commit's rule.
      const uint32_t published =
          model_->Commit(ns, tokens, opened->block_ids, block_size_,
                         static_cast<uint32_t>(tier1_hits), static_cast<uint32_t>(hits));
      if (published != loaded) {
        return Fail(absl::StrCat("open: loaded ", loaded, " blocks, model publishes ", published));
      }
    }
    for (size_t i = hits; i < total_blocks; ++i) shadow_[opened->block_ids[i]].reset();

    SeqInfo info{.session_id = session_id,
                 .tenant = session.tenant,
                 .ns = ns,
                 .tokens = tokens,
                 .blocks = opened->block_ids,
                 .committed = static_cast<uint32_t>(hits)};
    if (mode != OpenMode::kCompute) info.tokens.resize(total_blocks * block_size_);
    const uint64_t id = opened->sequence_id;
    seqs_.emplace(id, std::move(info));
    if (!composite) return absl::OkStatus();
    if (mode != OpenMode::kPinCached) {
      RETURN_IF_ERROR(DoCommit(session_id, id, static_cast<uint32_t>(seqs_.at(id).tokens.size())));
    }
    return DoRelease(session_id, id);
  }

  absl::Status Extend() {
    auto [session_id, id] = PickSequence();
    if (session_id == 0) return absl::OkStatus();
    std::vector<uint32_t> more(Chance(5) ? 0 : Uniform(1, 2 * block_size_));
    for (uint32_t& token : more) token = Uniform(1, 3);
    trace_.push_back(
        absl::StrCat("extend session ", session_id, " seq ", id, " by ", absl::StrJoin(more, ",")));
    absl::StatusCode want =
        more.empty() ? absl::StatusCode::kInvalidArgument : SequenceAccess(session_id, id);
    size_t needed = 0;
    if (want == absl::StatusCode::kOk) {
      const SeqInfo& seq = seqs_.at(id);
      const size_t total = (seq.tokens.size() + more.size() + block_size_ - 1) / block_size_;
      needed = total - seq.blocks.size();
      if (total > num_blocks_) {
        want = absl::StatusCode::kResourceExhausted;
      } else if (model_ && needed > model_->num_free() + model_->num_evictable()) {
        want = absl::StatusCode::kResourceExhausted;
      }
    }
    auto extended = pool_->Extend(*sessions_.at(session_id).session, id, more);
    trace_.back() +=
        absl::StrCat(" -> ", extended.ok() ? absl::StrJoin(extended->new_block_ids, ",")
                                           : extended.status().ToString());
    if (!model_ && want == absl::StatusCode::kOk && absl::IsResourceExhausted(extended.status())) {
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(ExpectCode(extended, want, "extend"));
    if (!extended.ok()) return absl::OkStatus();
    SeqInfo& seq = seqs_.at(id);
    if (extended->new_block_ids.size() != needed ||
        extended->num_tokens != seq.tokens.size() + more.size()) {
      return Fail("extend: wrong block or token count");
    }
    for (BlockId block : extended->new_block_ids) {
      if (model_) RETURN_IF_ERROR(model_->Allocate(block, seq.tenant));
      shadow_[block].reset();
      seq.blocks.push_back(block);
    }
    seq.tokens.insert(seq.tokens.end(), more.begin(), more.end());
    return absl::OkStatus();
  }

  absl::Status Commit() {
    auto [session_id, id] = PickSequence();
    if (session_id == 0) return absl::OkStatus();
    auto it = seqs_.find(id);
    const uint32_t length = it == seqs_.end() ? 0 : static_cast<uint32_t>(it->second.tokens.size());
    uint32_t written = Chance(60) ? length : Uniform(0, length);
    if (Chance(3)) written = length + 1;
    return DoCommit(session_id, id, written);
  }

  absl::Status DoCommit(uint64_t session_id, uint64_t id, uint32_t written) {
    trace_.push_back(absl::StrCat("commit session ", session_id, " seq ", id, " tokens ", written));
    absl::StatusCode want = SequenceAccess(session_id, id);
    if (want == absl::StatusCode::kOk && written > seqs_.at(id).tokens.size()) {
      want = absl::StatusCode::kInvalidArgument;
    }
    if (tier_ && want == absl::StatusCode::kOk) {
      // The worker writes the KV of every full block it computed (one it shares holds it).
      const SeqInfo& seq = seqs_.at(id);
      for (uint32_t i = 0; i < written / block_size_; ++i) {
        if (shadow_[seq.blocks[i]].has_value()) continue;
        const Key key = KeyOf(seq.ns, seq.tokens, i, block_size_);
        std::string bytes = BytesOf(key);
        RETURN_IF_ERROR(pool_->WriteBlock(seq.blocks[i], 0, bytes));
        written_.emplace(std::move(bytes), key);
        if (disk_) {
          const Chain chain = ChainOf(seq.ns, key.tokens);
          written_identities_.emplace(RecordKeyOf(chain.hashes.back(), chain.digests.back()), key);
        }
      }
    }
    auto committed = pool_->Commit(*sessions_.at(session_id).session, id, written);
    trace_.back() += absl::StrCat(
        " -> ", committed.ok() ? absl::StrCat(committed->num_committed_blocks, " committed, ",
                                              committed->num_published_blocks, " published")
                               : committed.status().ToString());
    RETURN_IF_ERROR(ExpectCode(committed, want, "commit"));
    if (!committed.ok()) return absl::OkStatus();
    SeqInfo& seq = seqs_.at(id);
    const uint32_t written_blocks = written / block_size_;
    // The worker wrote the KV of every block it computed; a block it shares already holds it.
    for (uint32_t i = 0; i < written_blocks; ++i) {
      const Key key = KeyOf(seq.ns, seq.tokens, i, block_size_);
      std::optional<Key>& held = shadow_[seq.blocks[i]];
      if (!held.has_value()) {
        held = key;
      } else if (!(*held == key)) {
        return Fail(absl::StrCat("commit: WRONG KV: block ", seq.blocks[i], " at position ", i,
                                 " holds ", Describe(*held), " for ", Describe(key)));
      }
    }
    const uint32_t from = seq.committed;
    seq.committed = std::max(seq.committed, written_blocks);
    if (committed->num_committed_blocks != seq.committed) {
      return Fail(absl::StrCat("commit: ", committed->num_committed_blocks, " committed, want ",
                               seq.committed));
    }
    if (model_) {
      const uint32_t published =
          model_->Commit(seq.ns, seq.tokens, seq.blocks, block_size_, from, written_blocks);
      if (published != committed->num_published_blocks) {
        return Fail(absl::StrCat("commit: ", committed->num_published_blocks,
                                 " published, model says ", published));
      }
    }
    return absl::OkStatus();
  }

  absl::Status Release() {
    auto [session_id, id] = PickSequence();
    if (session_id == 0) return absl::OkStatus();
    return DoRelease(session_id, id);
  }

  absl::Status DoRelease(uint64_t session_id, uint64_t id) {
    trace_.push_back(absl::StrCat("release session ", session_id, " seq ", id));
    const absl::StatusCode want = SequenceAccess(session_id, id);
    RETURN_IF_ERROR(
        ExpectCode(pool_->Release(*sessions_.at(session_id).session, id), want, "release"));
    if (want != absl::StatusCode::kOk) return absl::OkStatus();
    const SeqInfo& seq = seqs_.at(id);
    // Tail first.
    if (model_) model_->Release({seq.blocks.rbegin(), seq.blocks.rend()});
    seqs_.erase(id);
    dead_seqs_.push_back(id);
    return absl::OkStatus();
  }

  absl::Status Fork() {
    auto [session_id, id] = PickSequence();
    if (session_id == 0) return absl::OkStatus();
    trace_.push_back(absl::StrCat("fork session ", session_id, " seq ", id));
    absl::StatusCode want = SequenceAccess(session_id, id);
    bool has_partial = false;
    if (want == absl::StatusCode::kOk) {
      const SeqInfo& parent = seqs_.at(id);
      has_partial = parent.tokens.size() / block_size_ < parent.blocks.size();
      if (model_ && has_partial && model_->num_free() + model_->num_evictable() == 0) {
        want = absl::StatusCode::kResourceExhausted;
      }
    }
    auto forked = pool_->Fork(*sessions_.at(session_id).session, id);
    trace_.back() +=
        absl::StrCat(" -> ", forked.ok() ? absl::StrCat("seq ", forked->sequence_id, " blocks ",
                                                        absl::StrJoin(forked->block_ids, ","))
                                         : forked.status().ToString());
    if (!model_ && want == absl::StatusCode::kOk && absl::IsResourceExhausted(forked.status())) {
      return absl::OkStatus();
    }
    RETURN_IF_ERROR(ExpectCode(forked, want, "fork"));
    if (!forked.ok()) return absl::OkStatus();
    SeqInfo child = seqs_.at(id);
    const size_t full = child.tokens.size() / block_size_;
    if (forked->block_ids.size() != child.blocks.size() ||
        !std::equal(child.blocks.begin(), child.blocks.begin() + full, forked->block_ids.begin())) {
      return Fail("fork: the child does not share the parent's full blocks");
    }
    if (has_partial != (forked->copied_from_block != kNoBlock) ||
        (has_partial && forked->copied_from_block != child.blocks.back())) {
      return Fail("fork: wrong copy source");
    }
    if (model_) {
      for (size_t i = 0; i < full; ++i) model_->Acquire(child.blocks[i], child.tenant, false);
      if (has_partial) RETURN_IF_ERROR(model_->Allocate(forked->block_ids.back(), child.tenant));
    }
    if (has_partial) shadow_[forked->block_ids.back()].reset();
    child.blocks = forked->block_ids;
    seqs_.emplace(forked->sequence_id, std::move(child));
    return absl::OkStatus();
  }

  absl::Status Lookup() {
    const std::string tenant(kTenants[Uniform(0, 2)]);
    const std::string salt(kSalts[Chance(80) ? 0 : 1]);
    std::vector<uint32_t> tokens = NewPrompt();
    trace_.push_back(
        absl::StrCat("lookup ", tenant, "/", salt, " tokens ", absl::StrJoin(tokens, ",")));
    auto found = pool_->Lookup(tenant, SequenceSpec{tokens, salt, {}});
    if (!found.ok()) return Fail(absl::StrCat("lookup: ", found.status().ToString()));
    trace_.back() += absl::StrCat(" -> ", found->num_cached_blocks, " (tier 2 tokens ",
                                  found->num_host_tier_tokens, ", disk tokens ",
                                  found->num_disk_tier_tokens, ")");
    if (found->num_cached_tokens != found->num_cached_blocks * block_size_ ||
        found->num_cached_blocks > tokens.size() / block_size_ ||
        found->num_host_tier_tokens % block_size_ != 0 ||
        found->num_disk_tier_tokens % block_size_ != 0 ||
        found->num_host_tier_tokens + found->num_disk_tier_tokens > found->num_cached_tokens ||
        (!tier_ && found->num_host_tier_tokens > 0) ||
        (!disk_ && found->num_disk_tier_tokens > 0)) {
      return Fail("lookup: inconsistent answer");
    }
    if (model_) {
      // The lower tiers' part follows tier 1's; the model knows tier 1's.
      const size_t from_host = found->num_host_tier_tokens / block_size_;
      const size_t from_disk = found->num_disk_tier_tokens / block_size_;
      const size_t tier1_blocks = found->num_cached_blocks - from_host - from_disk;
      const std::string ns = Namespace(tenant, salt, "");
      const size_t want = model_->Walk(ns, tokens, block_size_, tokens.size()).size();
      if (tier1_blocks != want) {
        return Fail(absl::StrCat("lookup: ", tier1_blocks, " blocks in tier 1, model says ", want));
      }
      if (tier_) {
        const std::string below = PredictBelow(ns, tokens, want, tokens.size() / block_size_);
        if (from_host != static_cast<size_t>(absl::c_count(below, 'h')) ||
            from_disk != static_cast<size_t>(absl::c_count(below, 'd'))) {
          return Fail(absl::StrCat("lookup: ", from_host, " blocks in tier 2 and ", from_disk,
                                   " on disk; the tiers hold \"", below,
                                   "\" after the tier-1 hits"));
        }
      }
    }
    return absl::OkStatus();
  }

  // The model's side of a session's end: its sequences dropped, their blocks (each sequence's
  // tail first) appended to `blocks`, which the caller releases as one LRU group.
  uint32_t EndSession(uint64_t session_id, std::vector<BlockId>* blocks) {
    SessionInfo& info = sessions_.at(session_id);
    info.ended = true;
    uint32_t count = 0;
    for (auto it = seqs_.begin(); it != seqs_.end();) {
      if (it->second.session_id != session_id) {
        ++it;
        continue;
      }
      blocks->insert(blocks->end(), it->second.blocks.rbegin(), it->second.blocks.rend());
      dead_seqs_.push_back(it->first);
      it = seqs_.erase(it);
      ++count;
    }
    return count;
  }

  absl::Status CloseSession(uint64_t session_id) {
    SessionInfo& info = sessions_.at(session_id);
    trace_.push_back(absl::StrCat("close session ", session_id));
    auto closed = manager_->CloseSession(session_id, epoch_, info.principal);
    std::vector<BlockId> blocks;
    const uint32_t want = info.ended ? 0 : EndSession(session_id, &blocks);
    if (model_) model_->Release(blocks);
    if (!closed.ok() || *closed != want || !info.session->closed.load()) {
      return Fail(absl::StrCat("close: got ",
                               closed.ok() ? absl::StrCat(*closed) : closed.status().ToString(),
                               ", model says ", want));
    }
    return absl::OkStatus();
  }

  absl::Status AdvanceAndExpire() {
    const absl::Duration by = absl::Milliseconds(Uniform(1, 6) * 250);
    clock_.Advance(by);
    const bool sweep = Chance(70);
    trace_.push_back(
        absl::StrCat("advance ", absl::FormatDuration(by), sweep ? " and expire" : ""));
    if (!sweep) return absl::OkStatus();
    // The sweep ends them oldest first (SessionRegistry::TakeExpired), as session_order_ lists
    // them: their blocks join the LRU in exactly that order.
    size_t want = 0;
    std::vector<BlockId> blocks;
    for (uint64_t id : session_order_) {
      const SessionInfo& info = sessions_.at(id);
      if (info.ended || info.deadline > clock_.Now()) continue;
      ++want;
      EndSession(id, &blocks);
    }
    if (model_) model_->Release(blocks);
    const size_t expired = manager_->ExpireSessions();
    trace_.back() += absl::StrCat(" -> ", expired);
    if (expired != want)
      return Fail(absl::StrCat("expire: ", expired, " sessions, model says ", want));
    for (const auto& [id, info] : sessions_) {
      if (info.session->closed.load() != info.ended) {
        return Fail(absl::StrCat("session ", id, " closed is ", info.session->closed.load()));
      }
    }
    return absl::OkStatus();
  }

  absl::Status KeepAlive() {
    const uint64_t session_id = PickSession();
    if (session_id == 0) return absl::OkStatus();
    SessionInfo& info = sessions_.at(session_id);
    trace_.push_back(absl::StrCat("keepalive session ", session_id));
    // A lease past its deadline has ended, swept or not.
    const bool alive = !info.ended && info.deadline > clock_.Now();
    RETURN_IF_ERROR(ExpectCode(manager_->sessions().KeepAlive(session_id),
                               alive ? absl::StatusCode::kOk : absl::StatusCode::kAborted,
                               "keepalive"));
    if (alive) info.deadline = clock_.Now() + info.session->ttl;
    return absl::OkStatus();
  }

  absl::Status CheckAccounting() {
    RETURN_IF_ERROR(pool_->CheckInvariants());
    const PoolStatsSnapshot stats = pool_->Stats();
    if (stats.free + stats.evictable + stats.referenced != num_blocks_) {
      return Fail(absl::StrCat("free ", stats.free, " + evictable ", stats.evictable,
                               " + referenced ", stats.referenced, " != ", num_blocks_));
    }
    if (stats.open_sequences != seqs_.size()) {
      return Fail(absl::StrCat(stats.open_sequences, " open sequences, want ", seqs_.size()));
    }
    if (stats.host_tier.has_value() != tier_) return Fail("tier stats present or missing");
    if (tier_) {
      const PoolHostTierStats& tier = *stats.host_tier;
      if (tier.hit_blocks != tier_hit_blocks_ || tier.offloaded_blocks != offloaded_blocks_ ||
          tier.load_failures != 0 || tier.deadline_blocks != 0 || tier.request_waits != 0) {
        return Fail(absl::StrCat(
            "tier stats: hits/offloaded/load failures/deadline/waits ", tier.hit_blocks, "/",
            tier.offloaded_blocks, "/", tier.load_failures, "/", tier.deadline_blocks, "/",
            tier.request_waits, "; want ", tier_hit_blocks_, "/", offloaded_blocks_, "/0/0/0"));
      }
    }
    if (stats.disk_tier.has_value() != disk_) return Fail("disk tier stats present or missing");
    if (disk_) {
      // Every disk hit counted, once, by the pool and by the tier; nothing failed or refused.
      const PoolDiskTierStats& disk = *stats.disk_tier;
      const DiskTierStats& tier = disk.store;
      if (disk.hit_blocks != disk_hit_blocks_ || tier.load_hits != disk_hit_blocks_ ||
          tier.loads != tier.load_hits || disk.load_failures != 0 || disk.deadline_blocks != 0 ||
          tier.write_errors != 0 || tier.stores_refused_full != 0 ||
          tier.stores_refused_stopped != 0 || tier.stores_dropped != 0 || tier.queued != 0 ||
          tier.records > tier.slots) {
        return Fail(
            absl::StrCat("disk stats: hits ", disk.hit_blocks, " (tier ", tier.load_hits, " of ",
                         tier.loads, " loads; want ", disk_hit_blocks_, "), load failures ",
                         disk.load_failures, ", deadline ", disk.deadline_blocks, ", write errors ",
                         tier.write_errors, ", refused ", tier.stores_refused_full, "+",
                         tier.stores_refused_stopped, ", dropped ", tier.stores_dropped,
                         ", queued ", tier.queued, ", records ", tier.records, " of ", tier.slots));
      }
    }
    if (!model_) return absl::OkStatus();
    const BlockPoolCounters& want = model_->counters();
    if (stats.free != model_->num_free() || stats.evictable != model_->num_evictable() ||
        stats.referenced != model_->num_referenced() || stats.pool.evictions != want.evictions ||
        stats.pool.resurrections != want.resurrections || stats.pool.published != want.published ||
        stats.pool.duplicates != want.duplicates) {
      return Fail(absl::StrCat("stats: free/evictable/referenced ", stats.free, "/",
                               stats.evictable, "/", stats.referenced,
                               " evictions/resurrections/published/"
                               "duplicates ",
                               stats.pool.evictions, "/", stats.pool.resurrections, "/",
                               stats.pool.published, "/", stats.pool.duplicates, "; model says ",
                               model_->num_free(), "/", model_->num_evictable(), "/",
                               model_->num_referenced(), " ", want.evictions, "/",
                               want.resurrections, "/", want.published, "/", want.duplicates));
    }
    for (absl::string_view tenant : kTenants) {
      const uint32_t referenced = pool_->Stats(tenant).referenced;
      if (referenced != model_->ReferencedBy(std::string(tenant))) {
        return Fail(absl::StrCat("tenant ", tenant, " holds ", referenced, ", model says ",
                                 model_->ReferencedBy(std::string(tenant))));
      }
    }
    return absl::OkStatus();
  }

  std::mt19937_64 rng_;
  const uint32_t hash_bits_;
  const bool tier_;
  const bool disk_;
  const bool staged_;
  const bool parts_;
  const int num_ops_;
  PoolOptions options_;
  // The disk tier's file, kept across restarts.
  std::optional<::kvcache::testing::ScopedTempDir> disk_dir_;
  uint32_t block_size_ = 0;
  uint64_t block_bytes_ = 0;
  uint32_t num_blocks_ = 0;
  FakeClock clock_;
  uint64_t epoch_ = kEpoch;                // a restart is a new daemon: a new epoch
  std::unique_ptr<CacheManager> manager_;  // destroyed before the file: declared after disk_dir_
  Pool* pool_ = nullptr;
  std::optional<Model> model_;
  std::vector<std::optional<Key>> shadow_;
  std::map<uint64_t, SessionInfo> sessions_;
  std::vector<uint64_t> session_order_;
  std::vector<uint64_t> opened_sessions_;  // every session opened, restarts included
  std::map<uint64_t, SeqInfo> seqs_;
  std::vector<uint64_t> dead_seqs_;
  std::vector<std::vector<uint32_t>> prompts_;
  std::vector<std::string> trace_;
  uint64_t hit_blocks_ = 0;
  uint64_t tier_hit_blocks_ = 0;  // blocks Open loaded from tier 2
  uint64_t disk_hit_blocks_ = 0;  // blocks Open loaded from the disk tier
  uint64_t offloaded_blocks_ = 0;
  std::map<std::string, Key> written_;  // the tier run's bytes, for messages
  // The disk run's written blocks by their records' identity, kept across restarts.
  std::map<RecordKey, Key> written_identities_;
};

// Operations per seed by default: fewer under the sanitizers (CI's Debug ASan + UBSan build runs
// some 20 times slower), the same 10,000 seeds either way. The tier run keeps 120 operations (its
// tier-2 hits need a commit, an offload, an eviction and a reopen: 30 operations make 10 in 2,000
// seeds) and takes a quarter of its seeds there instead.
#if defined(__SANITIZE_ADDRESS__)
constexpr bool kSanitized = true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
constexpr bool kSanitized = true;
#else
constexpr bool kSanitized = false;
#endif
#else
constexpr bool kSanitized = false;
#endif
constexpr uint64_t kDefaultOps = kSanitized ? 30 : 120;
constexpr uint64_t kTierOps = 120;
constexpr uint64_t kTierSeeds = kSanitized ? 500 : 2'000;
// The disk runs' I/O (a file per seed, an fdatasync per offload that passes records down, a
// restart's scan) costs more per operation.
constexpr uint64_t kDiskSeeds = 100;

uint64_t EnvOr(const char* name, uint64_t fallback) {
  const char* value = std::getenv(name);
  return value == nullptr || *value == '\0' ? fallback : std::strtoull(value, nullptr, 10);
}

// The one seed KVCACHE_SIM_SEED names, else KVCACHE_SIM_SEEDS (default `default_seeds`) seeds
// from `first_seed`.
std::vector<uint64_t> SeedsToRun(uint64_t first_seed, uint64_t default_seeds) {
  const char* replay = std::getenv("KVCACHE_SIM_SEED");
  if (replay != nullptr && *replay != '\0') return {std::strtoull(replay, nullptr, 10)};
  std::vector<uint64_t> seeds;
  const uint64_t count = EnvOr("KVCACHE_SIM_SEEDS", default_seeds);
  for (uint64_t i = 0; i < count; ++i) seeds.push_back(first_seed + i);
  return seeds;
}

// After a seed's run: a failure names the seed, how to replay it and its trace; a replayed seed
// (the only one run) prints its trace. False after a failure: the run stops there.
bool ReportSeed(absl::string_view name, uint64_t seed, const absl::Status& status,
                const std::vector<std::string>& trace_lines, bool only_seed) {
  if (status.ok() && !only_seed) return true;
  const std::string trace = absl::StrJoin(trace_lines, "\n  ");
  if (!status.ok()) {
    ADD_FAILURE() << name << " seed " << seed << " failed: " << status.message()
                  << "\nreplay: KVCACHE_SIM_SEED=" << seed
                  << " tests/cache/simulation_test --gtest_filter=*" << name << "*\ntrace:\n  "
                  << trace;
    return false;
  }
  std::printf("seed %llu trace:\n  %s\n", static_cast<unsigned long long>(seed), trace.c_str());
  return true;
}

enum class Run {
  kModel,         // full-width hashes, checked against the model
  kWeakHash,      // 4- or 8-bit hashes, without the model
  kTier,          // a tier 2, full-width hashes, checked against the model
  kTierStaged,    // kTier on staged memory: a device pool's copies (CPU reference)
  kWeakHashTier,  // a tier 2, 6-bit hashes, without the model
  kDisk,          // a tier 2 over a disk tier, restarts, full-width hashes, with the model
  kWeakHashDisk,  // a tier 2 over a disk tier, restarts, 6-bit hashes, without the model
  kTierParts,     // kTier on a pool with declared parts, every block committed with all of them
};

// Runs `default_seeds` seeds (or the one KVCACHE_SIM_SEED names); stops at the first failure,
// printing the seed, how to replay it and its trace.
void RunSeeds(absl::string_view name, uint64_t first_seed, Run run, uint64_t default_seeds,
              uint64_t default_ops = kDefaultOps) {
  const int ops = static_cast<int>(EnvOr("KVCACHE_SIM_OPS", default_ops));
  const std::vector<uint64_t> seeds = SeedsToRun(first_seed, default_seeds);
  SimTotals totals;
  // KVCACHE_SIM_REPLAY_EVERY=N: every Nth seed of a disk run is run twice and the traces compared.
  // Off by default: a disk run does not always replay (1 replay in 247 differed in the first 12,351
  // seeds, 1 in 44 of the weak-hash run's): when tier 2 passes down a record whose hash the full
  // disk still indexes, DiskTier::Store refuses it as a duplicate or, if the writer thread has
  // meanwhile evicted that record for an earlier store of the same offload, accepts it; the disk
  // then holds other records. Either is a valid cache state, and every check holds in both, but the
  // seed's later answers differ.
  const uint64_t replay_every = EnvOr("KVCACHE_SIM_REPLAY_EVERY", 0);
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t seed : seeds) {
    uint32_t hash_bits = 0;
    if (run == Run::kWeakHash) hash_bits = seed % 2 == 0 ? 4 : 8;
    if (run == Run::kWeakHashTier || run == Run::kWeakHashDisk) hash_bits = 6;
    const bool disk = run == Run::kDisk || run == Run::kWeakHashDisk;
    const bool staged = run == Run::kTierStaged;
    const bool parts = run == Run::kTierParts;
    const bool tier = disk || staged || parts || run == Run::kTier || run == Run::kWeakHashTier;
    Simulation simulation(seed, hash_bits, tier, disk, ops, staged, parts);
    const absl::Status status = simulation.Run(&totals);
    ++totals.seeds;
    if (status.ok() && disk && replay_every != 0 && seed % replay_every == 0) {
      // The disk tier has threads of its own (the writer, the read rings): a seed must still
      // replay exactly, answer for answer.
      SimTotals ignored;
      Simulation again(seed, hash_bits, tier, disk, ops);
      const absl::Status replayed = again.Run(&ignored);
      const std::vector<std::string> first = simulation.ComparableTrace();
      const std::vector<std::string> second = again.ComparableTrace();
      const size_t differs =
          std::mismatch(first.begin(), first.end(), second.begin(), second.end()).first -
          first.begin();
      if (!replayed.ok() || differs != first.size() || first.size() != second.size()) {
        ADD_FAILURE() << name << " seed " << seed << " did not replay (" << replayed.ToString()
                      << "): at operation " << differs << " first run "
                      << (differs < first.size() ? first[differs] : "ended") << ", replay "
                      << (differs < second.size() ? second[differs] : "ended");
        break;
      }
    }
    if (!ReportSeed(name, seed, status, simulation.trace(), seeds.size() == 1)) break;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%s: %llu seeds, %llu operations, %llu hit blocks (%llu from tier 2), %llu evictions, "
      "%llu offloaded, %llu collisions caught; disk: %llu hit blocks, %llu passed down, "
      "%llu restarts restoring %llu records (lookups then found %llu blocks); in %.1f s\n",
      std::string(name).c_str(), static_cast<unsigned long long>(totals.seeds),
      static_cast<unsigned long long>(totals.operations),
      static_cast<unsigned long long>(totals.hit_blocks),
      static_cast<unsigned long long>(totals.tier_hit_blocks),
      static_cast<unsigned long long>(totals.evictions),
      static_cast<unsigned long long>(totals.offloaded_blocks),
      static_cast<unsigned long long>(totals.collisions_caught),
      static_cast<unsigned long long>(totals.disk_hit_blocks),
      static_cast<unsigned long long>(totals.demoted_blocks),
      static_cast<unsigned long long>(totals.restarts),
      static_cast<unsigned long long>(totals.restored_records),
      static_cast<unsigned long long>(totals.restart_found_blocks), seconds);
  // A run that exercised nothing would pass vacuously.
  EXPECT_GT(totals.hit_blocks, 0u);
  EXPECT_GT(totals.evictions, 0u);
  const bool weak = run == Run::kWeakHash || run == Run::kWeakHashTier || run == Run::kWeakHashDisk;
  if (weak && seeds.size() > 100) {
    EXPECT_GT(totals.collisions_caught, 0u);
  }
  if (run != Run::kModel && run != Run::kWeakHash && seeds.size() > 100) {
    EXPECT_GT(totals.offloaded_blocks, 0u);
    EXPECT_GT(totals.tier_hit_blocks, 0u);
  }
  if ((run == Run::kDisk || run == Run::kWeakHashDisk) && seeds.size() > 100) {
    EXPECT_GT(totals.demoted_blocks, 0u);
    EXPECT_GT(totals.disk_hit_blocks, 0u);
    EXPECT_GT(totals.restored_records, 0u);
    EXPECT_GT(totals.restart_found_blocks, 0u);
  }
}

TEST(SimulationTest, MatchesTheModel) { RunSeeds("MatchesTheModel", 1, Run::kModel, 10'000); }

TEST(SimulationTest, WeakHashCollisionsAreMisses) {
  RunSeeds("WeakHashCollisionsAreMisses", 1'000'000, Run::kWeakHash, 10'000);
}

TEST(SimulationTest, Tier2KeepsTheContract) {
  RunSeeds("Tier2KeepsTheContract", 2'000'000, Run::kTier, kTierSeeds, kTierOps);
}

// The same on a device pool's path: offloads and loads through the batched copies.
TEST(SimulationTest, Tier2OnDeviceMemoryKeepsTheContract) {
  RunSeeds("Tier2OnDeviceMemoryKeepsTheContract", 2'500'000, Run::kTierStaged, kTierSeeds,
           kTierOps);
}

// Token blocks of a pool with parts keep each block's part mask beside its extra keys' digest
// (common/page_parts.h): with every part committed, the answers are the model's.
TEST(SimulationTest, Tier2WithDeclaredPartsKeepsTheContract) {
  RunSeeds("Tier2WithDeclaredPartsKeepsTheContract", 2'700'000, Run::kTierParts, kTierSeeds,
           kTierOps);
}

TEST(SimulationTest, DiskTierKeepsTheContract) {
  RunSeeds("DiskTierKeepsTheContract", 3'000'000, Run::kDisk, kDiskSeeds, kTierOps);
}

TEST(SimulationTest, WeakHashDiskTierCollisionsAreMisses) {
  RunSeeds("WeakHashDiskTierCollisionsAreMisses", 3'000'000, Run::kWeakHashDisk, kDiskSeeds,
           kTierOps);
}

// Regression (seed 2000035 served [3,2]'s KV for [3,2,2,2,3,2] when tier-2 records were verified
// against one chain link only): each record's prefix digest turns a chain collision into a miss.
TEST(SimulationTest, WeakHashTier2CollisionsAreMisses) {
  RunSeeds("WeakHashTier2CollisionsAreMisses", 2'000'000, Run::kWeakHashTier, kTierSeeds, kTierOps);
}

// ---------------------------------------------------------------------------------------------
// Pages named by an engine's keys (issue 31, DESIGN §13), on a pool with three parts: "kv" on
// every page, "swa" (a sliding window) on the last two pages of a hit, "state" (a recurrent
// state) on its last page. Seeded random operations: puts of random keys with random part masks
// (reserve and write, commit later or never, release), exists and acquire with random wanted
// parts, acquired pages held and released, pins and touches with TTLs on the FakeClock, sessions
// opened (bound to one of two manifests, or none), closed, kept alive and expired, some of them
// in the middle of a put, and offloads to tier 2 (and a disk tier below it in the disk run).
//
// PageModel is the reference: its own statement of the hit rule over the parts table below
// (never RestorablePages), and what every (tenant, manifest) namespace has been given.
//  - Every page the pool reports present must hold a part mask some put of that key in that
//    namespace committed, and its bytes (read back from every acquire) must be that put's.
//  - Exists of a key list must equal the model's hit rule applied to what each key alone
//    reports (present, tier, part mask); acquire must give that many pages with those masks
//    (fewer only when the pool had no room to load them), and pin the leading present ones.
//  - Until the pool's first eviction nothing can be lost, so the model knows exactly which
//    pages tier 1 holds with which parts: every reservation's duplicates, every commit's
//    published count, every per-key answer and every exists are predicted from it alone.
//  - Pages held (an acquire not yet released, a pin before its TTL, by a live session) stay in
//    tier 1 with their parts; with no pin alive, the referenced blocks are exactly the held ones.
//  - A session ending mid-put publishes nothing: its commit fails and its pages stay absent.
// After every operation: Pool::CheckInvariants and free + evictable + referenced = size; at the
// end, once every session has ended, nothing is referenced.

struct PagePartSpec {
  const char* name;
  uint64_t bytes;
  uint32_t trailing_pages;  // 0: needed on every page up to the endpoint
};
constexpr PagePartSpec kSimPageParts[] = {{"kv", 64, 0}, {"swa", 32, 2}, {"state", 32, 1}};
constexpr absl::string_view kSimPageSpec = "kv/64+swa/32/trailing2+state/32/trailing1";
constexpr uint32_t kSimAllParts = 0b111;
constexpr uint32_t kSimPageTokens = 4;
constexpr uint64_t kSimPageBytes = 128;

// The hit rule as the issue states it, by brute force: the greatest e such that every wanted
// part is on every page [0, e) (an all-pages part) or on each of the last `trailing_pages` pages
// before e. `leading_masks`: the part masks of the leading present pages.
size_t ModelHitRule(const std::vector<uint32_t>& leading_masks, uint32_t wanted) {
  for (size_t end = leading_masks.size(); end > 0; --end) {
    bool restorable = true;
    for (size_t part = 0; part < std::size(kSimPageParts) && restorable; ++part) {
      if ((wanted & (1u << part)) == 0) continue;
      const uint32_t trailing = kSimPageParts[part].trailing_pages;
      const size_t from = trailing == 0 || end < trailing ? 0 : end - trailing;
      for (size_t page = from; page < end; ++page) {
        if ((leading_masks[page] & (1u << part)) == 0) restorable = false;
      }
    }
    if (restorable) return end;
  }
  return 0;
}

// What one key alone reports.
struct PageProbe {
  bool present = false;
  bool in_tier1 = false;
  uint32_t mask = 0;
  friend bool operator==(const PageProbe&, const PageProbe&) = default;
};

// Keys as a trace shows them: the long ones (16 bytes of 'p', then their own) by their end.
std::string DescribeKeys(absl::Span<const std::string> keys) {
  std::vector<std::string> shown;
  for (const std::string& key : keys) {
    shown.push_back(key.size() > 16 ? absl::StrCat("p..", key.substr(key.size() - 2)) : key);
  }
  return absl::StrCat("[", absl::StrJoin(shown, ","), "]");
}

std::string DescribeProbe(const PageProbe& probe) {
  if (!probe.present) return "absent";
  return absl::StrCat(probe.in_tier1 ? "tier1" : "below", "/0x", absl::Hex(probe.mask));
}

std::string DescribeProbes(const std::vector<PageProbe>& probes) {
  std::vector<std::string> shown;
  for (const PageProbe& probe : probes) shown.push_back(DescribeProbe(probe));
  return absl::StrCat("{", absl::StrJoin(shown, " "), "}");
}

class PageSimulation {
 public:
  PageSimulation(uint64_t seed, bool disk, int num_ops)
      : rng_(seed), disk_(disk), num_ops_(num_ops) {}

  absl::Status Run(SimTotals* totals) {
    num_blocks_ = Uniform(4, 20);
    options_ = testing::SmallPoolOptions("pages", num_blocks_, kSimPageTokens);
    if (options_.layout.BlockBytes() != kSimPageBytes) return Fail("layout is not 128 bytes");
    ASSIGN_OR_RETURN(options_.parts, ParsePageParts(kSimPageSpec, kSimPageBytes));
    options_.host_tier_bytes = uint64_t{Uniform(1, (disk_ ? 1 : 2) * num_blocks_)} * kSimPageBytes;
    options_.testing_manual_offload = true;
    if (disk_) {
      disk_dir_.emplace();
      options_.disk_tier_path = disk_dir_->File("pages.tier");
      options_.disk_tier_bytes = uint64_t{Uniform(1, 2 * num_blocks_)} * (4096 + 4096);
      // Room for every store of one offload, so a full queue never refuses one (see Simulation).
      options_.testing_disk_tier_options = [](DiskTierOptions* disk) {
        disk->max_queued_stores = 48;
      };
    }
    auto memory =
        testing::CreatePoolMemory(testing::PoolMemoryKind::kHost, kSimPageBytes, num_blocks_);
    if (!memory.ok()) return memory.status();
    manager_ = std::make_unique<CacheManager>(SessionLimits{}, &clock_, kEpoch);
    RETURN_IF_ERROR(manager_->AddPool(options_, *std::move(memory)));
    pool_ = manager_->pools().front();
    RETURN_IF_ERROR(CheckPoolParts());
    for (const char* config : {"cfg-1", "cfg-2"}) {
      ASSIGN_OR_RETURN(std::shared_ptr<const CompatibilityManifest> manifest,
                       CompatibilityManifest::Create(
                           ManifestFields{.model_id = options_.model_id,
                                          .model_config_digest = config,
                                          .kv_dtype = "fp32",
                                          .page_tokens = kSimPageTokens,
                                          .parts = {{"kv", 64}, {"swa", 32}, {"state", 32}}}));
      manifests_.push_back(std::move(manifest));
    }
    // Keys up to kMaxPageKeyBytes; the long ones share their first 16 bytes (the tokens a hit
    // compares), so only the key's digest tells them apart.
    for (int i = 0; i < 6; ++i) keys_.push_back(absl::StrCat("k", i));
    for (int i = 0; i < 4; ++i) {
      keys_.push_back(absl::StrCat(std::string(16, 'p'), "/", std::string(40, 'x'), "/", i));
    }
    trace_.push_back(absl::StrCat("pool: ", num_blocks_, " pages, tier 2 ",
                                  options_.host_tier_bytes / kSimPageBytes, " pages",
                                  disk_ ? ", disk tier" : ""));

    for (int op = 0; op < num_ops_; ++op) {
      ++totals->operations;
      RETURN_IF_ERROR(Step());
      RETURN_IF_ERROR(CheckAfterStep());
    }
    // Every pin's TTL passes; an acquire sweeps them; then every session ends.
    clock_.Advance(Pool::kMaxPinTtl);
    for (uint64_t id : session_order_) {
      SessionInfo& info = sessions_.at(id);
      if (info.ended) continue;
      RETURN_IF_ERROR(ExpectCode(manager_->sessions().KeepAlive(id), absl::StatusCode::kAborted,
                                 "keepalive after a day"));
    }
    RETURN_IF_ERROR(ExpireSessions());
    RETURN_IF_ERROR(CheckAfterStep());
    const PoolStatsSnapshot stats = pool_->Stats();
    if (stats.referenced != 0 || stats.open_sequences != 0) {
      return Fail(absl::StrCat(stats.referenced, " blocks and ", stats.open_sequences,
                               " sequences held after every session ended"));
    }
    totals->seeds += 0;  // RunPageSeeds counts seeds
    totals->hit_blocks += hit_pages_;
    totals->tier_hit_blocks += below_hit_pages_;
    totals->disk_hit_blocks += disk_hit_pages_;
    totals->evictions += stats.pool.evictions;
    totals->offloaded_blocks += offloaded_;
    totals->exact_steps += exact_steps_;
    totals->partial_hits += partial_hits_;
    totals->ended_mid_put += ended_mid_put_;
    totals->ambiguous_walks += ambiguous_walks_;
    if (stats.host_tier.has_value()) totals->superseded += stats.host_tier->store.superseded;
    if (stats.disk_tier.has_value()) totals->superseded += stats.disk_tier->store.superseded;
    return absl::OkStatus();
  }

  const std::vector<std::string>& trace() const { return trace_; }

 private:
  struct SessionInfo {
    std::shared_ptr<Session> session;
    std::string tenant;
    int manifest = -1;  // index into manifests_; -1: none
    absl::Time deadline;
    bool ended = false;
  };
  struct Put {
    uint64_t session_id = 0;
    std::vector<std::string> keys;
    std::vector<uint32_t> masks;
    std::vector<BlockId> blocks;  // kNoBlock: a duplicate
  };
  struct Held {
    uint64_t session_id = 0;
    std::vector<std::string> keys;
    std::vector<uint32_t> masks;
    std::vector<BlockId> blocks;
  };
  struct Pin {
    uint64_t session_id = 0;
    absl::Time until;
    std::vector<std::string> keys;
    std::vector<uint32_t> masks;
  };

  std::string NamespaceOf(const SessionInfo& info) const {
    return absl::StrCat(info.tenant, "/cfg-", info.manifest + 1);
  }
  std::string NamespaceOf(uint64_t session_id) const {
    return NamespaceOf(sessions_.at(session_id));
  }

  // A page's bytes: a function of its namespace, key and parts, so that a page served under
  // another namespace, key or mask is caught.
  static std::string PageBytes(const std::string& ns, const std::string& key, uint32_t mask) {
    const std::string seed = absl::StrCat(ns, "|", key, "|", mask);
    std::string bytes(kSimPageBytes, '\0');
    for (size_t b = 0; b < bytes.size(); ++b) {
      bytes[b] = static_cast<char>(seed[b % seed.size()] * 31 + b);
    }
    return bytes;
  }

  absl::Status CheckPoolParts() {
    const std::vector<PagePartLayout>& parts = pool_->parts();
    uint64_t offset = 0;
    bool same = parts.size() == std::size(kSimPageParts);
    for (size_t i = 0; same && i < parts.size(); ++i) {
      const PagePartSpec& spec = kSimPageParts[i];
      same = parts[i].name == spec.name && parts[i].offset == offset &&
             parts[i].bytes == spec.bytes &&
             parts[i].policy == (spec.trailing_pages == 0 ? PartHitPolicy::kAllPages
                                                          : PartHitPolicy::kTrailingPages) &&
             (spec.trailing_pages == 0 || parts[i].trailing_pages == spec.trailing_pages);
      offset += spec.bytes;
    }
    return same ? absl::OkStatus() : Fail("the pool's parts are not the spec's");
  }

  uint32_t Uniform(uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng_);
  }
  bool Chance(int percent) { return Uniform(0, 99) < static_cast<uint32_t>(percent); }
  absl::Status Fail(absl::string_view what) { return absl::InternalError(what); }
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

  // Exact while nothing has been evicted: what tier 1 holds is then all that was published.
  bool Exact() const { return pool_->Stats().pool.evictions == 0; }

  // A live session, or 0 if none.
  uint64_t PickSession() {
    std::vector<uint64_t> live;
    for (uint64_t id : session_order_) {
      if (!sessions_.at(id).ended) live.push_back(id);
    }
    return live.empty() ? 0 : live[Uniform(0, live.size() - 1)];
  }

  std::vector<std::string> PickKeys() {
    std::vector<std::string> keys;
    const uint32_t count = Uniform(1, 5);
    // Mostly a run of neighbouring keys, as an engine's pages of one prompt; sometimes any.
    const uint32_t first = Uniform(0, keys_.size() - 1);
    for (uint32_t i = 0; i < count; ++i) {
      keys.push_back(Chance(80) ? keys_[(first + i) % keys_.size()]
                                : keys_[Uniform(0, keys_.size() - 1)]);
    }
    return keys;
  }
  uint32_t PickMask() {
    // Mostly kv with or without the others, as an engine checkpoints state now and then.
    if (Chance(75)) return 1u | (Uniform(0, 3) << 1);
    return Uniform(1, kSimAllParts);
  }
  uint32_t PickWanted() { return Chance(10) ? 0 : Uniform(1, kSimAllParts); }

  absl::Status Step() {
    const uint32_t dice = Uniform(0, 99);
    if (live_sessions() < 2 || dice < 5) return OpenSession();
    if (dice < 25) return Reserve();
    if (dice < 33) return CommitPending();
    if (dice < 36) return ReleasePending();
    if (dice < 50) return Exists();
    if (dice < 65) return Acquire();
    if (dice < 71) return ReleaseHeld();
    if (dice < 78) return PinPages();
    if (dice < 82) return CloseSession();
    if (dice < 88) return AdvanceAndExpire();
    if (dice < 91) return KeepAlive();
    return Offload();
  }

  size_t live_sessions() const {
    size_t live = 0;
    for (const auto& [id, info] : sessions_) live += info.ended ? 0 : 1;
    return live;
  }

  absl::Status OpenSession() {
    const std::string tenant(kTenants[Uniform(0, 1)]);
    const int manifest = Chance(8) ? -1 : static_cast<int>(Uniform(0, 1));
    const absl::Duration ttl = absl::Seconds(Uniform(2, 8));
    auto session = manager_->sessions().Open(absl::StrCat("uid:", tenant), tenant, "sim", ttl,
                                             manifest < 0 ? nullptr : manifests_[manifest]);
    trace_.push_back(absl::StrCat("open-session ", tenant, " manifest ", manifest, " ttl ",
                                  absl::FormatDuration(ttl)));
    if (!session.ok()) return session.status();
    trace_.back() += absl::StrCat(" -> ", (*session)->id);
    sessions_[(*session)->id] = SessionInfo{*session, tenant, manifest, clock_.Now() + ttl};
    session_order_.push_back((*session)->id);
    return absl::OkStatus();
  }

  // A session without a manifest has no page namespace: every page call is refused.
  absl::Status ExpectNoManifestRefused(const SessionInfo& info,
                                       const std::vector<std::string>& keys) {
    RETURN_IF_ERROR(ExpectCode(pool_->ExistsPages(*info.session, keys, kSimAllParts),
                               absl::StatusCode::kFailedPrecondition, "exists without manifest"));
    RETURN_IF_ERROR(ExpectCode(pool_->ReservePages(*info.session, keys, {}),
                               absl::StatusCode::kFailedPrecondition, "put without manifest"));
    return ExpectCode(pool_->AcquirePages(*info.session, keys, kSimAllParts, 0),
                      absl::StatusCode::kFailedPrecondition, "acquire without manifest");
  }

  // What `key` alone reports in `session_id`'s namespace: present or not, in tier 1 or below,
  // and (one exists per part) which parts it holds. Holds nothing, changes nothing.
  absl::StatusOr<PageProbe> ProbeKey(uint64_t session_id, const std::string& key) {
    const Session& session = *sessions_.at(session_id).session;
    ASSIGN_OR_RETURN(PagesFound any, pool_->ExistsPages(session, {key}, 0));
    PageProbe probe;
    probe.present = any.num_pages == 1;
    probe.in_tier1 = any.by_tier.pool == 1;
    if (!probe.present) return probe;
    for (size_t part = 0; part < std::size(kSimPageParts); ++part) {
      ASSIGN_OR_RETURN(PagesFound found, pool_->ExistsPages(session, {key}, 1u << part));
      if (found.num_pages == 1) probe.mask |= 1u << part;
    }
    // Every present page holds parts, and only parts some put of this key here committed.
    const std::string ns = NamespaceOf(session_id);
    auto it = committed_.find({ns, key});
    if (probe.mask == 0 || it == committed_.end() || it->second.count(probe.mask) == 0) {
      return Fail(absl::StrCat("key ", key, " in ", ns, " reports ", DescribeProbe(probe),
                               ", never committed so"));
    }
    if (Exact()) {
      auto known = tier1_.find({ns, key});
      const PageProbe want{known != tier1_.end(), known != tier1_.end(),
                           known == tier1_.end() ? 0 : known->second};
      if (!(probe == want)) {
        return Fail(absl::StrCat("key ", key, " in ", ns, " reports ", DescribeProbe(probe),
                                 " before any eviction; the model says ", DescribeProbe(want)));
      }
    }
    return probe;
  }

  // The hit the pool should answer for `keys`, from each key's own answer: the leading present
  // keys (tier 1's run, then the pages below continuing it), under the model's hit rule.
  absl::StatusOr<std::vector<PageProbe>> ProbeKeys(uint64_t session_id,
                                                   const std::vector<std::string>& keys) {
    std::vector<PageProbe> probes;
    for (const std::string& key : keys) {
      ASSIGN_OR_RETURN(PageProbe probe, ProbeKey(session_id, key));
      probes.push_back(probe);
    }
    return probes;
  }
  // What a walk over `keys` answers, from each key's own answer: the leading keys present, each
  // looked up in tier 1 first and below it after (pages are independent, so tier 1 may hold a
  // page after one that went below), under the model's hit rule.
  // With a disk tier the walk is exact up to its first page below tier 1 only: the disk
  // tier's writes land in the background, so a record below may turn into another copy of its
  // key (another put's parts) between the keys' answers and the call.
  struct Expected {
    size_t hit = 0;           // the model's hit rule over the exact leading keys
    size_t present = 0;       // the leading keys present anywhere
    size_t ambiguous_at = 0;  // the first key whose answer may change; `present` when none
    bool exact() const { return ambiguous_at == present; }
  };
  Expected Expect(const std::vector<PageProbe>& probes, uint32_t wanted) {
    Expected expected;
    while (expected.present < probes.size() && probes[expected.present].present) {
      ++expected.present;
    }
    expected.ambiguous_at = expected.present;
    std::vector<uint32_t> masks;
    bool below_seen = false;
    bool tier1_after_below = false;
    for (size_t j = 0; j < expected.present; ++j) {
      if (disk_ && !probes[j].in_tier1 && expected.ambiguous_at == expected.present) {
        expected.ambiguous_at = j;
      }
      if (j < expected.ambiguous_at) masks.push_back(probes[j].mask);
      tier1_after_below |= below_seen && probes[j].in_tier1;
      below_seen |= !probes[j].in_tier1;
    }
    expected.hit = ModelHitRule(masks, wanted);
    if (tier1_after_below) ++ambiguous_walks_;
    return expected;
  }
  // How many of the first `pages` keys tier 1 holds.
  static size_t InTier1(const std::vector<PageProbe>& probes, size_t pages) {
    size_t in_tier1 = 0;
    for (size_t j = 0; j < std::min(pages, probes.size()); ++j) in_tier1 += probes[j].in_tier1;
    return in_tier1;
  }
  // An answer of `got` pages fits: exactly the hit where the walk is unambiguous, else at
  // least that (the rule never shrinks as pages are added) and at most the present keys.
  static bool Fits(const Expected& expected, size_t got) {
    if (expected.exact()) return got == expected.hit;
    return got >= expected.hit && got <= expected.present;
  }
  static std::string DescribeExpected(const Expected& expected) {
    if (expected.exact()) return absl::StrCat(expected.hit);
    return absl::StrCat(expected.hit, " to ", expected.present);
  }

  absl::Status Reserve() {
    const uint64_t session_id = PickSession();
    if (session_id == 0) return absl::OkStatus();
    const SessionInfo& info = sessions_.at(session_id);
    std::vector<std::string> keys = PickKeys();
    if (info.manifest < 0) return ExpectNoManifestRefused(info, keys);
    std::vector<uint32_t> masks;
    if (Chance(80)) {
      for (size_t i = 0; i < keys.size(); ++i) masks.push_back(PickMask());
    }
    std::vector<uint32_t> want_masks = masks;
    if (want_masks.empty()) want_masks.assign(keys.size(), kSimAllParts);
    trace_.push_back(absl::StrCat("reserve session ", session_id, " ", DescribeKeys(keys),
                                  " masks [", absl::StrJoin(want_masks, ","), "]"));
    const std::string ns = NamespaceOf(session_id);
    const bool exact = Exact();
    // Which keys are fresh: those tier 1 does not hold with at least the put's parts.
    std::vector<bool> fresh(keys.size());
    size_t num_fresh = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = tier1_.find({ns, keys[i]});
      fresh[i] = it == tier1_.end() || (it->second & want_masks[i]) != want_masks[i];
      num_fresh += fresh[i] ? 1 : 0;
    }
    const PoolStatsSnapshot before = pool_->Stats();
    absl::StatusOr<ReservedPages> reserved =
        pool_->ReservePages(*info.session, keys, absl::MakeConstSpan(masks));
    trace_.back() +=
        absl::StrCat(" -> ", reserved.ok() ? absl::StrCat(reserved->sequence_id, " blocks ",
                                                          absl::StrJoin(reserved->block_ids, ","))
                                           : reserved.status().ToString());
    const bool had_unswept_pins = UnsweptExpiredPins();
    pins_swept_at_ = clock_.Now();
    if (exact) {
      // Pins past their TTL are swept first: they can only make room.
      const bool fits = num_fresh <= before.free + before.evictable;
      if (fits && !reserved.ok()) return Fail("a put that fits was refused");
      if (!fits && !had_unswept_pins &&
          reserved.status().code() != absl::StatusCode::kResourceExhausted) {
        return Fail("a put that does not fit was not RESOURCE_EXHAUSTED");
      }
    }
    if (!reserved.ok()) {
      if (reserved.status().code() != absl::StatusCode::kResourceExhausted) {
        return reserved.status();
      }
      return absl::OkStatus();
    }
    if (exact) {
      for (size_t i = 0; i < keys.size(); ++i) {
        if (fresh[i] != (reserved->block_ids[i] != kNoBlock)) {
          return Fail(absl::StrCat("key ", keys[i], " reserved ",
                                   reserved->block_ids[i] == kNoBlock ? "as a duplicate" : "fresh",
                                   "; the model says otherwise"));
        }
      }
    }
    for (size_t i = 0; i < keys.size(); ++i) {
      if (reserved->block_ids[i] == kNoBlock) continue;
      RETURN_IF_ERROR(
          pool_->WriteBlock(reserved->block_ids[i], 0, PageBytes(ns, keys[i], want_masks[i])));
    }
    pending_[reserved->sequence_id] =
        Put{session_id, std::move(keys), std::move(want_masks), reserved->block_ids};
    if (Chance(70)) return Commit(reserved->sequence_id);
    if (Chance(15)) return Release(reserved->sequence_id);
    return absl::OkStatus();
  }

  absl::Status CommitPending() {
    if (pending_.empty()) return absl::OkStatus();
    auto it = std::next(pending_.begin(), Uniform(0, pending_.size() - 1));
    return Commit(it->first);
  }
  absl::Status ReleasePending() {
    if (pending_.empty()) return absl::OkStatus();
    auto it = std::next(pending_.begin(), Uniform(0, pending_.size() - 1));
    return Release(it->first);
  }

  absl::Status Commit(uint64_t sequence_id) {
    Put put = pending_.at(sequence_id);
    pending_.erase(sequence_id);
    const SessionInfo& info = sessions_.at(put.session_id);
    trace_.push_back(absl::StrCat("commit ", sequence_id, " of session ", put.session_id));
    const std::string ns = NamespaceOf(put.session_id);
    const bool exact = Exact();
    absl::StatusOr<CommittedPages> committed = pool_->CommitPages(*info.session, sequence_id);
    trace_.back() +=
        absl::StrCat(" -> ", committed.ok() ? absl::StrCat(committed->num_published, " published, ",
                                                           committed->num_duplicates, " duplicates")
                                            : committed.status().ToString());
    if (info.ended) {
      // The session ended mid-put: its reservation went with it, and nothing was published.
      ++ended_mid_put_;
      if (committed.ok()) return Fail("a put committed after its session ended");
      // The model did not take its pages: a later probe of any of them, exact until the first
      // eviction, finds them absent unless another put published them.
      return absl::OkStatus();
    }
    if (!committed.ok()) return committed.status();
    uint32_t published = 0;
    std::set<std::pair<std::string, std::string>> published_now;  // held by this put
    for (size_t i = 0; i < put.keys.size(); ++i) {
      if (put.blocks[i] == kNoBlock) continue;
      committed_[{ns, put.keys[i]}].insert(put.masks[i]);
      if (!exact) continue;
      const std::pair<std::string, std::string> page{ns, put.keys[i]};
      auto [it, fresh] = tier1_.emplace(page, put.masks[i]);
      // A later copy with more parts supersedes tier 1's when nobody holds that (a copy this
      // put published is held by it); otherwise it is a duplicate.
      const bool more_parts = (it->second & put.masks[i]) != put.masks[i];
      if (!fresh && more_parts && !published_now.contains(page) && !HeldInTier1(page)) {
        it->second = put.masks[i];
        fresh = true;
      }
      if (fresh) {
        published_now.insert(page);
        ++published;
      }
    }
    if (exact && (committed->num_published != published ||
                  committed->num_duplicates != put.keys.size() - published)) {
      return Fail(absl::StrCat("the model says ", published, " published"));
    }
    return absl::OkStatus();
  }

  absl::Status Release(uint64_t sequence_id) {
    const Put put = pending_.at(sequence_id);
    pending_.erase(sequence_id);
    trace_.push_back(absl::StrCat("release put ", sequence_id));
    const SessionInfo& info = sessions_.at(put.session_id);
    return ExpectCode(pool_->Release(*info.session, sequence_id),
                      info.ended ? absl::StatusCode::kAborted : absl::StatusCode::kOk,
                      "release put");
  }

  absl::Status Exists() {
    const uint64_t session_id = PickSession();
    if (session_id == 0) return absl::OkStatus();
    const SessionInfo& info = sessions_.at(session_id);
    const std::vector<std::string> keys = PickKeys();
    if (info.manifest < 0) return ExpectNoManifestRefused(info, keys);
    const uint32_t wanted = PickWanted();
    ASSIGN_OR_RETURN(std::vector<PageProbe> probes, ProbeKeys(session_id, keys));
    const Expected expected = Expect(probes, wanted);
    ASSIGN_OR_RETURN(PagesFound found, pool_->ExistsPages(*info.session, keys, wanted));
    pins_swept_at_ = clock_.Now();  // an exists releases expired pins first
    trace_.push_back(absl::StrCat("exists session ", session_id, " ", DescribeKeys(keys),
                                  " wanted 0x", absl::Hex(wanted), " -> ", found.num_pages,
                                  ", model ", DescribeExpected(expected), " of ",
                                  DescribeProbes(probes)));
    if (!Fits(expected, found.num_pages)) {
      return Fail("exists differs from the model's hit rule");
    }
    const PagesByTier& tiers = found.by_tier;
    if (tiers.pool + tiers.host + tiers.disk + tiers.cluster != found.num_pages) {
      return Fail("exists' tiers do not sum to its pages");
    }
    if (tiers.pool != InTier1(probes, found.num_pages)) {
      return Fail(absl::StrCat("model says ", InTier1(probes, found.num_pages), " in tier 1"));
    }
    if (expected.exact() && expected.hit < expected.present) ++partial_hits_;
    return absl::OkStatus();
  }

  absl::Status Acquire() {
    const uint64_t session_id = PickSession();
    if (session_id == 0) return absl::OkStatus();
    const SessionInfo& info = sessions_.at(session_id);
    const std::vector<std::string> keys = PickKeys();
    if (info.manifest < 0) return ExpectNoManifestRefused(info, keys);
    const uint32_t wanted = PickWanted();
    ASSIGN_OR_RETURN(std::vector<PageProbe> probes, ProbeKeys(session_id, keys));
    const Expected expected = Expect(probes, wanted);
    const PoolStatsSnapshot before = pool_->Stats();
    absl::StatusOr<AcquiredPages> acquired =
        pool_->AcquirePages(*info.session, keys, wanted, /*max_load_ms=*/0);
    trace_.push_back(
        absl::StrCat("acquire session ", session_id, " ", DescribeKeys(keys), " wanted 0x",
                     absl::Hex(wanted), " -> ",
                     acquired.ok() ? absl::StrCat(acquired->block_ids.size(), " (blocks ",
                                                  absl::StrJoin(acquired->block_ids, ","), ")")
                                   : acquired.status().ToString(),
                     ", model ", DescribeExpected(expected), " of ", DescribeProbes(probes)));
    pins_swept_at_ = clock_.Now();
    if (!acquired.ok()) return acquired.status();
    return CheckAcquired(session_id, keys, wanted, probes, expected, before, *acquired);
  }

  // The pages an acquire got: as many as the model's hit rule gives unless the pool lacked room
  // to load them (then fewer), a hit under the rule by their own parts, each with the parts and
  // the bytes some put of its key committed (the key's own answer's, where unambiguous).
  absl::Status CheckAcquired(uint64_t session_id, const std::vector<std::string>& keys,
                             uint32_t wanted, const std::vector<PageProbe>& probes,
                             const Expected& expected, const PoolStatsSnapshot& before,
                             const AcquiredPages& acquired) {
    const size_t got = acquired.block_ids.size();
    // Room for every load whatever the hits hold: the answer is then the walk's.
    const bool room = before.free + before.evictable >= 2 * keys.size();
    if (got > expected.present || (room && !Fits(expected, got))) {
      return Fail(absl::StrCat("got ", got, " pages, model says ", DescribeExpected(expected)));
    }
    if (acquired.part_masks.size() != got) return Fail("part masks and pages differ in count");
    const std::vector<uint32_t> masks(acquired.part_masks.begin(), acquired.part_masks.end());
    if (ModelHitRule(masks, wanted) != got) {
      return Fail("the acquired pages are no hit under the rule by their own parts");
    }
    const std::string ns = NamespaceOf(session_id);
    for (size_t i = 0; i < got; ++i) {
      const auto committed = committed_.find({ns, keys[i]});
      const bool known = i < expected.ambiguous_at
                             ? masks[i] == probes[i].mask
                             : committed != committed_.end() && committed->second.count(masks[i]);
      if (!known) {
        return Fail(absl::StrCat("page ", i, " acquired with parts 0x", absl::Hex(masks[i]),
                                 ", reported 0x", absl::Hex(probes[i].mask)));
      }
      std::string bytes(kSimPageBytes, '\0');
      RETURN_IF_ERROR(pool_->ReadBlock(acquired.block_ids[i], 0, kSimPageBytes, bytes.data()));
      if (bytes != PageBytes(ns, keys[i], masks[i])) {
        return Fail(absl::StrCat("page ", i, " (", keys[i], ") holds other bytes"));
      }
      ++hit_pages_;
      if (!probes[i].in_tier1) ++below_hit_pages_;
    }
    disk_hit_pages_ += acquired.by_tier.disk;
    if (acquired.by_tier.pool + acquired.by_tier.host + acquired.by_tier.disk != got) {
      return Fail("acquire's tiers do not sum to its pages");
    }
    // Only the unambiguous pages are the ones tier 1 indexes; an ambiguous one may be loaded
    // into a copy of its own while tier 1's stays evictable.
    const size_t indexed = std::min(got, expected.ambiguous_at);
    Held held{session_id, std::vector<std::string>(keys.begin(), keys.begin() + indexed),
              std::vector<uint32_t>(masks.begin(), masks.begin() + indexed), acquired.block_ids};
    if (Chance(60)) {
      trace_.push_back(absl::StrCat("release acquired ", acquired.sequence_id));
      return pool_->Release(*sessions_.at(session_id).session, acquired.sequence_id);
    }
    held_[acquired.sequence_id] = std::move(held);
    return absl::OkStatus();
  }

  absl::Status ReleaseHeld() {
    if (held_.empty()) return absl::OkStatus();
    auto it = std::next(held_.begin(), Uniform(0, held_.size() - 1));
    trace_.push_back(absl::StrCat("release acquired ", it->first));
    const SessionInfo& info = sessions_.at(it->second.session_id);
    RETURN_IF_ERROR(ExpectCode(pool_->Release(*info.session, it->first),
                               info.ended ? absl::StatusCode::kAborted : absl::StatusCode::kOk,
                               "release acquired"));
    held_.erase(it);
    return absl::OkStatus();
  }

  absl::Status PinPages() {
    const uint64_t session_id = PickSession();
    if (session_id == 0) return absl::OkStatus();
    const SessionInfo& info = sessions_.at(session_id);
    const std::vector<std::string> keys = PickKeys();
    if (info.manifest < 0) return absl::OkStatus();
    const absl::Duration ttl = Chance(20) ? absl::ZeroDuration() : absl::Seconds(Uniform(1, 6));
    ASSIGN_OR_RETURN(std::vector<PageProbe> probes, ProbeKeys(session_id, keys));
    // No part asked for: the leading present pages, whatever parts they hold.
    const Expected expected = Expect(probes, 0);
    const PoolStatsSnapshot before = pool_->Stats();
    absl::StatusOr<uint32_t> pinned = pool_->PinPages(*info.session, keys, ttl);
    trace_.push_back(absl::StrCat(
        "pin session ", session_id, " ", DescribeKeys(keys), " for ", absl::FormatDuration(ttl),
        " -> ", pinned.ok() ? absl::StrCat(*pinned) : pinned.status().ToString(), ", model ",
        DescribeExpected(expected), " of ", DescribeProbes(probes)));
    pins_swept_at_ = clock_.Now();
    if (!pinned.ok()) return pinned.status();
    const bool room = before.free + before.evictable >= 2 * keys.size();
    if (*pinned > expected.present || (room && !Fits(expected, *pinned))) {
      return Fail("pin differs from the model");
    }
    if (ttl > absl::ZeroDuration() && *pinned > 0) {
      Pin pin{session_id, clock_.Now() + ttl, {}, {}};
      for (size_t i = 0; i < std::min<size_t>(*pinned, expected.ambiguous_at); ++i) {
        pin.keys.push_back(keys[i]);
        pin.masks.push_back(probes[i].mask);
      }
      pins_.push_back(std::move(pin));
    }
    return absl::OkStatus();
  }

  // Whether an acquire held or a pin not swept yet holds tier 1's copy of `page` (namespace,
  // key).
  bool HeldInTier1(const std::pair<std::string, std::string>& page) const {
    for (const auto& [sequence_id, held] : held_) {
      if (NamespaceOf(held.session_id) == page.first &&
          std::find(held.keys.begin(), held.keys.end(), page.second) != held.keys.end()) {
        return true;
      }
    }
    for (const Pin& pin : pins_) {
      if (pin.until > pins_swept_at_ && !sessions_.at(pin.session_id).ended &&
          NamespaceOf(pin.session_id) == page.first &&
          std::find(pin.keys.begin(), pin.keys.end(), page.second) != pin.keys.end()) {
        return true;
      }
    }
    return false;
  }

  // A pin whose TTL has passed but that no reserve or acquire has swept yet: still held.
  bool UnsweptExpiredPins() const {
    for (const Pin& pin : pins_) {
      if (pin.until <= clock_.Now() && pin.until > pins_swept_at_) return true;
    }
    return false;
  }
  bool LivePins() const {
    for (const Pin& pin : pins_) {
      if (pin.until > clock_.Now() && !sessions_.at(pin.session_id).ended) return true;
    }
    return false;
  }

  // Forgets what a session held once it ended.
  void Ended(uint64_t session_id) {
    sessions_.at(session_id).ended = true;
    for (auto it = held_.begin(); it != held_.end();) {
      it = it->second.session_id == session_id ? held_.erase(it) : std::next(it);
    }
    std::erase_if(pins_, [&](const Pin& pin) { return pin.session_id == session_id; });
  }

  absl::Status CloseSession() {
    const uint64_t session_id = PickSession();
    if (session_id == 0) return absl::OkStatus();
    trace_.push_back(absl::StrCat("close session ", session_id));
    RETURN_IF_ERROR(
        manager_->CloseSession(session_id, kEpoch, sessions_.at(session_id).session->principal)
            .status());
    Ended(session_id);
    return absl::OkStatus();
  }

  absl::Status AdvanceAndExpire() {
    const absl::Duration by = absl::Milliseconds(Uniform(1, 8) * 500);
    clock_.Advance(by);
    trace_.push_back(absl::StrCat("advance ", absl::FormatDuration(by)));
    return Chance(70) ? ExpireSessions() : absl::OkStatus();
  }

  absl::Status ExpireSessions() {
    size_t want = 0;
    for (uint64_t id : session_order_) {
      SessionInfo& info = sessions_.at(id);
      if (info.ended || info.deadline > clock_.Now()) continue;
      ++want;
      Ended(id);
    }
    const size_t expired = manager_->ExpireSessions();
    pins_swept_at_ = clock_.Now();  // the reaper's sweep releases expired pins too
    trace_.push_back(absl::StrCat("expire -> ", expired, ", model ", want));
    return expired == want ? absl::OkStatus() : Fail("expired sessions differ from the model");
  }

  absl::Status KeepAlive() {
    const uint64_t session_id = PickSession();
    if (session_id == 0) return absl::OkStatus();
    SessionInfo& info = sessions_.at(session_id);
    const bool alive = info.deadline > clock_.Now();
    trace_.push_back(absl::StrCat("keepalive session ", session_id));
    RETURN_IF_ERROR(ExpectCode(manager_->sessions().KeepAlive(session_id),
                               alive ? absl::StatusCode::kOk : absl::StatusCode::kAborted,
                               "keepalive"));
    if (alive) info.deadline = clock_.Now() + info.session->ttl;
    return absl::OkStatus();
  }

  absl::Status Offload() {
    const size_t stored = pool_->OffloadForTesting();
    offloaded_ += stored;
    trace_.push_back(absl::StrCat("offload -> ", stored));
    // What was passed down becomes durable, hence visible, now (see Simulation::Offload).
    if (disk_) pool_->disk_tier()->Flush();
    return absl::OkStatus();
  }

  absl::Status CheckAfterStep() {
    RETURN_IF_ERROR(pool_->CheckInvariants());
    const PoolStatsSnapshot stats = pool_->Stats();
    if (stats.free + stats.evictable + stats.referenced != num_blocks_) {
      return Fail(absl::StrCat("free ", stats.free, " + evictable ", stats.evictable,
                               " + referenced ", stats.referenced, " != ", num_blocks_));
    }
    if (Exact()) ++exact_steps_;
    // Held pages stay in tier 1 with their parts.
    std::set<BlockId> held_blocks;
    for (const auto& [sequence_id, held] : held_) {
      for (size_t i = 0; i < held.keys.size(); ++i) {
        ASSIGN_OR_RETURN(PageProbe probe, ProbeKey(held.session_id, held.keys[i]));
        if (!probe.in_tier1 || probe.mask != held.masks[i]) {
          return Fail(absl::StrCat("held page ", held.keys[i], " reports ", DescribeProbe(probe)));
        }
      }
      held_blocks.insert(held.blocks.begin(), held.blocks.end());
    }
    for (const Pin& pin : pins_) {
      if (pin.until <= clock_.Now()) continue;
      for (size_t i = 0; i < pin.keys.size(); ++i) {
        ASSIGN_OR_RETURN(PageProbe probe, ProbeKey(pin.session_id, pin.keys[i]));
        if (!probe.in_tier1 || probe.mask != pin.masks[i]) {
          return Fail(absl::StrCat("pinned page ", pin.keys[i], " reports ", DescribeProbe(probe)));
        }
      }
    }
    for (const auto& [sequence_id, put] : pending_) {
      if (sessions_.at(put.session_id).ended) continue;
      for (BlockId block : put.blocks) {
        if (block != kNoBlock) held_blocks.insert(block);
      }
    }
    if (!LivePins() && !UnsweptExpiredPins() && stats.referenced != held_blocks.size()) {
      return Fail(absl::StrCat(stats.referenced, " blocks referenced; the model holds ",
                               held_blocks.size(), ": {", absl::StrJoin(held_blocks, ","), "}"));
    }
    return absl::OkStatus();
  }

  std::mt19937_64 rng_;
  const bool disk_;
  const int num_ops_;
  uint32_t num_blocks_ = 0;
  PoolOptions options_;
  FakeClock clock_;
  std::optional<testing::ScopedTempDir> disk_dir_;
  std::unique_ptr<CacheManager> manager_;
  Pool* pool_ = nullptr;
  std::vector<std::shared_ptr<const CompatibilityManifest>> manifests_;
  std::vector<std::string> keys_;
  std::map<uint64_t, SessionInfo> sessions_;
  std::vector<uint64_t> session_order_;
  // By (namespace, key): every part mask a commit of it carried.
  std::map<std::pair<std::string, std::string>, std::set<uint32_t>> committed_;
  // Exact while nothing was evicted: tier 1's pages and their masks, by (namespace, key).
  std::map<std::pair<std::string, std::string>, uint32_t> tier1_;
  std::map<uint64_t, Put> pending_;  // by sequence id: reserved, written, not yet committed
  std::map<uint64_t, Held> held_;    // by sequence id: acquired, not yet released
  std::vector<Pin> pins_;
  absl::Time pins_swept_at_ = absl::InfinitePast();
  std::vector<std::string> trace_;
  uint64_t hit_pages_ = 0;
  uint64_t below_hit_pages_ = 0;
  uint64_t disk_hit_pages_ = 0;
  uint64_t offloaded_ = 0;
  uint64_t exact_steps_ = 0;
  uint64_t partial_hits_ = 0;
  uint64_t ended_mid_put_ = 0;
  uint64_t ambiguous_walks_ = 0;
};

void RunPageSeeds(absl::string_view name, uint64_t first_seed, bool disk, uint64_t default_seeds,
                  uint64_t default_ops) {
  const int ops = static_cast<int>(EnvOr("KVCACHE_SIM_OPS", default_ops));
  const std::vector<uint64_t> seeds = SeedsToRun(first_seed, default_seeds);
  SimTotals totals;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t seed : seeds) {
    PageSimulation simulation(seed, disk, ops);
    const absl::Status status = simulation.Run(&totals);
    ++totals.seeds;
    if (!ReportSeed(name, seed, status, simulation.trace(), seeds.size() == 1)) break;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf(
      "%s: %llu seeds, %llu operations (%llu checked exactly), %llu pages acquired (%llu from "
      "below tier 1, %llu from disk), %llu hits cut short by the hit rule, %llu evictions, "
      "%llu offloaded, %llu records superseded below tier 1, %llu puts ended with their session, "
      "%llu walks past a tier-1 page after one from below; in %.1f s\n",
      std::string(name).c_str(), static_cast<unsigned long long>(totals.seeds),
      static_cast<unsigned long long>(totals.operations),
      static_cast<unsigned long long>(totals.exact_steps),
      static_cast<unsigned long long>(totals.hit_blocks),
      static_cast<unsigned long long>(totals.tier_hit_blocks),
      static_cast<unsigned long long>(totals.disk_hit_blocks),
      static_cast<unsigned long long>(totals.partial_hits),
      static_cast<unsigned long long>(totals.evictions),
      static_cast<unsigned long long>(totals.offloaded_blocks),
      static_cast<unsigned long long>(totals.superseded),
      static_cast<unsigned long long>(totals.ended_mid_put),
      static_cast<unsigned long long>(totals.ambiguous_walks), seconds);
  // A run that exercised nothing would pass vacuously.
  if (seeds.size() > 100) {
    EXPECT_GT(totals.hit_blocks, 0u);
    EXPECT_GT(totals.tier_hit_blocks, 0u);
    EXPECT_GT(totals.partial_hits, 0u);
    EXPECT_GT(totals.evictions, 0u);
    EXPECT_GT(totals.exact_steps, 0u);
    EXPECT_GT(totals.ended_mid_put, 0u);
    // Pages put again with more parts reach the tiers below, whose answers the model checks.
    EXPECT_GT(totals.superseded, 0u);
    if (disk) {
      EXPECT_GT(totals.disk_hit_blocks, 0u);
    }
  }
}

// The model's hit rule itself, on the cases the issue names, so that a wrong model cannot agree
// with a wrong pool.
TEST(SimulationTest, ModelHitRuleEndsWhereEveryWantedPartCanRestore) {
  constexpr uint32_t kKv = 1, kSwa = 2, kState = 4;
  // state only on page 2: kv + state ends after page 2; kv alone covers all.
  EXPECT_EQ(ModelHitRule({kKv, kKv, kKv | kState, kKv}, kKv | kState), 3u);
  EXPECT_EQ(ModelHitRule({kKv, kKv, kKv | kState, kKv}, kKv), 4u);
  // swa needs the last two pages: missing on page 0 only is fine past page 1.
  EXPECT_EQ(ModelHitRule({kKv, kKv | kSwa, kKv | kSwa}, kKv | kSwa), 3u);
  EXPECT_EQ(ModelHitRule({kKv | kSwa, kKv, kKv | kSwa}, kKv | kSwa), 1u);
  // kv missing on an inner page ends the hit there.
  EXPECT_EQ(ModelHitRule({kKv, kSwa, kKv}, kKv), 1u);
  EXPECT_EQ(ModelHitRule({}, kKv), 0u);
  EXPECT_EQ(ModelHitRule({kState, kState}, 0), 2u);
}

// Tier 2 under every page: 2,000 seeds of 120 operations (500 under ASan), as the tier runs.
TEST(SimulationTest, PagesMatchTheModel) {
  RunPageSeeds("PagesMatchTheModel", 4'000'000, /*disk=*/false, kTierSeeds, kTierOps);
}

// Tier 2 over a disk tier: pages and their parts come back from the disk too.
TEST(SimulationTest, PagesOnADiskTierMatchTheModel) {
  RunPageSeeds("PagesOnADiskTierMatchTheModel", 4'500'000, /*disk=*/true, kDiskSeeds, kTierOps);
}

}  // namespace
}  // namespace kvcache
