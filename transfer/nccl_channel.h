// NcclChannel: moves KV blocks between GPU pools with NCCL point-to-point send/recv (DESIGN.md
// section 4, prefill -> decode). One channel is one NCCL communicator of `world_size` ranks, one
// rank per process and GPU, with its own non-blocking CUDA stream. The ranks meet through the
// daemon: rank 0 creates the NCCL unique id and publishes it under a rendezvous key
// (KvCacheClient::PublishRendezvous); the other ranks await it (AwaitRendezvous). The key is
// scoped to the session's tenant and its value lives until rank 0's session ends, so use a
// fresh key per communicator (say, with a generation number): a reused key can hand out a stale
// id, and rank 0 cannot publish over another live session's value (ALREADY_EXISTS).
//
// Pools are device memory, block-major: block i is the bytes [i * block_bytes, (i+1) *
// block_bytes) of the pool's base pointer (as in kernels/block_copy.h). A transfer is one NCCL
// group with one ncclSend or ncclRecv per block (long lists are split into groups of at most
// kMaxBlocksPerGroup blocks, the same way on both sides). SendBlocks on one rank must be matched
// by RecvBlocks on the peer with as many ids and the same block_bytes; ids may differ.
//
// Costs: NCCL connects a pair of ranks on their first send/recv, about 0.7 s, and the first
// transfer call to a peer then waits (unbounded) inside the call for the peer to post its side.
// Call Warm(peer) on both ranks once after Connect, outside the request path.
//
// Asynchrony: SendBlocks, RecvBlocks and SelfCopyBlocks only enqueue work on stream() and return;
// the pool bytes must stay valid and untouched until Synchronize returns OK. Synchronize polls the
// stream and the communicator's asynchronous error state, so a failed peer is reported as an
// error instead of hanging. A channel whose communicator failed (an NCCL error, or a Synchronize
// that timed out) is aborted: every later call returns FAILED_PRECONDITION and the channel must be
// replaced, on every rank.
//
// One GPU cannot hold two ranks of one communicator (NCCL's rule). On a one-GPU machine, test the
// NCCL path with a single-rank channel (world_size 1) and SelfCopyBlocks, which sends to and
// receives from its own rank in one group — within one pool, or from one pool into another on the
// same GPU (the nccl BlockTransport, transfer/nccl_transport.h, ships prefill KV that way).
//
// Errors: INVALID_ARGUMENT for bad arguments; FAILED_PRECONDITION when there is no usable CUDA
// device (or driver), after an abort, and for every call in a build without NCCL ("built without
// NCCL"); INTERNAL with ncclGetErrorString for NCCL failures; CUDA failures as
// common/cuda/cuda_status.h maps them (RESOURCE_EXHAUSTED out of device memory, INTERNAL for a
// fault), with cudaGetErrorString; DEADLINE_EXCEEDED when Connect or Synchronize runs past its
// timeout; and the rendezvous calls' own codes from Connect.
//
// Thread safety: thread-compatible. A channel is used by one thread at a time (NCCL
// communicators are not thread-safe); different channels may be used concurrently. The calls set
// the calling thread's current CUDA device to the channel's and restore it before returning.
#ifndef KVCACHE_TRANSFER_NCCL_CHANNEL_H_
#define KVCACHE_TRANSFER_NCCL_CHANNEL_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace kvcache {

class KvCacheClient;  // client/kv_cache_client.h

class NcclChannel {
 public:
  // Blocks per NCCL group in one transfer call; longer id lists take several groups.
  static constexpr size_t kMaxBlocksPerGroup = 512;
  // Size of an NCCL unique id (sizeof(ncclUniqueId)).
  static constexpr size_t kUniqueIdBytes = 128;

  // True when this binary was built with NCCL (and CUDA); false for the stub.
  static bool BuiltWithNccl();

  // A fresh NCCL unique id: the kUniqueIdBytes raw bytes of ncclGetUniqueId. Needs no GPU.
  static absl::StatusOr<std::string> NewUniqueId();

  // Joins rank `rank` of a `world_size`-rank communicator on CUDA device `cuda_device`. `client`
  // must have an open session (of the same tenant on every rank) and is used only during the
  // call. Rank 0 creates the unique id and publishes it under `rendezvous_key`; the other ranks
  // await it. Then every rank initializes the communicator, which waits for all ranks to join.
  // `timeout` bounds the whole call (rendezvous and initialization): DEADLINE_EXCEEDED past it.
  // INVALID_ARGUMENT for a null client, an empty key, world_size < 1, rank outside
  // [0, world_size) or a negative device; FAILED_PRECONDITION when CUDA has no such device
  // (checked before the rendezvous, so nothing is published then).
  static absl::StatusOr<std::unique_ptr<NcclChannel>> Connect(KvCacheClient* client,
                                                              absl::string_view rendezvous_key,
                                                              int rank, int world_size,
                                                              int cuda_device,
                                                              absl::Duration timeout);

