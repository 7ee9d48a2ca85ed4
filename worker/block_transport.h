// BlockTransport: moves a prompt's finished KV from the prefill side's pool into the decode side's
// daemon, where it is committed, so the decode worker gets it as a prefix hit. The flow code
// (kvcache-worker --role=prefill, kvcache-pd) only sees this interface.
//
// Contract of every transport:
//   - only the full blocks the receiver does not already hold are sent (it is asked first);
//   - the sender's blocks stay pinned by its own open sequence for the whole shipment (the caller
//     holds it); the receiver's blocks are pinned by a sequence (or a put stream) until all bytes
//     arrived, and only then are their hashes registered;
//   - an abort, a failure or a killed process leaves no hash pointing at partial data on the
//     receiver, and leaks nothing once the dead side's lease or stream ends.
// The partial last block is not shipped: only full blocks are published by hash, so the decode
// side computes the prompt's tail (fewer than block_size tokens, or one block when the prompt
// ends on a boundary) itself.
//
// Implementations:
//   StreamTransport  the receiving daemon's PutBlocks stream (between nodes; any pool kind)
//   ShmTransport     same node: maps the receiving pool, writes the blocks in place into a
//                    sequence opened there, commits and releases it
//   (NCCL: worker/nccl_channel.h moves device blocks between GPU workers.)
// Thread-safety: thread-compatible.
#ifndef KVCACHE_WORKER_BLOCK_TRANSPORT_H_
#define KVCACHE_WORKER_BLOCK_TRANSPORT_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"

namespace kvcache::worker {

struct Shipment {
  absl::Span<const uint32_t> tokens;          // the prompt
  absl::string_view cache_salt;
  const MappedPool* source = nullptr;         // the sender's pool, mapped
  absl::Span<const uint32_t> source_blocks;   // the sender's block table for `tokens`
};

struct ShipmentStats {
  uint32_t blocks_sent = 0;
  uint32_t blocks_already_there = 0;  // full blocks the receiver held: not sent
  uint64_t bytes_sent = 0;
  absl::Duration elapsed;
};

class BlockTransport {
 public:
  virtual ~BlockTransport() = default;
  virtual std::string name() const = 0;
  virtual absl::StatusOr<ShipmentStats> Ship(const Shipment& shipment) = 0;

  // For tests of aborted transfers: called once when half of the bytes are out.
  void set_midway_hook(std::function<void()> hook) { midway_hook_ = std::move(hook); }

 protected:
  void Midway() {
    if (midway_hook_) midway_hook_();
  }

 private:
  std::function<void()> midway_hook_;
};

// `receiver` has an open session of `tenant` (the sender's, for the hashes to match) and outlives
// the transport.
std::unique_ptr<BlockTransport> MakeStreamTransport(KvCacheClient* receiver, std::string tenant,
                                                    std::string pool);
// Also maps the receiving pool: FAILED_PRECONDITION when it cannot be mapped here.
absl::StatusOr<std::unique_ptr<BlockTransport>> MakeShmTransport(KvCacheClient* receiver,
                                                                  std::string pool);

}  // namespace kvcache::worker

#endif  // KVCACHE_WORKER_BLOCK_TRANSPORT_H_
