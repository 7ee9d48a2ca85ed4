// KvCacheClient's calls on pages named by the engine's keys (DESIGN §13): the unary page RPCs, with
// the batch's shape checked before it leaves and each page's XXH3-64 computed on the way out and
// verified on the way in, and the same-node helpers that copy pages through a mapped pool.
#include <google/protobuf/arena.h>

#include <algorithm>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "client/block_stream.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"
#include "client/mapped_pool_cuda.h"
#include "client/page_releases.h"
#include "client/proto_convert.h"
#include "common/block_checksum.h"
#include "common/rpc/bytes_field_split.h"
#include "common/status_macros.h"
#include "common/task_workers.h"
#include "kernels/page_checksum.h"

namespace kvcache {
namespace {

using Stub = v1::KvCache::StubInterface;

// The page calls that carry page bytes travel raw (RawSessionCall); methods and fields as in
// proto/kvcache/v1/kvcache.proto.
constexpr char kPutPagesMethod[] = "/kvcache.v1.KvCache/PutPages";
constexpr char kGetPagesMethod[] = "/kvcache.v1.KvCache/GetPages";

// INVALID_ARGUMENT unless there are `count` `what` (part masks, pages...) for `num_keys` keys.
absl::Status CheckOnePerKey(absl::string_view what, size_t count, size_t num_keys) {
  if (count == num_keys) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(count, " ", what, " for ", num_keys, " page keys; want one per key"));
}

// The daemon's first checks of a batch, made here so that a batch it would refuse never leaves:
// the keys, and part masks that are none or one per key.
absl::Status CheckPageBatch(absl::Span<const std::string> keys,
                            absl::Span<const uint32_t> part_masks) {
  RETURN_IF_ERROR(ValidatePageKeys(keys));
  return part_masks.empty() ? absl::OkStatus()
                            : CheckOnePerKey("part masks", part_masks.size(), keys.size());
}

template <typename Request>
void FillPageRequest(absl::string_view pool, absl::Span<const std::string> keys, Request* request) {
  request->set_pool(std::string(pool));
  request->mutable_keys()->Add(keys.begin(), keys.end());
}

template <typename Request>
void FillPageReadRequest(absl::string_view pool, absl::Span<const std::string> keys,
                         const PageReadOptions& options, Request* request) {
  FillPageRequest(pool, keys, request);
  request->mutable_parts()->Add(options.parts.begin(), options.parts.end());
  request->set_max_load_ms(options.max_load_ms);
}

// A reply of `num_pages` pages must carry one checksum and one part mask per page, and no more
// pages than keys were asked about.
absl::Status CheckPagesReply(absl::string_view call, size_t num_pages, size_t num_checksums,
                             size_t num_part_masks, size_t num_keys) {
  if (num_pages <= num_keys && num_checksums == num_pages && num_part_masks == num_pages) {
    return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat(call, ": inconsistent reply from the daemon: ", num_pages,
                                          " pages, ", num_checksums, " checksums and ",
                                          num_part_masks, " part masks for ", num_keys, " keys"));
}

// DATA_LOSS naming page `index` and its key (escaped: keys are opaque bytes).
absl::Status PageChecksumMismatch(absl::string_view call, size_t index, absl::string_view key) {
  return absl::DataLossError(absl::StrCat(call, ": page ", index, " (key \"", absl::CHexEscape(key),
                                          "\") does not match its checksum"));
}

// The engine's side of a page call through a device mapping (`pages`: string_views or spans of
// device addresses the kernel reads or writes): none null, each 16-byte aligned
// (INVALID_ARGUMENT naming the page).
template <typename Pages>
absl::Status CheckDevicePages(const char* call, const Pages& pages, uint64_t page_bytes) {
  std::vector<kernels::PageCopy> copies;
  copies.reserve(pages.size());
  for (const auto& page : pages) {
    copies.push_back({reinterpret_cast<const uint8_t*>(page.data()), nullptr});
  }
  const absl::Status valid = kernels::ValidatePageCopies(copies, page_bytes);
  if (valid.ok()) return valid;
  return absl::Status(valid.code(), absl::StrCat(call, ": ", valid.message()));
}

// A reserved or acquired block's address in the mapping (device or host), after checking that
// the daemon's id is in the pool.
absl::StatusOr<uint8_t*> MappedBlock(const char* call, const MappedPool& mapped, uint32_t block) {
  if (block >= mapped.num_blocks()) {
    return absl::OutOfRangeError(
        absl::StrCat(call, ": block ", block, " is past pool '", mapped.name(), "'"));
  }
  return mapped.Block(block);
}

}  // namespace

