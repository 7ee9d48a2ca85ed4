#include "server/block_streams.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "common/rpc/bytes_field_split.h"
#include "common/rpc/chunk_bytes.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "server/proto_keys.h"

namespace kvcache {
namespace {

// A stream's two sessions: the caller's (its lease, which the stream must not outlive) and the
// transfer's own, in the caller's tenant (so hashes match its namespace) with id 0, which holds
// the stream's blocks and which no lease expiry touches.
struct StreamSessions {
  std::shared_ptr<Session> lease;
  std::unique_ptr<Session> transfer;
};

absl::StatusOr<StreamSessions> TransferSession(CacheManager* manager, uint64_t session_id,
                                               uint64_t epoch, absl::string_view principal) {
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   manager->SessionFor(session_id, epoch, principal));
  auto transfer = std::make_unique<Session>(kTransferSessionId, session->principal, session->tenant,
                                            "transfer", session->ttl);
  return StreamSessions{std::move(session), std::move(transfer)};
}

absl::Status LeaseEnded(const Session& lease, absl::string_view stream) {
  return absl::AbortedError(absl::StrCat("session ", lease.id, "'s lease ended during the ", stream,
                                         "; its blocks are released"));
}

absl::Status ParseMessage(const grpc::ByteBuffer& buffer, google::protobuf::Message* message) {
  grpc::Slice flat;
  if (!buffer.DumpToSingleSlice(&flat).ok() ||
      !message->ParseFromArray(flat.begin(), static_cast<int>(flat.size()))) {
    return absl::InvalidArgumentError(
        absl::StrCat("request is not a valid ", message->GetDescriptor()->name()));
  }
  return absl::OkStatus();
}

// The bytes of a GetBlocksResponse up to its data: the epoch (field 1, fixed64), then the data
// field's tag and length. The data itself follows as separate slices.
grpc::Slice DataFraming(uint64_t epoch, uint64_t data_size) {
  std::string framing(1, static_cast<char>((1 << 3) | 1));  // field 1, wire type 64-bit
  for (int i = 0; i < 8; ++i) framing.push_back(static_cast<char>(epoch >> (8 * i)));
  framing += BytesFieldPrefix(v1::GetBlocksResponse::kDataFieldNumber, data_size);
  return grpc::Slice(framing);
}

// Releases a stream's own sequence. It belongs to the stream's private transfer session, which
// nothing else closes and no lease ends, so a failure here means the pool's bookkeeping is broken
// (an invariant breach, not anything a client can cause): checked in debug builds only.
void ReleaseTransferSequence(Pool* pool, const Session& session, uint64_t sequence_id) {
  [[maybe_unused]] const absl::Status released = pool->Release(session, sequence_id);
  assert(released.ok() && "a transfer stream's own sequence could not be released");
}

}  // namespace

PutBlocksReactor::PutBlocksReactor(CacheManager* manager, StreamLeases* leases, CallLimits* limits,
                                   grpc::CallbackServerContext* context, grpc::ByteBuffer* response,
                                   absl::StatusOr<StreamCaller> caller)
    : manager_(manager), leases_(leases), limits_(limits), context_(context), response_(response) {
  reply_.set_epoch(manager_->epoch());
  if (!caller.ok()) {
    FinishWith(caller.status());
    return;
  }
  principal_ = std::move(caller->identity.principal);
  stream_ticket_ = std::move(caller->stream);
  StartRead(&message_);
}

