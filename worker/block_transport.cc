#include "worker/block_transport.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"

namespace kvcache::worker {
namespace {

absl::Status CheckShipment(const Shipment& shipment) {
  if (shipment.source == nullptr) return absl::InvalidArgumentError("shipment has no source pool");
  const size_t full_blocks = shipment.tokens.size() / shipment.source->layout().block_size;
  if (shipment.source_blocks.size() < full_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("shipment has ", shipment.source_blocks.size(),
                                                   " source blocks for ", full_blocks,
                                                   " full blocks"));
  }
  if (shipment.source->layout().BlockBytes() != shipment.source->block_bytes()) {
    return absl::FailedPreconditionError("source pool layout and block size disagree");
  }
  return absl::OkStatus();
}

// Between nodes: the receiving daemon's PutBlocks, skipping the prefix it already holds. The put
// stream pins the receiver's blocks and registers nothing unless every byte arrived.
class StreamTransport final : public BlockTransport {
 public:
  StreamTransport(KvCacheClient* receiver, std::string tenant, std::string pool)
      : receiver_(receiver), tenant_(std::move(tenant)), pool_(std::move(pool)) {}

  std::string name() const override { return "stream"; }

  absl::StatusOr<ShipmentStats> Ship(const Shipment& shipment) override {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(CheckShipment(shipment));
    const uint32_t block_size = shipment.source->layout().block_size;
    const uint32_t full_blocks = shipment.tokens.size() / block_size;
    ASSIGN_OR_RETURN(const KvCacheClient::LookupResult held,
                     receiver_->Lookup(pool_, tenant_, shipment.tokens, shipment.cache_salt));
    const uint32_t first = std::min(held.num_cached_blocks, full_blocks);
    ShipmentStats stats{.blocks_already_there = first};
    if (first < full_blocks) {
      const uint64_t block_bytes = shipment.source->block_bytes();
      std::string bytes;
      bytes.reserve((full_blocks - first) * block_bytes);
      for (uint32_t i = first; i < full_blocks; ++i) {
        bytes.append(reinterpret_cast<const char*>(shipment.source->Block(shipment.source_blocks[i])),
                     block_bytes);
      }
      Midway();
      // FAILED_PRECONDITION here means the receiver evicted part of the prefix since the lookup.
      RETURN_IF_ERROR(receiver_->PutBlocks(pool_, shipment.tokens, bytes, shipment.cache_salt, {},
                                           size_t{1} << 20, first)
                          .status());
      stats.blocks_sent = full_blocks - first;
      stats.bytes_sent = bytes.size();
    }
    stats.elapsed = absl::Now() - start;
    return stats;
  }

 private:
  KvCacheClient* const receiver_;
  const std::string tenant_;
  const std::string pool_;
};

// Same node: the receiver's pool is mapped here too. Blocks are written in place into a sequence
// opened on the receiver (which pins them), then committed — published only after every byte is
// written — and released into the receiver's cache.
class ShmTransport final : public BlockTransport {
 public:
  ShmTransport(KvCacheClient* receiver, std::string pool, std::unique_ptr<MappedPool> target)
      : receiver_(receiver), pool_(std::move(pool)), target_(std::move(target)) {}

  std::string name() const override { return "shm"; }

  absl::StatusOr<ShipmentStats> Ship(const Shipment& shipment) override {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(CheckShipment(shipment));
    const uint32_t block_size = shipment.source->layout().block_size;
    if (target_->block_bytes() != shipment.source->block_bytes()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "receiving pool '", pool_, "' has ", target_->block_bytes(), "-byte blocks, the sender ",
          shipment.source->block_bytes()));
    }
    const uint32_t full_blocks = shipment.tokens.size() / block_size;
    ShipmentStats stats;
    if (full_blocks == 0) return stats;
    // One token past the full blocks (when the prompt has one) lets every full block be a hit.
    const size_t open_tokens =
        std::min<size_t>(shipment.tokens.size(), size_t{full_blocks} * block_size + 1);
    ASSIGN_OR_RETURN(KvCacheClient::Sequence sequence,
                     receiver_->OpenSequence(pool_, shipment.tokens.first(open_tokens),
                                             shipment.cache_salt));
    absl::Status status = Copy(shipment, sequence, full_blocks, &stats);
    if (status.ok()) {
      status = receiver_->CommitSequence(sequence.sequence_id, full_blocks * block_size).status();
    }
    // Released either way: committed blocks stay cached on the receiver, the rest go free.
    const absl::Status released = receiver_->ReleaseSequence(sequence.sequence_id);
    if (status.ok()) status = released;
    if (!status.ok()) return status;
    stats.elapsed = absl::Now() - start;
    return stats;
  }

 private:
  absl::Status Copy(const Shipment& shipment, const KvCacheClient::Sequence& sequence,
                    uint32_t full_blocks, ShipmentStats* stats) {
    const uint32_t first = sequence.num_cached_tokens / shipment.source->layout().block_size;
    const uint64_t block_bytes = target_->block_bytes();
    stats->blocks_already_there = first;
    const uint32_t midway = first + (full_blocks - first) / 2;
    for (uint32_t i = first; i < full_blocks; ++i) {
      if (i == midway) Midway();
      ASSIGN_OR_RETURN(absl::Span<uint8_t> destination, target_->CheckedBlock(sequence.block_ids[i]));
      std::memcpy(destination.data(), shipment.source->Block(shipment.source_blocks[i]),
                  block_bytes);
      ++stats->blocks_sent;
      stats->bytes_sent += block_bytes;
    }
    return absl::OkStatus();
  }

  KvCacheClient* const receiver_;
  const std::string pool_;
  const std::unique_ptr<MappedPool> target_;
};

}  // namespace

std::unique_ptr<BlockTransport> MakeStreamTransport(KvCacheClient* receiver, std::string tenant,
                                                    std::string pool) {
  return std::make_unique<StreamTransport>(receiver, std::move(tenant), std::move(pool));
}

absl::StatusOr<std::unique_ptr<BlockTransport>> MakeShmTransport(KvCacheClient* receiver,
                                                                  std::string pool) {
  ASSIGN_OR_RETURN(KvCacheClient::PoolDescription description, receiver->DescribePool(pool));
  ASSIGN_OR_RETURN(std::unique_ptr<MappedPool> target, MappedPool::Map(description));
  return std::make_unique<ShmTransport>(receiver, std::move(pool), std::move(target));
}

}  // namespace kvcache::worker
