// XXH3-64 (seed 0) with the widest vector code this CPU runs. Debian's libxxhash is built for
// baseline x86-64 (SSE2): about 12 GB/s here, a tenth of a block stream's time. An AVX2 build of
// the same algorithm runs at about 37 GB/s and gives the same values (XXH3's result never
// depends on its vectorization); it is picked at run time, so the binaries still run on any
// x86-64 CPU, and elsewhere the library serves.
#ifndef KVCACHE_COMMON_XXH3_FAST_H_
#define KVCACHE_COMMON_XXH3_FAST_H_

#include <cstddef>
#include <cstdint>

namespace kvcache::xxh3 {

uint64_t Hash64(const void* data, size_t size);

// Hash64 of exactly `total` bytes that arrive in pieces, in order, each copied as it is hashed
// (memcpy's contract per piece), reading each source once: with AVX2 every 64-byte stripe is
// stored and hashed from the registers it was loaded into, so the hash's arithmetic runs while the
// copy waits on memory (a copy then a hash of it ran at 0.67-0.83x of memcpy from memory, this at
// 0.85x, 0.98x streaming; in cache 0.86-1.19x). Only a stripe that straddles two pieces is put
// together in a buffer here. `streaming`: the destination is written with non-temporal stores
// and fenced, as StreamingCopy does (common/streaming_copy.h). Thread-compatible.
class CopyingHash {
 public:
  explicit CopyingHash(uint64_t total);

  // The next `size` bytes; their sum over calls must not pass `total`. A null `destination`: only
  // hashed. The source must not change until this returns.
  void Copy(void* destination, const void* source, size_t size, bool streaming);
  uint64_t fed() const { return fed_; }
  // REQUIRES: fed() == total. At most once: it folds the last stripe into the accumulators.
  uint64_t Finish();

  // Tests of the code CPUs without AVX2 run: true makes every CopyingHash use it from now on.
  static void UseBaselineCodeForTesting(bool baseline);

 private:
  // XXH3's inputs of up to this many bytes are hashed apart (no stripes).
  static constexpr uint64_t kMidsizeMax = 240;
  static constexpr uint64_t kStripeBytes = 64;

  alignas(64) uint64_t lanes_[8];  // XXH3's accumulators
  // A short input whole, else its last stripe (which XXH3 hashes with its own key at the end).
  uint8_t window_[kMidsizeMax];
  uint8_t straddling_[kStripeBytes];  // a stripe that crosses pieces, put together
  uint64_t total_;
  uint64_t window_begin_;  // offset of window_[0] in the input
  uint64_t stripes_;       // stripes hashed on the way (all but the last, long inputs)
  uint64_t fed_ = 0;
};

// The streaming form: Update any number of times, then DigestAndReset gives Hash64 of all the
// bytes since the last reset. Thread-compatible.
class Stream {
 public:
  Stream();
  ~Stream();
  Stream(const Stream&) = delete;
  Stream& operator=(const Stream&) = delete;

  void Update(const void* data, size_t size);
  uint64_t DigestAndReset();

 private:
  void* state_;
};

}  // namespace kvcache::xxh3

#endif  // KVCACHE_COMMON_XXH3_FAST_H_
