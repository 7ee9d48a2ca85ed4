#include "server/block_streams.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "common/rpc/bytes_field_split.h"
#include "common/rpc/chunk_bytes.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "server/proto_convert.h"

namespace kvcache {
namespace {

// The bytes of a GetBlocksResponse up to its data: the epoch (field 1, fixed64), then the data
// field's tag and length. The data itself follows as separate slices.
grpc::Slice DataFraming(uint64_t epoch, uint64_t data_size) {
  std::string framing(1, static_cast<char>((1 << 3) | 1));  // field 1, wire type 64-bit
  for (int i = 0; i < 8; ++i) framing.push_back(static_cast<char>(epoch >> (8 * i)));
  framing += BytesFieldPrefix(v1::GetBlocksResponse::kDataFieldNumber, data_size);
  return grpc::Slice(framing);
}

}  // namespace

absl::Status StreamHold::Attach(CacheManager* manager, StreamLeases* leases, uint64_t session_id,
                                uint64_t epoch, absl::string_view principal,
                                std::function<void()> on_lease_end) {
  ASSIGN_OR_RETURN(lease, manager->SessionFor(session_id, epoch, principal));
  transfer_session = std::make_unique<Session>(kTransferSessionId, lease->principal, lease->tenant,
                                               "transfer", lease->ttl, lease->manifest);
  ASSIGN_OR_RETURN(lease_binding, leases->Bind(*lease, std::move(on_lease_end)));
  return absl::OkStatus();
}

absl::StatusOr<uint32_t> StreamHold::OpenSequence(const SequenceSpec& spec, OpenMode mode) {
  ASSIGN_OR_RETURN(OpenedSequence opened, pool->Open(*transfer_session, spec, mode));
  sequence_id = opened.sequence_id;
  block_ids = std::move(opened.block_ids);
  part_masks = std::move(opened.part_masks);
  return opened.num_cached_tokens;
}

absl::Status StreamHold::LeaseEnded(absl::string_view stream) const {
  return absl::AbortedError(absl::StrCat("session ", lease->id, "'s lease ended during the ",
                                         stream, "; its blocks are released"));
}

// The sequence belongs to the stream's private transfer session, which nothing else closes and no
// lease ends, so a failure here means the pool's bookkeeping is broken (an invariant breach, not
// anything a client can cause): checked in debug builds only.
void StreamHold::ReleaseSequence() {
  if (sequence_id == 0) return;
  [[maybe_unused]] const absl::Status released = pool->Release(*transfer_session, sequence_id);
  assert(released.ok() && "a transfer stream's own sequence could not be released");
  sequence_id = 0;
}

void StreamHold::Unbind(StreamLeases* leases) {
  if (lease_binding != nullptr) leases->Unbind(*lease_binding);
}

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
  // From the notifier thread: the status goes out now; OnDone, soon after, releases the blocks.
  RETURN_IF_ERROR(
      hold_.Attach(manager_, leases_, header.session_id(), header.epoch(), principal_, [this] {
        if (TakeFinish()) Finish(ToGrpcStatus(hold_.LeaseEnded("put")));
      }));
  ASSIGN_OR_RETURN(hold_.pool, manager_->FindPool(header.pool()));
  const uint32_t block_size = hold_.pool->options().layout.block_size;
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
  if (!header.part_masks().empty()) {
    // Checked before any byte is taken, as the commit at the end checks them again.
    if (static_cast<size_t>(header.part_masks_size()) != full_blocks) {
      return absl::InvalidArgumentError(
          absl::StrCat("put header carries ", header.part_masks_size(), " part masks for ",
                       full_blocks, " full blocks of ", header.tokens_size(),
                       " tokens; want one per full block from block 0"));
    }
    RETURN_IF_ERROR(ValidateBlockPartMasks(
        hold_.pool->parts(),
        absl::MakeConstSpan(header.part_masks().data(), header.part_masks_size())));
    part_masks_.assign(header.part_masks().begin(), header.part_masks().end());
  }
  const uint64_t put_bytes =
      (full_blocks - first_block_) * hold_.pool->options().layout.BlockBytes();
  ASSIGN_OR_RETURN(put_bytes_ticket_, limits_->AdmitPutBytes(context_->peer(), put_bytes));
  RETURN_IF_ERROR(manager_->quotas().TryAcquire(hold_.transfer_session->tenant,
                                                QuotaResource::kPutBytesInFlight, put_bytes));
  put_bytes_reserved_ = put_bytes;
  ASSIGN_OR_RETURN(
      const uint32_t cached_tokens,
      hold_.OpenSequence(
          SequenceSpec{absl::MakeConstSpan(header.tokens().data(), header.tokens_size()),
                       header.cache_salt(), ToExtraKeys(header.extra_keys())},
          OpenMode::kPut));
  cached_blocks_ = cached_tokens / block_size;
  if (cached_blocks_ < first_block_) {
    return absl::FailedPreconditionError(
        absl::StrCat("the put skips the first ", first_block_, " blocks but only ", cached_blocks_,
                     " of them are cached here; send from block ", cached_blocks_));
  }
  verifier_.emplace(
      hold_.pool->options().layout.BlockBytes(),
      std::vector<uint64_t>(header.block_checksums().begin(), header.block_checksums().end()),
      first_block_);
  return absl::OkStatus();
}

