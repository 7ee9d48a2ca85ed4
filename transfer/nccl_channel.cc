// NcclChannel over NCCL and the CUDA runtime (built when both are found; see
// nccl_channel_stub.cc otherwise).
//
// The communicator is non-blocking (ncclConfig_t::blocking = 0): initialization and the groups'
// connection setup run in NCCL's background threads and report through ncclCommGetAsyncError,
// which this file polls with a deadline. A blocking communicator would leave ncclCommInitRank
// waiting forever for a rank that never comes.
#include "transfer/nccl_channel.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/kv_cache_client.h"
#include "common/cuda/cuda_device.h"
#include "common/cuda/cuda_status.h"
#include "common/cuda/scoped_cuda_device.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

static_assert(sizeof(ncclUniqueId) == NcclChannel::kUniqueIdBytes,
              "NcclChannel::kUniqueIdBytes must match ncclUniqueId");

// How long the destructor lets pending work and ncclCommFinalize take before it aborts.
constexpr absl::Duration kDestroyGrace = absl::Seconds(5);
// The warm-up message, each way.
constexpr size_t kWarmBytes = 4096;

absl::Status NcclError(absl::string_view what, ncclResult_t result) {
  const char* detail = ncclGetLastError(nullptr);
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(result),
                                          detail != nullptr && *detail != '\0' ? ": " : "",
                                          detail != nullptr ? detail : ""));
}

// The same code with `context` in front of the message.
absl::Status Annotate(const absl::Status& status, absl::string_view context) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

// Spins briefly, then sleeps: most waits end within microseconds, connection setup takes ~1 s.
class Backoff {
 public:
  void Wait() {
    if (spins_ < kSpins) {
      ++spins_;
      std::this_thread::yield();
    } else {
      absl::SleepFor(absl::Microseconds(100));
    }
  }

 private:
  static constexpr int kSpins = 200;
  int spins_ = 0;
};

absl::Time DeadlineAfter(absl::Duration timeout) {
  return timeout == absl::InfiniteDuration() ? absl::InfiniteFuture() : absl::Now() + timeout;
}

// Polls a non-blocking communicator until its pending call (initialization, a group, finalize)
// is done. The caller aborts the communicator on an error.
absl::Status WaitForComm(ncclComm_t comm, absl::Time deadline, absl::string_view what) {
  Backoff backoff;
  while (true) {
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(comm, &state);
    if (result != ncclSuccess) return NcclError("ncclCommGetAsyncError", result);
    if (state == ncclSuccess) return absl::OkStatus();
    if (state != ncclInProgress) return NcclError(what, state);
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(what, " did not complete in time"));
    }
    backoff.Wait();
  }
}

bool CallOk(ncclResult_t result) { return result == ncclSuccess || result == ncclInProgress; }

// Checks a block list: block_bytes > 0, a pool when there are ids, and every id's end offset
// representable.
absl::Status CheckBlocks(absl::string_view op, const void* pool, uint64_t block_bytes,
                         absl::Span<const uint32_t> ids) {
  if (block_bytes == 0) return absl::InvalidArgumentError(absl::StrCat(op, ": block_bytes is 0"));
  if (ids.empty()) return absl::OkStatus();
  if (pool == nullptr) return absl::InvalidArgumentError(absl::StrCat(op, ": null device_pool"));
  const uint64_t max_id = *std::max_element(ids.begin(), ids.end());
  if (block_bytes > std::numeric_limits<uint64_t>::max() / (max_id + 1)) {
    return absl::InvalidArgumentError(absl::StrCat(op, ": block ", max_id, " of ", block_bytes,
                                                   " bytes lies beyond the address space"));
  }
  return absl::OkStatus();
}

