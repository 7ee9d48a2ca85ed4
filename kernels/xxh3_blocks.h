// XXH3-64's long-input path (inputs over 240 bytes, seed 0, the default secret) taken apart by
// 1 KiB block, for kernels/page_checksum.cu and its CPU reference (page_checksum.cc), which share
// these functions so that a build without a GPU tests the kernel's arithmetic against libxxhash.
//
// XXH3 keeps eight 64-bit lane accumulators. Each 64-byte stripe adds to them (lane i gets its
// word, and its word keyed and multiplied lands in lane i ^ 1); after every 16 stripes (a 1 KiB
// block) each lane is scrambled on its own. Additions commute, so a block's contribution is a
// sum of its stripes' that any number of threads can compute apart; only the per-lane chain
//   acc = Scramble(acc + block_sums)
// runs in order. The last partial block's stripes are summed the same way without a scramble,
// the input's last 64 bytes with keys of their own, then the lanes are merged (XXH3_mergeAccs,
// XXH3_avalanche). Names follow xxhash.h.
#ifndef KVCACHE_KERNELS_XXH3_BLOCKS_H_
#define KVCACHE_KERNELS_XXH3_BLOCKS_H_

#include <cstdint>

// Inline on the host and, compiled by nvcc, on the device too (a name of its own: the macro
// common/float_convert.h defines is not inline).
#ifdef __CUDACC__
#define KVCACHE_XXH3_INLINE __host__ __device__ __forceinline__
#else
#define KVCACHE_XXH3_INLINE inline
#endif

namespace kvcache::kernels::xxh3_blocks {

inline constexpr int kLanes = 8;
inline constexpr uint64_t kStripeBytes = 64;
inline constexpr uint64_t kStripesPerBlock = 16;  // (192-byte secret - 64) / 8
inline constexpr uint64_t kBlockBytes = kStripeBytes * kStripesPerBlock;
// The shortest input on the long path that these functions cover (XXH3_MIDSIZE_MAX is 240).
inline constexpr uint64_t kMinInputBytes = 256;

inline constexpr uint64_t kPrime32_1 = 0x9E3779B1u;
inline constexpr uint64_t kPrime64_1 = 0x9E3779B185EBCA87ull;

// The secret's words as the steps read them (little-endian loads, some at odd offsets).
struct Keys {
  // Word k at secret + 8k: stripe s of a block keys lane i with word s + i; the scramble keys
  // lane i with word 16 + i.
  uint64_t words[24];
  uint64_t last_stripe[kLanes];  // at secret + 121 + 8i (XXH_SECRET_LASTACC_START)
  uint64_t merge[kLanes];        // at secret + 11 + 8i (XXH_SECRET_MERGEACCS_START)
};

// The default secret's keys (page_checksum.cc, from xxhash.h's XXH3_kSecret).
Keys DefaultKeys();

// XXH3_INIT_ACC, lane `lane`.
KVCACHE_XXH3_INLINE uint64_t InitialLane(int lane) {
  constexpr uint64_t kInit[kLanes] = {
      0xC2B2AE3Dull,         0x9E3779B185EBCA87ull, 0xC2B2AE3D27D4EB4Full, 0x165667B19E3779F9ull,
      0x85EBCA77C2B2AE63ull, 0x85EBCA77ull,         0x27D4EB2F165667C5ull, 0x9E3779B1ull};
  return kInit[lane];
}

// Four lanes' share of one stripe (XXH3_scalarRound for lanes 4h..4h+3, whose i ^ 1 partners
// are among them): `words` are the stripe's words of those lanes, `keys` their keys, and the
// results are added to `sums` (those lanes).
KVCACHE_XXH3_INLINE void AddStripeHalf(const uint64_t (&words)[4], const uint64_t (&keys)[4],
                                       uint64_t (&sums)[4]) {
#ifdef __CUDACC__
#pragma unroll
#endif
  for (int j = 0; j < 4; ++j) {
    const uint64_t keyed = words[j] ^ keys[j];
    sums[j ^ 1] += words[j];
    sums[j] += (keyed & 0xFFFFFFFFull) * (keyed >> 32);
  }
}

// XXH3_scalarScrambleRound for one lane.
KVCACHE_XXH3_INLINE uint64_t Scramble(uint64_t lane, uint64_t key) {
  lane ^= lane >> 47;
  lane ^= key;
  return lane * kPrime32_1;
}

// XXH3_mul128_fold64.
KVCACHE_XXH3_INLINE uint64_t Mul128Fold64(uint64_t a, uint64_t b) {
#ifdef __CUDA_ARCH__
  return (a * b) ^ __umul64hi(a, b);
#else
  const unsigned __int128 product = static_cast<unsigned __int128>(a) * b;
  return static_cast<uint64_t>(product) ^ static_cast<uint64_t>(product >> 64);
#endif
}

// XXH3_mergeAccs then XXH3_avalanche: the hash of `input_bytes` bytes from the final lanes.
KVCACHE_XXH3_INLINE uint64_t Merge(const uint64_t (&lanes)[kLanes], uint64_t input_bytes,
                                   const Keys& keys) {
  uint64_t result = input_bytes * kPrime64_1;
#ifdef __CUDACC__
#pragma unroll
#endif
  for (int i = 0; i < kLanes; i += 2) {
    result += Mul128Fold64(lanes[i] ^ keys.merge[i], lanes[i + 1] ^ keys.merge[i + 1]);
  }
  result ^= result >> 37;
  result *= 0x165667919E3779F9ull;
  return result ^ (result >> 32);
}

// Whole blocks scrambled along the chain; the rest (1 to 16 stripes, the last keyed apart)
// summed at the end. REQUIRES: input_bytes >= kMinInputBytes and a multiple of kStripeBytes.
KVCACHE_XXH3_INLINE uint64_t ChainedBlocks(uint64_t input_bytes) {
  return (input_bytes - 1) / kBlockBytes;
}
KVCACHE_XXH3_INLINE uint64_t TailStripes(uint64_t input_bytes) {
  return (input_bytes - ChainedBlocks(input_bytes) * kBlockBytes) / kStripeBytes;
}

// The key of lane 4 * half + j for stripe `stripe` of a chained block.
KVCACHE_XXH3_INLINE uint64_t BlockKey(const Keys& keys, uint64_t stripe, int half, int j) {
  return keys.words[stripe + 4 * half + j];
}
// The same for stripe `stripe` of the tail of `tail_stripes`: the last keyed apart.
KVCACHE_XXH3_INLINE uint64_t TailKey(const Keys& keys, uint64_t stripe, uint64_t tail_stripes,
                                     int half, int j) {
  return stripe + 1 == tail_stripes ? keys.last_stripe[4 * half + j]
                                    : BlockKey(keys, stripe, half, j);
}

}  // namespace kvcache::kernels::xxh3_blocks

#endif  // KVCACHE_KERNELS_XXH3_BLOCKS_H_
