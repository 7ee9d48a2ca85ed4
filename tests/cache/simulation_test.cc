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
// The page runs (PageSimulation, issue 31: keys, parts and the hit rule) are described in
// page_simulation.h; they take the tier runs' seeds and operations (about 5 s and 4 s here,
// 19 s and 8 s under ASan).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "tests/cache/page_simulation.h"
#include "tests/cache/token_simulation.h"

namespace kvcache {
namespace simulation {
namespace {

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
}  // namespace simulation
}  // namespace kvcache
