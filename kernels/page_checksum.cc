// The CPU reference of kernels/page_checksum.h, computed block by block as the kernel computes it
// (xxh3_blocks.h), the argument checks both paths share, and the CUDA launcher up to the launch.
// This file includes xxhash.h whole (XXH_INLINE_ALL) for its default secret, and no other header
// that includes it.
#define XXH_INLINE_ALL
#include "kernels/page_checksum.h"

#include <xxhash.h>

#include <cstring>

#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "kernels/block_copy_internal.h"
#include "kernels/page_checksum_internal.h"
#include "kernels/xxh3_blocks.h"

namespace kvcache::kernels {
namespace xxh3_blocks {

Keys DefaultKeys() {
  static_assert(sizeof(XXH3_kSecret) == 192, "the blocks assume XXH3's default 192-byte secret");
  static_assert(XXH_SECRET_LASTACC_START == 7 && XXH_SECRET_MERGEACCS_START == 11);
  Keys keys;
  for (int k = 0; k < 24; ++k) keys.words[k] = XXH_readLE64(XXH3_kSecret + 8 * k);
  const uint8_t* const last =
      XXH3_kSecret + sizeof(XXH3_kSecret) - XXH_STRIPE_LEN - XXH_SECRET_LASTACC_START;
  for (int i = 0; i < kLanes; ++i) {
    keys.last_stripe[i] = XXH_readLE64(last + 8 * i);
    keys.merge[i] = XXH_readLE64(XXH3_kSecret + XXH_SECRET_MERGEACCS_START + 8 * i);
  }
  return keys;
}

}  // namespace xxh3_blocks

namespace {

using xxh3_blocks::kLanes;

// The eight lanes' share of `stripes` stripes at `input`; stripe s keyed by key(s, half, j).
template <typename KeyOf>
void SumStripes(const uint8_t* input, uint64_t stripes, KeyOf key, uint64_t (&sums)[kLanes]) {
  for (uint64_t s = 0; s < stripes; ++s) {
    for (int half = 0; half < 2; ++half) {
      uint64_t words[4];
      uint64_t keys[4];
      uint64_t half_sums[4] = {};
      for (int j = 0; j < 4; ++j) {
        words[j] = XXH_readLE64(input + s * xxh3_blocks::kStripeBytes + 8 * (4 * half + j));
        keys[j] = key(s, half, j);
      }
      xxh3_blocks::AddStripeHalf(words, keys, half_sums);
      for (int j = 0; j < 4; ++j) sums[4 * half + j] += half_sums[j];
    }
  }
}

uint64_t ChecksumPageByBlocks(const uint8_t* page, uint64_t page_bytes,
                              const xxh3_blocks::Keys& keys) {
  uint64_t lanes[kLanes];
  for (int i = 0; i < kLanes; ++i) lanes[i] = xxh3_blocks::InitialLane(i);
  const uint64_t blocks = xxh3_blocks::ChainedBlocks(page_bytes);
  for (uint64_t b = 0; b < blocks; ++b) {
    uint64_t sums[kLanes] = {};
    SumStripes(
        page + b * xxh3_blocks::kBlockBytes, xxh3_blocks::kStripesPerBlock,
        [&](uint64_t s, int half, int j) { return xxh3_blocks::BlockKey(keys, s, half, j); }, sums);
    for (int i = 0; i < kLanes; ++i) {
      lanes[i] = xxh3_blocks::Scramble(lanes[i] + sums[i], keys.words[16 + i]);
    }
  }
  const uint64_t tail_stripes = xxh3_blocks::TailStripes(page_bytes);
  uint64_t sums[kLanes] = {};
  SumStripes(
      page + blocks * xxh3_blocks::kBlockBytes, tail_stripes,
      [&](uint64_t s, int half, int j) {
        return xxh3_blocks::TailKey(keys, s, tail_stripes, half, j);
      },
      sums);
  for (int i = 0; i < kLanes; ++i) lanes[i] += sums[i];
  return xxh3_blocks::Merge(lanes, page_bytes, keys);
}

}  // namespace

absl::Status CheckChecksummedPageBytes(uint64_t page_bytes) {
  if (page_bytes < xxh3_blocks::kMinInputBytes || page_bytes % xxh3_blocks::kStripeBytes != 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "pages of %u bytes cannot be checksummed on a GPU: they must be a multiple of %u bytes and "
        "at least %u",
        page_bytes, xxh3_blocks::kStripeBytes, xxh3_blocks::kMinInputBytes));
  }
  return absl::OkStatus();
}

absl::Status ValidatePageCopies(absl::Span<const PageCopy> copies, uint64_t page_bytes) {
  RETURN_IF_ERROR(CheckChecksummedPageBytes(page_bytes));
  constexpr uintptr_t kAlignment = 16;
  for (size_t i = 0; i < copies.size(); ++i) {
    const auto misaligned = [](const void* pointer) {
      return reinterpret_cast<uintptr_t>(pointer) % kAlignment != 0;
    };
    if (copies[i].source == nullptr) {
      return absl::InvalidArgumentError(absl::StrFormat("page %u: the source is null", i));
    }
    if (misaligned(copies[i].source) || misaligned(copies[i].destination)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "page %u: the source and destination must be %u-byte aligned", i, kAlignment));
    }
  }
  return absl::OkStatus();
}

absl::Status CopyPagesChecksummedCpu(absl::Span<const PageCopy> copies, uint64_t page_bytes,
                                     absl::Span<uint64_t> checksums) {
  RETURN_IF_ERROR(ValidatePageCopies(copies, page_bytes));
  if (checksums.size() != copies.size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "CopyPagesChecksummedCpu: %u checksums for %u pages", checksums.size(), copies.size()));
  }
  const xxh3_blocks::Keys keys = xxh3_blocks::DefaultKeys();
  for (size_t i = 0; i < copies.size(); ++i) {
    checksums[i] = ChecksumPageByBlocks(copies[i].source, page_bytes, keys);
    if (copies[i].destination != nullptr) {
      std::memcpy(copies[i].destination, copies[i].source, page_bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status CopyPagesChecksummedCuda(const PageCopy* copies, uint32_t num_pages,
                                      uint64_t page_bytes, uint64_t* checksums, void* stream) {
  constexpr char kOp[] = "CopyPagesChecksummedCuda";
  RETURN_IF_ERROR(CheckChecksummedPageBytes(page_bytes));
  if (num_pages == 0) return absl::OkStatus();
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "copies", copies));
  RETURN_IF_ERROR(internal::CheckNotNull(kOp, "checksums", checksums));
  static const xxh3_blocks::Keys keys = xxh3_blocks::DefaultKeys();
  return internal::LaunchCopyPagesChecksummed(copies, num_pages, page_bytes, checksums, keys,
                                              stream);
}

}  // namespace kvcache::kernels
