#include "common/streaming_copy.h"

#include <cstdint>
#include <cstring>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif

namespace kvcache {

#if defined(__x86_64__)

void StreamingCopy(void* destination, const void* source, size_t size) {
  constexpr size_t kLine = 64;
  auto* to = static_cast<char*>(destination);
  const auto* from = static_cast<const char*>(source);
  // Short copies gain nothing, and non-temporal stores need a 16-byte aligned destination.
  if (size < 4 * kLine) {
    std::memcpy(to, from, size);
    return;
  }
  const size_t head = (kLine - reinterpret_cast<uintptr_t>(to) % kLine) % kLine;
  std::memcpy(to, from, head);
  to += head;
  from += head;
  size -= head;
  // Whole lines, so each line's write-combining buffer fills and goes out in one write.
  const size_t lines = size / kLine;
  for (size_t line = 0; line < lines; ++line) {
    const auto* in = reinterpret_cast<const __m128i*>(from + line * kLine);
    auto* out = reinterpret_cast<__m128i*>(to + line * kLine);
    const __m128i a = _mm_loadu_si128(in);
    const __m128i b = _mm_loadu_si128(in + 1);
    const __m128i c = _mm_loadu_si128(in + 2);
    const __m128i d = _mm_loadu_si128(in + 3);
    _mm_stream_si128(out, a);
    _mm_stream_si128(out + 1, b);
    _mm_stream_si128(out + 2, c);
    _mm_stream_si128(out + 3, d);
  }
  // Non-temporal stores are weakly ordered: without the fence a later flag or unlock could
  // become visible to another thread before the bytes.
  _mm_sfence();
  std::memcpy(to + lines * kLine, from + lines * kLine, size - lines * kLine);
}

#else

void StreamingCopy(void* destination, const void* source, size_t size) {
  std::memcpy(destination, source, size);
}

#endif

}  // namespace kvcache
