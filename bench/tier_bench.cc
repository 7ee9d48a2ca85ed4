// Tier 2 (the host tier, issue 18): loading blocks from it vs a plain memcpy of the same bytes,
// measured in one run. Two figures per block size:
//   HostTier::Load   copy out of the tier's slot + XXH3-64 verify of the copy, vs memcpy of the
//                    same bytes between the same kind of buffers (target >= 0.8x);
//   Pool::Open       an OpenSequence whose whole prefix comes up from tier 2 (probe under the
//                    pool mutex, load into fresh pool blocks, verify, publish), per byte loaded,
//                    vs the same memcpy.
// Working sets exceed the last-level cache (both sides stream from memory). No timing asserted.
// Usage: tier_bench [seconds per measurement]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <vector>

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
  uint64_t failures = 0;
  const double load = Rate(seconds, block_bytes * blocks, [&] {
    for (uint32_t i = 0; i < blocks; ++i) {
      failures += !(*tier)->Load(records[i], out.data() + i * block_bytes).ok();
    }
  });
  const double copy = Rate(seconds, block_bytes * blocks, [&] {
    for (uint32_t i = 0; i < blocks; ++i) {
      std::memcpy(out.data() + i * block_bytes, source.data() + i * block_bytes, block_bytes);
    }
  });
  std::printf("%-22s %9llu KiB %8u %10.2f %10.2f %7.2fx %s\n", "HostTier::Load",
              static_cast<unsigned long long>(block_bytes >> 10), blocks, load / 1e9, copy / 1e9,
              load / copy, failures == 0 ? "" : "LOAD FAILURES");
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
  options.testing_manual_offload = true;  // offload is not what is measured
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
  const double open = Rate(seconds, block_bytes * prefix_blocks,
                           [&] {
                             // The other prompt's blocks are in tier 1 (it was opened last): this
                             // open loads all of ours, then the other's open loads all of its, and
                             // so on.
                             for (const std::vector<uint32_t>* which : {&prompt, &other}) {
                               auto opened = (*pool)->Open(session, SequenceSpec{*which});
                               if (!opened.ok() || opened->num_host_tier_tokens != tokens)
                                 ++short_loads;
                               if (opened.ok())
                                 (void)(*pool)->Release(session, opened->sequence_id);
                             }
                           }) /
                      2;
  std::vector<uint8_t> source(block_bytes * prefix_blocks, 1), out(block_bytes * prefix_blocks);
  const double copy = Rate(seconds, source.size(), [&] {
    for (uint32_t i = 0; i < prefix_blocks; ++i) {
      std::memcpy(out.data() + i * block_bytes, source.data() + i * block_bytes, block_bytes);
    }
  });
  std::printf("%-22s %9llu KiB %8u %10.2f %10.2f %7.2fx %s\n", "Pool::Open from tier 2",
              static_cast<unsigned long long>(block_bytes >> 10), prefix_blocks, open / 1e9,
              copy / 1e9, open / copy, short_loads == 0 ? "" : "SHORT LOADS");
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  std::printf("tier 2 loads vs memcpy of the same bytes, %.1f s per figure, one thread\n", seconds);
  std::printf("%-22s %13s %8s %10s %10s %8s\n", "path", "block", "blocks", "GB/s", "memcpy",
              "ratio");
  // 32 KiB: the default pool's block; 256 KiB and 2 MiB: larger models' blocks.
  for (uint64_t block_bytes : {32ull << 10, 256ull << 10, 2ull << 20}) {
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
  kvcache::OpenFromTierVsMemcpy(small, 2048, seconds);  // 64 MiB prefix
  kvcache::OpenFromTierVsMemcpy(large, 128, seconds);   // 64 MiB prefix
}
