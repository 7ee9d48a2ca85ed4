// Internal to common/xxh3_fast.cc: the AVX2 build of XXH3 (common/xxh3_avx2.cc). Plain C types
// only, so that this header pulls no shared inline code into the AVX2 translation unit.
#ifndef KVCACHE_COMMON_XXH3_AVX2_H_
#define KVCACHE_COMMON_XXH3_AVX2_H_

#include <stddef.h>
#include <stdint.h>

namespace kvcache::xxh3::avx2 {

uint64_t Hash64(const void* data, size_t size);
void* NewState();
void FreeState(void* state);
void Update(void* state, const void* data, size_t size);
uint64_t DigestAndReset(void* state);
// xxh3_fast.cc's CopyStripes, each stripe stored and accumulated from the same registers.
void CopyStripes(uint64_t* lanes, void* out, const void* in, size_t stripes, uint64_t first_stripe,
                 bool streaming);

}  // namespace kvcache::xxh3::avx2

#endif  // KVCACHE_COMMON_XXH3_AVX2_H_
