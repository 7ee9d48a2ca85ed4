// The baseline the disk tier's loads are measured against (disk_tier_bench, tier_bench): raw
// io_uring O_DIRECT reads of whole slots of a tier file, no decoding, no verification, no copy.
#ifndef KVCACHE_BENCH_RAW_DIRECT_READS_H_
#define KVCACHE_BENCH_RAW_DIRECT_READS_H_

#include <cstdint>

#include "absl/types/span.h"
#include "tiers/io_ring.h"

namespace kvcache::bench {

enum class RawReadPipeline {
  // Each completion queues the next read at once: `depth` reads in flight all the time, the best
  // the device does at this depth.
  kContinuous,
  // `depth` reads submitted, all waited for, then the next `depth`: the queue drains between
  // batches, as it does between the LoadMany calls of a pool's prefix walk.
  kDrainedBatches,
};

// How each read lands in memory.
struct RawReadLayout {
  // 0: each slot is read whole into `buffers`. Otherwise a readv puts a slot's first header_bytes
  // into `buffers` and the rest apart, as the disk tier reads a record into a pool block.
  uint64_t header_bytes = 0;
  // With header_bytes: where the rest of the r-th read goes, at bytes_out + r * (slot_bytes -
  // header_bytes) (4 KiB aligned; as large as every read's bytes), as the tier fills a sequence's
  // fresh blocks; null: into the second half of `buffers`, reused (then 2 * depth * slot_bytes).
  char* bytes_out = nullptr;
  // With bytes_out: XXH3-64 of each read's bytes in the reaping loop, after the next read is
  // queued, as the disk tier verifies each record (what its extra work per read costs the loop).
  bool checksum_bytes = false;
};

// Reads `slots` of `fd` (opened O_DIRECT), each `slot_bytes` long, in that order with `depth`
// reads in flight, into `buffers` (at least depth * slot_bytes, 4 KiB aligned, reused); `ring`
// holds at least `depth` entries. Aborts on any failed or short read (a bench has no way on).
// Returns seconds.
double RawDirectReads(int fd, uint64_t slot_bytes, absl::Span<const uint64_t> slots, uint32_t depth,
                      IoRing& ring, AlignedBuffer& buffers,
                      RawReadPipeline pipeline = RawReadPipeline::kContinuous,
                      const RawReadLayout& layout = {});

}  // namespace kvcache::bench

#endif  // KVCACHE_BENCH_RAW_DIRECT_READS_H_
