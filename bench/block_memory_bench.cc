// Metadata memory per block: the daemon's anonymous memory for a pool of N blocks (the pool's
// bytes excluded: they are the block size times N, in their own mapping), empty and at full
// occupancy — every block published through open + commit, half of them held by open sequences
// and half released (evictable), KV events recorded as the daemon records them (the event log's
// own copy of the index included). Printed per block, and extrapolated to 100M blocks from the
// per-block figure. Measured in process with the daemon's own Pool and KvEventLog: the gRPC layer
// keeps nothing per block. Baseline: the bar of 128 bytes per block. No timing.
// Prompts are random ids of Llama 3's vocabulary (128,256 tokens, 17 bits): the pool stores
// tokens at the width its vocabulary needs (PackedTokens), so a counter running past 2^18
// would measure a vocabulary no model has.
//
// Where the bytes go, per block of the pool at 4M blocks (16 tokens a block; "held": blocks an
// open sequence holds, half the pool here). Measured full: 319 B (527 B at 1a33682, 328 B with
// each event block's tokens in a vector of their own).
//   BlockPool::BlockMeta                  80  hash, 4 digests incl. checksum, 6 links, ref, flags
//   BlockPool tokens (PackedTokens)       36  16 tokens x 18 bits (64 B as uint32)
//   BlockPool index (block id set)        10  4 B slot + 1 control byte, at most half full
//   BlockPool roots_                      <1  one per chain root (1 in 128 blocks here)
//   Pool tenant slot + 3 residency ticks  16  block_tenant_, allocated_at_, last_access_,
//                                             released_at_
//   Pool sequences, per held block       100  tokens 64, chain hash 16, 2 digests 16, id 4
//                                             (50 per pool block at half held)
//   KvEventLog entry                      48  hash, parent hash, extras, tenant id, medium
//   KvEventLog tokens (PackedTokens)      36
//   KvEventLog index (entry id set)       10
//   KvEventLog buffer                    ~29  its last 10,000 events of 128 blocks, 96 B a
//                                             block (tokens inline): 123 MB whatever the
//                                             pool's size (fixed, not per block)
// Empty, only BlockMeta, the index's control bytes and the Pool's vectors are resident (98 B).
// The bench also prints what a published block adds over the second half of the prompts, when
// the buffer is full (pools over 2.56M blocks), and extrapolates to 100M blocks from it.
// Usage: block_memory_bench [blocks, default 4194304]
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/bookkeeping_pool.h"
#include "cache/kv_event_log.h"
#include "cache/pool.h"

namespace kvcache {
namespace {

constexpr uint32_t kBlockSize = 16;
constexpr uint32_t kPromptBlocks = 128;   // 2,048-token prompts
constexpr uint32_t kVocabulary = 128256;  // Llama 3's

// Anonymous resident memory of this process (heap and anonymous mappings), in bytes.
uint64_t RssAnonBytes() {
  std::ifstream status("/proc/self/status");
  std::string key;
  while (status >> key) {
    if (key == "RssAnon:") {
      uint64_t kib = 0;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 10, '\n');
  }
  std::fprintf(stderr, "no RssAnon in /proc/self/status\n");
  std::exit(1);
}

int Run(uint32_t num_blocks) {
  const uint64_t before = RssAnonBytes();
  KvEventLog events;
  // The pool's own bytes (2 MiB a million blocks) barely move the figure, and they are a file
  // mapping in the daemon anyway.
  events.AddPool(0, bench::kBookkeepingPoolName, std::string(kKvMediumCpu), kBlockSize);
  const std::unique_ptr<Pool> pool = bench::MakeBookkeepingPool(num_blocks, kBlockSize, &events);
  Session session(1, "uid:0", "tenant", "bench", absl::Hours(1));
  const uint64_t empty = RssAnonBytes();

  std::vector<uint32_t> prompt(kPromptBlocks * kBlockSize);
  std::minstd_rand random(1);
  const uint32_t num_prompts = num_blocks / kPromptBlocks;
  uint64_t half = 0;  // after the first half of the prompts
  for (uint32_t i = 0; i < num_prompts; ++i) {
    if (i == num_prompts / 2) {
      malloc_trim(0);
      half = RssAnonBytes();
    }
    for (uint32_t& token : prompt) token = random() % kVocabulary;
    absl::StatusOr<OpenedSequence> opened = pool->Open(session, SequenceSpec{prompt});
    absl::Status done = opened.status();
    if (done.ok()) {
      done = pool->Commit(session, opened->sequence_id, prompt.size()).status();
    }
    // Every other prompt is released: its blocks stay published, evictable.
    if (done.ok() && i % 2 == 1) done = pool->Release(session, opened->sequence_id);
    if (!done.ok()) {
      std::fprintf(stderr, "prompt %u: %s\n", i, done.ToString().c_str());
      return 1;
    }
  }
  malloc_trim(0);
  const uint64_t full = RssAnonBytes();
  const PoolStatsSnapshot stats = pool->Stats();
  const uint64_t published = stats.pool.published;
  if (published != uint64_t{num_prompts} * kPromptBlocks || events.indexed_blocks() != published) {
    std::fprintf(stderr, "published %llu blocks, the event log indexes %zu, wanted %u\n",
                 static_cast<unsigned long long>(published), events.indexed_blocks(),
                 num_prompts * kPromptBlocks);
    return 1;
  }
  const double empty_per_block = double(empty - before) / num_blocks;
  const double full_per_block = double(full - before) / num_blocks;
  // What a published block adds, from the second half of the prompts: by then the event log's
  // buffer (its last 10,000 events, whatever the pool's size) is full, so this is what grows
  // with the pool. The rest of the full figure past the empty pool is that fixed part.
  const uint64_t second_half = published - uint64_t{num_prompts / 2} * kPromptBlocks;
  const double marginal = double(full - half) / second_half;
  const double fixed = double(full - empty) - marginal * published;
  std::printf("pool of %u blocks (block_size %u), %llu published, half of them evictable\n",
              num_blocks, kBlockSize, static_cast<unsigned long long>(published));
  std::printf(
      "anonymous memory per block: empty %.0f B, full %.0f B (%.0f B per published block)"
      "  bar: <= 128 B full\n",
      empty_per_block, full_per_block, double(full - empty) / published);
  std::printf("per published block past the first half: %.0f B; fixed: %.0f MB\n", marginal,
              fixed / 1e6);
  std::printf("at 100M blocks: %.1f GB (empty + that per block + fixed)\n",
              ((empty_per_block + marginal) * 100e6 + fixed) / 1e9);
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  const long blocks = argc > 1 ? std::atol(argv[1]) : 4L << 20;
  if (blocks < 256 || blocks >= 0xffffffffL) {
    std::fprintf(stderr, "blocks: 256 to 2^32 - 2\n");
    return 2;
  }
  return kvcache::Run(static_cast<uint32_t>(blocks));
}
