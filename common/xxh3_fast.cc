#include "common/xxh3_fast.h"

#include <xxhash.h>

#if defined(KVCACHE_XXH3_AVX2)
#include "common/xxh3_avx2.h"
#endif

namespace kvcache::xxh3 {
namespace {

#if defined(KVCACHE_XXH3_AVX2)
const bool kUseAvx2 = __builtin_cpu_supports("avx2");
#else
constexpr bool kUseAvx2 = false;
#endif

}  // namespace

uint64_t Hash64(const void* data, size_t size) {
#if defined(KVCACHE_XXH3_AVX2)
  if (kUseAvx2) return avx2::Hash64(data, size);
#endif
  return XXH3_64bits_withSeed(data, size, 0);
}

std::optional<uint64_t> CopyAndHash64(void* destination, const void* source, size_t size,
                                      bool streaming) {
#if defined(KVCACHE_XXH3_AVX2)
  if (kUseAvx2) return avx2::CopyAndHash64(destination, source, size, streaming);
#endif
  return std::nullopt;
}

Stream::Stream() {
#if defined(KVCACHE_XXH3_AVX2)
  if (kUseAvx2) {
    state_ = avx2::NewState();
    return;
  }
#endif
  XXH3_state_t* state = XXH3_createState();
  XXH3_64bits_reset_withSeed(state, 0);
  state_ = state;
}

Stream::~Stream() {
#if defined(KVCACHE_XXH3_AVX2)
  if (kUseAvx2) {
    avx2::FreeState(state_);
    return;
  }
#endif
  XXH3_freeState(static_cast<XXH3_state_t*>(state_));
}

void Stream::Update(const void* data, size_t size) {
#if defined(KVCACHE_XXH3_AVX2)
  if (kUseAvx2) return avx2::Update(state_, data, size);
#endif
  XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}

uint64_t Stream::DigestAndReset() {
#if defined(KVCACHE_XXH3_AVX2)
  if (kUseAvx2) return avx2::DigestAndReset(state_);
#endif
  auto* state = static_cast<XXH3_state_t*>(state_);
  const uint64_t digest = XXH3_64bits_digest(state);
  XXH3_64bits_reset_withSeed(state, 0);
  return digest;
}

}  // namespace kvcache::xxh3
