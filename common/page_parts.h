// PageParts: the named byte ranges of a pool's pages (DESIGN §13) and the one hit rule every
// lookup of pages answers with.
//
// A model may keep several kinds of state per page: full-attention KV, a sliding window's KV, a
// recurrent (linear-attention, Mamba) state, a sparse indexer. A pool declares them as parts of
// its block, in page order; a page carries a subset of them (a recurrent state only at the
// boundaries the engine checkpointed), recorded as a bit mask (bit i: part i).
//
// The hit rule: restoring the first e pages needs, for each part asked for, the part on every
// one of them (kAllPages: full attention, indexers), or only on the last `trailing_pages` of
// them (kTrailingPages: a window of W tokens needs the pages covering the last W, a state its
// one page at the endpoint). RestorablePages answers the greatest such e: the greatest endpoint
// every part can restore, never a per-part minimum that one part could not load at
// (sglang#39147).
//
// Thread safety: value types and pure functions.
#ifndef KVCACHE_COMMON_PAGE_PARTS_H_
#define KVCACHE_COMMON_PAGE_PARTS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace kvcache {

inline constexpr size_t kMaxPageParts = 16;
// A page key's bytes and a call's keys (kvcache.v1, "Pages named by the engine's keys").
inline constexpr size_t kMaxPageKeyBytes = 64;
inline constexpr size_t kMaxPagesPerCall = 4096;

// Where a page call's pages were (kvcache.v1.TierPages), summing to its page count; the daemon's
// answer and the client's.
struct PagesByTier {
  uint32_t pool = 0;
  uint32_t host = 0;
  uint32_t disk = 0;
  uint32_t cluster = 0;
};

// INVALID_ARGUMENT unless there are 1 to kMaxPagesPerCall keys of 1 to kMaxPageKeyBytes bytes;
// the daemon's check, and the client's before it sends a batch.
absl::Status ValidatePageKeys(absl::Span<const std::string> keys);

enum class PartHitPolicy : uint8_t {
  kAllPages,       // every page up to the endpoint
  kTrailingPages,  // the last trailing_pages pages before the endpoint
};

struct PagePartLayout {
  std::string name;
  uint64_t offset = 0;  // from the page's first byte; parts follow each other in order
  uint64_t bytes = 0;
  PartHitPolicy policy = PartHitPolicy::kAllPages;
  uint32_t trailing_pages = 0;  // kTrailingPages only, at least 1

  bool operator==(const PagePartLayout&) const = default;
};

// A pool spec's `parts` value: NAME/SIZE[/trailingN] joined by "+", in page order ("kv/12K+
// state/4K/trailing1"); SIZE as common/byte_size.h reads it. Offsets follow from the order.
// INVALID_ARGUMENT naming what is wrong: a bad name (1 to 64 of [A-Za-z0-9._-]), a repeated
// one, a size of 0, more than kMaxPageParts parts, or parts not summing to `page_bytes`.
absl::StatusOr<std::vector<PagePartLayout>> ParsePageParts(absl::string_view spec,
                                                           uint64_t page_bytes);

// The parts of a pool declared without any: one part "kv", the whole page, all pages.
std::vector<PagePartLayout> SinglePagePart(uint64_t page_bytes);

// The mask of every part.
inline uint32_t AllPartsMask(size_t num_parts) {
  return num_parts >= 32 ? ~uint32_t{0} : (uint32_t{1} << num_parts) - 1;
}

// The mask of the named parts; empty `names`: every part. INVALID_ARGUMENT naming an unknown
// part.
absl::StatusOr<uint32_t> PartMaskOf(absl::Span<const PagePartLayout> parts,
                                    absl::Span<const std::string> names);

// The mask of the parts every page up to an endpoint needs (kAllPages): a token block without
// them is no block.
uint32_t RequiredPartsMask(absl::Span<const PagePartLayout> parts);

// INVALID_ARGUMENT unless every mask (a token commit's, one per block from block 0) names only
// the pool's parts and holds each all-pages part; the message names the first bad block.
absl::Status ValidateBlockPartMasks(absl::Span<const PagePartLayout> parts,
                                    absl::Span<const uint32_t> masks);

// A block's part mask below tier 1 travels in its identity's extras digest (tiers/block_record.h):
// a page's digest is its mask; a token block of a pool with declared parts keeps its extra keys'
// digest in the high bits and its mask in the low kPartMaskBits (the prefix digest covers the
// extra keys in full). A pool without declared parts keeps the whole digest: its blocks have
// every part.
inline constexpr int kPartMaskBits = 16;
static_assert(kMaxPageParts <= kPartMaskBits);
inline constexpr uint64_t kPartMaskField = (uint64_t{1} << kPartMaskBits) - 1;
inline uint32_t PartMaskIn(uint64_t extras_digest) {
  return static_cast<uint32_t>(extras_digest & kPartMaskField);
}
inline uint64_t WithPartMask(uint64_t extras_digest, uint32_t mask) {
  return (extras_digest & ~kPartMaskField) | mask;
}
// Whether two extras digests name the same extra keys, whatever parts they carry.
inline bool SameExtraKeys(uint64_t a, uint64_t b) { return ((a ^ b) & ~kPartMaskField) == 0; }

// The greatest e <= page_masks.size() such that, for every part in `wanted`, the pages [0, e)
// hold it where its policy needs it (see the file comment). page_masks[i]: the parts page i
// holds. O(pages x parts).
size_t RestorablePages(absl::Span<const PagePartLayout> parts, uint32_t wanted,
                       absl::Span<const uint32_t> page_masks);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_PAGE_PARTS_H_
