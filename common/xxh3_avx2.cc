// The AVX2 build of XXH3 for common/xxh3_fast.cc, compiled with -mavx2 and called only when the
// CPU has AVX2, and the copy that hashes what it copies (CopyAndHash64), built from xxhash.h's own
// AVX2 steps. This file includes nothing but xxhash.h, whose inline functions are static here, and
// the intrinsics' and memcpy's headers: no AVX2 code can leak into functions other files share.
#define XXH_INLINE_ALL
#include "common/xxh3_avx2.h"

#include <immintrin.h>
#include <xxhash.h>

#include <cstring>

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

// Copies one 64-byte stripe and accumulates it from the registers it went through.
template <bool kStreaming>
inline void CopyStripe(__m256i acc[2], uint8_t* out, const uint8_t* in, const uint8_t* secret) {
  const __m256i low = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in));
  const __m256i high = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(in + 32));
  if constexpr (kStreaming) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out), low);
    _mm256_stream_si256(reinterpret_cast<__m256i*>(out + 32), high);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), low);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + 32), high);
  }
  Accumulate(&acc[0], low, secret);
  Accumulate(&acc[1], high, secret + 32);
}

// XXH3_hashLong_64b_internal (seed 0, the default secret), step for step, with each stripe
// copied as it is read. REQUIRES: size > XXH3_MIDSIZE_MAX; kStreaming: `out` 32-byte aligned.
template <bool kStreaming>
uint64_t CopyAndHashLong(uint8_t* out, const uint8_t* in, size_t size) {
  constexpr size_t kSecretSize = sizeof(XXH3_kSecret);
  constexpr size_t kStripesPerBlock = (kSecretSize - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE;
  constexpr size_t kBlockBytes = XXH_STRIPE_LEN * kStripesPerBlock;
  const uint8_t* const secret = XXH3_kSecret;
  alignas(32) uint64_t lanes[XXH_ACC_NB] = XXH3_INIT_ACC;
  __m256i acc[2] = {_mm256_load_si256(reinterpret_cast<const __m256i*>(lanes)),
                    _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + 4))};
  const auto spill = [&] {
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), acc[0]);
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes + 4), acc[1]);
  };
  const size_t blocks = (size - 1) / kBlockBytes;
  size_t offset = 0;
  for (size_t block = 0; block < blocks; ++block) {
    for (size_t stripe = 0; stripe < kStripesPerBlock; ++stripe, offset += XXH_STRIPE_LEN) {
      CopyStripe<kStreaming>(acc, out + offset, in + offset,
                             secret + stripe * XXH_SECRET_CONSUME_RATE);
    }
    spill();
    XXH3_scrambleAcc_avx2(lanes, secret + kSecretSize - XXH_STRIPE_LEN);
    acc[0] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes));
    acc[1] = _mm256_load_si256(reinterpret_cast<const __m256i*>(lanes + 4));
  }
  const size_t stripes = ((size - 1) - kBlockBytes * blocks) / XXH_STRIPE_LEN;
  for (size_t stripe = 0; stripe < stripes; ++stripe, offset += XXH_STRIPE_LEN) {
    CopyStripe<kStreaming>(acc, out + offset, in + offset,
                           secret + stripe * XXH_SECRET_CONSUME_RATE);
  }
  // Non-temporal stores are weakly ordered: fenced, like StreamingCopy's, before anyone is told.
  if constexpr (kStreaming) _mm_sfence();
  std::memcpy(out + offset, in + offset, size - offset);  // 1 to 64 bytes
  spill();
  // The last stripe overlaps the ones before; it is read from the source, in cache by now.
  XXH3_accumulate_512_avx2(lanes, in + size - XXH_STRIPE_LEN,
                           secret + kSecretSize - XXH_STRIPE_LEN - XXH_SECRET_LASTACC_START);
  return XXH3_mergeAccs(lanes, secret + XXH_SECRET_MERGEACCS_START,
                        static_cast<uint64_t>(size) * XXH_PRIME64_1);
}

}  // namespace

uint64_t CopyAndHash64(void* destination, const void* source, size_t size, bool streaming) {
  auto* out = static_cast<uint8_t*>(destination);
  const auto* in = static_cast<const uint8_t*>(source);
  if (size <= XXH3_MIDSIZE_MAX) {
    std::memcpy(out, in, size);
    return XXH3_64bits_withSeed(in, size, 0);
  }
  if (streaming && reinterpret_cast<uintptr_t>(out) % 32 == 0) {
    return CopyAndHashLong<true>(out, in, size);
  }
  return CopyAndHashLong<false>(out, in, size);
}

}  // namespace kvcache::xxh3::avx2