absl::Status PutBlocksReactor::Consume(absl::string_view data) {
  // Cached blocks keep their bytes; the client's copy is only checksummed. A host pool's block is
  // written by the verifier as it checksums (streaming: the bytes are for the pool's readers).
  const absl::Status status = verifier_->FeedInto(
      data,
      [this](uint32_t block) {
        if (block < cached_blocks_) return BlockStreamVerifier::CopyTarget{};
        return BlockStreamVerifier::CopyTarget{
            .bytes = reinterpret_cast<char*>(
                hold_.pool->memory().MutableHostBlock(hold_.block_ids[block])),
            .stores = CopyStores::kStreaming};
      },
      [this](uint32_t block, uint64_t offset, absl::string_view piece) {
        if (block < cached_blocks_) return absl::OkStatus();
        return hold_.pool->WriteBlock(hold_.block_ids[block], offset, piece);
      });
  if (absl::IsDataLoss(status)) return absl::DataLossError(absl::StrCat("put: ", status.message()));
  return status;
}

absl::Status PutBlocksReactor::Complete() {
  if (hold_.pool == nullptr) return absl::InvalidArgumentError("put stream carried no header");
  if (verifier_->received_bytes() != verifier_->expected_bytes()) {
    return absl::DataLossError(absl::StrCat("put stream ended after ", verifier_->received_bytes(),
                                            " of ", verifier_->expected_bytes(), " bytes"));
  }
  // Nothing is published under a lease that has ended, even before its streams are told.
  if (hold_.lease->closed.load(std::memory_order_acquire)) return hold_.LeaseEnded("put");
  ASSIGN_OR_RETURN(
      CommitResult committed,
      hold_.pool->Commit(*hold_.transfer_session, hold_.sequence_id,
                         hold_.block_ids.size() * hold_.pool->options().layout.block_size,
                         part_masks_));
  hold_.pool->transfers().put_bytes.fetch_add(verifier_->received_bytes(),
                                              std::memory_order_relaxed);
  reply_.set_num_blocks(hold_.block_ids.size());
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
  if (hold_.pool == nullptr) {
    return request.has_header()
               ? Begin(request.header())
               : absl::InvalidArgumentError("the first message of a put must be its header");
  }
  if (request.has_header()) return absl::InvalidArgumentError("a put carries one header, first");
  if (split->field_size > verifier_->expected_bytes() - verifier_->received_bytes()) {
    return absl::InvalidArgumentError(
        absl::StrCat("put carries more than the ", verifier_->expected_bytes(), " bytes of its ",
                     hold_.block_ids.size() - first_block_, " blocks"));
  }
  for (absl::string_view piece : split->pieces) RETURN_IF_ERROR(Consume(piece));
  return absl::OkStatus();
}

void PutBlocksReactor::FinishWith(const absl::Status& status) {
  if (!TakeFinish()) return;  // the lease ended first, and its status went out
  if (!status.ok() && hold_.pool != nullptr) {
    hold_.pool->transfers().put_failures.fetch_add(1, std::memory_order_relaxed);
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
    manager_->quotas().Release(hold_.transfer_session->tenant, QuotaResource::kPutBytesInFlight,
                               put_bytes_reserved_);
    put_bytes_reserved_ = 0;
  }
  hold_.ReleaseSequence();
}

