// KvCacheClient's block data calls: PutBlocks and GetBlocks streams, with per-block XXH3-64
// checksums computed on the way out and verified on the way in.
#include <xxhash.h>

#include <algorithm>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/kv_cache_client.h"
#include "client/proto_convert.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

// Room for a data message's framing (tag and length) within max_message_bytes.
constexpr size_t kMessageOverhead = 1024;
constexpr size_t kMinChunkBytes = 4096;
constexpr uint32_t kDaemonDefaultChunkBytes = 1 << 20;
// A stream's deadline grows by one second per this many bytes moved.
constexpr double kBytesPerExtraSecond = 64.0 * (1 << 20);

// XXH3-64, seed 0: the checksum the data RPCs carry for each block.
uint64_t BlockChecksum(const char* data, uint64_t size) { return XXH3_64bits(data, size); }

// The header must describe at most the prompt's full blocks of the pool's shape.
absl::Status CheckGetHeader(const v1::GetBlocksHeader& header, uint32_t block_size,
                            uint64_t block_bytes, size_t max_blocks) {
  if (header.num_blocks() > max_blocks ||
      static_cast<size_t>(header.block_checksums_size()) != header.num_blocks() ||
      header.num_cached_tokens() != uint64_t{header.num_blocks()} * block_size ||
      (header.num_blocks() > 0 && header.block_bytes() != block_bytes)) {
    return absl::InternalError(absl::StrCat(
        "GetBlocks: inconsistent header from the daemon: ", header.num_blocks(), " blocks (",
        header.num_cached_tokens(), " tokens, ", header.block_checksums_size(), " checksums) of ",
        header.block_bytes(), " bytes for a prompt of at most ", max_blocks, " full blocks of ",
        block_size, " tokens and ", block_bytes, " bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Duration KvCacheClient::StreamTimeout(uint64_t bytes) const {
  return options_.rpc_timeout + absl::Seconds(static_cast<double>(bytes) / kBytesPerExtraSecond);
}

absl::StatusOr<KvCacheClient::BlockShape> KvCacheClient::PoolShape(absl::string_view pool,
                                                                   const SessionRef& session) {
  {
    absl::MutexLock lock(&mu_);
    auto it = shapes_.find(pool);
    if (it != shapes_.end() && it->second.epoch == session.epoch) return it->second;
  }
  ASSIGN_OR_RETURN(const PoolDescription described, DescribePool(pool));
  if (described.epoch != session.epoch) {
    NoteEpochChange(session, described.epoch);
    return absl::FailedPreconditionError(absl::StrCat("the kvcache daemon restarted (epoch ",
                                                      session.epoch, " is now ", described.epoch,
                                                      "): open a new session"));
  }
  const BlockShape shape{.epoch = described.epoch,
                         .block_size = described.pool.layout.block_size,
                         .block_bytes = described.pool.block_bytes};
  if (shape.block_size == 0 || shape.block_bytes == 0) {
    return absl::InternalError(
        absl::StrCat("the daemon describes pool '", pool, "' with an empty layout"));
  }
  absl::MutexLock lock(&mu_);
  shapes_[pool] = shape;
  return shape;
}

absl::StatusOr<KvCacheClient::PutResult> KvCacheClient::PutBlocks(
    absl::string_view pool, absl::Span<const uint32_t> tokens, absl::string_view bytes,
    absl::string_view cache_salt, const ExtraKeys& extra_keys, size_t chunk_bytes,
    uint32_t first_block) {
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("PutBlocks"));
  ASSIGN_OR_RETURN(const BlockShape shape, PoolShape(pool, session));
  const size_t full_blocks = tokens.size() / shape.block_size;
  if (first_block > full_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("PutBlocks: first_block ", first_block,
                                                   " past the ", full_blocks, " full blocks"));
  }
  const size_t num_blocks = full_blocks - first_block;
  if (bytes.size() != num_blocks * shape.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PutBlocks: ", bytes.size(), " bytes given for the ", num_blocks, " full blocks of a ",
        tokens.size(), "-token prompt in pool '", pool, "' (", shape.block_size, " tokens and ",
        shape.block_bytes, " bytes per block): want ", num_blocks * shape.block_bytes));
  }

  v1::PutBlocksRequest request;
  v1::PutBlocksHeader* header = request.mutable_header();
  FillPromptRequest(session.session_id, session.epoch, pool, tokens, cache_salt, extra_keys, header);
  header->set_first_block(first_block);
  header->mutable_block_checksums()->Reserve(num_blocks);
  for (size_t i = 0; i < num_blocks; ++i) {
    header->add_block_checksums(
        BlockChecksum(bytes.data() + i * shape.block_bytes, shape.block_bytes));
  }

  const size_t max_chunk =
      std::max(kMinChunkBytes, static_cast<size_t>(options_.max_message_bytes) - kMessageOverhead);
  const size_t chunk = std::clamp<size_t>(chunk_bytes, 1, max_chunk);
  grpc::ClientContext context;
  PrepareContext(&context, StreamTimeout(bytes.size()));
  v1::PutBlocksResponse response;
  std::unique_ptr<grpc::ClientWriterInterface<v1::PutBlocksRequest>> writer =
      stub_->PutBlocks(&context, &response);
  // A failed Write means the stream broke (or the daemon answered early): Finish says why.
  bool open = writer->Write(request);
  for (size_t offset = 0; open && offset < bytes.size(); offset += chunk) {
    request.set_data(bytes.data() + offset, std::min(chunk, bytes.size() - offset));
    open = writer->Write(request);
  }
  if (open) writer->WritesDone();
  const grpc::Status status = writer->Finish();
  RETURN_IF_ERROR(CheckReply("PutBlocks", context, status, response.epoch(), session, true));
  return PutResult{.num_blocks = response.num_blocks(),
                   .num_already_cached = response.num_already_cached(),
                   .num_stored = response.num_stored()};
}