absl::StatusOr<KvCacheClient::PagesFound> KvCacheClient::ExistsPages(
    absl::string_view pool, absl::Span<const std::string> keys,
    absl::Span<const std::string> parts) {
  RETURN_IF_ERROR(CheckPageBatch(keys, {}));
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("ExistsPages"));
  // On an arena: up to thousands of keys, each a string of its own, allocated and freed at once
  // (a malloc and a free per key took ~12% of this client's samples).
  google::protobuf::Arena arena;
  auto* request = google::protobuf::Arena::CreateMessage<v1::ExistsPagesRequest>(&arena);
  FillPageRequest(pool, keys, request);
  request->mutable_parts()->Add(parts.begin(), parts.end());
  v1::ExistsPagesResponse response;
  RETURN_IF_ERROR(SessionCall(&Stub::ExistsPages, "ExistsPages", session, request, &response));
  return PagesFound{.num_pages = response.num_pages(),
                    .pages_by_tier = ToTierPages(response.pages_by_tier())};
}

absl::StatusOr<KvCacheClient::PageReservation> KvCacheClient::ReservePages(
    absl::string_view pool, absl::Span<const std::string> keys,
    absl::Span<const uint32_t> part_masks) {
  RETURN_IF_ERROR(CheckPageBatch(keys, part_masks));
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("ReservePages"));
  v1::ReservePagesRequest request;
  FillPageRequest(pool, keys, &request);
  request.mutable_part_masks()->Add(part_masks.begin(), part_masks.end());
  v1::ReservePagesResponse response;
  RETURN_IF_ERROR(SessionCall(&Stub::ReservePages, "ReservePages", session, &request, &response));
  if (static_cast<size_t>(response.block_ids_size()) != keys.size()) {
    return absl::InternalError(absl::StrCat(
        "ReservePages: inconsistent reply from the daemon: ", response.block_ids_size(),
        " block ids for ", keys.size(), " keys"));
  }
  return PageReservation{.sequence_id = response.sequence_id(),
                         .block_ids = ToVector(response.block_ids())};
}

absl::StatusOr<KvCacheClient::PagesStored> KvCacheClient::CommitPages(
    uint64_t sequence_id, absl::Span<const uint64_t> page_checksums) {
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("CommitPages"));
  v1::CommitPagesRequest request;
  request.set_sequence_id(sequence_id);
  request.mutable_page_checksums()->Add(page_checksums.begin(), page_checksums.end());
  v1::CommitPagesResponse response;
  RETURN_IF_ERROR(SessionCall(&Stub::CommitPages, "CommitPages", session, &request, &response));
  return PagesStored{.num_published = response.num_published(),
                     .num_duplicates = response.num_duplicates()};
}

absl::StatusOr<KvCacheClient::AcquiredPages> KvCacheClient::AcquirePages(
    absl::string_view pool, absl::Span<const std::string> keys, const PageReadOptions& options) {
  RETURN_IF_ERROR(CheckPageBatch(keys, {}));
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("AcquirePages"));
  v1::AcquirePagesRequest request;
  FillPageReadRequest(pool, keys, options, &request);
  v1::AcquirePagesResponse response;
  RETURN_IF_ERROR(SessionCall(&Stub::AcquirePages, "AcquirePages", session, &request, &response));
  const absl::Status consistent =
      CheckPagesReply("AcquirePages", response.block_ids_size(), response.page_checksums_size(),
                      response.part_masks_size(), keys.size());
  if (!consistent.ok()) {
    ReleaseSequence(response.sequence_id()).IgnoreError();  // the reply is unusable: unpin
    return consistent;
  }
  return AcquiredPages{.sequence_id = response.sequence_id(),
                       .block_ids = ToVector(response.block_ids()),
                       .page_checksums = std::vector<uint64_t>(response.page_checksums().begin(),
                                                               response.page_checksums().end()),
                       .part_masks = ToVector(response.part_masks()),
                       .pages_by_tier = ToTierPages(response.pages_by_tier())};
}