absl::Status PutBlocksReactor::Begin(const v1::PutBlocksHeader& header) {
  ASSIGN_OR_RETURN(StreamSessions sessions,
                   TransferSession(manager_, header.session_id(), header.epoch(), principal_));
  lease_ = std::move(sessions.lease);
  transfer_session_ = std::move(sessions.transfer);
  // From the notifier thread: the status goes out now; OnDone, soon after, releases the blocks.
  ASSIGN_OR_RETURN(lease_binding_, leases_->Bind(*lease_, [this] {
    if (TakeFinish()) Finish(ToGrpcStatus(LeaseEnded(*lease_, "put")));
  }));
  ASSIGN_OR_RETURN(pool_, manager_->FindPool(header.pool()));
  const uint32_t block_size = pool_->options().layout.block_size;
  const size_t full_blocks = header.tokens_size() / block_size;
  if (header.first_block() > full_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("put starts at block ", header.first_block(),
                                                   " of ", full_blocks, " full blocks"));
  }
  first_block_ = header.first_block();
  if (static_cast<size_t>(header.block_checksums_size()) != full_blocks - first_block_) {
    return absl::InvalidArgumentError(
        absl::StrCat("put header carries ", header.block_checksums_size(), " checksums for ",
                     full_blocks - first_block_, " blocks sent of ", full_blocks,
                     " full blocks of ", header.tokens_size(), " tokens"));
  }
  const uint64_t put_bytes = (full_blocks - first_block_) * pool_->options().layout.BlockBytes();
  ASSIGN_OR_RETURN(put_bytes_ticket_, limits_->AdmitPutBytes(context_->peer(), put_bytes));
  RETURN_IF_ERROR(manager_->quotas().TryAcquire(transfer_session_->tenant,
                                                QuotaResource::kPutBytesInFlight, put_bytes));
  put_bytes_reserved_ = put_bytes;
  ASSIGN_OR_RETURN(
      OpenedSequence opened,
      pool_->Open(*transfer_session_,
                  SequenceSpec{absl::MakeConstSpan(header.tokens().data(), header.tokens_size()),
                               header.cache_salt(), ToExtraKeys(header.extra_keys())},
                  OpenMode::kPut));
  sequence_id_ = opened.sequence_id;
  block_ids_ = std::move(opened.block_ids);
  cached_blocks_ = opened.num_cached_tokens / block_size;
  if (cached_blocks_ < first_block_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the put skips the first ", first_block_, " blocks but only ", cached_blocks_,
                     " of them are cached here; send from block ", cached_blocks_));
  }
  verifier_.emplace(
      pool_->options().layout.BlockBytes(),
      std::vector<uint64_t>(header.block_checksums().begin(), header.block_checksums().end()),
      first_block_);
  return absl::OkStatus();
}

absl::Status PutBlocksReactor::Consume(absl::string_view data) {
  // Cached blocks keep their bytes; the client's copy is only checksummed.
  const absl::Status status =
      verifier_->Feed(data, [this](uint32_t block, uint64_t offset, absl::string_view piece) {
        if (block < cached_blocks_) return absl::OkStatus();
        return pool_->WriteBlock(block_ids_[block], offset, piece);
      });
  if (absl::IsDataLoss(status)) return absl::DataLossError(absl::StrCat("put: ", status.message()));
  return status;
}

absl::Status PutBlocksReactor::Complete() {
  if (pool_ == nullptr) return absl::InvalidArgumentError("put stream carried no header");
  if (verifier_->received_bytes() != verifier_->expected_bytes()) {
    return absl::DataLossError(absl::StrCat("put stream ended after ", verifier_->received_bytes(),
                                            " of ", verifier_->expected_bytes(), " bytes"));
  }
  // Nothing is published under a lease that has ended, even before its streams are told.
  if (lease_->closed.load(std::memory_order_acquire)) return LeaseEnded(*lease_, "put");
  ASSIGN_OR_RETURN(CommitResult committed,
                   pool_->Commit(*transfer_session_, sequence_id_,
                                 block_ids_.size() * pool_->options().layout.block_size));
  pool_->transfers().put_bytes.fetch_add(verifier_->received_bytes(), std::memory_order_relaxed);
  reply_.set_num_blocks(block_ids_.size());
  reply_.set_num_already_cached(cached_blocks_);
  reply_.set_num_stored(committed.num_published_blocks);
  return absl::OkStatus();
}

bool PutBlocksReactor::TakeFinish() {
  absl::MutexLock lock(&finish_mu_);
  if (finished_) return false;
  finished_ = true;
  return true;
}

bool PutBlocksReactor::IsFinished() {
  absl::MutexLock lock(&finish_mu_);
  return finished_;
}

void PutBlocksReactor::OnReadDone(bool ok) {
  if (IsFinished()) return;
  if (!ok) {  // the client finished writing, or the stream broke
    // A client that died (or cancelled) after its last byte did not end the put: store nothing.
    // Nor when the deadline ended the stream (gRPC may fail the read before it marks the call
    // cancelled).
    if (context_->IsCancelled()) {
      FinishWith(absl::CancelledError("the put was cancelled before the client ended it"));
    } else if (context_->deadline() <= std::chrono::system_clock::now()) {
      FinishWith(
          absl::DeadlineExceededError("the put's deadline passed before the client ended it"));
    } else {
      FinishWith(Complete());
    }
    return;
  }
  if (absl::Status status = OnMessage(); !status.ok()) {
    FinishWith(status);
    return;
  }
  if (!IsFinished()) StartRead(&message_);
}