absl::Status CheckUnique(absl::string_view op, absl::string_view what,
                         absl::Span<const uint32_t> ids) {
  absl::flat_hash_set<uint32_t> seen;
  seen.reserve(ids.size());
  for (uint32_t id : ids) {
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat(op, ": ", what, " block ", id, " repeats"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

struct NcclChannel::Impl {
  ncclComm_t comm = nullptr;  // null once aborted or destroyed
  cudaStream_t stream = nullptr;
  void* warm_buffer = nullptr;  // device [2, kWarmBytes], allocated by the first Warm
  absl::Status broken;          // why the communicator was aborted; OK while it is usable

  // Aborts the communicator for good; later calls report `why`.
  void Abort(const absl::Status& why) {
    if (comm != nullptr) ncclCommAbort(comm);
    comm = nullptr;
    if (broken.ok()) broken = why;
  }

  absl::Status CheckUsable(absl::string_view op) const {
    if (broken.ok()) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat(op, ": the channel's communicator was aborted (", broken.ToString(),
                     "); connect a new channel"));
  }

  // Runs `count` operations in NCCL groups of at most `per_group`, `issue(i)` posting the i-th
  // (ncclSend/ncclRecv calls), and waits until each group is enqueued on the stream. An NCCL
  // error aborts the communicator.
  template <typename Issue>
  absl::Status Grouped(absl::string_view op, size_t count, size_t per_group, absl::Time deadline,
                       Issue issue) {
    for (size_t begin = 0; begin < count; begin += per_group) {
      const size_t end = std::min(count, begin + per_group);
      ncclResult_t result = ncclGroupStart();
      if (!CallOk(result)) {
        const absl::Status status = NcclError(absl::StrCat(op, ": ncclGroupStart"), result);
        Abort(status);
        return status;
      }
      absl::Status first_error;
      for (size_t i = begin; i < end && first_error.ok(); ++i) {
        result = issue(i);
        if (!CallOk(result))
          first_error = NcclError(absl::StrCat(op, ": ncclSend/ncclRecv"), result);
      }
      // Always close the group: an open one would capture this thread's next NCCL calls.
      result = ncclGroupEnd();
      if (first_error.ok() && !CallOk(result)) {
        first_error = NcclError(absl::StrCat(op, ": ncclGroupEnd"), result);
      }
      if (first_error.ok()) {
        first_error = WaitForComm(comm, deadline, absl::StrCat(op, ": ncclGroupEnd"));
      }
      if (!first_error.ok()) {
        Abort(first_error);
        return first_error;
      }
    }
    return absl::OkStatus();
  }
};

NcclChannel::NcclChannel(int rank, int world_size, int cuda_device, std::unique_ptr<Impl> impl)
    : rank_(rank), world_size_(world_size), cuda_device_(cuda_device), impl_(std::move(impl)) {}

NcclChannel::~NcclChannel() {
  if (impl_ == nullptr) return;
  ScopedCudaDevice device;
  // Best effort: the handles are freed below whichever device is current.
  (void)device.Set(cuda_device_);
  if (impl_->comm != nullptr) {
    // Synchronize aborts the communicator if the work does not finish within the grace period.
    if (Synchronize(kDestroyGrace).ok()) {
      const ncclResult_t result = ncclCommFinalize(impl_->comm);
      if (CallOk(result) &&
          WaitForComm(impl_->comm, absl::Now() + kDestroyGrace, "ncclCommFinalize").ok()) {
        ncclCommDestroy(impl_->comm);
        impl_->comm = nullptr;
      } else {
        impl_->Abort(absl::CancelledError("channel destroyed"));
      }
    }
  }
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
  if (impl_->warm_buffer != nullptr) cudaFree(impl_->warm_buffer);
  cudaGetLastError();
}

bool NcclChannel::BuiltWithNccl() { return true; }

absl::StatusOr<std::string> NcclChannel::NewUniqueId() {
  ncclUniqueId id;
  const ncclResult_t result = ncclGetUniqueId(&id);
  if (result != ncclSuccess) return NcclError("ncclGetUniqueId", result);
  return std::string(reinterpret_cast<const char*>(&id), sizeof(id));
}

absl::StatusOr<std::unique_ptr<NcclChannel>> NcclChannel::Connect(KvCacheClient* client,
                                                                  absl::string_view rendezvous_key,
                                                                  int rank, int world_size,
                                                                  int cuda_device,
                                                                  absl::Duration timeout) {
  constexpr char kOp[] = "NcclChannel::Connect";
  if (client == nullptr) return absl::InvalidArgumentError(absl::StrCat(kOp, ": null client"));
  if (rendezvous_key.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": empty rendezvous key"));
  }
  if (world_size < 1 || rank < 0 || rank >= world_size) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": rank ", rank, " of a world of ", world_size));
  }
  if (cuda_device < 0) {
    return absl::InvalidArgumentError(absl::StrCat(kOp, ": CUDA device ", cuda_device));
  }
  const absl::Time deadline = DeadlineAfter(timeout);
  // Before the rendezvous: a rank that cannot take part must not publish an id.
  RETURN_IF_ERROR(Annotate(CheckCudaDevice(cuda_device), kOp));

  std::string id_bytes;
  if (rank == 0) {
    ASSIGN_OR_RETURN(id_bytes, NewUniqueId());
    RETURN_IF_ERROR(
        Annotate(client->PublishRendezvous(rendezvous_key, id_bytes),
                 absl::StrCat(kOp, ": publishing the NCCL id under '", rendezvous_key, "'")));
  } else {
    absl::StatusOr<std::string> awaited =
        client->AwaitRendezvous(rendezvous_key, deadline - absl::Now());
    if (!awaited.ok()) {
      return Annotate(awaited.status(),
                      absl::StrCat(kOp, ": awaiting the NCCL id under '", rendezvous_key, "'"));
    }
    id_bytes = *std::move(awaited);
    if (id_bytes.size() != sizeof(ncclUniqueId)) {
      return absl::FailedPreconditionError(
          absl::StrCat(kOp, ": the value under '", rendezvous_key, "' is ", id_bytes.size(),
                       " bytes, not an NCCL unique id (", sizeof(ncclUniqueId), ")"));
    }
  }
  ncclUniqueId id;
  std::memcpy(&id, id_bytes.data(), sizeof(id));

  ScopedCudaDevice device;
  KVCACHE_CUDA_RETURN_IF_ERROR(device.Set(cuda_device),
                               absl::StrCat(kOp, ": cudaSetDevice(", cuda_device, ")"));
  auto impl = std::make_unique<Impl>();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const ncclResult_t result = ncclCommInitRankConfig(&impl->comm, world_size, id, rank, &config);
  absl::Status status;
  if (!CallOk(result)) {
    status = NcclError(absl::StrCat(kOp, ": ncclCommInitRankConfig"), result);
  } else {
    status = WaitForComm(impl->comm, deadline,
                         absl::StrCat(kOp, ": ncclCommInitRankConfig (rank ", rank, " of ",
                                      world_size, ", waiting for every rank to join)"));
  }
  if (status.ok()) {
    const cudaError_t error = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
    if (error != cudaSuccess) {
      impl->stream = nullptr;
      status = CudaStatus(error, absl::StrCat(kOp, ": cudaStreamCreateWithFlags"));
    }
  }
  if (!status.ok()) {
    impl->Abort(status);
    return status;
  }
  return std::unique_ptr<NcclChannel>(
      new NcclChannel(rank, world_size, cuda_device, std::move(impl)));
}

