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

// Reads `slots` of `fd` (opened O_DIRECT), each `slot_bytes` long, in that order with `depth`
// reads in flight, into `buffers` (at least depth * slot_bytes, 4 KiB aligned); `ring` holds at
// least `depth` entries. With `header_bytes`, each read is a readv that puts a slot's first
// header_bytes apart from the rest, as the disk tier reads a record into a pool block (`buffers`
// then holds 2 * depth * slot_bytes). Aborts on any failed or short read (a bench has no way on).
// Returns seconds.
double RawDirectReads(int fd, uint64_t slot_bytes, absl::Span<const uint64_t> slots, uint32_t depth,
                      IoRing& ring, AlignedBuffer& buffers,
                      RawReadPipeline pipeline = RawReadPipeline::kContinuous,
                      uint64_t header_bytes = 0);

}  // namespace kvcache::bench

#endif  // KVCACHE_BENCH_RAW_DIRECT_READS_H_
