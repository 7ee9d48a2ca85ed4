// CPU reference for the block copy kernels, the argument checks both paths share, and the CUDA
// launchers up to the launch (block_copy.cu), so that every build runs their checks.
#include "kernels/block_copy.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/block_copy_internal.h"

namespace kvcache::kernels {
namespace internal {

absl::Status CheckGeometry(const char* op, uint64_t block_bytes, uint32_t num_blocks,
                           uint64_t num_slots) {
  if (block_bytes == 0) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: block_bytes must be > 0", op));
  }
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  if (num_blocks > kMax / block_bytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: pool of %u blocks of %u bytes overflows uint64", op, num_blocks, block_bytes));
  }
  if (num_slots > kMax / block_bytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%s: %u slots of %u bytes overflow uint64", op, num_slots, block_bytes));
  }
  return absl::OkStatus();
}

absl::Status CheckNotNull(const char* op, const char* what, const void* ptr) {
  if (ptr == nullptr) {
    return absl::InvalidArgumentError(absl::StrFormat("%s: %s is null", op, what));
  }
  return absl::OkStatus();
}

}  // namespace internal

namespace {

// (block id, slot index) of every non-skipped slot, sorted by id then index.
using IdSlots = std::vector<std::pair<int64_t, size_t>>;

absl::Status CheckRange(const char* name, uint32_t num_blocks, absl::Span<const int64_t> ids) {
  for (size_t i = 0; i < ids.size(); ++i) {
    const int64_t id = ids[i];
    if (id != kSkipBlock && (id < 0 || id >= static_cast<int64_t>(num_blocks))) {
      return absl::OutOfRangeError(absl::StrFormat(
          "%s[%u] = %d is out of range [0, %u) (use -1 to skip a slot)", name, i, id, num_blocks));
    }
  }
  return absl::OkStatus();
}

// Sorted ids that repeat produce INVALID_ARGUMENT naming the block and the first two slots.
absl::Status CheckUnique(const IdSlots& sorted, const char* what) {
  for (size_t k = 1; k < sorted.size(); ++k) {
    if (sorted[k].first == sorted[k - 1].first) {
      return absl::InvalidArgumentError(absl::StrFormat("block %d is written twice (%s %u and %u)",
                                                        sorted[k].first, what, sorted[k - 1].second,
                                                        sorted[k].second));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ValidateCopyIds(uint32_t num_blocks, absl::Span<const int64_t> src,
                             absl::Span<const int64_t> dst) {
  if (src.size() != dst.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("src has %u ids but dst has %u", src.size(), dst.size()));
  }
  RETURN_IF_ERROR(CheckRange("src", num_blocks, src));
  RETURN_IF_ERROR(CheckRange("dst", num_blocks, dst));
  IdSlots dsts;
  dsts.reserve(dst.size());
  for (size_t i = 0; i < dst.size(); ++i) {
    if (src[i] != kSkipBlock && dst[i] != kSkipBlock) dsts.emplace_back(dst[i], i);
  }
  std::sort(dsts.begin(), dsts.end());
  RETURN_IF_ERROR(CheckUnique(dsts, "as dst of pairs"));
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == kSkipBlock || dst[i] == kSkipBlock) continue;
    auto it = std::lower_bound(dsts.begin(), dsts.end(), std::make_pair(src[i], size_t{0}));
    if (it != dsts.end() && it->first == src[i]) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "block %d is both a src (pair %u) and a dst (pair %u)", src[i], i, it->second));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidateBlockIds(uint32_t num_blocks, absl::Span<const int64_t> block_ids,
                              bool unique_targets) {
  RETURN_IF_ERROR(CheckRange("block_ids", num_blocks, block_ids));
  if (!unique_targets) return absl::OkStatus();
  IdSlots ids;
  ids.reserve(block_ids.size());
  for (size_t i = 0; i < block_ids.size(); ++i) {
    if (block_ids[i] != kSkipBlock) ids.emplace_back(block_ids[i], i);
  }
  std::sort(ids.begin(), ids.end());
  return CheckUnique(ids, "by slots");
}

absl::Status CopyBlocksCpu(uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                           absl::Span<const int64_t> src, absl::Span<const int64_t> dst) {
  constexpr char kOp[] = "CopyBlocksCpu";
  RETURN_IF_ERROR(internal::CheckGeometry(kOp, block_bytes, num_blocks, 0));
  RETURN_IF_ERROR(ValidateCopyIds(num_blocks, src, dst));
  if (src.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "pool", pool));
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == kSkipBlock || dst[i] == kSkipBlock) continue;
    std::memcpy(pool + static_cast<uint64_t>(dst[i]) * block_bytes,
                pool + static_cast<uint64_t>(src[i]) * block_bytes, block_bytes);
  }
  return absl::OkStatus();
}

