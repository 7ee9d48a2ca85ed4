// BlockTransport: moves a prompt's finished KV from the prefill side's pool into the decode side's
// daemon, where it is committed, so the decode worker gets it as a prefix hit. The flow code
// (kvcache-worker --role=prefill, kvcache-pd) only sees this interface.
//
// Contract of every transport:
//   - only the full blocks the receiver does not already hold are sent (it is asked first);
//   - the sender's blocks stay pinned by its own open sequence for the whole shipment (the caller
//     holds it), and their bytes are written and synchronized before Ship is called;
//   - the receiver's blocks are pinned by a sequence (or a put stream) until all bytes arrived,
//     and only then are their hashes registered;
//   - an abort, a failure or a killed process leaves no hash pointing at partial data on the
//     receiver, and leaks nothing once the dead side's lease or stream ends.
// The partial last block is not shipped: only full blocks are published by hash, so the decode
// side computes the prompt's tail (fewer than block_size tokens, or one block when the prompt
// ends on a boundary) itself.
//
// Implementations, by where the two pools live:
//   StreamTransport  the receiving daemon's PutBlocks stream (between nodes; any receiving pool
//                    kind; a host source pool)
//   ShmTransport     same node, host pools: maps the receiving pool, writes the blocks in place
//                    into a sequence opened there, commits and releases it
//   NcclTransport    same node, device pools: as ShmTransport, but the bytes move device to
//                    device over NCCL (transfer/nccl_transport.h)
// ShmTransport and NcclTransport share their bookkeeping (transfer/in_place_transport.h). A pool of
// the wrong kind is refused with FAILED_PRECONDITION naming the transports that move it.
// Thread-safety: thread-compatible.
#ifndef KVCACHE_TRANSFER_BLOCK_TRANSPORT_H_
#define KVCACHE_TRANSFER_BLOCK_TRANSPORT_H_

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
  absl::Span<const uint32_t> tokens;  // the prompt
  absl::string_view cache_salt;
  const MappedPool* source = nullptr;        // the sender's pool, mapped
  absl::Span<const uint32_t> source_blocks;  // the sender's block table for `tokens`
  // The parts each full block holds, as CommitSequence takes them: one per full block from
  // block 0 (more are ignored), or empty for every part. The receiver publishes the blocks it
  // is sent with these masks, so its hit rule sees the parts the sender wrote and no more.
  absl::Span<const uint32_t> part_masks;
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

  // For tests of aborted transfers: called once when half of the bytes are out (before any
  // block is sent when there is one block, not at all when there is none). A hook that returns
  // an error aborts the shipment with that error, as a failed transfer would: nothing is
  // committed and the receiver's blocks are released.
  void set_midway_hook(std::function<absl::Status()> hook) { midway_hook_ = std::move(hook); }

 protected:
  absl::Status Midway() { return midway_hook_ ? midway_hook_() : absl::OkStatus(); }

 private:
  std::function<absl::Status()> midway_hook_;
};

// Checks a shipment's shape: a source pool whose layout matches its block size, a block id (and,
// when there are masks, a part mask) for each full block of the prompt, and every such id inside
// the source pool. INVALID_ARGUMENT or OUT_OF_RANGE otherwise (FAILED_PRECONDITION for a source
// whose layout disagrees with itself). The receiver checks the masks themselves.
absl::Status CheckShipment(const Shipment& shipment);
// The masks of a checked shipment's full blocks: what the receiver's commit takes.
absl::Span<const uint32_t> ShippedPartMasks(const Shipment& shipment);

// `receiver` has an open session of `tenant` (the sender's, for the hashes to match) and outlives
// the transport. Ship refuses a device source pool (FAILED_PRECONDITION: use the nccl transport).
std::unique_ptr<BlockTransport> MakeStreamTransport(KvCacheClient* receiver, std::string tenant,
                                                    std::string pool);
// Also maps the receiving pool: FAILED_PRECONDITION when it cannot be mapped here, or when it is
// device memory (ship into it with the nccl or the stream transport). Ship refuses a device
// source pool the same way.
absl::StatusOr<std::unique_ptr<BlockTransport>> MakeShmTransport(KvCacheClient* receiver,
                                                                 std::string pool);

}  // namespace kvcache::worker

#endif  // KVCACHE_TRANSFER_BLOCK_TRANSPORT_H_
