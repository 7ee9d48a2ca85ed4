// NcclChannel in a build without CUDA or NCCL: no channel can be made, and every call returns
// FAILED_PRECONDITION("built without NCCL").
#include <utility>

#include "common/cuda/not_built.h"
#include "transfer/nccl_channel.h"

namespace kvcache {
struct NcclChannel::Impl {};

NcclChannel::NcclChannel(int rank, int world_size, int cuda_device, std::unique_ptr<Impl> impl)
    : rank_(rank), world_size_(world_size), cuda_device_(cuda_device), impl_(std::move(impl)) {}

NcclChannel::~NcclChannel() = default;

bool NcclChannel::BuiltWithNccl() { return false; }

absl::StatusOr<std::string> NcclChannel::NewUniqueId() {
  return NotBuiltWith("NCCL", "NcclChannel::NewUniqueId");
}

absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Connect(KvCacheClient* client,
                                                                  absl::string_view rendezvous_key,
                                                                  int rank, int world_size,
                                                                  int cuda_device,
                                                                  absl::Duration timeout) {
  return NotBuiltWith("NCCL", "NcclChannel::Connect");
}

void* NcclChannel::stream() const { return nullptr; }

absl::Status NcclChannel::Warm(int peer, absl::Duration timeout) {
  return NotBuiltWith("NCCL", "NcclChannel::Warm");
}

absl::Status NcclChannel::SendBlocks(const uint8_t* device_pool, uint64_t block_bytes,
                                     absl::Span<const uint32_t> block_ids, int peer) {
  return NotBuiltWith("NCCL", "NcclChannel::SendBlocks");
}

absl::Status NcclChannel::RecvBlocks(uint8_t* device_pool, uint64_t block_bytes,
                                     absl::Span<const uint32_t> block_ids, int peer) {
  return NotBuiltWith("NCCL", "NcclChannel::RecvBlocks");
}

absl::Status NcclChannel::SelfCopyBlocks(uint8_t* device_pool, uint64_t block_bytes,
                                         absl::Span<const uint32_t> src_ids,
                                         absl::Span<const uint32_t> dst_ids) {
  return NotBuiltWith("NCCL", "NcclChannel::SelfCopyBlocks");
}

absl::Status NcclChannel::SelfCopyBlocks(const uint8_t* src_pool, uint8_t* dst_pool,
                                         uint64_t block_bytes, absl::Span<const uint32_t> src_ids,
                                         absl::Span<const uint32_t> dst_ids) {
  return NotBuiltWith("NCCL", "NcclChannel::SelfCopyBlocks");
}

absl::Status NcclChannel::Synchronize(absl::Duration timeout) {
  return NotBuiltWith("NCCL", "NcclChannel::Synchronize");
}

}  // namespace kvcache