absl::Status KvCacheClient::RawSessionCall(
    const char* method, const char* name, const SessionRef& session,
    absl::FunctionRef<grpc::ByteBuffer(BlockStream& stream)> request,
    absl::FunctionRef<absl::StatusOr<uint64_t>(const grpc::ByteBuffer& reply)> read_reply) {
  BlockStream stream(&generic_stub_, method, [&](grpc::ClientContext* context) {
    PrepareContext(context, options_.rpc_timeout);
  });
  // If the write fails, so does the Read, and Finish says why.
  stream.WriteLast(request(stream));
  // The reply (absent after an error) must be read before Finish: gRPC hands out the status only
  // once every message that came before it was read.
  grpc::ByteBuffer reply;
  const bool replied = stream.Read(&reply);
  const grpc::Status status = stream.Finish();
  uint64_t reply_epoch = session.epoch;
  if (status.ok()) {
    if (!replied) return absl::InternalError(absl::StrCat(name, ": the daemon sent no reply"));
    ASSIGN_OR_RETURN(reply_epoch, read_reply(reply));
  }
  return CheckReply(name, stream.context(), status, reply_epoch, session, true);
}

// Written raw: each page goes as its field's tag and length, then a slice lent from `pages`, so
// the bytes are not copied into the message first.
absl::StatusOr<KvCacheClient::PagesStored> KvCacheClient::PutPages(
    absl::string_view pool, absl::Span<const std::string> keys,
    absl::Span<const absl::string_view> pages, absl::Span<const uint32_t> part_masks) {
  RETURN_IF_ERROR(CheckPageBatch(keys, part_masks));
  RETURN_IF_ERROR(CheckOnePerKey("pages", pages.size(), keys.size()));
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("PutPages"));
  v1::PutPagesRequest request;  // every field but the pages
  StampSession(session, &request);
  FillPageRequest(pool, keys, &request);
  request.mutable_part_masks()->Add(part_masks.begin(), part_masks.end());
  std::vector<uint64_t> checksums(pages.size());
  uint64_t bytes = 0;
  for (const absl::string_view page : pages) bytes += page.size();
  RunOnPages(pages.size(), bytes, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      checksums[i] = BlockChecksum(pages[i].data(), pages[i].size());
    }
  });
  request.mutable_page_checksums()->Add(checksums.begin(), checksums.end());
  v1::PutPagesResponse response;
  RETURN_IF_ERROR(RawSessionCall(
      kPutPagesMethod, "PutPages", session,
      [&](BlockStream& stream) {
        std::vector<grpc::Slice> slices;
        slices.reserve(1 + 2 * pages.size());
        slices.emplace_back(request.SerializeAsString());
        for (const absl::string_view page : pages) {
          slices.emplace_back(
              BytesFieldPrefix(v1::PutPagesRequest::kPagesFieldNumber, page.size()));
          slices.push_back(stream.Lend(page.data(), page.size()));
        }
        return grpc::ByteBuffer(slices.data(), slices.size());
      },
      [&](const grpc::ByteBuffer& reply) -> absl::StatusOr<uint64_t> {
        if (!ParseByteBuffer(reply, &response).ok()) {
          return absl::InternalError("PutPages: the daemon's reply is not a PutPagesResponse");
        }
        return response.epoch();
      }));
  return PagesStored{.num_published = response.num_published(),
                     .num_duplicates = response.num_duplicates()};
}

