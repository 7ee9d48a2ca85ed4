#include "common/xxh3_fast.h"

// xxhash.h's internal steps (accumulate, scramble, merge) for CopyingHash, inlined here at this
// build's baseline vector width; the functions this file calls by name are the same algorithm.
#define XXH_INLINE_ALL
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/streaming_copy.h"

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

// CopyingHash's stripes with AVX2: as detected, unless a test asks for the baseline code.
std::atomic<bool> copy_stripes_with_avx2{kUseAvx2};

void CopyBytes(uint8_t* out, const uint8_t* in, uint64_t size, bool streaming) {
  if (streaming) {
    StreamingCopy(out, in, size);
  } else {
    std::memcpy(out, in, size);
  }
}

// Copies `stripes` stripes of XXH3's long input from `in` to `out` (none when `out` is null) and
// accumulates them into `lanes`, the first being the input's stripe `first_stripe`, scrambling
// after each block's last: XXH3_hashLong_internal_loop's steps, a stripe at a time. With AVX2 each
// stripe is hashed from the registers that copy it; here xxhash.h's baseline steps follow a copy.
void CopyStripes(uint64_t* lanes, uint8_t* out, const uint8_t* in, uint64_t stripes,
                 uint64_t first_stripe, bool streaming) {
#if defined(KVCACHE_XXH3_AVX2)
  if (copy_stripes_with_avx2.load(std::memory_order_relaxed)) {
    return avx2::CopyStripes(lanes, out, in, stripes, first_stripe, streaming);
  }
#endif
  constexpr uint64_t kStripesPerBlock =
      (sizeof(XXH3_kSecret) - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE;
  constexpr uint64_t kStripesInL1 = (16 << 10) / XXH_STRIPE_LEN;  // copied, then hashed from L1
  for (uint64_t i = 0; i < stripes; ++i) {
    if (out != nullptr && i % kStripesInL1 == 0) {
      CopyBytes(out + i * XXH_STRIPE_LEN, in + i * XXH_STRIPE_LEN,
                std::min(kStripesInL1, stripes - i) * XXH_STRIPE_LEN, streaming);
    }
    const uint64_t stripe = (first_stripe + i) % kStripesPerBlock;
    XXH3_accumulate_512(lanes, in + i * XXH_STRIPE_LEN,
                        XXH3_kSecret + stripe * XXH_SECRET_CONSUME_RATE);
    if (stripe == kStripesPerBlock - 1) {
      XXH3_scrambleAcc(lanes, XXH3_kSecret + sizeof(XXH3_kSecret) - XXH_STRIPE_LEN);
    }
  }
}

}  // namespace

uint64_t Hash64(const void* data, size_t size) {
#if defined(KVCACHE_XXH3_AVX2)
  if (kUseAvx2) return avx2::Hash64(data, size);
#endif
  return XXH3_64bits_withSeed(data, size, 0);
}

CopyingHash::CopyingHash(uint64_t total)
    : total_(total),
      window_begin_(total <= kMidsizeMax ? 0 : total - kStripeBytes),
      stripes_(total <= kMidsizeMax ? 0 : (total - 1) / kStripeBytes) {
  const uint64_t initial[8] = XXH3_INIT_ACC;
  std::copy(initial, initial + 8, lanes_);
}

void CopyingHash::Copy(void* destination, const void* source, size_t size, bool streaming) {
  auto* out = static_cast<uint8_t*>(destination);
  const auto* in = static_cast<const uint8_t*>(source);
  if (fed_ + size > window_begin_) {
    const uint64_t from = std::max(fed_, window_begin_);
    std::memcpy(window_ + (from - window_begin_), in + (from - fed_), fed_ + size - from);
  }
  while (size > 0) {
    const uint64_t stripe = fed_ / kStripeBytes;
    const uint64_t into = fed_ % kStripeBytes;
    uint64_t length;
    if (stripe >= stripes_) {
      length = size;  // past the stripes hashed on the way (or a short input): only copied
      if (out != nullptr) CopyBytes(out, in, length, streaming);
    } else if (into == 0 && size >= kStripeBytes) {
      const uint64_t whole = std::min<uint64_t>(size / kStripeBytes, stripes_ - stripe);
      length = whole * kStripeBytes;
      CopyStripes(lanes_, out, in, whole, stripe, streaming);
    } else {
      // A stripe this piece only starts or ends: put together here, hashed once it is whole.
      length = std::min<uint64_t>(kStripeBytes - into, size);
      std::memcpy(straddling_ + into, in, length);
      if (out != nullptr) std::memcpy(out, in, length);
      if (into + length == kStripeBytes) {
        CopyStripes(lanes_, nullptr, straddling_, 1, stripe, false);
      }
    }
    if (out != nullptr) out += length;
    in += length;
    size -= length;
    fed_ += length;
  }
}

void CopyingHash::UseBaselineCodeForTesting(bool baseline) {
  copy_stripes_with_avx2.store(kUseAvx2 && !baseline, std::memory_order_relaxed);
}

uint64_t CopyingHash::Finish() {
  if (total_ <= kMidsizeMax) return Hash64(window_, total_);
  // XXH3_hashLong_64b_internal's last steps: the last stripe under its own key, then the merge.
  XXH3_accumulate_512(
      lanes_, window_,
      XXH3_kSecret + sizeof(XXH3_kSecret) - XXH_STRIPE_LEN - XXH_SECRET_LASTACC_START);
  return XXH3_mergeAccs(lanes_, XXH3_kSecret + XXH_SECRET_MERGEACCS_START, total_ * XXH_PRIME64_1);
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
