// PoolOptions for the core's unit tests: a one-layer, one-head, 4-dim fp32 layout (32 bytes per
// token: a 4-token block is 128 bytes), so pools of a few blocks cost nothing; and their prompts.
#ifndef KVCACHE_TESTS_TESTING_SMALL_POOL_OPTIONS_H_
#define KVCACHE_TESTS_TESTING_SMALL_POOL_OPTIONS_H_

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "cache/pool.h"

namespace kvcache::testing {

inline PoolOptions SmallPoolOptions(std::string name, uint32_t num_blocks, uint32_t block_size) {
  PoolOptions options;
  options.name = std::move(name);
  options.model_id = "model";
  options.layout = PoolLayout{.num_layers = 1,
                              .num_kv_heads = 1,
                              .head_dim = 4,
                              .block_size = block_size,
                              .dtype = DType::kFloat32};
  options.num_blocks = num_blocks;
  return options;
}

// Tokens first, first+1, ... (n of them).
inline std::vector<uint32_t> Tokens(uint32_t first, size_t n) {
  std::vector<uint32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

// The bytes a worker would write for block `i` of `tokens` (`block_bytes` of them, blocks of
// `block_size` tokens): a function of the block's tokens, so a block loaded under another's
// name holds other bytes.
inline std::string TokenBlockBytes(const std::vector<uint32_t>& tokens, size_t i,
                                   uint32_t block_size, uint64_t block_bytes) {
  std::string bytes(block_bytes, '\0');
  for (size_t b = 0; b < bytes.size(); ++b) {
    bytes[b] = static_cast<char>(tokens[i * block_size + b % block_size] * 7 + b);
  }
  return bytes;
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_SMALL_POOL_OPTIONS_H_
