#include "model/float_convert.h"

#include <cmath>
#include <limits>

namespace kvcache::worker {
namespace {

// Shifts `mantissa` right by `shift` (1..31) rounding to nearest, ties to even.
uint32_t ShiftRightRoundEven(uint32_t mantissa, int shift) {
  const uint32_t kept = mantissa >> shift;
  const uint32_t rest = mantissa & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  return (rest > half || (rest == half && (kept & 1u))) ? kept + 1 : kept;
}

}  // namespace

float Float16ToFloat(uint16_t bits) {
  const uint32_t sign = uint32_t{bits & 0x8000u} << 16;
  const uint32_t exponent = (bits >> 10) & 0x1fu;
  const uint32_t mantissa = bits & 0x3ffu;
  if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in fp32
    const float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 0x1f) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  return BitsToFloat(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

uint16_t FloatToFloat16(float value) {
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
  const uint32_t full = mantissa | 0x800000u;
  return sign | static_cast<uint16_t>(ShiftRightRoundEven(full, -exponent - 1));
}

float Fp8E4M3ToFloat(uint8_t bits) {
  const bool negative = (bits & 0x80u) != 0;
  const int exponent = (bits >> 3) & 0xf;
  const int mantissa = bits & 0x7;
  float magnitude;
  if (exponent == 0xf && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);
  }
  return negative ? -magnitude : magnitude;
}

uint8_t FloatToFp8E4M3(float value) {
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

}  // namespace kvcache::worker
