// Device helpers shared by the worker kernels' .cu files (worker_kernels_dense.cu,
// worker_kernels_attention.cu, worker_kernels_moe.cu): warp constants and reductions, the grid
// size for grid-stride loops, and the pool row codec. Included from .cu files only.
//
// Precision notes. nvcc contracts a * b + c into an FMA by default; where the CPU result is meant
// to be reproduced (RMSNorm's scaling, RoPE's rotation, LinearCuda's lanes, the MoE combine) the
// kernels use __fmul_rn / __fadd_rn / __fsub_rn, which are never contracted. The pool dtype
// conversions are the CPU's own (common/float_convert.h, integer bit manipulation), so the KV
// write is byte-exact. The expert matvecs and the attention sums run in a different order from
// the CPU (warp trees, online softmax) and are not bit-exact with it.
#ifndef KVCACHE_KERNELS_WORKER_KERNELS_DEVICE_H_
#define KVCACHE_KERNELS_WORKER_KERNELS_DEVICE_H_

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "common/float_convert.h"
#include "common/pool_layout.h"

namespace kvcache::kernels::internal {

constexpr uint32_t kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;
// gridDim.x limit; larger work counts are covered by the kernels' grid-stride loops.
constexpr uint64_t kMaxGridX = 0x7fffffffu;

inline dim3 GridFor(uint64_t count) {
  return dim3(static_cast<unsigned>(std::min(count, kMaxGridX)));
}

// --- Warp reductions. The xor butterfly leaves the same value in every lane (a + b == b + a). ---

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

__device__ __forceinline__ double WarpSum(double v) {
#pragma unroll
  for (int offset = kWarp / 2; offset > 0; offset /= 2) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

// Element `i` of a pool row of `kDtype` elements. `row` is aligned to the element size (the
// launchers check the pool base; every offset inside a pool is a multiple of the element size).
template <DType kDtype>
struct PoolCodec;

template <>
struct PoolCodec<DType::kFloat32> {
  __device__ static float Load(const uint8_t* row, uint32_t i) {
    return reinterpret_cast<const float*>(row)[i];
  }
  __device__ static void Store(uint8_t* row, uint32_t i, float v) {
    reinterpret_cast<float*>(row)[i] = v;
  }
};

template <>
struct PoolCodec<DType::kBFloat16> {
  __device__ static float Load(const uint8_t* row, uint32_t i) {
    return BFloat16ToFloat(reinterpret_cast<const uint16_t*>(row)[i]);
  }
  __device__ static void Store(uint8_t* row, uint32_t i, float v) {
    reinterpret_cast<uint16_t*>(row)[i] = FloatToBFloat16(v);
  }
};

template <>
struct PoolCodec<DType::kFloat16> {
  __device__ static float Load(const uint8_t* row, uint32_t i) {
    return Float16ToFloat(reinterpret_cast<const uint16_t*>(row)[i]);
  }
  __device__ static void Store(uint8_t* row, uint32_t i, float v) {
    reinterpret_cast<uint16_t*>(row)[i] = FloatToFloat16(v);
  }
};

template <>
struct PoolCodec<DType::kFp8E4M3> {
  __device__ static float Load(const uint8_t* row, uint32_t i) { return Fp8E4M3ToFloat(row[i]); }
  __device__ static void Store(uint8_t* row, uint32_t i, float v) { row[i] = FloatToFp8E4M3(v); }
};

}  // namespace kvcache::kernels::internal

#endif  // KVCACHE_KERNELS_WORKER_KERNELS_DEVICE_H_
