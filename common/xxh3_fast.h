// XXH3-64 (seed 0) with the widest vector code this CPU runs. Debian's libxxhash is built for
// baseline x86-64 (SSE2): about 12 GB/s here, a tenth of a block stream's time. An AVX2 build of
// the same algorithm runs at about 37 GB/s and gives the same values (XXH3's result never
// depends on its vectorization); it is picked at run time, so the binaries still run on any
// x86-64 CPU, and elsewhere the library serves.
#ifndef KVCACHE_COMMON_XXH3_FAST_H_
#define KVCACHE_COMMON_XXH3_FAST_H_

#include <cstddef>
#include <cstdint>
#include <optional>

namespace kvcache::xxh3 {

uint64_t Hash64(const void* data, size_t size);

// memcpy's contract, and Hash64 of the bytes copied, reading the source once: each 64-byte stripe
// is stored and hashed from the registers it was loaded into, so the hash's arithmetic runs while
// the copy waits on memory. `streaming`: the destination is written with non-temporal stores and
// fenced, as StreamingCopy does (common/streaming_copy.h). The source must not change meanwhile.
// Nullopt, having done nothing, where this CPU lacks the vector build (block_checksum.h's
// ChecksumWhileCopying then copies in cache-sized pieces).
std::optional<uint64_t> CopyAndHash64(void* destination, const void* source, size_t size,
                                      bool streaming);

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