absl::Status PutBlocksReactor::OnMessage() {
  absl::StatusOr<SplitMessage> split =
      SplitBytesField(message_, v1::PutBlocksRequest::kDataFieldNumber);
  if (!split.ok()) return split.status();
  v1::PutBlocksRequest request;
  if (!request.ParseFromString(split->rest)) {
    return absl::InvalidArgumentError("put message is not a valid PutBlocksRequest");
  }
  if (request.has_header() && split->has_field) {
    return absl::InvalidArgumentError("a put message carries a header or data, not both");
  }
  if (pool_ == nullptr) {
    return request.has_header()
               ? Begin(request.header())
               : absl::InvalidArgumentError("the first message of a put must be its header");
  }
  if (request.has_header()) return absl::InvalidArgumentError("a put carries one header, first");
  if (split->field_size > verifier_->expected_bytes() - verifier_->received_bytes()) {
    return absl::InvalidArgumentError(absl::StrCat("put carries more than the ",
                                                   verifier_->expected_bytes(), " bytes of its ",
                                                   block_ids_.size() - first_block_, " blocks"));
  }
  for (absl::string_view piece : split->pieces) RETURN_IF_ERROR(Consume(piece));
  return absl::OkStatus();
}

void PutBlocksReactor::FinishWith(const absl::Status& status) {
  if (!TakeFinish()) return;  // the lease ended first, and its status went out
  if (!status.ok() && pool_ != nullptr) {
    pool_->transfers().put_failures.fetch_add(1, std::memory_order_relaxed);
  }
  ReleaseSequence();
  if (status.ok()) {
    const std::string serialized = reply_.SerializeAsString();
    grpc::Slice slice(serialized);
    *response_ = grpc::ByteBuffer(&slice, 1);
  }
  Finish(ToGrpcStatus(status));
}

void PutBlocksReactor::ReleaseSequence() {
  put_bytes_ticket_.Release();
  if (put_bytes_reserved_ != 0) {
    manager_->quotas().Release(transfer_session_->tenant, QuotaResource::kPutBytesInFlight,
                               put_bytes_reserved_);
    put_bytes_reserved_ = 0;
  }
  if (sequence_id_ == 0) return;
  ReleaseTransferSequence(pool_, *transfer_session_, sequence_id_);
  sequence_id_ = 0;
}

void PutBlocksReactor::OnDone() {
  if (lease_binding_ != nullptr) leases_->Unbind(*lease_binding_);
  ReleaseSequence();
  delete this;
}

GetBlocksReactor::GetBlocksReactor(CacheManager* manager, StreamLeases* leases,
                                   grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request, uint32_t max_chunk_bytes,
                                   absl::StatusOr<StreamCaller> caller)
    : manager_(manager), leases_(leases), context_(context), max_chunk_bytes_(max_chunk_bytes) {
  v1::GetBlocksRequest parsed;
  absl::Status status = caller.status();
  if (status.ok()) {
    stream_ticket_ = std::move(caller->stream);
    status = ParseMessage(*request, &parsed);
  }
  if (status.ok()) status = Begin(parsed, caller->identity.principal);
  if (!status.ok()) {
    Finish(ToGrpcStatus(status));
    return;
  }
  StartWrite(&message_);
}

