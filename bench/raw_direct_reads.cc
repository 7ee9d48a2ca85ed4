#include "bench/raw_direct_reads.h"

#include <sys/uio.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "common/block_checksum.h"

namespace kvcache::bench {
namespace {

void CheckRead(const absl::StatusOr<IoRing::Completion>& completion, uint64_t slot_bytes) {
  if (!completion.ok() || completion->result != static_cast<int>(slot_bytes)) std::abort();
}

}  // namespace

double RawDirectReads(int fd, uint64_t slot_bytes, absl::Span<const uint64_t> slots, uint32_t depth,
                      IoRing& ring, AlignedBuffer& buffers, RawReadPipeline pipeline,
                      const RawReadLayout& layout) {
  const uint64_t header_bytes = layout.header_bytes;
  if (layout.checksum_bytes && (header_bytes == 0 || layout.bytes_out == nullptr)) std::abort();
  std::vector<uint64_t> read_in(depth);  // which read each buffer holds
  uint64_t checksums = 0;
  const auto checksum = [&](uint64_t read) {
    if (!layout.checksum_bytes) return;
    const uint64_t bytes = slot_bytes - header_bytes;
    checksums ^= BlockChecksum(layout.bytes_out + read * bytes, bytes);
  };
  const uint64_t count = slots.size();
  std::vector<std::array<iovec, 2>> iovecs(depth);
  const auto start = std::chrono::steady_clock::now();
  const auto queue = [&](uint64_t read, uint64_t buffer) {
    char* slot = buffers.data() + buffer * slot_bytes;
    read_in[buffer] = read;
    if (header_bytes == 0) {
      ring.QueueRead(fd, slot, slot_bytes, slots[read] * slot_bytes, buffer);
      return;
    }
    char* bytes = layout.bytes_out != nullptr
                      ? layout.bytes_out + read * (slot_bytes - header_bytes)
                      : buffers.data() + (depth + buffer) * slot_bytes;
    iovecs[buffer] = {iovec{slot, header_bytes}, iovec{bytes, slot_bytes - header_bytes}};
    ring.QueueReadv(fd, iovecs[buffer].data(), 2, slots[read] * slot_bytes, buffer);
  };
  if (pipeline == RawReadPipeline::kDrainedBatches) {
    std::vector<IoRing::Completion> done;
    for (uint64_t batch = 0; batch < count; batch += depth) {
      const uint64_t n = std::min<uint64_t>(depth, count - batch);
      for (uint64_t i = 0; i < n; ++i) queue(batch + i, i);
      done.clear();
      if (!ring.SubmitAndWait(&done).ok()) std::abort();
      for (const IoRing::Completion& completion : done) {
        CheckRead(completion, slot_bytes);
        checksum(read_in[completion.tag]);
      }
    }
  } else {
    uint64_t next = 0;
    for (; next < std::min<uint64_t>(depth, count); ++next) queue(next, next);
    if (!ring.Submit().ok()) std::abort();
    for (uint64_t done = 0; done < count; ++done) {
      const absl::StatusOr<IoRing::Completion> completion = ring.WaitOne();
      CheckRead(completion, slot_bytes);
      const uint64_t completed = read_in[completion->tag];
      if (next < count) {
        queue(next++, completion->tag);
        if (!ring.Submit().ok()) std::abort();
      }
      checksum(completed);
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // Kept, so that the checksums are computed.
  if (checksums == 1) std::printf(" ");
  return seconds;
}

}  // namespace kvcache::bench
