// The AVX2 build of XXH3 for common/xxh3_fast.cc, compiled with -mavx2 and called only when the
// CPU has AVX2, and the copy that hashes what it copies (CopyStripes), built from xxhash.h's own
// AVX2 steps. This file includes nothing but xxhash.h, whose inline functions are static here, and
// the intrinsics' header: no AVX2 code can leak into functions other files share.
#define XXH_INLINE_ALL
#include "common/xxh3_avx2.h"

#include <immintrin.h>
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

namespace {

// One 32-byte half of XXH3_accumulate_512_avx2, on a vector already loaded.
inline void Accumulate(__m256i* acc, __m256i data, const uint8_t* secret) {
  const __m256i key = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(secret));
  const __m256i data_key = _mm256_xor_si256(data, key);
  const __m256i data_key_lo = _mm256_shuffle_epi32(data_key, _MM_SHUFFLE(0, 3, 0, 1));
  const __m256i product = _mm256_mul_epu32(data_key, data_key_lo);
  const __m256i data_swap = _mm256_shuffle_epi32(data, _MM_SHUFFLE(1, 0, 3, 2));
  *acc = _mm256_add_epi64(product, _mm256_add_epi64(*acc, data_swap));
}

enum class Stores { kNone, kCached, kStreaming };

template <Stores kStores>
void CopyStripesWith(uint64_t* lanes, uint8_t* out, const uint8_t* in, size_t stripes,
                     uint64_t first_stripe) {
  constexpr size_t kSecretSize = sizeof(XXH3_kSecret);
  constexpr uint64_t kStripesPerBlock = (kSecretSize - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE;
  const uint8_t* const secret = XXH3_kSecret;
  __m256i acc[2] = {_mm256_load_si256(reinterpret_cast<const __m256i*>(lanes)),
                    _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + 4))};
  for (size_t i = 0; i < stripes; ++i) {
    const uint8_t* from = in + i * XXH_STRIPE_LEN;
    const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from));
    const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + 32));
    if constexpr (kStores != Stores::kNone) {
      auto* to = reinterpret_cast<__m256i*>(out + i * XXH_STRIPE_LEN);
      if constexpr (kStores == Stores::kStreaming) {
        _mm256_stream_si256(to, low);
        _mm256_stream_si256(to + 1, high);
      } else {
        _mm256_storeu_si256(to, low);
        _mm256_storeu_si256(to + 1, high);
      }
    }
    const uint64_t stripe = (first_stripe + i) % kStripesPerBlock;
    const uint8_t* const key = secret + stripe * XXH_SECRET_CONSUME_RATE;
    Accumulate(&acc[0], low, key);
    Accumulate(&acc[1], high, key + 32);
    if (stripe == kStripesPerBlock - 1) {
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
      _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 4), acc[1]);
      XXH3_scrambleAcc_avx2(lanes, secret + kSecretSize - XXH_STRIPE_LEN);
      acc[0] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
      acc[1] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + 4));
    }
  }
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 4), acc[1]);
  // Non-temporal stores are weakly ordered: fenced, like StreamingCopy's, before anyone is told.
  if constexpr (kStores == Stores::kStreaming) _mm_sfence();
}

}  // namespace

void CopyStripes(uint64_t* lanes, void* out, const void* in, size_t stripes, uint64_t first_stripe,
                 bool streaming) {
  auto* to = static_cast<uint8_t*>(out);
  const auto* from = static_cast<const uint8_t*>(in);
  if (to == nullptr) {
    CopyStripesWith<Stores::kNone>(lanes, to, from, stripes, first_stripe);
  } else if (streaming && reinterpret_cast<uintptr_t>(to) % 32 == 0) {
    CopyStripesWith<Stores::kStreaming>(lanes, to, from, stripes, first_stripe);
  } else {
    CopyStripesWith<Stores::kCached>(lanes, to, from, stripes, first_stripe);
  }
}

}  // namespace kvcache::xxh3::avx2
