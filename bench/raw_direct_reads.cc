#include "bench/raw_direct_reads.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <vector>

namespace kvcache::bench {
namespace {

void CheckRead(const absl::StatusOr<IoRing::Completion>& completion, uint64_t slot_bytes) {
  if (!completion.ok() || completion->result != static_cast<int>(slot_bytes)) std::abort();
}

}  // namespace

double RawDirectReads(int fd, uint64_t slot_bytes, uint64_t first, uint64_t count, uint32_t depth,
                      IoRing& ring, AlignedBuffer& buffers, RawReadPipeline pipeline) {
  const auto start = std::chrono::steady_clock::now();
  const auto queue = [&](uint64_t slot, uint64_t buffer) {
    ring.QueueRead(fd, buffers.data() + buffer * slot_bytes, slot_bytes,
                   (first + slot) * slot_bytes, buffer);
  };
  if (pipeline == RawReadPipeline::kDrainedBatches) {
    std::vector<IoRing::Completion> done;
    for (uint64_t batch = 0; batch < count; batch += depth) {
      const uint64_t n = std::min<uint64_t>(depth, count - batch);
      for (uint64_t i = 0; i < n; ++i) queue(batch + i, i);
      done.clear();
      if (!ring.SubmitAndWait(&done).ok()) std::abort();
      for (const IoRing::Completion& completion : done) CheckRead(completion, slot_bytes);
    }
  } else {
    uint64_t next = 0;
    for (; next < std::min<uint64_t>(depth, count); ++next) queue(next, next);
    if (!ring.Submit().ok()) std::abort();
    for (uint64_t done = 0; done < count; ++done) {
      const absl::StatusOr<IoRing::Completion> completion = ring.WaitOne();
      CheckRead(completion, slot_bytes);
      if (next < count) {
        queue(next++, completion->tag);
        if (!ring.Submit().ok()) std::abort();
      }
    }
  }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kvcache::bench