// Read raw: each page is checksummed while it is copied, once, from the received slices into its
// string, instead of being parsed into the message and read again for its checksum.
absl::StatusOr<KvCacheClient::GotPages> KvCacheClient::GetPages(absl::string_view pool,
                                                                absl::Span<const std::string> keys,
                                                                const PageReadOptions& options) {
  RETURN_IF_ERROR(CheckPageBatch(keys, {}));
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("GetPages"));
  v1::GetPagesRequest request;
  StampSession(session, &request);
  FillPageReadRequest(pool, keys, options, &request);
  v1::GetPagesResponse response;  // every field but the pages
  SplitMessage split;
  RETURN_IF_ERROR(RawSessionCall(
      kGetPagesMethod, "GetPages", session,
      [&](BlockStream&) {
        grpc::Slice serialized(request.SerializeAsString());
        return grpc::ByteBuffer(&serialized, 1);
      },
      [&](const grpc::ByteBuffer& reply) -> absl::StatusOr<uint64_t> {
        absl::StatusOr<SplitMessage> pages =
            SplitBytesField(reply, v1::GetPagesResponse::kPagesFieldNumber);
        if (!pages.ok() || !response.ParseFromString(pages->rest)) {
          return absl::InternalError("GetPages: the daemon's reply is not a GetPagesResponse");
        }
        split = *std::move(pages);
        return response.epoch();
      }));
  const std::vector<SplitMessage::Value>& pages = split.values;
  RETURN_IF_ERROR(CheckPagesReply("GetPages", pages.size(), response.page_checksums_size(),
                                  response.part_masks_size(), keys.size()));
  GotPages got{.part_masks = ToVector(response.part_masks()),
               .pages_by_tier = ToTierPages(response.pages_by_tier())};
  got.pages.resize(pages.size());
  for (size_t i = 0; i < pages.size(); ++i) {
    std::string& page = got.pages[i];
    const uint64_t checksum = response.page_checksums(static_cast<int>(i));
    if (pages[i].size == 0) {  // the verifier checks blocks of at least a byte
      if (BlockChecksum(page.data(), 0) != checksum)
        return PageChecksumMismatch("GetPages", i, keys[i]);
      continue;
    }
    page.reserve(pages[i].size);
    BlockStreamVerifier verifier(pages[i].size, {checksum});
    for (const absl::string_view piece : pages[i].pieces) {
      const absl::Status copied = verifier.Feed(
          piece,
          [&page](uint32_t, uint64_t, absl::string_view part) {
            page.append(part.data(), part.size());
            return absl::OkStatus();
          },
          BlockStreamVerifier::Pieces::kCacheSized);
      if (!copied.ok()) return PageChecksumMismatch("GetPages", i, keys[i]);
    }
  }
  return got;
}

absl::StatusOr<uint32_t> KvCacheClient::PinPages(absl::string_view pool,
                                                 absl::Span<const std::string> keys,
                                                 absl::Duration ttl, uint32_t priority) {
  RETURN_IF_ERROR(CheckPageBatch(keys, {}));
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("PinPages"));
  v1::PinPagesRequest request;
  FillPageRequest(pool, keys, &request);
  // Clamped, not wrapped: a TTL past what the field holds is still one the daemon refuses.
  request.set_ttl_ms(static_cast<uint32_t>(std::clamp<int64_t>(
      absl::ToInt64Milliseconds(ttl), 0, std::numeric_limits<uint32_t>::max())));
  request.set_priority(priority);
  v1::PinPagesResponse response;
  RETURN_IF_ERROR(SessionCall(&Stub::PinPages, "PinPages", session, &request, &response));
  return response.num_pages();
}

