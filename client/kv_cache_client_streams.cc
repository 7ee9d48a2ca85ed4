// KvCacheClient's block data calls: PutBlocks and GetBlocks streams (over BlockStream), with
// per-block XXH3-64 checksums computed on the way out and verified on the way in.
#include <algorithm>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/block_stream.h"
#include "client/kv_cache_client.h"
#include "client/proto_convert.h"
#include "common/block_checksum.h"
#include "common/rpc/bytes_field_split.h"
#include "common/rpc/chunk_bytes.h"
#include "common/status_macros.h"
#include "common/streaming_copy.h"

namespace kvcache {
namespace {

// Room for a data message's framing (tag and length) within max_message_bytes.
constexpr size_t kMessageOverhead = 1024;
// A stream's deadline grows by one second per this many bytes moved.
constexpr double kBytesPerExtraSecond = 64.0 * (1 << 20);

// The data RPCs move raw bytes (see PutBlocks and ReadBlocks); methods and fields as in
// proto/kvcache/v1/kvcache.proto.
constexpr char kGetBlocksMethod[] = "/kvcache.v1.KvCache/GetBlocks";
constexpr char kPutBlocksMethod[] = "/kvcache.v1.KvCache/PutBlocks";
constexpr uint32_t kGetBlocksDataField = v1::GetBlocksResponse::kDataFieldNumber;

// The largest data message this client sends or asks for: what max_message_bytes leaves after the
// framing, and never below the daemon's smallest chunk.
size_t MaxChunkBytes(int max_message_bytes) {
  return std::max<size_t>(kMinChunkBytes,
                          static_cast<size_t>(max_message_bytes) - kMessageOverhead);
}

// `message` as a BlockStream writes it.
template <typename Message>
absl::StatusOr<grpc::ByteBuffer> Serialize(const Message& message) {
  grpc::ByteBuffer buffer;
  bool own_buffer = false;
  if (!grpc::SerializationTraits<Message>::Serialize(message, &buffer, &own_buffer).ok()) {
    return absl::InternalError(
        absl::StrCat("cannot serialize a ", message.GetDescriptor()->name()));
  }
  return buffer;
}

// The header must describe at most the prompt's full blocks of the pool's shape.
absl::Status CheckGetHeader(const v1::GetBlocksHeader& header, uint32_t block_size,
                            uint64_t block_bytes, size_t max_blocks) {
  if (header.num_blocks() > max_blocks ||
      static_cast<size_t>(header.block_checksums_size()) != header.num_blocks() ||
      (!header.part_masks().empty() &&
       static_cast<size_t>(header.part_masks_size()) != header.num_blocks()) ||
      header.num_cached_tokens() != uint64_t{header.num_blocks()} * block_size ||
      (header.num_blocks() > 0 && header.block_bytes() != block_bytes)) {
    return absl::InternalError(absl::StrCat(
        "GetBlocks: inconsistent header from the daemon: ", header.num_blocks(), " blocks (",
        header.num_cached_tokens(), " tokens, ", header.block_checksums_size(), " checksums, ",
        header.part_masks_size(), " part masks) of ", header.block_bytes(),
        " bytes for a prompt of at most ", max_blocks, " full blocks of ", block_size,
        " tokens and ", block_bytes, " bytes"));
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
    uint32_t first_block, absl::Span<const uint32_t> part_masks) {
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("PutBlocks"));
  ASSIGN_OR_RETURN(const BlockShape shape, PoolShape(pool, session));
  const size_t full_blocks = tokens.size() / shape.block_size;
  const size_t num_blocks = full_blocks - std::min<size_t>(first_block, full_blocks);
  if (bytes.size() != num_blocks * shape.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "PutBlocks: ", bytes.size(), " bytes given for the ", num_blocks, " full blocks of a ",
        tokens.size(), "-token prompt in pool '", pool, "' (", shape.block_size, " tokens and ",
        shape.block_bytes, " bytes per block): want ", num_blocks * shape.block_bytes));
  }
  std::vector<absl::string_view> blocks;
  blocks.reserve(num_blocks);
  for (size_t i = 0; i < num_blocks; ++i) {
    blocks.push_back(bytes.substr(i * shape.block_bytes, shape.block_bytes));
  }
  return PutBlocks(pool, tokens, blocks,
                   PutOptions{.cache_salt = cache_salt,
                              .extra_keys = extra_keys,
                              .chunk_bytes = chunk_bytes,
                              .first_block = first_block,
                              .part_masks = part_masks});
}

