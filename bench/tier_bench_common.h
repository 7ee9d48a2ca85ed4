// What tier_bench.cc and tier_bench_disk.cc share: the alternating comparison they print every
// ratio from, the measuring thread's CPU and wait times, and pools with a manual tier 2.
#ifndef KVCACHE_BENCH_TIER_BENCH_COMMON_H_
#define KVCACHE_BENCH_TIER_BENCH_COMMON_H_

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_run.h"
#include "bench/raw_direct_reads.h"
#include "cache/cuda_pool_memory.h"
#include "cache/pool.h"
#include "common/block_checksum.h"
#include "common/task_workers.h"
#include "tiers/host_tier.h"
#include "tiers/io_ring.h"
#include "tiers/record_codec.h"
#include "tiers/tier_keyring.h"

namespace kvcache::tier_bench {

using SteadyClock = std::chrono::steady_clock;

// The calling thread's time on a CPU and waiting for one (runnable, not running: what a busy
// shared machine costs a loop that must run to reap and refill its reads), in seconds.
struct ThreadTimes {
  double on_cpu = 0;
  double waiting = 0;
};
inline ThreadTimes ThreadTimesNow() {
  unsigned long long on_cpu_ns = 0, waiting_ns = 0;
  std::FILE* file = std::fopen("/proc/thread-self/schedstat", "r");
  if (file != nullptr) {
    if (std::fscanf(file, "%llu %llu", &on_cpu_ns, &waiting_ns) != 2) on_cpu_ns = waiting_ns = 0;
    std::fclose(file);
  }
  return {on_cpu_ns * 1e-9, waiting_ns * 1e-9};
}

struct Measured {
  double rate = 0;        // bytes per second
  double cpu_share = 0;   // this thread's time on a CPU per second of the phase
  double wait_share = 0;  // this thread's time waiting for a CPU per second of the phase
};

// Calls `step()` (which moves `bytes_per_step`) until `seconds` pass.
template <typename Step>
inline Measured Rate(double seconds, uint64_t bytes_per_step, Step step) {
  step();  // warm: page faults are not measured
  uint64_t steps = 0;
  const ThreadTimes times_start = ThreadTimesNow();
  const auto start = SteadyClock::now();
  const auto stop = start + std::chrono::duration<double>(seconds);
  while (SteadyClock::now() < stop) {
    step();
    ++steps;
  }
  const double elapsed = std::chrono::duration<double>(SteadyClock::now() - start).count();
  const ThreadTimes times = ThreadTimesNow();
  return {steps * bytes_per_step / elapsed, (times.on_cpu - times_start.on_cpu) / elapsed,
          (times.waiting - times_start.waiting) / elapsed};
}

// `a` and `b` (each moving `bytes_per_step` per call) measured in turn, in short alternating
// phases over `rounds` rounds, so that the shared machine's drift hits both alike.
struct Comparison {
  double a_rate = 0, b_rate = 0;  // bytes per second, over all rounds
  double a_cpu = 0, b_cpu = 0;    // CPU share of the measuring thread, over all rounds
  double a_wait = 0, b_wait = 0;  // share of the time it waited for a CPU
  double median_ratio = 0;        // of the rounds' a/b
};
template <typename A, typename B>
inline Comparison Compare(double seconds, uint64_t bytes_per_step, A a, B b, int rounds = 9) {
  std::vector<double> ratios;
  Comparison result;
  for (int round = 0; round < rounds; ++round) {
    const double phase = seconds / rounds;
    const Measured first = round % 2 == 0 ? Rate(phase, bytes_per_step, a) : Measured{};
    const Measured rb = Rate(phase, bytes_per_step, b);
    const Measured ra = round % 2 == 0 ? first : Rate(phase, bytes_per_step, a);
    result.a_rate += ra.rate / rounds;
    result.b_rate += rb.rate / rounds;
    result.a_cpu += ra.cpu_share / rounds;
    result.b_cpu += rb.cpu_share / rounds;
    result.a_wait += ra.wait_share / rounds;
    result.b_wait += rb.wait_share / rounds;
    ratios.push_back(ra.rate / rb.rate);
  }
  std::sort(ratios.begin(), ratios.end());
  result.median_ratio = ratios[ratios.size() / 2];
  return result;
}

// A pool of `num_blocks` with a tier 2 of `tier_blocks`, whose mover runs only when the bench
// calls OffloadForTesting.
inline PoolOptions ManualTierOptions(const std::string& name, const PoolLayout& layout,
                                     uint32_t num_blocks, uint64_t tier_blocks) {
  PoolOptions options;
  options.name = name;
  options.model_id = name;
  options.layout = layout;
  options.num_blocks = num_blocks;
  options.host_tier_bytes = tier_blocks * layout.BlockBytes();
  options.testing_manual_offload = true;
  return options;
}

// Opens `tokens`, writes each full block with bytes of its own, commits and releases: a prompt
// computed once, left evictable in tier 1.
inline bool ComputeOnce(Pool& pool, const Session& session, const std::vector<uint32_t>& tokens) {
  auto opened = pool.Open(session, SequenceSpec{tokens});
  if (!opened.ok()) return false;
  const PoolLayout& layout = pool.options().layout;
  std::string bytes(layout.BlockBytes(), '\0');
  for (size_t i = 0; i < tokens.size() / layout.block_size; ++i) {
    for (size_t b = 0; b < bytes.size(); ++b) bytes[b] = static_cast<char>(tokens[i] + b);
    if (!pool.WriteBlock(opened->block_ids[i], 0, bytes).ok()) return false;
  }
  return pool.Commit(session, opened->sequence_id, tokens.size()).ok() &&
         pool.Release(session, opened->sequence_id).ok();
}

// The chain hashes `pool` computes for `tokens` in `session`'s tenant.
inline std::vector<Hash128> ChainOf(Pool& pool, const Session& session,
                                    const std::vector<uint32_t>& tokens) {
  BlockHasher hasher(pool.options().hash_algorithm);
  const HashNamespace ns{pool.options().model_id, pool.layout_fingerprint(), session.tenant, ""};
  std::vector<Hash128> chain;
  hasher.ExtendChain(hasher.Root(ns), tokens, pool.options().layout.block_size, ExtraKeys{},
                     &chain);
  return chain;
}

// Opens and releases each of `prompts`; returns how many did not load the whole `tokens` of
// their prefix from the tier whose count `loaded_from` names.
inline uint64_t OpenAndRelease(Pool& pool, const Session& session,
                               std::initializer_list<const std::vector<uint32_t>*> prompts,
                               uint32_t tokens, uint32_t OpenedSequence::*loaded_from) {
  uint64_t short_loads = 0;
  for (const std::vector<uint32_t>* prompt : prompts) {
    auto opened = pool.Open(session, SequenceSpec{*prompt});
    if (!opened.ok() || (*opened).*loaded_from != tokens) ++short_loads;
    if (opened.ok()) (void)pool.Release(session, opened->sequence_id);
  }
  return short_loads;
}

// Opens from tier 3 vs raw O_DIRECT reads, and sealed vs unsealed (tier_bench_disk.cc).
void OpenFromDiskVsRawReads(const PoolLayout& layout, uint32_t prefix_blocks, double seconds,
                            const std::string& dir);
void OpenFromSealedVsUnsealedDisk(const PoolLayout& layout, uint32_t prefix_blocks, double seconds,
                                  const std::string& dir);

}  // namespace kvcache::tier_bench

#endif  // KVCACHE_BENCH_TIER_BENCH_COMMON_H_