  // Waits for the stream (bounded by a short grace period) and releases the communicator, the
  // stream and the warm-up buffer; aborts the communicator instead if it failed or its work
  // does not finish.
  ~NcclChannel();

  NcclChannel(const NcclChannel&) = delete;
  NcclChannel& operator=(const NcclChannel&) = delete;

  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  int cuda_device() const { return cuda_device_; }
  // The channel's cudaStream_t, as void* so that code without the CUDA headers can hold it.
  void* stream() const;

  // Connects this rank with `peer` in both directions by sending and receiving one small
  // buffer, and waits for it (Synchronize(timeout)). `peer` must call Warm(this rank) as well;
  // Warm(rank()) warms the send-to-self path. Call once per peer after Connect.
  absl::Status Warm(int peer, absl::Duration timeout = absl::InfiniteDuration());

  // device_pool: device [any, block_bytes]. Sends block block_ids[i] of the pool to `peer`, in
  // order, one message per block. INVALID_ARGUMENT for peer == rank() (a send to self needs its
  // receive in the same group: use SelfCopyBlocks), a peer outside [0, world_size), block_bytes
  // of 0, a null pool with ids, or an id whose offset overflows. Ids are not checked against the
  // pool's size: the caller owns the pool. No ids: nothing to do.
  absl::Status SendBlocks(const uint8_t* device_pool, uint64_t block_bytes,
                          absl::Span<const uint32_t> block_ids, int peer);
  // device_pool: device [any, block_bytes]. Receives the peer's blocks, in order, into blocks
  // block_ids[i]. Same checks as SendBlocks, and INVALID_ARGUMENT when an id repeats (two
  // receives would race on one block).
  absl::Status RecvBlocks(uint8_t* device_pool, uint64_t block_bytes,
                          absl::Span<const uint32_t> block_ids, int peer);
  // device_pool: device [any, block_bytes]. Copies block src_ids[i] to block dst_ids[i] by
  // sending to and receiving from this rank in one group (any world_size). INVALID_ARGUMENT for
  // lists of different lengths, a dst id that repeats or that is also a src id (the copies run
  // concurrently), and SendBlocks' argument errors.
  absl::Status SelfCopyBlocks(uint8_t* device_pool, uint64_t block_bytes,
                              absl::Span<const uint32_t> src_ids,
                              absl::Span<const uint32_t> dst_ids);
  // src_pool, dst_pool: device [any, block_bytes], both usable from cuda_device() (allocations
  // of that device, or mappings of them such as CUDA IPC). Copies block src_ids[i] of src_pool
  // to block dst_ids[i] of dst_pool, as above (a send to self and its receive per block). When
  // the two pools are one (the same base), the checks of the one-pool form apply; otherwise
  // REQUIRES: the pools do not overlap (two allocations). INVALID_ARGUMENT for lists of
  // different lengths, a dst id that repeats, and SendBlocks' argument errors.
  absl::Status SelfCopyBlocks(const uint8_t* src_pool, uint8_t* dst_pool, uint64_t block_bytes,
                              absl::Span<const uint32_t> src_ids,
                              absl::Span<const uint32_t> dst_ids);

  // Waits until everything enqueued so far has completed. Polls the stream and the
  // communicator's error state; an NCCL error aborts the channel (INTERNAL), and so does running
  // past `timeout` (DEADLINE_EXCEEDED), since NCCL work stuck on an absent peer cannot be
  // cancelled otherwise.
  absl::Status Synchronize(absl::Duration timeout = absl::InfiniteDuration());

 private:
  struct Impl;  // NCCL and CUDA handles; defined where the headers are included
  enum class Direction { kSend, kRecv };

  NcclChannel(int rank, int world_size, int cuda_device, std::unique_ptr<Impl> impl);

  // SendBlocks (kSend) and RecvBlocks (kRecv, whose caller's pool is writable): their checks,
  // then one ncclSend or ncclRecv per block, in groups of kMaxBlocksPerGroup.
  absl::Status PointToPointBlocks(const char* op, Direction direction, const uint8_t* device_pool,
                                  uint64_t block_bytes, absl::Span<const uint32_t> block_ids,
                                  int peer);

  const int rank_;
  const int world_size_;
  const int cuda_device_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache

#endif  // KVCACHE_TRANSFER_NCCL_CHANNEL_H_