void* NcclChannel::stream() const { return impl_->stream; }

absl::Status NcclChannel::Warm(int peer, absl::Duration timeout) {
  constexpr char kOp[] = "NcclChannel::Warm";
  RETURN_IF_ERROR(impl_->CheckUsable(kOp));
  if (peer < 0 || peer >= world_size_) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": peer ", peer, " of a world of ", world_size_));
  }
  const absl::Time deadline = DeadlineAfter(timeout);
  ScopedCudaDevice device;
  KVCACHE_CUDA_RETURN_IF_ERROR(device.Set(cuda_device_),
                               absl::StrCat(kOp, ": cudaSetDevice(", cuda_device_, ")"));
  if (impl_->warm_buffer == nullptr) {
    const cudaError_t error = cudaMalloc(&impl_->warm_buffer, 2 * kWarmBytes);
    if (error != cudaSuccess) {
      impl_->warm_buffer = nullptr;
      return CudaStatus(error, absl::StrCat(kOp, ": cudaMalloc"));
    }
  }
  uint8_t* const send = static_cast<uint8_t*>(impl_->warm_buffer);
  uint8_t* const recv = send + kWarmBytes;
  cudaStream_t stream = impl_->stream;
  ncclComm_t comm = impl_->comm;
  // One group, a send and a receive: both peers do the same, so neither waits on the other's
  // order (and a send to self has its receive beside it).
  RETURN_IF_ERROR(impl_->Grouped(kOp, 2, 2, deadline, [&](size_t i) {
    return i == 0 ? ncclSend(send, kWarmBytes, ncclUint8, peer, comm, stream)
                  : ncclRecv(recv, kWarmBytes, ncclUint8, peer, comm, stream);
  }));
  return Synchronize(deadline - absl::Now());  // infinite when the deadline is
}