absl::Status KvCacheClient::CheckMappedPages(const char* call, const MappedPool& mapped,
                                             size_t num_keys,
                                             absl::Span<const size_t> page_sizes) const {
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession(call));
  if (mapped.is_device()) {
    if (const absl::Status pages = kernels::CheckChecksummedPageBytes(mapped.block_bytes());
        !pages.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat(call, ": pool '", mapped.name(), "' is device memory, and its ",
                       pages.message(), " (PutPages and GetPages serve it)"));
    }
  }
  if (mapped.epoch() != session.epoch) {
    return absl::FailedPreconditionError(absl::StrCat(
        call, ": pool '", mapped.name(), "' was mapped at daemon epoch ", mapped.epoch(),
        " but the session is of epoch ", session.epoch, ": map the pool again"));
  }
  RETURN_IF_ERROR(CheckOnePerKey("pages", page_sizes.size(), num_keys));
  for (size_t i = 0; i < page_sizes.size(); ++i) {
    if (page_sizes[i] != mapped.block_bytes()) {
      return absl::InvalidArgumentError(absl::StrCat(call, ": page ", i, " has ", page_sizes[i],
                                                     " bytes; pool '", mapped.name(),
                                                     "' pages have ", mapped.block_bytes()));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<KvCacheClient::PagesStored> KvCacheClient::WritePages(
    const MappedPool& mapped, absl::Span<const std::string> keys,
    absl::Span<const absl::string_view> pages, absl::Span<const uint32_t> part_masks) {
  RETURN_IF_ERROR(CheckPageBatch(keys, part_masks));
  std::vector<size_t> sizes;
  sizes.reserve(pages.size());
  for (const absl::string_view page : pages) sizes.push_back(page.size());
  RETURN_IF_ERROR(CheckMappedPages("WritePages", mapped, keys.size(), sizes));
  if (mapped.is_device()) {
    RETURN_IF_ERROR(CheckDevicePages("WritePages", pages, mapped.block_bytes()));
  }
  if (!mapped.is_device()) ReadyPageCopyThreads(uint64_t{keys.size()} * mapped.block_bytes());
  ASSIGN_OR_RETURN(const PageReservation reservation,
                   ReservePages(mapped.name(), keys, part_masks));
  absl::Status written = absl::OkStatus();
  // Each page is checksummed while it is copied in, so the daemon need not read the pages back to
  // checksum them. On the host the copy streams (common/streaming_copy.h): the pool's blocks are
  // for other processes and not in this one's cache, and a plain copy read each line of them in
  // before writing it. On a device one kernel copies and checksums the whole batch.
  std::vector<kernels::PageCopy> copies;
  copies.reserve(keys.size());
  for (size_t i = 0; i < keys.size() && written.ok(); ++i) {
    if (reservation.block_ids[i] == kDuplicatePage) continue;
    absl::StatusOr<uint8_t*> block = MappedBlock("WritePages", mapped, reservation.block_ids[i]);
    written = block.status();
    if (written.ok()) copies.push_back({reinterpret_cast<const uint8_t*>(pages[i].data()), *block});
  }
  std::vector<uint64_t> checksums(copies.size());
  if (written.ok() && mapped.is_device()) {
    written = mapped_pool_internal::CopyPagesChecksummed(
        mapped.device(), copies, mapped.block_bytes(), absl::MakeSpan(checksums));
  } else if (written.ok()) {
    CopyHostPages(copies, mapped.block_bytes(), CopyStores::kStreaming, absl::MakeSpan(checksums));
  }
  if (written.ok()) {
    absl::StatusOr<PagesStored> committed = CommitPages(reservation.sequence_id, checksums);
    if (committed.ok()) return committed;
    written = committed.status();
  }
  // Nothing published; give the blocks back now rather than when the session ends (a reservation
  // a failed commit ended already answers NOT_FOUND).
  ReleaseSequence(reservation.sequence_id).IgnoreError();
  return written;
}

absl::StatusOr<KvCacheClient::PagesRead> KvCacheClient::ReadPagesInto(
    const MappedPool& mapped, absl::Span<const std::string> keys,
    absl::Span<const absl::Span<char>> destinations, const PageReadOptions& options) {
  RETURN_IF_ERROR(CheckPageBatch(keys, {}));
  std::vector<size_t> sizes;
  sizes.reserve(destinations.size());
  for (const absl::Span<char> destination : destinations) sizes.push_back(destination.size());
  RETURN_IF_ERROR(CheckMappedPages("ReadPagesInto", mapped, keys.size(), sizes));
  if (mapped.is_device()) {
    RETURN_IF_ERROR(CheckDevicePages("ReadPagesInto", destinations, mapped.block_bytes()));
  }
  if (!mapped.is_device()) ReadyPageCopyThreads(uint64_t{keys.size()} * mapped.block_bytes());
  ASSIGN_OR_RETURN(AcquiredPages acquired, AcquirePages(mapped.name(), keys, options));
  absl::Status read = absl::OkStatus();
  // One pass over the shared page: the bytes checked are the bytes copied.
  std::vector<kernels::PageCopy> copies;
  copies.reserve(acquired.block_ids.size());
  for (size_t i = 0; i < acquired.block_ids.size() && read.ok(); ++i) {
    absl::StatusOr<uint8_t*> block = MappedBlock("ReadPagesInto", mapped, acquired.block_ids[i]);
    read = block.status();
    if (read.ok()) copies.push_back({*block, reinterpret_cast<uint8_t*>(destinations[i].data())});
  }
  std::vector<uint64_t> checksums(copies.size());
  if (read.ok() && mapped.is_device()) {
    read = mapped_pool_internal::CopyPagesChecksummed(mapped.device(), copies, mapped.block_bytes(),
                                                      absl::MakeSpan(checksums));
  } else if (read.ok()) {
    CopyHostPages(copies, mapped.block_bytes(), CopyStores::kCached, absl::MakeSpan(checksums));
  }
  for (size_t i = 0; i < checksums.size() && read.ok(); ++i) {
    if (checksums[i] != acquired.page_checksums[i]) {
      read = PageChecksumMismatch("ReadPagesInto", i, keys[i]);
    }
  }
  if (!read.ok()) {
    ReleaseSequence(acquired.sequence_id).IgnoreError();  // the read's error is the answer
    return read;
  }
  page_releases_->Send(CurrentSession(), acquired.sequence_id);
  return PagesRead{.num_pages = static_cast<uint32_t>(acquired.block_ids.size()),
                   .part_masks = std::move(acquired.part_masks),
                   .pages_by_tier = acquired.pages_by_tier};
}

void KvCacheClient::AwaitReleases() { page_releases_->Await(); }

void KvCacheClient::CopyHostPages(absl::Span<const kernels::PageCopy> copies, uint64_t page_bytes,
                                  CopyStores stores, absl::Span<uint64_t> checksums) {
  RunOnPages(copies.size(), copies.size() * page_bytes, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      checksums[i] =
          ChecksumWhileCopying(copies[i].destination, copies[i].source, page_bytes, stores);
    }
  });
}

