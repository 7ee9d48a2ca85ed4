// The AVX2 build of XXH3 for common/xxh3_fast.cc, compiled with -mavx2 and called only when the
// CPU has AVX2. This file includes nothing but xxhash.h, whose inline functions are static here:
// no AVX2 code can leak into functions other files share.
#define XXH_INLINE_ALL
#include "common/xxh3_avx2.h"

#include <xxhash.h>

namespace kvcache::xxh3::avx2 {

uint64_t Hash64(const void* data, size_t size) { return XXH3_64bits_withSeed(data, size, 0); }

void* NewState() {
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset_withSeed(state, 0);
  return state;
}

void FreeState(void* state) { XXH3_freeState(static_cast<XXH3_state_t*>(state)); }

void Update(void* state, const void* data, size_t size) {
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state), data, size);
}

uint64_t DigestAndReset(void* state) {
  auto* xxh_state = static_cast<XXH3_state_t*>(state);
  const uint64_t digest = XXH3_64bits_digest(xxh_state);
  XXH3_64bits_reset_withSeed(xxh_state, 0);
  return digest;
}

}  // namespace kvcache::xxh3::avx2