absl::StatusOr<KvCacheClient::PutResult> KvCacheClient::PutBlocks(
    absl::string_view pool, absl::Span<const uint32_t> tokens,
    absl::Span<const absl::string_view> blocks, const PutOptions& options) {
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("PutBlocks"));
  ASSIGN_OR_RETURN(const BlockShape shape, PoolShape(pool, session));
  const size_t full_blocks = tokens.size() / shape.block_size;
  if (options.first_block > full_blocks) {
    return absl::InvalidArgumentError(absl::StrCat("PutBlocks: first_block ", options.first_block,
                                                   " past the ", full_blocks, " full blocks"));
  }
  const size_t num_blocks = full_blocks - options.first_block;
  if (blocks.size() != num_blocks) {
    return absl::InvalidArgumentError(
        absl::StrCat("PutBlocks: ", blocks.size(), " blocks given for blocks ", options.first_block,
                     " to ", full_blocks, " of a ", tokens.size(), "-token prompt in pool '", pool,
                     "' (", shape.block_size, " tokens per block): want ", num_blocks));
  }
  v1::PutBlocksRequest request;
  v1::PutBlocksHeader* header = request.mutable_header();
  FillPromptRequest(session.session_id, session.epoch, pool, tokens, options.cache_salt,
                    options.extra_keys, header);
  header->set_first_block(options.first_block);
  header->mutable_part_masks()->Add(options.part_masks.begin(), options.part_masks.end());
  for (size_t i = 0; i < num_blocks; ++i) {
    if (blocks[i].size() != shape.block_bytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("PutBlocks: block ", options.first_block + i, " has ", blocks[i].size(),
                       " bytes; blocks of pool '", pool, "' have ", shape.block_bytes));
    }
  }
  // Every checksum goes in the header, before the first byte: the page copy threads share them.
  header->mutable_block_checksums()->Resize(num_blocks, 0);
  uint64_t* checksums = header->mutable_block_checksums()->mutable_data();
  RunOnPages(num_blocks, uint64_t{num_blocks} * shape.block_bytes, [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end; ++i) {
      checksums[i] = BlockChecksum(blocks[i].data(), blocks[i].size());
    }
  });

  const size_t chunk =
      std::clamp<size_t>(options.chunk_bytes, 1, MaxChunkBytes(options_.max_message_bytes));
  // Written raw: each data message is its framing plus slices lent from `blocks`, so the bytes
  // are not copied into messages first.
  ASSIGN_OR_RETURN(const grpc::ByteBuffer header_message, Serialize(request));
  BlockStream stream(&generic_stub_, kPutBlocksMethod, [&](grpc::ClientContext* context) {
    PrepareContext(context, StreamTimeout(num_blocks * shape.block_bytes));
  });
  // A failed Write means the stream broke (or the daemon answered early): Finish says why.
  bool open = stream.Write(header_message);
  const uint64_t total = uint64_t{num_blocks} * shape.block_bytes;
  absl::Status interrupted;  // by options.after_chunk
  for (uint64_t sent = 0; open && sent < total;) {
    const uint64_t size = std::min<uint64_t>(chunk, total - sent);
    std::vector<grpc::Slice> slices;
    slices.emplace_back(BytesFieldPrefix(v1::PutBlocksRequest::kDataFieldNumber, size));
    for (uint64_t filled = 0; filled < size;) {
      const absl::string_view block = blocks[(sent + filled) / shape.block_bytes];
      const uint64_t offset = (sent + filled) % shape.block_bytes;
      const uint64_t piece = std::min(size - filled, shape.block_bytes - offset);
      slices.push_back(stream.Lend(block.data() + offset, piece));
      filled += piece;
    }
    open = stream.Write(grpc::ByteBuffer(slices.data(), slices.size()));
    sent += size;
    if (open && options.after_chunk) interrupted = options.after_chunk(sent);
    if (!interrupted.ok()) {
      stream.Cancel();
      break;
    }
  }
  if (open && interrupted.ok()) stream.WritesDone();
  // The reply (absent after an error) must be read before Finish: gRPC hands out the status only
  // once every message that came before it was read.
  grpc::ByteBuffer reply;
  const bool replied = stream.Read(&reply);
  const grpc::Status status = stream.Finish();
  RETURN_IF_ERROR(interrupted);
  v1::PutBlocksResponse response;
  if (status.ok() &&
      (!replied ||
       !grpc::SerializationTraits<v1::PutBlocksResponse>::Deserialize(&reply, &response).ok())) {
    return absl::InternalError("PutBlocks: the daemon's reply is not a PutBlocksResponse");
  }
  RETURN_IF_ERROR(
      CheckReply("PutBlocks", stream.context(), status, response.epoch(), session, true));
  return PutResult{.num_blocks = response.num_blocks(),
                   .num_already_cached = response.num_already_cached(),
                   .num_stored = response.num_stored()};
}

