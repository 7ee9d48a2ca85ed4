// NcclTransport over the NcclChannel API only: no CUDA or NCCL header here, so this file builds in
// every configuration (without NCCL the channel is a stub that cannot be connected, and device
// pools cannot be mapped without CUDA).
#include "transfer/nccl_transport.h"

#include <unistd.h>

#include <atomic>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "transfer/in_place_transport.h"

namespace kvcache::worker {
namespace {

constexpr char kHostTransports[] =
    "ship host pools with the shm transport (same node) or the stream transport (any node)";

// FAILED_PRECONDITION unless the described receiving pool is device memory.
absl::Status CheckDeviceReceiver(const KvCacheClient::PoolDescription& description) {
  if (description.pool.mapping.kind == KvCacheClient::PoolMapping::Kind::kCudaIpc) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "the nccl transport moves blocks between device pools, and the receiving pool '",
      description.pool.name, "' is ",
      description.pool.memory_kind.empty() ? "not device" : description.pool.memory_kind,
      " memory: ", kHostTransports));
}

absl::Status CheckDeviceSource(const MappedPool& source) {
  if (source.is_device()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("the nccl transport moves blocks between device pools, and the sender's pool '",
                   source.name(), "' is host memory: ", kHostTransports));
}

class NcclTransport final : public InPlaceTransport {
 public:
  NcclTransport(KvCacheClient* receiver, std::string pool, std::unique_ptr<MappedPool> target,
                NcclChannel* channel, std::unique_ptr<NcclChannel> owned_channel)
      : InPlaceTransport(receiver, std::move(pool), std::move(target)),
        channel_(channel),
        owned_channel_(std::move(owned_channel)) {}

  std::string name() const override { return "nccl"; }

 private:
  absl::Status CheckSource(const MappedPool& source) const override {
    RETURN_IF_ERROR(CheckDeviceSource(source));
    if (source.device() != channel_->cuda_device()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the sender's pool '", source.name(), "' is on cuda:", source.device(),
          ", the nccl channel and the receiving pool on cuda:", channel_->cuda_device(),
          ": this transport copies within one GPU"));
    }
    return absl::OkStatus();
  }

  // Enqueues the copies on the channel's stream; Finish waits for them.
  absl::Status Copy(const MappedPool& source, absl::Span<const uint32_t> src_ids,
                    absl::Span<const uint32_t> dst_ids) override {
    if (src_ids.empty()) return absl::OkStatus();
    return channel_->SelfCopyBlocks(source.Block(0), target().Block(0), target().block_bytes(),
                                    src_ids, dst_ids);
  }

  // A channel that fails here has aborted its communicator (NcclChannel's contract), which stops
  // its work on the device: nothing writes into the receiver's blocks after this returns.
  absl::Status Finish() override { return channel_->Synchronize(kNcclShipTimeout); }

  NcclChannel* const channel_;
  // Declared after channel_ and destroyed before the base's mapping of the receiving pool.
  const std::unique_ptr<NcclChannel> owned_channel_;
};

// MakeNcclTransport after the receiving pool was described and found to be device memory,
// optionally owning the channel.
absl::StatusOr<std::unique_ptr<BlockTransport>> MakeTransport(
    KvCacheClient* receiver, std::string pool, const KvCacheClient::PoolDescription& description,
    NcclChannel* channel, std::unique_ptr<NcclChannel> owned_channel) {
  if (channel == nullptr) return absl::InvalidArgumentError("nccl transport: null channel");
  ASSIGN_OR_RETURN(std::unique_ptr<MappedPool> target, MappedPool::Map(description));
  if (target->device() != channel->cuda_device()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the receiving pool '", pool, "' is on cuda:", target->device(),
                     ", the nccl channel on cuda:", channel->cuda_device(),
                     ": this transport copies within one GPU"));
  }
  return std::make_unique<NcclTransport>(receiver, std::move(pool), std::move(target), channel,
                                         std::move(owned_channel));
}

}  // namespace

absl::StatusOr<std::unique_ptr<BlockTransport>> MakeNcclTransport(KvCacheClient* receiver,
                                                                  std::string pool,
                                                                  NcclChannel* channel) {
  if (receiver == nullptr) return absl::InvalidArgumentError("nccl transport: null receiver");
  ASSIGN_OR_RETURN(KvCacheClient::PoolDescription description, receiver->DescribePool(pool));
  RETURN_IF_ERROR(CheckDeviceReceiver(description));
  return MakeTransport(receiver, std::move(pool), description, channel, nullptr);
}

absl::StatusOr<std::unique_ptr<BlockTransport>> MakeSingleGpuNcclTransport(
    KvCacheClient* rendezvous, const MappedPool& source, KvCacheClient* receiver, std::string pool,
    absl::Duration timeout) {
  RETURN_IF_ERROR(CheckDeviceSource(source));
  if (receiver == nullptr) return absl::InvalidArgumentError("nccl transport: null receiver");
  // Before the channel: a host receiving pool is the clearer error, and costs no connection.
  ASSIGN_OR_RETURN(KvCacheClient::PoolDescription description, receiver->DescribePool(pool));
  RETURN_IF_ERROR(CheckDeviceReceiver(description));
  ASSIGN_OR_RETURN(std::unique_ptr<NcclChannel> channel,
                   NcclChannel::Connect(rendezvous, FreshRendezvousKey("kvcache/nccl-transport"),
                                        /*rank=*/0, /*world_size=*/1, source.device(), timeout));
  RETURN_IF_ERROR(channel->Warm(/*peer=*/0, timeout));
  NcclChannel* const raw = channel.get();
  return MakeTransport(receiver, std::move(pool), description, raw, std::move(channel));
}

std::string FreshRendezvousKey(absl::string_view prefix) {
  static std::atomic<uint64_t> counter{0};
  char host[65] = {};
  if (gethostname(host, sizeof(host) - 1) != 0) host[0] = '\0';
  std::random_device random;
  const uint64_t nonce = (uint64_t{random()} << 32) ^ random();
  return absl::StrFormat("%s/%s/%d/%d/%016x", prefix, host, getpid(), counter.fetch_add(1), nonce);
}

}  // namespace kvcache::worker
