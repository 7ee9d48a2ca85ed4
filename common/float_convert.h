// Exact conversions between float32 and the narrow float formats a KV pool or a checkpoint may
// hold: bfloat16, IEEE binary16 (fp16) and fp8 E4M3 ("e4m3fn": no infinities, max 448, NaN =
// S.1111.111). Widening (narrow → fp32) is exact. Narrowing rounds to nearest, ties to even; NaN
// stays NaN. fp32 → fp16 overflows to ±inf; fp32 → fp8 saturates to ±448 (the OCP "satfinite"
// convention used by vLLM and TensorRT-LLM for KV caches), and maps ±inf to ±448 as well.
//
// One implementation for the host (model/: checkpoints, the CPU reference pool) and the device
// (kernels/: the KV write and paged attention), so the two agree to the bit: every function is
// integer bit manipulation, or a multiplication by a power of two that is exact. Compiled by nvcc
// the functions are __host__ __device__; by a C++ compiler, plain inline functions.
// Thread-safety: pure functions.
#ifndef KVCACHE_COMMON_FLOAT_CONVERT_H_
#define KVCACHE_COMMON_FLOAT_CONVERT_H_

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVCACHE_HOST_DEVICE __host__ __device__
#else
#define KVCACHE_HOST_DEVICE
#endif

namespace kvcache {

KVCACHE_HOST_DEVICE inline uint32_t FloatBits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
#endif
}

KVCACHE_HOST_DEVICE inline float BitsToFloat(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
#endif
}

namespace float_convert_internal {

// Shifts `mantissa` right by `shift` (1..31) rounding to nearest, ties to even.
KVCACHE_HOST_DEVICE inline uint32_t ShiftRightRoundEven(uint32_t mantissa, int shift) {
  const uint32_t kept = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return (rest > half || (rest == half && (kept & 1u))) ? kept + 1 : kept;
}

}  // namespace float_convert_internal

KVCACHE_HOST_DEVICE inline float BFloat16ToFloat(uint16_t bits) {
  return BitsToFloat(uint32_t{bits} << 16);
}

KVCACHE_HOST_DEVICE inline uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

KVCACHE_HOST_DEVICE inline float Float16ToFloat(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-08f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

KVCACHE_HOST_DEVICE inline uint16_t FloatToFloat16(float value) {
  using float_convert_internal::ShiftRightRoundEven;
  const uint32_t bits = FloatBits(value);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;  // NaN
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  const uint32_t mantissa = magnitude & 0x7fffffu;
  if (exponent > 15) return sign | 0x7c00u;  // overflow or inf
  if (exponent >= -14) {
    // A carry out of the mantissa correctly bumps the exponent (65520 and up become inf).
    const uint32_t half = (static_cast<uint32_t>(exponent + 15) << 10) | (mantissa >> 13);
    return sign |
           static_cast<uint16_t>(ShiftRightRoundEven((half << 13) | (mantissa & 0x1fffu), 13));
  }
  if (exponent < -25) return sign;  // below half the smallest subnormal
  // Subnormal: the value in units of 2^-24.
  return sign | static_cast<uint16_t>(ShiftRightRoundEven(mantissa | 0x800000u, -exponent - 1));
}

KVCACHE_HOST_DEVICE inline float Fp8E4M3ToFloat(uint8_t bits) {
  const bool negative = (bits & 0x80u) != 0;
  const uint32_t exponent = (bits >> 3) & 0xfu;
  const uint32_t mantissa = bits & 0x7u;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = BitsToFloat(0x7fc00000u);  // quiet NaN
  } else if (exponent == 0) {
    magnitude = static_cast<float>(mantissa) * 0.001953125f;  // mantissa * 2^-9, exact
  } else {
    // (8 + mantissa) * 2^(exponent - 10) = (1 + mantissa / 8) * 2^(exponent - 7), exact.
    magnitude = BitsToFloat(((exponent + 120) << 23) | (mantissa << 20));
  }
  return negative ? -magnitude : magnitude;
}

KVCACHE_HOST_DEVICE inline uint8_t FloatToFp8E4M3(float value) {
  using float_convert_internal::ShiftRightRoundEven;
  const uint32_t bits = FloatBits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7fu;   // NaN
  if (magnitude >= 0x43e00000u) return sign | 0x7eu;  // >= 448 (and inf): saturate
  const int exponent = static_cast<int>(magnitude >> 23) - 127;
  const uint32_t mantissa = magnitude & 0x7fffffu;
  if (exponent >= -6) {
    const uint32_t code = (static_cast<uint32_t>(exponent + 7) << 3) | (mantissa >> 20);
    return sign |
           static_cast<uint8_t>(ShiftRightRoundEven((code << 20) | (mantissa & 0xfffffu), 20));
  }
  if (exponent < -10) return sign;  // below half the smallest subnormal (2^-9)
  // Subnormal: the value in units of 2^-9.
  return sign | static_cast<uint8_t>(ShiftRightRoundEven(mantissa | 0x800000u, 14 - exponent));
}

}  // namespace kvcache

#endif  // KVCACHE_COMMON_FLOAT_CONVERT_H_