void KvCacheClient::RunOnPages(size_t count, uint64_t bytes,
                               absl::FunctionRef<void(size_t begin, size_t end)> run) {
  TaskWorkers* workers = bytes < kParallelCopyBytes ? nullptr : PageCopyWorkers();
  RunInSlices(workers, count, workers == nullptr ? 1 : workers->threads() + 1, run);
}

void KvCacheClient::ReadyPageCopyThreads(uint64_t bytes) {
  if (bytes < kParallelCopyBytes) return;
  if (TaskWorkers* workers = PageCopyWorkers(); workers != nullptr) {
    workers->ExpectWork(kCopyThreadsReadyFor);
  }
}

TaskWorkers* KvCacheClient::PageCopyWorkers() {
  absl::call_once(page_copy_workers_started_, [this] {
    int threads = options_.page_copy_threads;
    if (threads < 0) {
      threads = std::clamp(static_cast<int>(std::thread::hardware_concurrency()) - 1, 0, 3);
    }
    // No spinning: a batch hands out all its slices at once.
    if (threads > 0) {
      page_copy_workers_ = std::make_unique<TaskWorkers>(threads, absl::ZeroDuration());
    }
  });
  return page_copy_workers_.get();
}

KvCacheClient::PageReleases::~PageReleases() {
  std::thread thread;
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    // The client closes its session next, which releases these; sending them first could wait
    // out a deadline each on a daemon that does not answer.
    unanswered_ -= queued_.size();
    queued_.clear();
    if (in_flight_ != nullptr) in_flight_->TryCancel();
    thread = std::move(thread_);
  }
  if (thread.joinable()) thread.join();
}

void KvCacheClient::PageReleases::Send(const SessionRef& session, uint64_t sequence_id) {
  absl::MutexLock lock(&mu_);
  queued_.emplace_back(session, sequence_id);
  ++unanswered_;
  if (!thread_.joinable()) thread_ = std::thread(&PageReleases::Loop, this);
}

void KvCacheClient::PageReleases::Await() {
  mu_.LockWhen(absl::Condition(
      +[](uint64_t* unanswered) { return *unanswered == 0; }, &unanswered_));
  mu_.Unlock();
}

void KvCacheClient::PageReleases::Loop() {
  const auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !queued_.empty();
  };
  mu_.Lock();
  while (true) {
    mu_.Await(absl::Condition(&ready));
    if (stopping_) break;
    const auto [session, sequence_id] = queued_.front();
    queued_.pop_front();
    v1::ReleaseSequenceRequest request;
    request.set_sequence_id(sequence_id);
    StampSession(session, &request);
    v1::ReleaseSequenceResponse response;
    grpc::ClientContext context;
    client_->PrepareContext(&context, client_->options_.rpc_timeout);
    in_flight_ = &context;
    mu_.Unlock();
    // Whatever the answer: see the class comment.
    client_->stub_->ReleaseSequence(&context, request, &response);
    mu_.Lock();
    in_flight_ = nullptr;
    --unanswered_;
  }
  mu_.Unlock();
}

}  // namespace kvcache
