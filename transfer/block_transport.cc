#include "transfer/block_transport.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "transfer/in_place_transport.h"

namespace kvcache::worker {

absl::Status CheckShipment(const Shipment& shipment) {
  if (shipment.source == nullptr) return absl::InvalidArgumentError("shipment has no source pool");
  const MappedPool& source = *shipment.source;
  if (source.layout().BlockBytes() != source.block_bytes()) {
    return absl::FailedPreconditionError("source pool layout and block size disagree");
  }
  const size_t full_blocks = shipment.tokens.size() / source.layout().block_size;
  if (shipment.source_blocks.size() < full_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("shipment has ", shipment.source_blocks.size(),
                                                   " source blocks for ", full_blocks,
                                                   " full blocks"));
  }
  if (!shipment.part_masks.empty() && shipment.part_masks.size() < full_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("shipment has ", shipment.part_masks.size(),
                                                   " part masks for ", full_blocks,
                                                   " full blocks"));
  }
  for (size_t i = 0; i < full_blocks; ++i) {
    if (shipment.source_blocks[i] >= source.num_blocks()) {
      return absl::OutOfRangeError(
          absl::StrCat("shipment's source block ", shipment.source_blocks[i], " is past pool '",
                       source.name(), "' of ", source.num_blocks(), " blocks"));
    }
  }
  return absl::OkStatus();
}

absl::Span<const uint32_t> ShippedPartMasks(const Shipment& shipment) {
  if (shipment.part_masks.empty()) return {};
  return shipment.part_masks.first(shipment.tokens.size() / shipment.source->layout().block_size);
}

namespace {

// The host transports read the source pool with the CPU.
absl::Status CheckHostSource(const MappedPool& source, absl::string_view transport) {
  if (!source.is_device()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "the ", transport, " transport reads host pools, and the sender's pool '", source.name(),
      "' is device memory (cuda:", source.device(), "): ship it with the nccl transport"));
}

// Between nodes: the receiving daemon's PutBlocks, skipping the prefix it already holds. The put
// stream pins the receiver's blocks and registers nothing unless every byte arrived.
class StreamTransport final : public BlockTransport {
  static constexpr uint64_t kChunkBytes = 1 << 20;

 public:
  StreamTransport(KvCacheClient* receiver, std::string tenant, std::string pool)
      : receiver_(receiver), tenant_(std::move(tenant)), pool_(std::move(pool)) {}

  std::string name() const override { return "stream"; }

  absl::StatusOr<ShipmentStats> Ship(const Shipment& shipment) override {
    const absl::Time start = absl::Now();
    RETURN_IF_ERROR(CheckShipment(shipment));
    RETURN_IF_ERROR(CheckHostSource(*shipment.source, name()));
    const uint32_t block_size = shipment.source->layout().block_size;
    const uint32_t full_blocks = shipment.tokens.size() / block_size;
    ASSIGN_OR_RETURN(const KvCacheClient::LookupResult held,
                     receiver_->Lookup(pool_, tenant_, shipment.tokens, shipment.cache_salt));
    const uint32_t first = std::min(held.num_cached_blocks, full_blocks);
    ShipmentStats stats{.blocks_already_there = first};
    if (first < full_blocks) {
      const uint64_t block_bytes = shipment.source->block_bytes();
      // The blocks go out from the source mapping as they lie, pinned by the caller's sequence.
      std::vector<absl::string_view> blocks;
      for (uint32_t i = first; i < full_blocks; ++i) {
        blocks.emplace_back(
            reinterpret_cast<const char*>(shipment.source->Block(shipment.source_blocks[i])),
            block_bytes);
      }
      const uint64_t total = blocks.size() * block_bytes;
      bool past_midway = false;
      // At least two messages when there are two blocks, so that "half the bytes are out" falls
      // between messages.
      const uint64_t half = (blocks.size() + 1) / 2 * block_bytes;
      KvCacheClient::PutOptions options{.cache_salt = shipment.cache_salt,
                                        .chunk_bytes = std::min<uint64_t>(kChunkBytes, half),
                                        .first_block = first,
                                        .part_masks = ShippedPartMasks(shipment)};
      // Midway runs inside the stream, once half of the bytes are out: the receiver holds a
      // half-received put when a test stops or kills this process there.
      options.after_chunk = [&](uint64_t sent) {
        if (past_midway || 2 * sent < total) return absl::OkStatus();
        past_midway = true;
        return Midway();
      };
      // FAILED_PRECONDITION here means the receiver evicted part of the prefix since the lookup.
      RETURN_IF_ERROR(receiver_->PutBlocks(pool_, shipment.tokens, blocks, options).status());
      stats.blocks_sent = full_blocks - first;
      stats.bytes_sent = total;
    }
    stats.elapsed = absl::Now() - start;
    return stats;
  }

 private:
  KvCacheClient* const receiver_;
  const std::string tenant_;
  const std::string pool_;
};

// Same node, host pools: the receiver's shared memory is mapped here too, and the blocks are
// memcpy'd in place (InPlaceTransport does the sequence bookkeeping around the copy).
class ShmTransport final : public InPlaceTransport {
 public:
  ShmTransport(KvCacheClient* receiver, std::string pool, std::unique_ptr<MappedPool> target)
      : InPlaceTransport(receiver, std::move(pool), std::move(target)) {}

  std::string name() const override { return "shm"; }

 private:
  absl::Status CheckSource(const MappedPool& source) const override {
    return CheckHostSource(source, name());
  }

  absl::Status Copy(const MappedPool& source, absl::Span<const uint32_t> src_ids,
                    absl::Span<const uint32_t> dst_ids) override {
    for (size_t i = 0; i < src_ids.size(); ++i) {
      ASSIGN_OR_RETURN(absl::Span<uint8_t> destination, target().CheckedBlock(dst_ids[i]));
      std::memcpy(destination.data(), source.Block(src_ids[i]), destination.size());
    }
    return absl::OkStatus();
  }
};

}  // namespace

std::unique_ptr<BlockTransport> MakeStreamTransport(KvCacheClient* receiver, std::string tenant,
                                                    std::string pool) {
  return std::make_unique<StreamTransport>(receiver, std::move(tenant), std::move(pool));
}

absl::StatusOr<std::unique_ptr<BlockTransport>> MakeShmTransport(KvCacheClient* receiver,
                                                                 std::string pool) {
  ASSIGN_OR_RETURN(KvCacheClient::PoolDescription description, receiver->DescribePool(pool));
  if (description.pool.mapping.kind == KvCacheClient::PoolMapping::Kind::kCudaIpc) {
    // Checked before mapping: a CUDA IPC mapping would cost an import only to be refused.
    return absl::FailedPreconditionError(absl::StrCat(
        "the shm transport writes host pools, and the receiving pool '", pool,
        "' is device memory (cuda:", description.pool.mapping.cuda_device,
        "): ship into it with the nccl transport (same node) or the stream transport"));
  }
  ASSIGN_OR_RETURN(std::unique_ptr<MappedPool> target, MappedPool::Map(description));
  return std::make_unique<ShmTransport>(receiver, std::move(pool), std::move(target));
}

}  // namespace kvcache::worker
