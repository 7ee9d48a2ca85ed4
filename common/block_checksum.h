// The per-block checksum of the block data RPCs (XXH3-64, seed 0), and a verifier that checks it
// on a stream of whole blocks arriving in pieces of any size — both ends of PutBlocks and
// GetBlocks use it, so each block is checksummed while its bytes are still in cache.
//
// Thread-safety: thread-compatible.
#ifndef KVCACHE_COMMON_BLOCK_CHECKSUM_H_
#define KVCACHE_COMMON_BLOCK_CHECKSUM_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/xxh3_fast.h"

namespace kvcache {

inline uint64_t BlockChecksum(const void* data, uint64_t size) { return xxh3::Hash64(data, size); }

// BlockChecksum of `size` bytes at `source`, computed while `copy_piece(offset, length)` copies
// them a piece at a time: each piece is checksummed, then copied while it is still in the L1
// cache, so the source is read from memory once. Meant for copies with streaming stores (a host
// pool's writes), whose destination is not in cache afterwards for a second pass to read. Measured
// gain not settled: Pool::Open from tier 2 at 256 KiB went from 0.54-0.58x to 0.67-0.72x of memcpy
// in one sitting and stayed at 0.67-0.69x in another (tier_bench, 2026-11-26). The
// source must not change until this returns.
uint64_t ChecksumWhileCopying(const void* source, uint64_t size,
                              absl::FunctionRef<void(uint64_t offset, uint64_t length)> copy_piece);

// How a host copy writes its destination: through the cache (a buffer its caller reads next), or
// streaming (common/streaming_copy.h: a pool block another process reads).
enum class CopyStores { kCached, kStreaming };

// memcpy of `size` bytes from `source` to `destination`, returning their BlockChecksum, with the
// source read once (xxh3::CopyingHash: the hash is taken from the registers the copy goes
// through). For host-to-host copies; the one above serves copies that are not a memcpy (a CUDA
// pool's). The source must not change until this returns.
uint64_t ChecksumWhileCopying(void* destination, const void* source, uint64_t size,
                              CopyStores stores);

class BlockStreamVerifier {
 public:
  // Expects checksums.size() blocks of `block_bytes`, numbered first_block, first_block + 1, ...
  // (the numbers only name blocks in errors and in Feed's callback).
  BlockStreamVerifier(uint64_t block_bytes, std::vector<uint64_t> checksums,
                      uint32_t first_block = 0);

  uint64_t expected_bytes() const { return block_bytes_ * checksums_.size(); }
  uint64_t received_bytes() const { return received_; }

  // Where a piece of a block goes: called before the block's checksum is checked.
  using Sink =
      absl::FunctionRef<absl::Status(uint32_t block, uint64_t offset, absl::string_view piece)>;
  // How Feed cuts `data` for its sink, besides at block boundaries. kCacheSized: pieces of at
  // most half an L1 cache, each checksummed and then handed to the sink while it is in cache — for
  // a sink that copies: gRPC hands over pieces of up to a message (MiBs), and a sink that copied
  // such a piece whole (into a pool, or a caller's buffer with streaming stores) left the checksum
  // to read it all again from memory.
  enum class Pieces { kAsGiven, kCacheSized };
  // Feeds the next bytes of the stream; REQUIRES: data.size() <= expected_bytes() -
  // received_bytes(). DATA_LOSS naming the block when a completed block's checksum differs;
  // the sink's error as it is.
  absl::Status Feed(absl::string_view data, Sink sink, Pieces pieces = Pieces::kAsGiven);

  // Host memory a block's bytes are copied into by the verifier itself, each stripe checksummed
  // from the registers that copy it (xxh3::CopyingHash: one pass over the bytes, where a sink's
  // copy after the checksum was a second). Null: the block's pieces go to the sink instead.
  struct CopyTarget {
    char* bytes = nullptr;  // block_bytes
    CopyStores stores = CopyStores::kCached;
  };
  using Targets = absl::FunctionRef<CopyTarget(uint32_t block)>;
  // Feed, with each block copied to targets(block) (asked once, when the block's first byte
  // arrives) where that is not null, else handed to `sink` in cache-sized pieces.
  absl::Status FeedInto(absl::string_view data, Targets targets, Sink sink);

 private:
  absl::Status FeedPieces(absl::string_view data, const Targets* targets, Sink sink, Pieces pieces);

  const uint64_t block_bytes_;
  const std::vector<uint64_t> checksums_;
  const uint32_t first_block_;
  uint64_t received_ = 0;
  xxh3::CopyingHash hash_;  // of the block being received
  CopyTarget target_;       // of the block being received
};

}  // namespace kvcache

#endif  // KVCACHE_COMMON_BLOCK_CHECKSUM_H_
