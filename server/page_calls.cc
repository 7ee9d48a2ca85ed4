// KvCacheService's calls on pages named by an engine's keys (DESIGN §13): each resolves the
// session and pool, converts the request and answers with Pool's page operations. PutPages and
// GetPages carry the bytes for clients on another node; the same-node calls hand out block ids
// in the pool the caller maps.
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cache/pool.h"
#include "common/block_checksum.h"
#include "common/rpc/bytes_field_split.h"
#include "common/status_macros.h"
#include "common/task_workers.h"
#include "server/kv_cache_service.h"
#include "server/proto_convert.h"
#include "server/unary_call.h"

namespace kvcache {
namespace {

std::vector<std::string> KeysOf(const google::protobuf::RepeatedPtrField<std::string>& keys) {
  return std::vector<std::string>(keys.begin(), keys.end());
}

// Counts `pages` of `op` in the session's namespace (the metrics' kvcache_pages_total).
void CountPages(Pool& pool, const Session& session, PageOp op, uint64_t pages) {
  // Every page call that got this far has a manifest: pages need one.
  if (session.manifest == nullptr) return;
  pool.page_counters().Count(
      session.tenant, session.manifest->Digest(pool.options().hash_algorithm).ToHex(), op, pages);
}

void CountServed(Pool& pool, const Session& session, size_t asked, size_t served) {
  CountPages(pool, session, PageOp::kHit, served);
  CountPages(pool, session, PageOp::kMiss, asked - served);
}

void CountCommitted(Pool& pool, const Session& session, const CommittedPages& committed) {
  CountPages(pool, session, PageOp::kPublished, committed.num_published);
  CountPages(pool, session, PageOp::kDuplicate, committed.num_duplicates);
}

// What a page read (AcquirePages, GetPages) works on: its session and pool, and the pages the
// hit rule gave, pinned by acquired.sequence_id.
struct PageRead {
  std::shared_ptr<Session> session;
  Pool* pool = nullptr;
  AcquiredPages acquired;
};

template <typename Request>
absl::StatusOr<PageRead> AcquireFor(CacheManager& manager, const Identity& caller,
                                    const Request& request) {
  PageRead read;
  ASSIGN_OR_RETURN(read.session,
                   manager.SessionFor(request.session_id(), request.epoch(), caller.principal));
  ASSIGN_OR_RETURN(read.pool, manager.FindPool(request.pool()));
  ASSIGN_OR_RETURN(const uint32_t wanted, WantedParts(read.pool->parts(), request.parts()));
  ASSIGN_OR_RETURN(read.acquired, read.pool->AcquirePages(*read.session, KeysOf(request.keys()),
                                                          wanted, request.max_load_ms()));
  return read;
}

// A page read's answer besides the pages: their parts and tiers; counted as hits and misses.
template <typename Response>
void FillRead(const PageRead& read, int asked, Response* response) {
  const AcquiredPages& acquired = read.acquired;
  response->mutable_part_masks()->Add(acquired.part_masks.begin(), acquired.part_masks.end());
  FillTiers(acquired.by_tier, response->mutable_pages_by_tier());
  CountServed(*read.pool, *read.session, asked, acquired.block_ids.size());
}

// Pages [begin, end) of a PutPages into their reserved blocks (none for a duplicate: checked,
// not copied), each checksummed while it is copied; the first that failed, with its error.
struct PageCopyFailure {
  size_t page = SIZE_MAX;
  absl::Status status;
};
PageCopyFailure CopyVerifiedPages(Pool& pool, const std::vector<SplitMessage::Value>& pages,
                                  absl::Span<const BlockId> blocks,
                                  absl::Span<const uint64_t> checksums, size_t begin, size_t end) {
  BlockStreamVerifier verifier(
      pool.options().layout.BlockBytes(),
      std::vector<uint64_t>(checksums.begin() + begin, checksums.begin() + end));
  for (size_t i = begin; i < end; ++i) {
    const BlockId block = blocks[i];
    absl::Status write_failed = absl::OkStatus();  // else the verifier's error: a mismatch
    absl::Status fed = absl::OkStatus();
    for (const absl::string_view piece : pages[i].pieces) {
      fed = verifier.FeedInto(
          piece,
          [&](uint32_t) {
            if (block == kNoBlock) return BlockStreamVerifier::CopyTarget{};
            return BlockStreamVerifier::CopyTarget{
                .bytes = reinterpret_cast<char*>(pool.memory().MutableHostBlock(block)),
                .stores = CopyStores::kStreaming};
          },
          [&](uint32_t, uint64_t offset, absl::string_view part) {
            if (block != kNoBlock) write_failed = pool.WriteBlock(block, offset, part);
            return write_failed;
          });
      if (!fed.ok()) break;
    }
    if (!fed.ok()) {
      return {.page = i,
              .status = !write_failed.ok() ? write_failed
                                           : absl::DataLossError(absl::StrCat(
                                                 "page ", i, " does not match its checksum"))};
    }
  }
  return {};
}

}  // namespace

grpc::ServerUnaryReactor* KvCacheService::ExistsPages(grpc::CallbackServerContext* context,
                                                      const v1::ExistsPagesRequest* request,
                                                      v1::ExistsPagesResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "ExistsPages", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(auto session, manager_->SessionFor(request->session_id(), request->epoch(),
                                                            caller.principal));
        ASSIGN_OR_RETURN(Pool * pool, manager_->FindPool(request->pool()));
        ASSIGN_OR_RETURN(const uint32_t wanted, WantedParts(pool->parts(), request->parts()));
        ASSIGN_OR_RETURN(PagesFound found,
                         pool->ExistsPages(*session, KeysOf(request->keys()), wanted));
        response->set_num_pages(found.num_pages);
        FillTiers(found.by_tier, response->mutable_pages_by_tier());
        CountPages(*pool, *session, PageOp::kExists, found.num_pages);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::ReservePages(grpc::CallbackServerContext* context,
                                                       const v1::ReservePagesRequest* request,
                                                       v1::ReservePagesResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "ReservePages", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(auto session, manager_->SessionFor(request->session_id(), request->epoch(),
                                                            caller.principal));
        ASSIGN_OR_RETURN(Pool * pool, manager_->FindPool(request->pool()));
        ASSIGN_OR_RETURN(ReservedPages reserved,
                         pool->ReservePages(*session, KeysOf(request->keys()),
                                            absl::MakeConstSpan(request->part_masks().data(),
                                                                request->part_masks_size())));
        response->set_sequence_id(reserved.sequence_id);
        response->mutable_block_ids()->Add(reserved.block_ids.begin(), reserved.block_ids.end());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::CommitPages(grpc::CallbackServerContext* context,
                                                      const v1::CommitPagesRequest* request,
                                                      v1::CommitPagesResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "CommitPages", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(auto session, manager_->SessionFor(request->session_id(), request->epoch(),
                                                            caller.principal));
        ASSIGN_OR_RETURN(Pool * pool, manager_->PoolOfSequence(request->sequence_id()));
        ASSIGN_OR_RETURN(CommittedPages committed,
                         pool->CommitPages(*session, request->sequence_id(),
                                           absl::MakeConstSpan(request->page_checksums().data(),
                                                               request->page_checksums_size())));
        response->set_num_published(committed.num_published);
        response->set_num_duplicates(committed.num_duplicates);
        CountCommitted(*pool, *session, committed);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::AcquirePages(grpc::CallbackServerContext* context,
                                                       const v1::AcquirePagesRequest* request,
                                                       v1::AcquirePagesResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "AcquirePages", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(const PageRead read, AcquireFor(*manager_, caller, *request));
        for (BlockId block : read.acquired.block_ids) {
          const absl::StatusOr<uint64_t> checksum = read.pool->BlockChecksum(block);
          if (!checksum.ok()) {
            read.pool->Release(*read.session, read.acquired.sequence_id).IgnoreError();
            return checksum.status();
          }
          response->add_page_checksums(*checksum);
        }
        response->set_sequence_id(read.acquired.sequence_id);
        response->mutable_block_ids()->Add(read.acquired.block_ids.begin(),
                                           read.acquired.block_ids.end());
        FillRead(read, request->keys_size(), response);
        return absl::OkStatus();
      });
}

// Served raw: the pages come as views into the received slices (SplitBytesField) and go from
// there into pool memory, rather than being parsed into strings first.
grpc::ServerUnaryReactor* KvCacheService::PutPages(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw_request,
                                                   grpc::ByteBuffer* raw_response) {
  return HandleRawUnary<v1::PutPagesResponse>(
      *this, context, raw_response, manager_->epoch(), "PutPages", Role::kWorker,
      [&](const Identity& caller, v1::PutPagesResponse* response, std::vector<grpc::Slice>*,
          std::function<void()>*) -> absl::Status {
        ASSIGN_OR_RETURN(const SplitMessage split,
                         SplitBytesField(*raw_request, v1::PutPagesRequest::kPagesFieldNumber));
        v1::PutPagesRequest request;
        if (!request.ParseFromString(split.rest)) {
          return absl::InvalidArgumentError("request is not a valid PutPagesRequest");
        }
        const std::vector<SplitMessage::Value>& pages = split.values;
        ASSIGN_OR_RETURN(auto session, manager_->SessionFor(request.session_id(), request.epoch(),
                                                            caller.principal));
        ASSIGN_OR_RETURN(Pool * pool, manager_->FindPool(request.pool()));
        const std::vector<std::string> keys = KeysOf(request.keys());
        RETURN_IF_ERROR(ValidatePageKeys(keys));
        const uint64_t page_bytes = pool->options().layout.BlockBytes();
        if (pages.size() != keys.size() || request.page_checksums_size() != request.keys_size()) {
          return absl::InvalidArgumentError(
              absl::StrCat(request.keys_size(), " keys but ", pages.size(), " pages and ",
                           request.page_checksums_size(), " checksums; want one of each per key"));
        }
        for (size_t i = 0; i < pages.size(); ++i) {
          if (pages[i].size != page_bytes) {
            return absl::InvalidArgumentError(absl::StrCat("page ", i, " has ", pages[i].size,
                                                           " bytes; pool '", request.pool(),
                                                           "' pages have ", page_bytes));
          }
        }
        ASSIGN_OR_RETURN(ReservedPages reserved,
                         pool->ReservePages(*session, keys,
                                            absl::MakeConstSpan(request.part_masks().data(),
                                                                request.part_masks_size())));
        // Each page is checksummed while it is copied into its block (a host pool's from the
        // copy's own registers, a device pool's a cache-sized piece at a time), so its bytes are
        // read from memory once (a separate pass before the copy cost as much as the copy). A
        // host pool's batch of kSlicedCopyMinBytes or more is cut into slices, the later ones
        // copied on the pool's workers. A page that does not match ends the put before its
        // commit: the reservation is released and nothing is published. Duplicates are checked,
        // not copied.
        const std::vector<uint64_t> checksums(request.page_checksums().begin(),
                                              request.page_checksums().end());
        TaskWorkers* workers = pool->options().workers.get();
        if (pool->memory().HostBlock(0) == nullptr ||
            uint64_t{pages.size()} * page_bytes < kSlicedCopyMinBytes) {
          workers = nullptr;
        }
        absl::Mutex failure_mu;
        PageCopyFailure failure;  // the first page that failed, over every slice
        RunInSlices(workers, pages.size(), workers == nullptr ? 1 : workers->threads() + 1,
                    [&](size_t begin, size_t end) {
                      PageCopyFailure failed = CopyVerifiedPages(*pool, pages, reserved.block_ids,
                                                                 checksums, begin, end);
                      if (failed.status.ok()) return;
                      absl::MutexLock lock(&failure_mu);
                      if (failed.page < failure.page) failure = std::move(failed);
                    });
        if (!failure.status.ok()) {
          pool->Release(*session, reserved.sequence_id).IgnoreError();
          return failure.status;
        }
        std::vector<uint64_t> verified;
        for (size_t i = 0; i < pages.size(); ++i) {
          if (reserved.block_ids[i] != kNoBlock) verified.push_back(checksums[i]);
        }
        ASSIGN_OR_RETURN(CommittedPages committed,
                         pool->CommitPages(*session, reserved.sequence_id, verified));
        response->set_num_published(committed.num_published);
        response->set_num_duplicates(committed.num_duplicates);
        CountCommitted(*pool, *session, committed);
        return absl::OkStatus();
      });
}

// Served raw: the reply's pages are slices of the pool's own memory (host pools; a device pool's
// are copied once into slices of their own), pinned until gRPC is done sending them, rather than
// copied into zeroed strings and again into the serialized reply.
grpc::ServerUnaryReactor* KvCacheService::GetPages(grpc::CallbackServerContext* context,
                                                   const grpc::ByteBuffer* raw_request,
                                                   grpc::ByteBuffer* raw_response) {
  return HandleRawUnary<v1::GetPagesResponse>(
      *this, context, raw_response, manager_->epoch(), "GetPages", Role::kWorker,
      [&](const Identity& caller, v1::GetPagesResponse* response, std::vector<grpc::Slice>* pages,
          std::function<void()>* on_done) -> absl::Status {
        v1::GetPagesRequest request;
        RETURN_IF_ERROR(ParseByteBuffer(*raw_request, &request));
        ASSIGN_OR_RETURN(const PageRead read, AcquireFor(*manager_, caller, request));
        const uint64_t page_bytes = read.pool->options().layout.BlockBytes();
        const std::string prefix =
            BytesFieldPrefix(v1::GetPagesResponse::kPagesFieldNumber, page_bytes);
        absl::Status copied = absl::OkStatus();
        pages->reserve(2 * read.acquired.block_ids.size());
        for (BlockId block : read.acquired.block_ids) {
          const absl::StatusOr<uint64_t> checksum = read.pool->BlockChecksum(block);
          copied = checksum.status();
          if (!copied.ok()) break;
          response->add_page_checksums(*checksum);
          pages->emplace_back(prefix);
          if (const uint8_t* host = read.pool->memory().HostBlock(block); host != nullptr) {
            // Static: gRPC neither frees nor copies it. The page stays pinned until on_done.
            pages->emplace_back(host, page_bytes, grpc::Slice::STATIC_SLICE);
            continue;
          }
          // Owned at once, so that a failed read frees it.
          grpc::Slice page(grpc_slice_malloc(page_bytes), grpc::Slice::STEAL_REF);
          copied = read.pool->ReadBlock(
              block, 0, page_bytes, reinterpret_cast<char*>(const_cast<uint8_t*>(page.begin())));
          if (!copied.ok()) break;
          pages->push_back(std::move(page));
        }
        const auto release = [pool = read.pool, session = read.session,
                              sequence_id = read.acquired.sequence_id] {
          pool->Release(*session, sequence_id).IgnoreError();
        };
        if (!copied.ok()) {
          release();
          return copied;
        }
        *on_done = release;
        FillRead(read, request.keys_size(), response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::PinPages(grpc::CallbackServerContext* context,
                                                   const v1::PinPagesRequest* request,
                                                   v1::PinPagesResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "PinPages", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(auto session, manager_->SessionFor(request->session_id(), request->epoch(),
                                                            caller.principal));
        ASSIGN_OR_RETURN(Pool * pool, manager_->FindPool(request->pool()));
        ASSIGN_OR_RETURN(
            const uint32_t pinned,
            pool->PinPages(*session, KeysOf(request->keys()), absl::Milliseconds(request->ttl_ms()),
                           request->priority()));
        response->set_num_pages(pinned);
        return absl::OkStatus();
      });
}

}  // namespace kvcache
