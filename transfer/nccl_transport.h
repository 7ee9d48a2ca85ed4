// The nccl BlockTransport: ships a prompt's KV between two device pools on one node (daemons
// started with --device cuda:N), device to device over NCCL, with ShmTransport's bookkeeping
// (transfer/in_place_transport.h): it asks the receiving daemon for a sequence over the prompt (the
// blocks it already holds are not sent, the others are pinned), copies the missing blocks from
// the sender's pool (the Shipment's source: a device MappedPool) into the receiving pool (mapped
// here through CUDA IPC), synchronizes the channel's stream, and only then commits and releases;
// on any error it synchronizes, releases and commits nothing.
//
// The copy is NcclChannel::SelfCopyBlocks: a send to this rank and its receive per block, grouped.
// NCCL cannot put two ranks on one GPU, so on one node with one GPU the channel is a single-rank
// communicator, and both pools and the channel must be on the same device (FAILED_PRECONDITION
// otherwise). Shipping to a decode worker on another GPU or node (a receive posted by a peer rank)
// is not this transport's job.
//
// Ordering: the source blocks' bytes must be complete before Ship (the channel's stream does not
// wait for the writer's stream): synchronize the device work that wrote them, as the commit
// protocol already requires. Ship returns after its own copies completed.
//
// Thread-safety: thread-compatible, and one channel serves one thread at a time (NCCL's rule).
#ifndef KVCACHE_TRANSFER_NCCL_TRANSPORT_H_
#define KVCACHE_TRANSFER_NCCL_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"
#include "transfer/block_transport.h"
#include "transfer/nccl_channel.h"

namespace kvcache::worker {

// How long Ship waits for its copies (NcclChannel::Synchronize) before it aborts the channel.
inline constexpr absl::Duration kNcclShipTimeout = absl::Seconds(60);

// A transport into pool `pool` of `receiver` (an open session of the sender's tenant, for the
// hashes to match) whose copies run on `channel` (connected, on the receiving pool's device,
// ideally warmed; not owned). Both outlive the transport. Maps the receiving pool.
// Errors, in the order checked:
//   INVALID_ARGUMENT     a null receiver
//   (the receiver's DescribePool codes)
//   FAILED_PRECONDITION  the receiving pool is host memory: ship with the shm or the stream
//                        transport (reported before the channel is looked at, so a machine
//                        without NCCL or a GPU, which cannot make a channel, learns this first)
//   INVALID_ARGUMENT     a null channel
//   (MappedPool::Map's codes: FAILED_PRECONDITION without CUDA or a device, or a stale handle)
//   FAILED_PRECONDITION  the channel is on another device than the receiving pool
// Ship also answers FAILED_PRECONDITION for a host source pool or one on another device, and
// the channel's errors (an aborted channel must be replaced: make a new transport).
absl::StatusOr<std::unique_ptr<BlockTransport>> MakeNcclTransport(KvCacheClient* receiver,
                                                                  std::string pool,
                                                                  NcclChannel* channel);

// What kvcache-worker --transport=nccl and kvcache-pd use: checks that `source` (the sender's
// pool) and the receiving pool are device memory, then connects a single-rank channel on
// `source`'s device under a fresh rendezvous key (FreshRendezvousKey) through `rendezvous` (a
// client with an open session; used only during the call), warms it once — NCCL's connection
// setup stays out of the request path — and returns a transport that owns the channel.
// `timeout` bounds the connection and the warm-up. FAILED_PRECONDITION when either pool is host
// memory (naming the shm and stream transports), in a build without NCCL ("built without
// NCCL") or CUDA, or with no usable device; MakeNcclTransport's and NcclChannel::Connect's codes
// otherwise.
absl::StatusOr<std::unique_ptr<BlockTransport>> MakeSingleGpuNcclTransport(
    KvCacheClient* rendezvous, const MappedPool& source, KvCacheClient* receiver, std::string pool,
    absl::Duration timeout = absl::Seconds(60));

// A rendezvous key no other communicator uses: `prefix`, host name, process id, a per-process
// counter and random bits. (A reused key could hand out a stale NCCL id; see NcclChannel.)
std::string FreshRendezvousKey(absl::string_view prefix);

}  // namespace kvcache::worker

#endif  // KVCACHE_TRANSFER_NCCL_TRANSPORT_H_
