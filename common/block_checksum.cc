#include "common/block_checksum.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache {

namespace {

// Half of a 32 KiB L1 data cache: a piece stays there between its checksum and its copy.
constexpr uint64_t kCachedPieceBytes = 16 << 10;

}  // namespace

uint64_t ChecksumWhileCopying(
    const void* source, uint64_t size,
    absl::FunctionRef<void(uint64_t offset, uint64_t length)> copy_piece) {
  // The same hash as every other verified copy, the copy itself the caller's.
  xxh3::CopyingHash hash(size);
  const auto* bytes = static_cast<const uint8_t*>(source);
  for (uint64_t offset = 0; offset < size; offset += kCachedPieceBytes) {
    const uint64_t length = std::min(kCachedPieceBytes, size - offset);
    hash.Copy(nullptr, bytes + offset, length, false);
    copy_piece(offset, length);
  }
  return hash.Finish();
}

uint64_t ChecksumWhileCopying(void* destination, const void* source, uint64_t size,
                              CopyStores stores) {
  xxh3::CopyingHash hash(size);
  hash.Copy(destination, source, size, stores == CopyStores::kStreaming);
  return hash.Finish();
}

BlockStreamVerifier::BlockStreamVerifier(uint64_t block_bytes, std::vector<uint64_t> checksums,
                                         uint32_t first_block)
    : block_bytes_(block_bytes),
      checksums_(std::move(checksums)),
      first_block_(first_block),
      hash_(block_bytes) {}

absl::Status BlockStreamVerifier::Feed(absl::string_view data, Sink sink, Pieces pieces) {
  return FeedPieces(data, nullptr, sink, pieces);
}

absl::Status BlockStreamVerifier::FeedInto(absl::string_view data, Targets targets, Sink sink) {
  return FeedPieces(data, &targets, sink, Pieces::kCacheSized);
}

absl::Status BlockStreamVerifier::FeedPieces(absl::string_view data, const Targets* targets,
                                             Sink sink, Pieces pieces) {
  const uint64_t max_piece =
      pieces == Pieces::kCacheSized ? kCachedPieceBytes : std::numeric_limits<uint64_t>::max();
  while (!data.empty()) {
    const uint64_t index = received_ / block_bytes_;
    const uint64_t offset = received_ % block_bytes_;
    const uint32_t block = first_block_ + static_cast<uint32_t>(index);
    if (offset == 0) {
      hash_ = xxh3::CopyingHash(block_bytes_);
      target_ = targets != nullptr ? (*targets)(block) : CopyTarget{};
    }
    const uint64_t room = block_bytes_ - offset;
    const absl::string_view piece =
        data.substr(0, target_.bytes != nullptr ? room : std::min(room, max_piece));
    if (target_.bytes != nullptr) {
      hash_.Copy(target_.bytes + offset, piece.data(), piece.size(),
                 target_.stores == CopyStores::kStreaming);
    } else {
      hash_.Copy(nullptr, piece.data(), piece.size(), false);
      if (absl::Status status = sink(block, offset, piece); !status.ok()) return status;
    }
    received_ += piece.size();
    data.remove_prefix(piece.size());
    if (received_ % block_bytes_ != 0) continue;
    const uint64_t checksum = hash_.Finish();
    if (checksum != checksums_[index]) {
      return absl::DataLossError(absl::StrCat("block ", block, " of ",
                                              first_block_ + checksums_.size(), " has checksum ",
                                              checksum, ", the header says ", checksums_[index]));
    }
  }
  return absl::OkStatus();
}

}  // namespace kvcache
