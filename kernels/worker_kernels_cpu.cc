// Host-side checks of the device-resident index arrays of worker_kernels.h, built in every
// configuration. The numeric CPU references of the kernels are the worker model's own functions
// (model/ops.h, model/paged_kv.h); see the header.
#include <algorithm>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include "absl/strings/str_format.h"
#include "kernels/worker_kernels.h"

namespace kvcache::kernels {

absl::Status ValidateSlotMapping(absl::Span<const int64_t> slot_mapping, uint64_t num_pool_blocks,
                                 uint32_t block_size) {
  if (block_size == 0) {
    return absl::InvalidArgumentError("ValidateSlotMapping: block_size must be > 0");
  }
  // num_pool_blocks * block_size, saturated at UINT64_MAX (past every int64 slot).
  constexpr uint64_t kMaxSlots = std::numeric_limits<uint64_t>::max();
  const uint64_t num_slots =
      num_pool_blocks > kMaxSlots / block_size ? kMaxSlots : num_pool_blocks * block_size;
  std::vector<std::pair<int64_t, size_t>> used;
  used.reserve(slot_mapping.size());
  for (size_t i = 0; i < slot_mapping.size(); ++i) {
    const int64_t slot = slot_mapping[i];
    if (slot == kSkipSlot) continue;
    if (slot < 0 || static_cast<uint64_t>(slot) >= num_slots) {
      return absl::OutOfRangeError(absl::StrFormat(
          "slot_mapping[%u] = %d is out of range [0, %u) (%u blocks of %u tokens; use -1 to skip)",
          i, slot, num_slots, num_pool_blocks, block_size));
    }
    used.emplace_back(slot, i);
  }
  std::sort(used.begin(), used.end());
  for (size_t i = 1; i < used.size(); ++i) {
    if (used[i].first == used[i - 1].first) {
      return absl::InvalidArgumentError(
          absl::StrFormat("slot_mapping[%u] and slot_mapping[%u] both write slot %d",
                          used[i - 1].second, used[i].second, used[i].first));
    }
  }
  return absl::OkStatus();
}

absl::Status ValidatePagedAttentionInputs(absl::Span<const uint32_t> positions,
                                          absl::Span<const uint32_t> seq_ids,
                                          absl::Span<const uint32_t> block_tables,
                                          uint32_t num_seqs, uint32_t max_blocks_per_seq,
                                          uint32_t block_size, uint64_t num_pool_blocks) {
  if (num_seqs == 0 || max_blocks_per_seq == 0 || block_size == 0) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ValidatePagedAttentionInputs: num_seqs (%u), max_blocks_per_seq (%u) and block_size "
        "(%u) must be > 0",
        num_seqs, max_blocks_per_seq, block_size));
  }
  if (!seq_ids.empty() && seq_ids.size() != positions.size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%u seq ids for %u positions (want one per token, or none)", seq_ids.size(),
                        positions.size()));
  }
  if (block_tables.size() != uint64_t{num_seqs} * max_blocks_per_seq) {
    return absl::InvalidArgumentError(
        absl::StrFormat("block_tables has %u entries, want num_seqs * max_blocks_per_seq = %u",
                        block_tables.size(), uint64_t{num_seqs} * max_blocks_per_seq));
  }
  const uint64_t capacity = uint64_t{max_blocks_per_seq} * block_size;
  // Per sequence, the number of leading table entries some token reads, and that token.
  std::vector<uint64_t> entries_read(num_seqs, 0);
  std::vector<size_t> reader(num_seqs, 0);
  for (size_t t = 0; t < positions.size(); ++t) {
    const uint32_t seq = seq_ids.empty() ? 0 : seq_ids[t];
    if (seq >= num_seqs) {
      return absl::InvalidArgumentError(
          absl::StrFormat("seq_ids[%u] = %u but there are %u sequences", t, seq, num_seqs));
    }
    const uint64_t position = positions[t];
    if (position >= capacity) {
      return absl::OutOfRangeError(
          absl::StrFormat("positions[%u] = %u is past the %u-token capacity of a %u-block table", t,
                          position, capacity, max_blocks_per_seq));
    }
    if (position / block_size + 1 > entries_read[seq]) {
      entries_read[seq] = position / block_size + 1;
      reader[seq] = t;
    }
  }
  for (uint32_t seq = 0; seq < num_seqs; ++seq) {
    const uint32_t* table = block_tables.data() + uint64_t{seq} * max_blocks_per_seq;
    for (uint64_t b = 0; b < entries_read[seq]; ++b) {
      if (table[b] >= num_pool_blocks) {
        return absl::OutOfRangeError(absl::StrFormat(
            "block_tables[%u][%u] = %u (read by token %u) is outside the %u-block pool", seq, b,
            table[b], reader[seq], num_pool_blocks));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace kvcache::kernels