absl::StatusOr<KvCacheClient::GetResult> KvCacheClient::GetBlocks(
    absl::string_view pool, absl::Span<const uint32_t> tokens, absl::string_view cache_salt,
    const ExtraKeys& extra_keys, uint32_t max_chunk_bytes,
    absl::Span<const std::string> restore_parts) {
  GetResult result;
  ASSIGN_OR_RETURN(static_cast<GetInfo&>(result),
                   ReadBlocks(
                       pool, tokens, cache_salt, extra_keys, max_chunk_bytes, restore_parts,
                       [&result](uint64_t total, uint64_t) {
                         result.bytes.reserve(total);
                         return absl::OkStatus();
                       },
                       [&result](uint32_t, uint64_t, absl::string_view piece) {
                         result.bytes.append(piece.data(), piece.size());
                         return absl::OkStatus();
                       },
                       BlockStreamVerifier::Pieces::kCacheSized));
  return result;
}

absl::StatusOr<KvCacheClient::GetInfo> KvCacheClient::GetBlocksInto(
    absl::string_view pool, absl::Span<const uint32_t> tokens, absl::Span<char> destination,
    absl::string_view cache_salt, const ExtraKeys& extra_keys, uint32_t max_chunk_bytes,
    absl::Span<const std::string> restore_parts) {
  uint64_t block_bytes = 0;
  CopyStores stores = CopyStores::kCached;
  // Each block is copied into place by the verifier as it checksums it: one pass over its bytes.
  const auto target_of = [&](uint32_t block) {
    return BlockStreamVerifier::CopyTarget{.bytes = destination.data() + block * block_bytes,
                                           .stores = stores};
  };
  const BlockStreamVerifier::Targets targets = target_of;  // a reference: target_of outlives it
  return ReadBlocks(
      pool, tokens, cache_salt, extra_keys, max_chunk_bytes, restore_parts,
      [&](uint64_t total, uint64_t bytes_per_block) {
        if (total > destination.size()) {
          return absl::OutOfRangeError(absl::StrCat("GetBlocksInto: the daemon has ", total,
                                                    " bytes of cached blocks for the prompt, the "
                                                    "destination holds ",
                                                    destination.size()));
        }
        block_bytes = bytes_per_block;
        stores =
            total >= kStreamingCopyMinTotalBytes ? CopyStores::kStreaming : CopyStores::kCached;
        return absl::OkStatus();
      },
      [](uint32_t block, uint64_t, absl::string_view) {
        return absl::InternalError(absl::StrCat("GetBlocksInto: block ", block, " has no target"));
      },
      BlockStreamVerifier::Pieces::kCacheSized, &targets);
}

absl::StatusOr<KvCacheClient::GetInfo> KvCacheClient::GetBlocksVisit(
    absl::string_view pool, absl::Span<const uint32_t> tokens, BlockVisitor visit,
    absl::string_view cache_salt, const ExtraKeys& extra_keys, uint32_t max_chunk_bytes,
    absl::Span<const std::string> restore_parts) {
  return ReadBlocks(
      pool, tokens, cache_salt, extra_keys, max_chunk_bytes, restore_parts,
      [](uint64_t, uint64_t) { return absl::OkStatus(); }, visit,
      BlockStreamVerifier::Pieces::kAsGiven);
}