namespace {

// A point-to-point peer: another rank of this world (a copy within a rank is SelfCopyBlocks).
absl::Status CheckPeer(const char* op, int peer, int rank, int world_size) {
  if (peer >= 0 && peer < world_size && peer != rank) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(op, ": peer ", peer, " of a world of ", world_size,
                                                 " (this is rank ", rank,
                                                 "; copy within a rank with SelfCopyBlocks)"));
}

}  // namespace

absl::Status NcclChannel::SendBlocks(const uint8_t* device_pool, uint64_t block_bytes,
                                     absl::Span<const uint32_t> block_ids, int peer) {
  return PointToPointBlocks("NcclChannel::SendBlocks", Direction::kSend, device_pool, block_bytes,
                            block_ids, peer);
}

absl::Status NcclChannel::RecvBlocks(uint8_t* device_pool, uint64_t block_bytes,
                                     absl::Span<const uint32_t> block_ids, int peer) {
  return PointToPointBlocks("NcclChannel::RecvBlocks", Direction::kRecv, device_pool, block_bytes,
                            block_ids, peer);
}

absl::Status NcclChannel::PointToPointBlocks(const char* op, Direction direction,
                                             const uint8_t* device_pool, uint64_t block_bytes,
                                             absl::Span<const uint32_t> block_ids, int peer) {
  RETURN_IF_ERROR(impl_->CheckUsable(op));
  RETURN_IF_ERROR(CheckPeer(op, peer, rank_, world_size_));
  RETURN_IF_ERROR(CheckBlocks(op, device_pool, block_bytes, block_ids));
  if (direction == Direction::kRecv) RETURN_IF_ERROR(CheckUnique(op, "destination", block_ids));
  if (block_ids.empty()) return absl::OkStatus();
  ScopedCudaDevice device;
  KVCACHE_CUDA_RETURN_IF_ERROR(device.Set(cuda_device_),
                               absl::StrCat(op, ": cudaSetDevice(", cuda_device_, ")"));
  cudaStream_t stream = impl_->stream;
  ncclComm_t comm = impl_->comm;
  return impl_->Grouped(op, block_ids.size(), kMaxBlocksPerGroup, absl::InfiniteFuture(),
                        [&](size_t i) {
                          const uint8_t* block = device_pool + uint64_t{block_ids[i]} * block_bytes;
                          // RecvBlocks' pool is writable: its caller passed it non-const.
                          return direction == Direction::kSend
                                     ? ncclSend(block, block_bytes, ncclUint8, peer, comm, stream)
                                     : ncclRecv(const_cast<uint8_t*>(block), block_bytes, ncclUint8,
                                                peer, comm, stream);
                        });
}

