#include "cache/packed_tokens.h"

#include <bit>
#include <cassert>
#include <new>
#include <vector>

namespace kvcache {
namespace {

size_t BytesFor(uint32_t count, uint32_t width) {
  return (static_cast<size_t>(count) * width + 7) / 8;
}

uint32_t MaskOf(uint32_t width) { return width == 32 ? ~uint32_t{0} : (uint32_t{1} << width) - 1; }

// Writes `count` tokens of `width` bits to the BytesFor(count, width) bytes at `out`: whole
// 32-bit words out of an accumulator, one store each and none read back (a read-modify-write per
// token stalls on the store before it).
void PackBits(const uint32_t* tokens, uint32_t count, uint32_t width, uint8_t* out) {
  uint64_t bits = 0;
  uint32_t held = 0;
  for (uint32_t i = 0; i < count; ++i) {
    bits |= uint64_t{tokens[i]} << held;
    held += width;
    if (held >= 32) {
      const uint32_t word = static_cast<uint32_t>(bits);
      std::memcpy(out, &word, sizeof(word));
      out += sizeof(word);
      bits >>= 32;
      held -= 32;
    }
  }
  for (; held > 0; held = held > 8 ? held - 8 : 0, bits >>= 8) *out++ = static_cast<uint8_t>(bits);
}

}  // namespace

PackedTokens::PackedTokens(uint32_t num_slots, uint32_t tokens_per_slot)
    : num_slots_(num_slots), tokens_per_slot_(tokens_per_slot) {
  SetWidth(kInitialWidth);
  bytes_ = Allocate(width_);
}

void PackedTokens::SetWidth(uint32_t width) {
  width_ = width;
  mask_ = MaskOf(width);
  slot_bytes_ = BytesFor(tokens_per_slot_, width);
}

PackedTokens::Buffer PackedTokens::Allocate(uint32_t width) const {
  // calloc: large buffers come from the kernel already zero, so untouched slots stay unmapped.
  auto* bytes = static_cast<uint8_t*>(
      std::calloc(num_slots_ * BytesFor(tokens_per_slot_, width) + sizeof(uint64_t), 1));
  if (bytes == nullptr) throw std::bad_alloc();
  return Buffer(bytes);
}

void PackedTokens::Store(uint32_t slot, absl::Span<const uint32_t> tokens,
                         absl::FunctionRef<bool(uint32_t)> live) {
  assert(slot < num_slots_ && tokens.size() == tokens_per_slot_);
  uint32_t all = 0;
  for (uint32_t token : tokens) all |= token;
  if ((all & ~mask_) != 0) Widen(static_cast<uint32_t>(std::bit_width(all)), live);
  PackBits(tokens.data(), tokens_per_slot_, width_, bytes_.get() + slot * slot_bytes_);
}

void PackedTokens::Widen(uint32_t width, absl::FunctionRef<bool(uint32_t)> live) {
  const Buffer narrow = std::move(bytes_);
  const uint32_t narrow_width = width_;
  const uint32_t narrow_mask = mask_;
  const size_t narrow_slot_bytes = slot_bytes_;
  SetWidth(width);
  bytes_ = Allocate(width);
  std::vector<uint32_t> tokens(tokens_per_slot_);
  for (uint32_t slot = 0; slot < num_slots_; ++slot) {
    if (!live(slot)) continue;
    const uint8_t* from = narrow.get() + slot * narrow_slot_bytes;
    for (uint32_t i = 0; i < tokens_per_slot_; ++i) {
      const size_t bit = static_cast<size_t>(i) * narrow_width;
      tokens[i] = static_cast<uint32_t>(Load(from + bit / 8) >> (bit % 8)) & narrow_mask;
    }
    PackBits(tokens.data(), tokens_per_slot_, width_, bytes_.get() + slot * slot_bytes_);
  }
}

void PackedTokens::CopyTo(uint32_t slot, uint32_t* out) const {
  for (uint32_t i = 0; i < tokens_per_slot_; ++i) out[i] = Get(slot, i);
}

bool PackedTokens::Equals(uint32_t slot, absl::Span<const uint32_t> tokens) const {
  if (tokens.size() != tokens_per_slot_) return false;
  for (uint32_t i = 0; i < tokens_per_slot_; ++i) {
    if (Get(slot, i) != tokens[i]) return false;
  }
  return true;
}

}  // namespace kvcache