void PutBlocksReactor::OnDone() {
  hold_.Unbind(leases_);
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
    status = ParseByteBuffer(*request, &parsed);
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
  // A write may wait on a reader that stalls: only a cancellation ends it (the reader sees
  // CANCELLED); OnWriteDone then finishes, and OnDone releases the blocks.
  RETURN_IF_ERROR(hold_.Attach(manager_, leases_, request.session_id(), request.epoch(), principal,
                               [this] { context_->TryCancel(); }));
  ASSIGN_OR_RETURN(hold_.pool, manager_->FindPool(request.pool()));
  const uint32_t requested = request.max_chunk_bytes();
  chunk_bytes_ = std::clamp<uint32_t>(requested == 0 ? kDefaultChunkBytes : requested,
                                      kMinChunkBytes, max_chunk_bytes_);
  SequenceSpec spec{absl::MakeConstSpan(request.tokens().data(), request.tokens_size()),
                    request.cache_salt(), ToExtraKeys(request.extra_keys())};
  ASSIGN_OR_RETURN(spec.wanted_parts, WantedParts(hold_.pool->parts(), request.restore_parts()));
  ASSIGN_OR_RETURN(const uint32_t cached_tokens, hold_.OpenSequence(spec, OpenMode::kPinCached));
  block_bytes_ = hold_.pool->options().layout.BlockBytes();
  v1::GetBlocksResponse response;
  response.set_epoch(manager_->epoch());
  v1::GetBlocksHeader* header = response.mutable_header();
  header->set_num_blocks(hold_.block_ids.size());
  header->set_num_cached_tokens(cached_tokens);
  header->set_block_bytes(block_bytes_);
  for (BlockId block : hold_.block_ids) {
    ASSIGN_OR_RETURN(uint64_t checksum, hold_.pool->BlockChecksum(block));
    header->add_block_checksums(checksum);
  }
  header->mutable_part_masks()->Add(hold_.part_masks.begin(), hold_.part_masks.end());
  const std::string serialized = response.SerializeAsString();
  grpc::Slice slice(serialized);
  message_ = grpc::ByteBuffer(&slice, 1);
  return absl::OkStatus();
}

absl::Status GetBlocksReactor::WriteNextChunk() {
  const uint64_t total = block_bytes_ * hold_.block_ids.size();
  const uint64_t size = std::min<uint64_t>(chunk_bytes_, total - sent_);
  std::vector<grpc::Slice> slices;
  slices.push_back(DataFraming(manager_->epoch(), size));
  for (uint64_t filled = 0; filled < size;) {
    const size_t index = (sent_ + filled) / block_bytes_;
    const uint64_t offset = (sent_ + filled) % block_bytes_;
    const uint64_t piece = std::min(size - filled, block_bytes_ - offset);
    const uint8_t* host = hold_.pool->memory().HostBlock(hold_.block_ids[index]);
    if (host != nullptr) {
      // Static: gRPC neither frees nor copies it. The block stays pinned until OnDone.
      slices.emplace_back(host + offset, piece, grpc::Slice::STATIC_SLICE);
    } else {
      grpc_slice staged = grpc_slice_malloc(piece);
      const absl::Status read =
          hold_.pool->ReadBlock(hold_.block_ids[index], offset, piece,
                                reinterpret_cast<char*>(GRPC_SLICE_START_PTR(staged)));
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
  if (hold_.lease->closed.load(std::memory_order_acquire)) {
    Finish(ToGrpcStatus(hold_.LeaseEnded("get")));
    return;
  }
  if (!ok) {
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "get stream broken"));
    return;
  }
  if (sent_ == block_bytes_ * hold_.block_ids.size()) {
    completed_ = true;
    Finish(grpc::Status::OK);
    return;
  }
  if (absl::Status status = WriteNextChunk(); !status.ok()) Finish(ToGrpcStatus(status));
}

void GetBlocksReactor::OnDone() {
  hold_.Unbind(leases_);
  if (hold_.pool != nullptr) {
    hold_.pool->transfers().got_bytes.fetch_add(sent_, std::memory_order_relaxed);
    if (!completed_) hold_.pool->transfers().get_failures.fetch_add(1, std::memory_order_relaxed);
  }
  hold_.ReleaseSequence();
  delete this;
}

}  // namespace kvcache
