#include "transfer/in_place_transport.h"

#include <algorithm>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace kvcache::worker {

absl::StatusOr<ShipmentStats> InPlaceTransport::Ship(const Shipment& shipment) {
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(CheckShipment(shipment));
  RETURN_IF_ERROR(CheckSource(*shipment.source));
  if (target_->block_bytes() != shipment.source->block_bytes()) {
    return absl::FailedPreconditionError(
        absl::StrCat("receiving pool '", pool_, "' has ", target_->block_bytes(),
                     "-byte blocks, the sender ", shipment.source->block_bytes()));
  }
  // Block ids of another daemon start would land in memory the mapping no longer shows (or, for
  // a device pool, in freed memory).
  const uint64_t session_epoch = receiver_->session_epoch();
  if (session_epoch != 0 && session_epoch != target_->epoch()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the receiving daemon restarted since pool '", pool_, "' was mapped (epoch ",
        target_->epoch(), ", session epoch ", session_epoch, "): make a new transport"));
  }
  const uint32_t block_size = shipment.source->layout().block_size;
  const uint32_t full_blocks = shipment.tokens.size() / block_size;
  ShipmentStats stats;
  if (full_blocks == 0) return stats;
  // One token past the full blocks (when the prompt has one) lets every full block be a hit.
  const size_t open_tokens =
      std::min<size_t>(shipment.tokens.size(), size_t{full_blocks} * block_size + 1);
  ASSIGN_OR_RETURN(
      KvCacheClient::Sequence sequence,
      receiver_->OpenSequence(pool_, shipment.tokens.first(open_tokens), shipment.cache_salt));
  absl::Status status = Fill(shipment, sequence, full_blocks, &stats);
  if (status.ok()) {
    status = receiver_
                 ->CommitSequence(sequence.sequence_id, full_blocks * block_size,
                                  ShippedPartMasks(shipment))
                 .status();
  }
  // Released either way: committed blocks stay cached on the receiver, the rest go free.
  const absl::Status released = receiver_->ReleaseSequence(sequence.sequence_id);
  if (status.ok()) status = released;
  if (!status.ok()) return status;
  stats.elapsed = absl::Now() - start;
  return stats;
}

absl::Status InPlaceTransport::Fill(const Shipment& shipment,
                                    const KvCacheClient::Sequence& sequence, uint32_t full_blocks,
                                    ShipmentStats* stats) {
  const uint32_t block_size = shipment.source->layout().block_size;
  if (sequence.block_ids.size() < full_blocks) {
    return absl::InternalError(absl::StrCat("the receiver's table has ", sequence.block_ids.size(),
                                            " blocks for ", full_blocks, " full blocks"));
  }
  const uint32_t first = std::min(sequence.num_cached_tokens / block_size, full_blocks);
  stats->blocks_already_there = first;
  const absl::Span<const uint32_t> src_ids =
      shipment.source_blocks.subspan(first, full_blocks - first);
  const absl::Span<const uint32_t> dst_ids =
      absl::MakeConstSpan(sequence.block_ids).subspan(first, full_blocks - first);
  for (uint32_t id : dst_ids) {
    if (id >= target_->num_blocks()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the receiving daemon handed out block ", id, " of pool '", pool_,
          "', past the mapping's ", target_->num_blocks(), " blocks: it is not that pool"));
    }
  }
  if (src_ids.empty()) return absl::OkStatus();
  const size_t half = src_ids.size() / 2;
  absl::Status status = Copy(*shipment.source, src_ids.first(half), dst_ids.first(half));
  if (status.ok()) status = Midway();
  if (status.ok()) status = Copy(*shipment.source, src_ids.subspan(half), dst_ids.subspan(half));
  // Also after an error: the receiver's blocks are released next, so no copy may still be
  // writing into them.
  const absl::Status finished = Finish();
  if (status.ok()) status = finished;
  if (!status.ok()) return status;
  stats->blocks_sent = static_cast<uint32_t>(src_ids.size());
  stats->bytes_sent = src_ids.size() * target_->block_bytes();
  return absl::OkStatus();
}

}  // namespace kvcache::worker
