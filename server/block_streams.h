// Streaming reactors for the block data RPCs (PutBlocks, GetBlocks).
//
// A stream's blocks are held by a sequence of its own, under a transfer session (id 0) that no
// lease expiry touches, so the sweep never frees a block under a write or a send. The stream is
// bound to its caller's lease instead (server/stream_leases.h): when that session ends, the stream
// ends too, ABORTED (a put publishes nothing; a get's stalled reader is cancelled and sees
// CANCELLED). Whatever way a stream ends — finished, failed, cancelled, its lease ended, or its
// client killed — OnDone releases that sequence, so a put that did not complete leaves its fresh
// blocks unpublished on the free list and nothing else changed.
//
// A stream acts for the identity that opened the session it names, in that session's tenant;
// a put also holds the bytes it will write against the tenant's max_put_bytes_in_flight and
// against its connection's and the daemon's bounds (server/call_limits.h), as every stream holds
// its place among the long calls.
//
// Thread safety: gRPC serializes a reactor's read/write callbacks; OnCancel touches no state. The
// lease notice runs on another thread: a put's only finishes the call (finish_mu_ decides who
// does), a get's only cancels it.
#ifndef KVCACHE_SERVER_BLOCK_STREAMS_H_
#define KVCACHE_SERVER_BLOCK_STREAMS_H_

#include <grpcpp/support/byte_buffer.h>
#include <grpcpp/support/server_callback.h>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "auth/identity.h"
#include "cache/cache_manager.h"
#include "common/block_checksum.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "server/call_limits.h"
#include "server/stream_leases.h"

namespace kvcache {

inline constexpr uint64_t kTransferSessionId = 0;

// The caller of a long call, and its place under the call limits for the call's whole life.
struct StreamCaller {
  Identity identity;
  CallLimits::Ticket stream;
};

// What a stream holds from its Begin until its OnDone, the same for a put and a get: its two
// sessions, its binding to the lease, and its own sequence.
//   - lease: the caller's session, which the stream must not outlive;
//   - lease_binding: the stream's place under that lease (server/stream_leases.h);
//   - transfer_session: the transfer's own session, id 0, in the caller's tenant (so hashes match
//     its namespace), which holds the stream's blocks and which no lease expiry touches;
//   - sequence_id, block_ids: the stream's own sequence in `pool` under it (0: none).
//
// Thread safety: thread-compatible; a reactor's callbacks are serialized. The lease notice reads
// only `lease`, which is set before the binding is made.
struct StreamHold {
  // Takes session `session_id` as the lease, makes the transfer session, and binds the stream to
  // the lease: `on_lease_end` runs on `leases`' thread when the lease ends.
  absl::Status Attach(CacheManager* manager, StreamLeases* leases, uint64_t session_id,
                      uint64_t epoch, absl::string_view principal,
                      std::function<void()> on_lease_end);
  // Opens the stream's own sequence in `pool` (set) under the transfer session, the hit rule
  // asking spec.wanted_parts. Returns its num_cached_tokens.
  absl::StatusOr<uint32_t> OpenSequence(const SequenceSpec& spec, OpenMode mode);
  // ABORTED: the lease ended during the `stream` ("put", "get"); its blocks are released.
  absl::Status LeaseEnded(absl::string_view stream) const;
  // Releases the stream's own sequence, if it has one. Idempotent.
  void ReleaseSequence();
  // Ends the binding, if there is one: its notice is not running and never will.
  void Unbind(StreamLeases* leases);

  Pool* pool = nullptr;
  std::shared_ptr<Session> lease;
  std::shared_ptr<StreamLeases::Binding> lease_binding;
  std::unique_ptr<Session> transfer_session;
  uint64_t sequence_id = 0;
  std::vector<BlockId> block_ids;
  // The cached blocks' part masks, as the open gave them (empty for a pool without parts).
  std::vector<uint32_t> part_masks;
};

// Reads PutBlocksRequest messages raw: the data field's bytes go from the received slices
// straight into pool memory (common/rpc/bytes_field_split.h), checksummed on the way.
class PutBlocksReactor final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  // `caller`: the authenticated identity and its stream ticket, or why there is none (the put
  // then fails with it). `limits` also bounds the bytes of the put on its connection.
  PutBlocksReactor(CacheManager* manager, StreamLeases* leases, CallLimits* limits,
                   grpc::CallbackServerContext* context, grpc::ByteBuffer* response,
                   absl::StatusOr<StreamCaller> caller);

  void OnReadDone(bool ok) override;
  void OnDone() override;

 private:
  absl::Status OnMessage();  // message_, just read
  absl::Status Begin(const v1::PutBlocksHeader& header);
  absl::Status Consume(absl::string_view data);
  absl::Status Complete();
  void FinishWith(const absl::Status& status);
  void ReleaseSequence();
  // True for the one caller that may call Finish.
  bool TakeFinish();
  bool IsFinished();

  CacheManager* const manager_;
  StreamLeases* const leases_;
  CallLimits* const limits_;
  grpc::CallbackServerContext* const context_;
  grpc::ByteBuffer* const response_;  // serialized from reply_ when the put succeeds
  v1::PutBlocksResponse reply_;
  grpc::ByteBuffer message_;
  std::string principal_;
  CallLimits::Ticket stream_ticket_;

  absl::Mutex finish_mu_;
  bool finished_ ABSL_GUARDED_BY(finish_mu_) = false;

  // Set by Begin.
  StreamHold hold_;
  uint32_t cached_blocks_ = 0;
  uint32_t first_block_ = 0;             // blocks before it are not sent (already cached here)
  uint64_t put_bytes_reserved_ = 0;      // of the tenant's max_put_bytes_in_flight
  CallLimits::Ticket put_bytes_ticket_;  // the same bytes, of the connection's and daemon's bound
  std::optional<BlockStreamVerifier> verifier_;  // of the blocks sent
  std::vector<uint32_t> part_masks_;             // the header's, checked; empty: every part
};

// Serves GetBlocksResponse messages encoded by hand: each data message is a few bytes of framing
// followed by slices that point straight into the pinned blocks of a host pool (device pools are
// staged through host slices), so the bytes are never copied into a protobuf message.
class GetBlocksReactor final : public grpc::ServerWriteReactor<grpc::ByteBuffer> {
 public:
  GetBlocksReactor(CacheManager* manager, StreamLeases* leases,
                   grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
                   uint32_t max_chunk_bytes, absl::StatusOr<StreamCaller> caller);

  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  absl::Status Begin(const v1::GetBlocksRequest& request, absl::string_view principal);
  absl::Status WriteNextChunk();

  CacheManager* const manager_;
  StreamLeases* const leases_;
  grpc::CallbackServerContext* const context_;
  const uint32_t max_chunk_bytes_;
  grpc::ByteBuffer message_;
  CallLimits::Ticket stream_ticket_;

  StreamHold hold_;  // set by Begin
  uint64_t block_bytes_ = 0;
  uint32_t chunk_bytes_ = 0;
  uint64_t sent_ = 0;
  bool completed_ = false;  // every byte sent
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_BLOCK_STREAMS_H_
