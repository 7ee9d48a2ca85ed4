// In-process block-manager throughput: open + commit + release of 2k-token prompts sharing 0%,
// 50% and 90% of their prefix, in blocks per second on one thread; the shared rows against the
// 0% row (every block allocated, nothing found). No gRPC, no timing asserted. Exits 1 at the
// first failed call (bench/bench_run.h). Usage: pool_bench [seconds per row]
#include <time.h>

#include <chrono>
#include <cstdio>
#include <numeric>
#include <vector>

#include "bench/bench_run.h"
#include "bench/bookkeeping_pool.h"
#include "cache/pool.h"

namespace kvcache {
namespace {

constexpr uint32_t kBlockSize = 16;
constexpr uint32_t kPromptTokens = 2048;
constexpr uint32_t kNumBlocks = 1 << 16;

// On a shared machine the thread's CPU time is the steadier figure: other processes lengthen
// the wall time, not the work.
double ThreadCpuSeconds() {
  timespec now;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

// Every prompt starts with the same `shared_fraction` of tokens; the rest is unique.
void Run(double shared_fraction, double seconds) {
  std::unique_ptr<Pool> cache = bench::MakeBookkeepingPool(kNumBlocks, kBlockSize);
  Session session(1, "uid:0", "tenant", "bench", absl::Seconds(60));
  const uint32_t shared_tokens =
      static_cast<uint32_t>(kPromptTokens * shared_fraction) / kBlockSize * kBlockSize;
  std::vector<uint32_t> prompt(kPromptTokens);
  std::iota(prompt.begin(), prompt.end(), 0);
  // Unique tokens from a counter: a Mersenne Twister drawing them took 13% of the time measured,
  // which is the bench's, not the pool's. Wraps after 2M prompts, far beyond a run.
  uint32_t next_token = kPromptTokens;
  uint64_t requests = 0, blocks = 0, cached_tokens = 0;
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = ThreadCpuSeconds();
  const auto stop = start + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < stop) {
    for (int batch = 0; batch < 64; ++batch) {
      for (uint32_t i = shared_tokens; i < kPromptTokens; ++i) prompt[i] = next_token++;
      auto opened = bench::ValueOrFail(cache->Open(session, SequenceSpec{prompt}), "Open");
      bench::CheckOk(cache->Commit(session, opened.sequence_id, kPromptTokens).status(), "Commit");
      bench::CheckOk(cache->Release(session, opened.sequence_id), "Release");
      ++requests;
      blocks += opened.block_ids.size();
      cached_tokens += opened.num_cached_tokens;
    }
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu = ThreadCpuSeconds() - cpu_start;
  std::printf(
      "shared %3.0f%%  %8.0f requests/s  %10.0f blocks/s  %10.0f blocks/cpu-s  %6.2f us/request  "
      "hit %5.1f%%  evictions %llu\n",
      shared_fraction * 100, requests / elapsed, blocks / elapsed, blocks / cpu,
      elapsed / requests * 1e6, 100.0 * cached_tokens / (requests * kPromptTokens),
      static_cast<unsigned long long>(cache->Stats().pool.evictions));
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  std::printf(
      "Pool: open+commit+release of %u-token prompts, block_size %u, "
      "pool %u blocks, one thread\n",
      kvcache::kPromptTokens, kvcache::kBlockSize, kvcache::kNumBlocks);
  for (double shared : {0.0, 0.5, 0.9}) kvcache::Run(shared, seconds);
}