absl::StatusOr<KvCacheClient::GetInfo> KvCacheClient::ReadBlocks(
    absl::string_view pool, absl::Span<const uint32_t> tokens, absl::string_view cache_salt,
    const ExtraKeys& extra_keys, uint32_t max_chunk_bytes,
    absl::Span<const std::string> restore_parts,
    absl::FunctionRef<absl::Status(uint64_t total, uint64_t block_bytes)> on_header,
    BlockStreamVerifier::Sink sink, BlockStreamVerifier::Pieces pieces,
    const BlockStreamVerifier::Targets* targets) {
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("GetBlocks"));
  ASSIGN_OR_RETURN(const BlockShape shape, PoolShape(pool, session));
  const size_t max_blocks = tokens.size() / shape.block_size;

  v1::GetBlocksRequest request;
  FillPromptRequest(session.session_id, session.epoch, pool, tokens, cache_salt, extra_keys,
                    &request);
  request.mutable_restore_parts()->Add(restore_parts.begin(), restore_parts.end());
  // Chunks must fit this client's receive limit; 0 leaves the daemon's default when it fits.
  const uint32_t max_chunk = static_cast<uint32_t>(MaxChunkBytes(options_.max_message_bytes));
  if (max_chunk_bytes != 0 || max_chunk < kDefaultChunkBytes) {
    request.set_max_chunk_bytes(
        std::min(max_chunk_bytes == 0 ? kDefaultChunkBytes : max_chunk_bytes, max_chunk));
  }

  // Read raw: each data message's bytes are checksummed and copied once, straight from the
  // received slices into the result, instead of being parsed into a message and copied again.
  ASSIGN_OR_RETURN(const grpc::ByteBuffer request_message, Serialize(request));
  BlockStream stream(&generic_stub_, kGetBlocksMethod, [&](grpc::ClientContext* context) {
    PrepareContext(context, StreamTimeout(max_blocks * shape.block_bytes));
  });
  // GetBlocks takes one request: it leaves with the half-close. If the write fails, so does the
  // first Read, and Finish says why.
  stream.WriteLast(request_message);
  GetInfo result;
  std::optional<BlockStreamVerifier> verifier;  // from the header on
  uint64_t reply_epoch = session.epoch;         // until a message says otherwise
  absl::Status local;                           // what this client found wrong with the stream
  grpc::ByteBuffer buffer;
  v1::GetBlocksResponse message;
  while (local.ok() && stream.Read(&buffer)) {
    absl::StatusOr<SplitMessage> split = SplitBytesField(buffer, kGetBlocksDataField);
    if (!split.ok() || !message.ParseFromString(split->rest)) {
      local = absl::InternalError(
          absl::StrCat("GetBlocks: the daemon sent a malformed message",
                       split.ok() ? "" : absl::StrCat(": ", split.status().message())));
      break;
    }
    reply_epoch = message.epoch();
    if (reply_epoch != session.epoch) break;  // fenced below
    if (message.has_header() && split->has_field) {
      local = absl::InternalError("GetBlocks: a message from the daemon carries header and data");
    } else if (message.has_header() && !verifier.has_value()) {
      const v1::GetBlocksHeader& header = message.header();
      local = CheckGetHeader(header, shape.block_size, shape.block_bytes, max_blocks);
      if (!local.ok()) break;
      result.num_blocks = header.num_blocks();
      result.num_cached_tokens = header.num_cached_tokens();
      result.block_bytes = shape.block_bytes;
      result.part_masks.assign(header.part_masks().begin(), header.part_masks().end());
      verifier.emplace(shape.block_bytes, std::vector<uint64_t>(header.block_checksums().begin(),
                                                                header.block_checksums().end()));
      local = on_header(verifier->expected_bytes(), shape.block_bytes);
    } else if (!verifier.has_value() || message.has_header()) {
      local = absl::InternalError("GetBlocks: the daemon's stream must carry one header, first");
    } else if (split->field_size > verifier->expected_bytes() - verifier->received_bytes()) {
      local = absl::InternalError(absl::StrCat("GetBlocks: the daemon sent more than the ",
                                               verifier->expected_bytes(), " bytes announced"));
    } else {
      for (absl::string_view piece : split->pieces) {
        local = targets != nullptr ? verifier->FeedInto(piece, *targets, sink)
                                   : verifier->Feed(piece, sink, pieces);
        if (absl::IsDataLoss(local)) {
          local = absl::DataLossError(
              absl::StrCat("GetBlocks from pool '", pool, "': ", local.message()));
        }
        if (!local.ok()) break;
      }
    }
  }
  const bool stopped_early = reply_epoch != session.epoch || !local.ok();
  if (stopped_early) stream.Cancel();
  const grpc::Status status = stream.Finish();
  if (reply_epoch != session.epoch) {
    return CheckReply("GetBlocks", stream.context(), grpc::Status::OK, reply_epoch, session, true);
  }
  RETURN_IF_ERROR(local);
  RETURN_IF_ERROR(CheckReply("GetBlocks", stream.context(), status, reply_epoch, session, true));
  if (!verifier.has_value()) {
    return absl::DataLossError("GetBlocks: the stream ended before its header");
  }
  if (verifier->received_bytes() != verifier->expected_bytes()) {
    return absl::DataLossError(absl::StrCat("GetBlocks: the stream ended after ",
                                            verifier->received_bytes(), " of ",
                                            verifier->expected_bytes(), " bytes"));
  }
  return result;
}

}  // namespace kvcache
