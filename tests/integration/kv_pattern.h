// The deterministic KV that the integration tests' fake workers "compute": every element is a
// function of the token id, its position in the prompt, the layer, K or V, the head and the
// dimension, so a block's bytes depend on everything that real KV depends on, and a block in the
// wrong place, a stale block or a torn write all show. Shared by kvcache-test-client (which
// writes and checks it) and the tests (which compute the digests they expect).
//
// An element holds the low DTypeBytes(dtype) bytes of KvPatternValue, little-endian, which is
// what a typed store of static_cast<T>(value) writes on this (little-endian) machine.
#ifndef KVCACHE_TESTS_INTEGRATION_KV_PATTERN_H_
#define KVCACHE_TESTS_INTEGRATION_KV_PATTERN_H_

#include <xxhash.h>

#include <bit>
#include <cstdint>
#include <string>

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/pool_layout.h"

namespace kvcache::testing {

static_assert(std::endian::native == std::endian::little, "the pattern's bytes are little-endian");

inline uint64_t KvPatternValue(uint32_t token, uint32_t position, uint32_t layer, uint32_t kv,
                               uint32_t head, uint32_t dim) {
  // splitmix64 over the packed coordinates.
  uint64_t x = (uint64_t{token} << 32 | position) ^
               (uint64_t{layer} << 48 | uint64_t{kv} << 40 | uint64_t{head} << 20 | dim) *
                   0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// Writes the pattern of `token` at prompt position `position` into its slot (position %
// block_size) of `block_bytes`, a host image of the block (layout.BlockBytes() bytes): K and V of
// every layer.
inline void WriteTokenPattern(const PoolLayout& layout, uint32_t token, uint32_t position,
                              char* block_bytes) {
  const uint32_t elem = DTypeBytes(layout.dtype);
  const uint32_t slot = position % layout.block_size;
  for (uint32_t layer = 0; layer < layout.num_layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      for (uint32_t head = 0; head < layout.num_kv_heads; ++head) {
        for (uint32_t dim = 0; dim < layout.head_dim; ++dim) {
          const uint64_t value = KvPatternValue(token, position, layer, kv, head, dim);
          const uint64_t offset = layout.KvOffset(layer, kv) + slot * layout.TokenBytes() +
                                  (uint64_t{head} * layout.head_dim + dim) * elem;
          for (uint32_t b = 0; b < elem; ++b)
            block_bytes[offset + b] = static_cast<char>(value >> (8 * b));
        }
      }
    }
  }
}

// The expected bytes of full block `block` of the prompt `tokens`.
inline std::string ExpectedBlockBytes(const PoolLayout& layout, absl::Span<const uint32_t> tokens,
                                      size_t block) {
  std::string bytes(layout.BlockBytes(), '\0');
  for (uint32_t slot = 0; slot < layout.block_size; ++slot) {
    const uint32_t position = static_cast<uint32_t>(block * layout.block_size + slot);
    WriteTokenPattern(layout, tokens[position], position, bytes.data());
  }
  return bytes;
}

// The expected bytes of the prompt's first `num_blocks` full blocks, concatenated.
inline std::string ExpectedPrefixBytes(const PoolLayout& layout, absl::Span<const uint32_t> tokens,
                                       size_t num_blocks) {
  std::string bytes;
  for (size_t block = 0; block < num_blocks; ++block) {
    bytes += ExpectedBlockBytes(layout, tokens, block);
  }
  return bytes;
}

// What the test client prints for a byte range: XXH3-64 in hex.
inline std::string Digest(absl::string_view bytes) {
  return absl::StrFormat("%016x", XXH3_64bits(bytes.data(), bytes.size()));
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_INTEGRATION_KV_PATTERN_H_