absl::Status GetBlocksReactor::Begin(const v1::GetBlocksRequest& request,
                                     absl::string_view principal) {
  ASSIGN_OR_RETURN(StreamSessions sessions,
                   TransferSession(manager_, request.session_id(), request.epoch(), principal));
  lease_ = std::move(sessions.lease);
  transfer_session_ = std::move(sessions.transfer);
  // A write may wait on a reader that stalls: only a cancellation ends it (the reader sees
  // CANCELLED); OnWriteDone then finishes, and OnDone releases the blocks.
  ASSIGN_OR_RETURN(lease_binding_, leases_->Bind(*lease_, [this] { context_->TryCancel(); }));
  ASSIGN_OR_RETURN(pool_, manager_->FindPool(request.pool()));
  const uint32_t requested = request.max_chunk_bytes();
  chunk_bytes_ = std::clamp<uint32_t>(requested == 0 ? kDefaultChunkBytes : requested,
                                      kMinChunkBytes, max_chunk_bytes_);
  ASSIGN_OR_RETURN(
      OpenedSequence opened,
      pool_->Open(*transfer_session_,
                  SequenceSpec{absl::MakeConstSpan(request.tokens().data(), request.tokens_size()),
                               request.cache_salt(), ToExtraKeys(request.extra_keys())},
                  OpenMode::kPinCached));
  sequence_id_ = opened.sequence_id;
  block_ids_ = std::move(opened.block_ids);
  block_bytes_ = pool_->options().layout.BlockBytes();
  v1::GetBlocksResponse response;
  response.set_epoch(manager_->epoch());
  v1::GetBlocksHeader* header = response.mutable_header();
  header->set_num_blocks(block_ids_.size());
  header->set_num_cached_tokens(opened.num_cached_tokens);
  header->set_block_bytes(block_bytes_);
  for (BlockId block : block_ids_) {
    ASSIGN_OR_RETURN(uint64_t checksum, pool_->BlockChecksum(block));
    header->add_block_checksums(checksum);
  }
  const std::string serialized = response.SerializeAsString();
  grpc::Slice slice(serialized);
  message_ = grpc::ByteBuffer(&slice, 1);
  return absl::OkStatus();
}

absl::Status GetBlocksReactor::WriteNextChunk() {
  const uint64_t total = block_bytes_ * block_ids_.size();
  const uint64_t size = std::min<uint64_t>(chunk_bytes_, total - sent_);
  std::vector<grpc::Slice> slices;
  slices.push_back(DataFraming(manager_->epoch(), size));
  for (uint64_t filled = 0; filled < size;) {
    const size_t index = (sent_ + filled) / block_bytes_;
    const uint64_t offset = (sent_ + filled) % block_bytes_;
    const uint64_t piece = std::min(size - filled, block_bytes_ - offset);
    const uint8_t* host = pool_->memory().HostBlock(block_ids_[index]);
    if (host != nullptr) {
      // Static: gRPC neither frees nor copies it. The block stays pinned until OnDone.
      slices.emplace_back(host + offset, piece, grpc::Slice::STATIC_SLICE);
    } else {
      grpc_slice staged = grpc_slice_malloc(piece);
      const absl::Status read = pool_->ReadBlock(
          block_ids_[index], offset, piece, reinterpret_cast<char*>(GRPC_SLICE_START_PTR(staged)));
      // Owned before the check, so a failed read frees the buffer. Not before the read: a small
      // slice keeps its bytes inline, in this very struct, and a copy in `slices` would not see
      // them.
      grpc::Slice owned(staged, grpc::Slice::STEAL_REF);
      RETURN_IF_ERROR(read);
      slices.push_back(std::move(owned));
    }
    filled += piece;
  }
  sent_ += size;
  message_ = grpc::ByteBuffer(slices.data(), slices.size());
  StartWrite(&message_);
  return absl::OkStatus();
}

void GetBlocksReactor::OnWriteDone(bool ok) {
  if (lease_->closed.load(std::memory_order_acquire)) {
    Finish(ToGrpcStatus(LeaseEnded(*lease_, "get")));
    return;
  }
  if (!ok) {
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "get stream broken"));
    return;
  }
  if (sent_ == block_bytes_ * block_ids_.size()) {
    completed_ = true;
    Finish(grpc::Status::OK);
    return;
  }
  if (absl::Status status = WriteNextChunk(); !status.ok()) Finish(ToGrpcStatus(status));
}

void GetBlocksReactor::OnDone() {
  if (lease_binding_ != nullptr) leases_->Unbind(*lease_binding_);
  if (pool_ != nullptr) {
    pool_->transfers().got_bytes.fetch_add(sent_, std::memory_order_relaxed);
    if (!completed_) pool_->transfers().get_failures.fetch_add(1, std::memory_order_relaxed);
  }
  if (sequence_id_ != 0) ReleaseTransferSequence(pool_, *transfer_session_, sequence_id_);
  delete this;
}

}  // namespace kvcache