absl::StatusOr<KvCacheClient::GetResult> KvCacheClient::GetBlocks(absl::string_view pool,
                                                                  absl::Span<const uint32_t> tokens,
                                                                  absl::string_view cache_salt,
                                                                  const ExtraKeys& extra_keys,
                                                                  uint32_t max_chunk_bytes) {
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("GetBlocks"));
  ASSIGN_OR_RETURN(const BlockShape shape, PoolShape(pool, session));
  const size_t max_blocks = tokens.size() / shape.block_size;

  v1::GetBlocksRequest request;
  FillPromptRequest(session.session_id, session.epoch, pool, tokens, cache_salt, extra_keys,
                    &request);
  // Chunks must fit this client's receive limit; 0 leaves the daemon's default when it fits.
  const uint32_t max_chunk = static_cast<uint32_t>(
      std::max(kMinChunkBytes, static_cast<size_t>(options_.max_message_bytes) - kMessageOverhead));
  if (max_chunk_bytes != 0 || max_chunk < kDaemonDefaultChunkBytes) {
    request.set_max_chunk_bytes(
        std::min(max_chunk_bytes == 0 ? kDaemonDefaultChunkBytes : max_chunk_bytes, max_chunk));
  }

  grpc::ClientContext context;
  PrepareContext(&context, StreamTimeout(max_blocks * shape.block_bytes));
  std::unique_ptr<grpc::ClientReaderInterface<v1::GetBlocksResponse>> reader =
      stub_->GetBlocks(&context, request);
  GetResult result;
  std::vector<uint64_t> checksums;
  uint64_t total = 0;
  bool have_header = false;
  uint64_t reply_epoch = session.epoch;  // until a message says otherwise
  absl::Status local;                    // what this client found wrong with the stream
  v1::GetBlocksResponse message;
  while (reader->Read(&message)) {
    reply_epoch = message.epoch();
    if (reply_epoch != session.epoch) break;  // fenced below
    if (message.has_header() && !have_header) {
      const v1::GetBlocksHeader& header = message.header();
      local = CheckGetHeader(header, shape.block_size, shape.block_bytes, max_blocks);
      if (!local.ok()) break;
      have_header = true;
      result.num_blocks = header.num_blocks();
      result.num_cached_tokens = header.num_cached_tokens();
      result.block_bytes = shape.block_bytes;
      checksums.assign(header.block_checksums().begin(), header.block_checksums().end());
      total = uint64_t{result.num_blocks} * shape.block_bytes;
      result.bytes.reserve(total);
    } else if (!have_header || message.has_header()) {
      local = absl::InternalError("GetBlocks: the daemon's stream must carry one header, first");
      break;
    } else if (message.data().size() > total - result.bytes.size()) {
      local = absl::InternalError(
          absl::StrCat("GetBlocks: the daemon sent more than the ", total, " bytes announced"));
      break;
    } else {
      result.bytes.append(message.data());
    }
  }
  const bool stopped_early = reply_epoch != session.epoch || !local.ok();
  if (stopped_early) context.TryCancel();
  const grpc::Status status = reader->Finish();
  if (reply_epoch != session.epoch) {
    return CheckReply("GetBlocks", context, grpc::Status::OK, reply_epoch, session, true);
  }
  RETURN_IF_ERROR(local);
  RETURN_IF_ERROR(CheckReply("GetBlocks", context, status, reply_epoch, session, true));
  if (!have_header) return absl::DataLossError("GetBlocks: the stream ended before its header");
  if (result.bytes.size() != total) {
    return absl::DataLossError(absl::StrCat("GetBlocks: the stream ended after ",
                                            result.bytes.size(), " of ", total, " bytes"));
  }
  for (uint32_t i = 0; i < result.num_blocks; ++i) {
    const uint64_t checksum =
        BlockChecksum(result.bytes.data() + uint64_t{i} * shape.block_bytes, shape.block_bytes);
    if (checksum != checksums[i]) {
      return absl::DataLossError(absl::StrCat("GetBlocks: block ", i, " of ", result.num_blocks,
                                              " from pool '", pool, "' has checksum ", checksum,
                                              ", the daemon's header says ", checksums[i]));
    }
  }
  return result;
}

}  // namespace kvcache
