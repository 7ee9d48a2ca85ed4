// InPlaceTransport: the bookkeeping of the same-node transports, which write a shipment's blocks
// straight into the receiving daemon's pool, mapped in this process (ShmTransport: memcpy between
// host pools; NcclTransport: device-to-device copies over NCCL). One Ship:
//   1. opens a sequence for the prompt on the receiver (its full blocks, and one token more when
//      the prompt has it, so every full block can be a hit): the blocks it already holds come
//      back as the cached prefix and are not sent; the rest are fresh blocks, pinned by the
//      sequence;
//   2. copies the missing blocks, source block table -> the sequence's block table, in two
//      halves with the midway hook between them, and waits until every byte is in (Finish);
//   3. commits the full blocks with the shipment's part masks — their hashes are registered only
//      now — and releases the sequence, which leaves them cached on the receiver.
// On any error after step 1 it still waits for the copies it started (Finish) and releases the
// sequence without committing: no hash points at partial data and no block stays pinned.
//
// Subclasses supply the copy: CheckSource (is the source pool of a kind this copy reads), Copy
// (may only enqueue) and Finish (returns once every byte Copy was given is in the receiver's
// memory and visible to other processes).
//
// Thread-safety: thread-compatible.
#ifndef KVCACHE_TRANSFER_IN_PLACE_TRANSPORT_H_
#define KVCACHE_TRANSFER_IN_PLACE_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"
#include "transfer/block_transport.h"

namespace kvcache::worker {

class InPlaceTransport : public BlockTransport {
 public:
  // Errors: CheckShipment's and CheckSource's; FAILED_PRECONDITION when the two pools' blocks
  // differ in size, or when the receiving daemon restarted since its pool was mapped (make a new
  // transport); the receiver's own codes (RESOURCE_EXHAUSTED when its pool is short of blocks);
  // Copy's, Finish's and the midway hook's.
  absl::StatusOr<ShipmentStats> Ship(const Shipment& shipment) final;

 protected:
  // `receiver` has an open session and outlives the transport; `target` maps its pool `pool`.
  InPlaceTransport(KvCacheClient* receiver, std::string pool, std::unique_ptr<MappedPool> target)
      : receiver_(receiver), pool_(std::move(pool)), target_(std::move(target)) {}

  const std::string& pool() const { return pool_; }
  const MappedPool& target() const { return *target_; }

  // FAILED_PRECONDITION unless this transport can read `source` (host or device memory).
  virtual absl::Status CheckSource(const MappedPool& source) const = 0;
  // Copies block src_ids[i] of `source` into block dst_ids[i] of target(); the lists have equal
  // lengths and every id is inside its pool. May return before the bytes land.
  virtual absl::Status Copy(const MappedPool& source, absl::Span<const uint32_t> src_ids,
                            absl::Span<const uint32_t> dst_ids) = 0;
  // Returns once everything Copy was given is in target()'s memory. Must not return (even with
  // an error) while a copy may still write into target(): the blocks are released afterwards.
  virtual absl::Status Finish() { return absl::OkStatus(); }

 private:
  // Step 2 for an open receiving sequence; fills in the stats.
  absl::Status Fill(const Shipment& shipment, const KvCacheClient::Sequence& sequence,
                    uint32_t full_blocks, ShipmentStats* stats);

  KvCacheClient* const receiver_;
  const std::string pool_;
  const std::unique_ptr<MappedPool> target_;
};

}  // namespace kvcache::worker

#endif  // KVCACHE_TRANSFER_IN_PLACE_TRANSPORT_H_