absl::Status GatherBlocksCpu(const uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                             absl::Span<const int64_t> block_ids, uint8_t* out) {
  constexpr char kOp[] = "GatherBlocksCpu";
  RETURN_IF_ERROR(internal::CheckGeometry(kOp, block_bytes, num_blocks, block_ids.size()));
  RETURN_IF_ERROR(ValidateBlockIds(num_blocks, block_ids, /*unique_targets=*/false));
  if (block_ids.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "pool", pool));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "out", out));
  for (size_t i = 0; i < block_ids.size(); ++i) {
    if (block_ids[i] == kSkipBlock) continue;
    std::memcpy(out + i * block_bytes, pool + static_cast<uint64_t>(block_ids[i]) * block_bytes,
                block_bytes);
  }
  return absl::OkStatus();
}

absl::Status ScatterBlocksCpu(const uint8_t* in, uint64_t block_bytes, uint32_t num_blocks,
                              absl::Span<const int64_t> block_ids, uint8_t* pool) {
  constexpr char kOp[] = "ScatterBlocksCpu";
  RETURN_IF_ERROR(internal::CheckGeometry(kOp, block_bytes, num_blocks, block_ids.size()));
  RETURN_IF_ERROR(ValidateBlockIds(num_blocks, block_ids, /*unique_targets=*/true));
  if (block_ids.empty()) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "in", in));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "pool", pool));
  for (size_t i = 0; i < block_ids.size(); ++i) {
    if (block_ids[i] == kSkipBlock) continue;
    std::memcpy(pool + static_cast<uint64_t>(block_ids[i]) * block_bytes, in + i * block_bytes,
                block_bytes);
  }
  return absl::OkStatus();
}

absl::Status CopyBlocksCuda(uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                            const int64_t* src_ids, const int64_t* dst_ids, uint32_t num_pairs,
                            void* stream) {
  constexpr char kOp[] = "CopyBlocksCuda";
  RETURN_IF_ERROR(internal::CheckGeometry(kOp, block_bytes, num_blocks, 0));
  if (num_pairs == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "pool", pool));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "src_ids", src_ids));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "dst_ids", dst_ids));
  return internal::LaunchCopyBlocks(pool, block_bytes, num_blocks, src_ids, dst_ids, num_pairs,
                                    stream);
}

absl::Status GatherBlocksCuda(const uint8_t* pool, uint64_t block_bytes, uint32_t num_blocks,
                              const int64_t* block_ids, uint32_t num_ids, uint8_t* out,
                              void* stream) {
  constexpr char kOp[] = "GatherBlocksCuda";
  RETURN_IF_ERROR(internal::CheckGeometry(kOp, block_bytes, num_blocks, num_ids));
  if (num_ids == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "pool", pool));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "block_ids", block_ids));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "out", out));
  return internal::LaunchGatherBlocks(pool, block_bytes, num_blocks, block_ids, num_ids, out,
                                      stream);
}

absl::Status ScatterBlocksCuda(const uint8_t* in, uint64_t block_bytes, uint32_t num_blocks,
                               const int64_t* block_ids, uint32_t num_ids, uint8_t* pool,
                               void* stream) {
  constexpr char kOp[] = "ScatterBlocksCuda";
  RETURN_IF_ERROR(internal::CheckGeometry(kOp, block_bytes, num_blocks, num_ids));
  if (num_ids == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "in", in));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "block_ids", block_ids));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "pool", pool));
  return internal::LaunchScatterBlocks(in, block_bytes, num_blocks, block_ids, num_ids, pool,
                                       stream);
}

}  // namespace kvcache::kernels
