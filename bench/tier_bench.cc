// Tier 2 (the host tier, issue 18): loading blocks from it vs a plain memcpy of the same bytes,
// measured in one run. Two figures per block size:
//   HostTier::Load   copy out of the tier's slot + XXH3-64 verify of the copy, vs memcpy of the
//                    same bytes between the same kind of buffers (target >= 0.8x);
//   Pool::Open       an OpenSequence whose whole prefix comes up from tier 2 (probe under the
//                    pool mutex, load into fresh pool blocks, verify, publish), per byte loaded,
//                    vs the same memcpy.
// Working sets exceed the last-level cache (both sides stream from memory). Then the offload
// window sweep: which share of tier 1 the mover should keep copied below (counts, no times).
// No timing asserted.
// Usage: tier_bench [seconds per measurement]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "cache/pool.h"
#include "common/block_checksum.h"
#include "tiers/host_tier.h"

namespace kvcache {
namespace {

using SteadyClock = std::chrono::steady_clock;

// Calls `step()` (which moves `bytes_per_step`) until `seconds` pass; bytes per second.
template <typename Step>
double Rate(double seconds, uint64_t bytes_per_step, Step step) {
  step();  // warm: page faults are not measured
  uint64_t steps = 0;
  const auto start = SteadyClock::now();
  const auto stop = start + std::chrono::duration<double>(seconds);
  while (SteadyClock::now() < stop) {
    step();
    ++steps;
  }
  const double elapsed = std::chrono::duration<double>(SteadyClock::now() - start).count();
  return steps * bytes_per_step / elapsed;
}

// Page-aligned bytes, as pool blocks and tier slots are: memcpy's speed depends on the relative
// alignment of source and destination (glibc's `rep movsb` path), so both sides of every
// comparison use the same alignment as the product's copies.
struct AlignedBuffer {
  explicit AlignedBuffer(size_t size, uint8_t fill = 0)
      : bytes(static_cast<uint8_t*>(std::aligned_alloc(4096, (size + 4095) / 4096 * 4096))) {
    std::memset(bytes, fill, size);
  }
  ~AlignedBuffer() { std::free(bytes); }
  uint8_t* data() const { return bytes; }
  uint8_t* const bytes;
};

// `a` and `b` (each moving `bytes_per_step` per call) measured in turn, in short alternating
// phases over `rounds` rounds, so that the shared machine's drift hits both alike.
struct Comparison {
  double a_rate = 0, b_rate = 0;  // bytes per second, over all rounds
  double median_ratio = 0;        // of the rounds' a/b
};
template <typename A, typename B>
Comparison Compare(double seconds, uint64_t bytes_per_step, A a, B b, int rounds = 9) {
  std::vector<double> ratios;
  Comparison result;
  for (int round = 0; round < rounds; ++round) {
    const double phase = seconds / rounds;
    const double ra = round % 2 == 0 ? Rate(phase, bytes_per_step, a) : 0;
    const double rb = Rate(phase, bytes_per_step, b);
    const double ra2 = round % 2 == 0 ? ra : Rate(phase, bytes_per_step, a);
    result.a_rate += ra2 / rounds;
    result.b_rate += rb / rounds;
    ratios.push_back(ra2 / rb);
  }
  std::sort(ratios.begin(), ratios.end());
  result.median_ratio = ratios[ratios.size() / 2];
  return result;
}

BlockRecordIdentity RecordFor(uint64_t i, const uint8_t* bytes, uint64_t size) {
  return BlockRecordIdentity{.hash = {i + 1, i * 31 + 7},
                             .parent_hash = {i, i},
                             .namespace_digest = 1,
                             .tokens = std::vector<uint32_t>(16, static_cast<uint32_t>(i)),
                             .checksum = BlockChecksum(bytes, size)};
}

// HostTier::Load of `blocks` records, round robin, vs memcpy between buffers of the same size.
void LoadVsMemcpy(uint64_t block_bytes, uint32_t blocks, double seconds) {
  auto tier = HostTier::Create(block_bytes * blocks, block_bytes);
  if (!tier.ok()) {
    std::fprintf(stderr, "tier: %s\n", tier.status().ToString().c_str());
    return;
  }
  std::vector<uint8_t> source(block_bytes * blocks), out(block_bytes * blocks);
  for (size_t i = 0; i < source.size(); ++i)
    source[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  std::vector<BlockRecordIdentity> records;
  for (uint32_t i = 0; i < blocks; ++i) {
    const uint8_t* bytes = source.data() + i * block_bytes;
    records.push_back(RecordFor(i, bytes, block_bytes));
    if (!(*tier)->Store(records.back(), bytes).ok()) return;
  }
  // The baseline copies the very same bytes from the very same addresses: memcpy's speed depends
  // on where source and destination lie relative to each other.
  std::vector<const uint8_t*> slots;
  for (const BlockRecordIdentity& record : records) {
    slots.push_back((*tier)->RecordBytesForTesting(record.hash));
  }
  uint64_t failures = 0;
  const Comparison c = Compare(
      seconds, block_bytes * blocks,
      [&] {
        for (uint32_t i = 0; i < blocks; ++i) {
          failures += !(*tier)->Load(records[i], out.data() + i * block_bytes).ok();
        }
      },
      [&] {
        for (uint32_t i = 0; i < blocks; ++i) {
          std::memcpy(out.data() + i * block_bytes, slots[i], block_bytes);
        }
      });
  std::printf("%-22s %9llu KiB %8u %10.2f %10.2f %7.2fx %s\n", "HostTier::Load",
              static_cast<unsigned long long>(block_bytes >> 10), blocks, c.a_rate / 1e9,
              c.b_rate / 1e9, c.median_ratio, failures == 0 ? "" : "LOAD FAILURES");
}

// Open of a prompt whose `prefix_blocks` come up from tier 2 each time: a pool of exactly
// prefix_blocks + 1 blocks is refilled by another prompt between opens, so every open loads the
// whole prefix again. Per byte loaded, vs memcpy of as many bytes.
void OpenFromTierVsMemcpy(const PoolLayout& layout, uint32_t prefix_blocks, double seconds) {
  PoolOptions options;
  options.name = "bench";
  options.model_id = "bench";
  options.layout = layout;
  options.num_blocks = prefix_blocks + 1;
  options.host_tier_bytes = uint64_t{2 * prefix_blocks + 2} * layout.BlockBytes();
  options.testing_manual_offload = true;        // offload is not what is measured
  options.offload_window = options.num_blocks;  // the whole prefix goes down
  const uint64_t block_bytes = layout.BlockBytes();
  auto memory = HostPoolMemory::Create(block_bytes, options.num_blocks);
  auto pool = Pool::Create(options, 0, *std::move(memory));
  if (!pool.ok()) {
    std::fprintf(stderr, "pool: %s\n", pool.status().ToString().c_str());
    return;
  }
  Session session(1, "uid:0", "tenant", "bench", absl::Seconds(600));
  const uint32_t tokens = prefix_blocks * layout.block_size;
  std::vector<uint32_t> prompt(tokens + 1), other(tokens + 1);
  std::iota(prompt.begin(), prompt.end(), 0);
  std::iota(other.begin(), other.end(), 1u << 30);
  // Computes `tokens_of` once: written, committed, released, offloaded.
  const auto compute = [&](const std::vector<uint32_t>& tokens_of) {
    auto opened = (*pool)->Open(session, SequenceSpec{tokens_of});
    if (!opened.ok()) return false;
    std::string bytes(block_bytes, '\0');
    for (size_t i = 0; i < prefix_blocks; ++i) {
      for (size_t b = 0; b < bytes.size(); ++b) bytes[b] = static_cast<char>(tokens_of[i] + b);
      (void)(*pool)->WriteBlock(opened->block_ids[i], 0, bytes);
    }
    (void)(*pool)->Commit(session, opened->sequence_id, tokens_of.size());
    (void)(*pool)->Release(session, opened->sequence_id);
    (*pool)->OffloadForTesting();
    return true;
  };
  if (!compute(prompt) || !compute(other)) return;
  uint64_t short_loads = 0;
  // The baseline: memcpy of the same records' bytes, from where tier 2 keeps them.
  std::vector<const uint8_t*> slots;
  for (const std::vector<uint32_t>* which : {&prompt, &other}) {
    BlockHasher hasher(options.hash_algorithm);
    const HashNamespace ns{options.model_id, (*pool)->layout_fingerprint(), session.tenant, ""};
    std::vector<Hash128> chain;
    hasher.ExtendChain(hasher.Root(ns), *which, layout.block_size, ExtraKeys{}, &chain);
    for (uint32_t i = 0; i < prefix_blocks; ++i) {
      slots.push_back((*pool)->host_tier()->RecordBytesForTesting(chain[i]));
      if (slots.back() == nullptr) return;
    }
  }
  AlignedBuffer out(block_bytes * prefix_blocks);
  // Two opens per step, each loading the whole prefix of its prompt (the other prompt's blocks
  // are what tier 1 holds), so a step moves twice the prefix.
  const Comparison c = Compare(
      seconds, 2 * block_bytes * prefix_blocks,
      [&] {
        for (const std::vector<uint32_t>* which : {&prompt, &other}) {
          auto opened = (*pool)->Open(session, SequenceSpec{*which});
          if (!opened.ok() || opened->num_host_tier_tokens != tokens) ++short_loads;
          if (opened.ok()) (void)(*pool)->Release(session, opened->sequence_id);
        }
      },
      [&] {
        for (size_t i = 0; i < slots.size(); ++i) {
          std::memcpy(out.data() + (i % prefix_blocks) * block_bytes, slots[i], block_bytes);
        }
      });
  std::printf("%-22s %9llu KiB %8u %10.2f %10.2f %7.2fx %s\n", "Pool::Open from tier 2",
              static_cast<unsigned long long>(block_bytes >> 10), prefix_blocks, c.a_rate / 1e9,
              c.b_rate / 1e9, c.median_ratio, short_loads == 0 ? "" : "SHORT LOADS");
}

// How far ahead the mover should work: a workload replayed against pools that differ only in
// their offload window. Prompts are one of `kDocuments` shared 32-block prefixes (Zipf 1.0) plus
// a 2-block unique suffix, more than tier 1 holds; the mover runs every `lag` requests (a mover
// that falls behind by that much). Deterministic: counts, not times.
void WindowSweep(uint32_t lag) {
  constexpr uint32_t kPoolBlocks = 1024, kTierBlocks = 8192, kDocuments = 200;
  constexpr uint32_t kPrefixBlocks = 32, kSuffixBlocks = 2, kRequests = 20000;
  const PoolLayout layout{.num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_size = 16};
  std::vector<double> cdf(kDocuments);
  double total = 0;
  for (uint32_t d = 0; d < kDocuments; ++d) cdf[d] = total += 1.0 / (d + 1);
  std::printf(
      "\nmover lag %u requests (pool %u blocks, tier 2 %u, %u documents of %u blocks, "
      "Zipf 1.0, %u requests)\n",
      lag, kPoolBlocks, kTierBlocks, kDocuments, kPrefixBlocks, kRequests);
  std::printf("%-10s %10s %10s %10s %12s %14s\n", "window", "tier1 hit", "tier2 hit", "computed",
              "copies/req", "evictions saved");
  for (uint32_t window : {16u, 64u, 128u, 256u, 512u, 1024u}) {
    PoolOptions options;
    options.name = "sweep";
    options.model_id = "sweep";
    options.layout = layout;
    options.num_blocks = kPoolBlocks;
    options.host_tier_bytes = uint64_t{kTierBlocks} * layout.BlockBytes();
    options.testing_manual_offload = true;
    options.offload_window = window;
    auto memory = HostPoolMemory::Create(layout.BlockBytes(), kPoolBlocks);
    auto pool = Pool::Create(options, 0, *std::move(memory));
    if (!pool.ok()) return;
    Session session(1, "uid:0", "tenant", "bench", absl::Seconds(600));
    std::mt19937 rng(7);
    std::uniform_real_distribution<double> uniform(0, total);
    uint64_t tier1 = 0, tier2 = 0, prompt_tokens = 0;
    std::vector<uint32_t> prompt((kPrefixBlocks + kSuffixBlocks) * layout.block_size + 1);
    for (uint32_t r = 0; r < kRequests; ++r) {
      const uint32_t document = static_cast<uint32_t>(
          std::lower_bound(cdf.begin(), cdf.end(), uniform(rng)) - cdf.begin());
      for (uint32_t t = 0; t < kPrefixBlocks * layout.block_size; ++t) {
        prompt[t] = document * 100000 + t;
      }
      for (uint32_t t = kPrefixBlocks * layout.block_size; t < prompt.size(); ++t) {
        prompt[t] = (1u << 30) + r * 1000 + t;
      }
      auto opened = (*pool)->Open(session, SequenceSpec{prompt});
      if (!opened.ok()) return;
      // KV is whatever the pool holds: the sweep counts blocks, not bytes.
      (void)(*pool)->Commit(session, opened->sequence_id, prompt.size());
      (void)(*pool)->Release(session, opened->sequence_id);
      tier1 += opened->num_cached_tokens - opened->num_host_tier_tokens;
      tier2 += opened->num_host_tier_tokens;
      prompt_tokens += prompt.size();
      if ((r + 1) % lag == 0) (*pool)->OffloadForTesting();
    }
    const PoolStatsSnapshot stats = (*pool)->Stats();
    const double evictions = stats.pool.evictions;
    std::printf("%-10u %9.1f%% %9.1f%% %9.1f%% %12.2f %13.1f%%\n", window,
                100.0 * tier1 / prompt_tokens, 100.0 * tier2 / prompt_tokens,
                100.0 * (prompt_tokens - tier1 - tier2) / prompt_tokens,
                static_cast<double>(stats.host_tier->offloaded_blocks) / kRequests,
                evictions == 0 ? 0 : 100.0 * stats.pool.evicted_offloaded / evictions);
  }
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  // As kvcache-manager runs (manager_main.cc): Debian's abseil otherwise checks every Mutex
  // acquisition against a global lock graph, a cost the daemon does not pay.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const double seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  // Optional: only "load", "open" or "sweep".
  const std::string only = argc > 2 ? argv[2] : "";
  const auto runs = [&](const char* part) { return only.empty() || only == part; };
  std::printf("tier 2 loads vs memcpy of the same bytes, %.1f s per figure, one thread\n", seconds);
  std::printf("%-22s %13s %8s %10s %10s %8s\n", "path", "block", "blocks", "GB/s", "memcpy",
              "median ratio of 9 alternating rounds");
  // 32 KiB: the default pool's block; 256 KiB and 2 MiB: larger models' blocks.
  for (uint64_t block_bytes : {32ull << 10, 256ull << 10, 2ull << 20}) {
    if (!runs("load")) break;
    kvcache::LoadVsMemcpy(block_bytes, static_cast<uint32_t>((256ull << 20) / block_bytes),
                          seconds);
  }
  // Pool blocks of 32 KiB (the default layout) and 512 KiB (48 layers, 4 heads, 128 dims, fp16,
  // 16 tokens would be 3 MiB; 8 layers keeps the bench's memory small).
  const kvcache::PoolLayout small{.num_layers = 4,
                                  .num_kv_heads = 2,
                                  .head_dim = 64,
                                  .block_size = 16,
                                  .dtype = kvcache::DType::kFloat16};
  const kvcache::PoolLayout large{.num_layers = 8,
                                  .num_kv_heads = 4,
                                  .head_dim = 128,
                                  .block_size = 16,
                                  .dtype = kvcache::DType::kFloat16};
  if (runs("open")) {
    kvcache::OpenFromTierVsMemcpy(small, 2048, seconds);  // 64 MiB prefix
    kvcache::OpenFromTierVsMemcpy(large, 128, seconds);   // 64 MiB prefix
  }
  if (runs("sweep")) {
    for (uint32_t lag : {1u, 8u}) kvcache::WindowSweep(lag);
  }
}