absl::Status NcclChannel::SelfCopyBlocks(uint8_t* device_pool, uint64_t block_bytes,
                                         absl::Span<const uint32_t> src_ids,
                                         absl::Span<const uint32_t> dst_ids) {
  return SelfCopyBlocks(device_pool, device_pool, block_bytes, src_ids, dst_ids);
}

absl::Status NcclChannel::SelfCopyBlocks(const uint8_t* src_pool, uint8_t* dst_pool,
                                         uint64_t block_bytes, absl::Span<const uint32_t> src_ids,
                                         absl::Span<const uint32_t> dst_ids) {
  constexpr char kOp[] = "NcclChannel::SelfCopyBlocks";
  RETURN_IF_ERROR(impl_->CheckUsable(kOp));
  if (src_ids.size() != dst_ids.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(kOp, ": ", src_ids.size(), " src ids but ", dst_ids.size(), " dst ids"));
  }
  RETURN_IF_ERROR(CheckBlocks(kOp, src_pool, block_bytes, src_ids));
  RETURN_IF_ERROR(CheckBlocks(kOp, dst_pool, block_bytes, dst_ids));
  RETURN_IF_ERROR(CheckUnique(kOp, "dst", dst_ids));
  if (src_pool == dst_pool) {
    const absl::flat_hash_set<uint32_t> sources(src_ids.begin(), src_ids.end());
    for (uint32_t id : dst_ids) {
      if (sources.contains(id)) {
        return absl::InvalidArgumentError(
            absl::StrCat(kOp, ": block ", id, " is both a src and a dst (the copies run at once)"));
      }
    }
  }
  if (src_ids.empty()) return absl::OkStatus();
  ScopedCudaDevice device;
  KVCACHE_CUDA_RETURN_IF_ERROR(device.Set(cuda_device_),
                               absl::StrCat(kOp, ": cudaSetDevice(", cuda_device_, ")"));
  cudaStream_t stream = impl_->stream;
  ncclComm_t comm = impl_->comm;
  const int self = rank_;
  // Operation 2k sends src_ids[k], 2k + 1 receives it into dst_ids[k]: a block's send and
  // receive always share a group.
  return impl_->Grouped(
      kOp, 2 * src_ids.size(), 2 * kMaxBlocksPerGroup, absl::InfiniteFuture(), [&](size_t i) {
        const size_t k = i / 2;
        return i % 2 == 0 ? ncclSend(src_pool + uint64_t{src_ids[k]} * block_bytes, block_bytes,
                                     ncclUint8, self, comm, stream)
                          : ncclRecv(dst_pool + uint64_t{dst_ids[k]} * block_bytes, block_bytes,
                                     ncclUint8, self, comm, stream);
      });
}

absl::Status NcclChannel::Synchronize(absl::Duration timeout) {
  constexpr char kOp[] = "NcclChannel::Synchronize";
  RETURN_IF_ERROR(impl_->CheckUsable(kOp));
  const absl::Time deadline = DeadlineAfter(timeout);
  Backoff backoff;
  while (true) {
    const cudaError_t error = cudaStreamQuery(impl_->stream);
    if (error != cudaSuccess && error != cudaErrorNotReady) {
      const absl::Status status = CudaStatus(error, absl::StrCat(kOp, ": cudaStreamQuery"));
      impl_->Abort(status);
      return status;
    }
    // An NCCL failure (a peer gone, a network error) can leave the stream waiting for ever.
    ncclResult_t state = ncclSuccess;
    const ncclResult_t result = ncclCommGetAsyncError(impl_->comm, &state);
    if (result != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      const absl::Status status =
          NcclError(absl::StrCat(kOp, ": NCCL reported"), result != ncclSuccess ? result : state);
      impl_->Abort(status);
      return status;
    }
    if (error == cudaSuccess) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      const absl::Status status = absl::DeadlineExceededError(absl::StrCat(
          kOp, ": the channel's work did not finish within ", absl::FormatDuration(timeout),
          " (a peer that never posted its side?); the communicator is aborted"));
      impl_->Abort(status);
      return status;
    }
    backoff.Wait();
  }
}

}  // namespace kvcache
