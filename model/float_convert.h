// Exact conversions between float32 and the narrow float formats a KV pool or a checkpoint may
// hold: bfloat16, IEEE binary16 (fp16) and fp8 E4M3 ("e4m3fn": no infinities, max 448, NaN =
// S.1111.111). Widening (narrow → fp32) is exact. Narrowing rounds to nearest, ties to even; NaN
// stays NaN. fp32 → fp16 overflows to ±inf; fp32 → fp8 saturates to ±448 (the OCP "satfinite"
// convention used by vLLM and TensorRT-LLM for KV caches), and maps ±inf to ±448 as well.
// Thread-safety: pure functions.
#ifndef KVCACHE_MODEL_FLOAT_CONVERT_H_
#define KVCACHE_MODEL_FLOAT_CONVERT_H_

#include <cstdint>
#include <cstring>

namespace kvcache::worker {

inline uint32_t FloatBits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

inline float BitsToFloat(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

inline float BFloat16ToFloat(uint16_t bits) { return BitsToFloat(uint32_t{bits} << 16); }

inline uint16_t FloatToBFloat16(float value) {
  const uint32_t bits = FloatBits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN, sign kept
  }
  const uint32_t rounding_bias = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding_bias) >> 16);
}

float Float16ToFloat(uint16_t bits);
uint16_t FloatToFloat16(float value);

float Fp8E4M3ToFloat(uint8_t bits);
uint8_t FloatToFp8E4M3(float value);

}  // namespace kvcache::worker

#endif  // KVCACHE_MODEL_FLOAT_CONVERT_H_
