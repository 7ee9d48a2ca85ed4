// The sizes of GetBlocks' data messages (chunks), shared by the daemon that sends them and the
// clients that ask for them: a client that knows the daemon's choice can tell when its own
// receive limit needs a smaller chunk. proto/kvcache/v1/kvcache.proto documents the default.
#ifndef KVCACHE_COMMON_RPC_CHUNK_BYTES_H_
#define KVCACHE_COMMON_RPC_CHUNK_BYTES_H_

#include <cstdint>

namespace kvcache {

// What the daemon sends when GetBlocksRequest.max_chunk_bytes is 0.
inline constexpr uint32_t kDefaultChunkBytes = 1 << 20;
// The smallest chunk the daemon sends, whatever was asked: a floor, so that a tiny
// max_chunk_bytes cannot turn a stream into one message per few bytes.
inline constexpr uint32_t kMinChunkBytes = 4096;

}  // namespace kvcache

#endif  // KVCACHE_COMMON_RPC_CHUNK_BYTES_H_
