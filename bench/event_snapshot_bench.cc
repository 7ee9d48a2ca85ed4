// A KV-event snapshot (KvEventLog::TakeSnapshot: what a watcher too far behind the event buffer
// gets, one BlocksStored per indexed block) of N indexed blocks: how long the log's mutex is held
// for the copy (from the moment it is taken to the end of the copy), against how long the whole
// snapshot takes. Every pool appends its events under its own mutex, so while the log's mutex is
// held no pool publishes or evicts: until 2026-11-27 the snapshot held it throughout (0.7 s per
// million blocks on the 2-core VM); now only while it copies the compact index, into memory made
// resident before it takes the mutex (the copy's page faults had been most of its time). Blocks
// are stored as the daemon's pools store them: chains of 16 blocks of 16 tokens, one tenant,
// tier 1's medium. No timing asserted; exits 1 when the snapshot does not hold every indexed
// block.
// Usage: event_snapshot_bench [blocks, default 4194304]
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_run.h"
#include "cache/kv_event_log.h"

namespace kvcache {
namespace {

using SteadyClock = std::chrono::steady_clock;

double MillisecondsSince(SteadyClock::time_point start) {
  return std::chrono::duration<double, std::milli>(SteadyClock::now() - start).count();
}

void Run(uint64_t num_blocks) {
  constexpr uint32_t kBlockSize = 16;
  constexpr uint32_t kChainBlocks = 16;
  KvEventLog log;
  log.AddPool(0, "default", std::string(kKvMediumCpu), kBlockSize);
  std::mt19937 random(7);
  std::uniform_int_distribution<uint32_t> vocabulary(0, 128255);  // Llama 3's
  uint64_t next_hash = 1;
  for (uint64_t stored = 0; stored < num_blocks; stored += kChainBlocks) {
    std::vector<StoredBlock> chain;
    for (uint32_t b = 0; b < kChainBlocks; ++b, ++next_hash) {
      StoredBlock block{.hash = Hash128{.hi = next_hash * 0x9e3779b97f4a7c15ull, .lo = next_hash}};
      for (uint32_t t = 0; t < kBlockSize; ++t) block.token_ids.push_back(vocabulary(random));
      chain.push_back(std::move(block));
    }
    log.BlocksStored(0, "tenant", std::nullopt, std::move(chain));
  }
  const uint64_t indexed = log.indexed_blocks();
  SteadyClock::time_point start;
  SteadyClock::time_point locked;
  double locked_ms = 0;
  log.SetSnapshotHookForTesting([&](KvEventLog::SnapshotStage stage) {
    if (stage == KvEventLog::SnapshotStage::kLocked) locked = SteadyClock::now();
    if (stage == KvEventLog::SnapshotStage::kCopied) locked_ms = MillisecondsSince(locked);
  });
  start = SteadyClock::now();
  const KvEventLog::Snapshot snapshot = log.TakeSnapshot(KvEventFilter{});
  const double total_ms = MillisecondsSince(start);
  if (snapshot.events.size() != indexed || indexed != num_blocks) {
    bench::Fail(absl::StrCat("the snapshot holds ", snapshot.events.size(), " blocks of ", indexed,
                             " indexed, ", num_blocks, " stored"));
  }
  std::printf(
      "snapshot of %llu indexed blocks: %.0f ms in all, the log's mutex held %.1f ms for the copy "
      "(%.3fx of the whole, which held it throughout before)\n",
      static_cast<unsigned long long>(indexed), total_ms, locked_ms, locked_ms / total_ms);
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  const uint64_t blocks = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : uint64_t{4} << 20;
  kvcache::Run(kvcache::bench::FullOrSmoke(blocks, uint64_t{65536}));
  return 0;
}
