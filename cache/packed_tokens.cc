#include "cache/packed_tokens.h"

#include <array>
#include <bit>
#include <cassert>
#include <new>
#include <utility>
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

// Whether the `count` tokens packed at `width` bits from `packed` are `tokens`. With the width a
// constant, 8 tokens take exactly `width` bytes, so each token of a group of 8 is a load at a
// constant offset, a constant shift and a constant mask: no branch and no arithmetic on
// positions. A hit compares every token, so nothing exits early.
template <uint32_t kWidth>
bool EqualsAtWidth(const uint8_t* packed, const uint32_t* tokens, uint32_t count) {
  constexpr uint32_t kMask = kWidth == 32 ? ~uint32_t{0} : (uint32_t{1} << kWidth) - 1;
  const auto token = [packed](uint32_t i) {
    const size_t bit = static_cast<size_t>(i) * kWidth;
    uint64_t word;
    std::memcpy(&word, packed + bit / 8, sizeof(word));
    return static_cast<uint32_t>(word >> (bit % 8)) & kMask;
  };
  uint32_t differ = 0;
  uint32_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const uint8_t* group = packed + static_cast<size_t>(i / 8) * kWidth;
    const uint32_t* expected = tokens + i;
    const auto at = [group](uint32_t j) {
      uint64_t word;
      std::memcpy(&word, group + j * kWidth / 8, sizeof(word));
      return static_cast<uint32_t>(word >> (j * kWidth % 8)) & kMask;
    };
    differ |= (at(0) ^ expected[0]) | (at(1) ^ expected[1]) | (at(2) ^ expected[2]) |
              (at(3) ^ expected[3]) | (at(4) ^ expected[4]) | (at(5) ^ expected[5]) |
              (at(6) ^ expected[6]) | (at(7) ^ expected[7]);
  }
  for (; i < count; ++i) differ |= token(i) ^ tokens[i];
  return differ == 0;
}

// Token `kJ` of a group of 8 at a constant width, into the group's bits `words`.
template <uint32_t kWidth, uint32_t kJ>
void PutInGroup(uint64_t (&words)[4], uint64_t token) {
  constexpr uint32_t kBit = kJ * kWidth;
  words[kBit / 64] |= token << (kBit % 64);
  if constexpr (kBit % 64 + kWidth > 64) words[kBit / 64 + 1] |= token >> (64 - kBit % 64);
}

// PackBits at a constant width: each group of 8 tokens (exactly `kWidth` bytes) is assembled in
// four words with constant shifts, unrolled at compile time, and stored at once.
template <uint32_t kWidth, uint32_t... kJs>
void PackAtWidth(const uint32_t* tokens, uint32_t count, uint8_t* out,
                 std::integer_sequence<uint32_t, kJs...>) {
  uint32_t i = 0;
  for (; i + 8 <= count; i += 8) {
    uint64_t words[4] = {};
    (PutInGroup<kWidth, kJs>(words, tokens[i + kJs]), ...);
    std::memcpy(out + static_cast<size_t>(i / 8) * kWidth, words, kWidth);
  }
  if (i < count) PackBits(tokens + i, count - i, kWidth, out + static_cast<size_t>(i / 8) * kWidth);
}

template <uint32_t kWidth>
void PackAtWidth(const uint32_t* tokens, uint32_t count, uint8_t* out) {
  PackAtWidth<kWidth>(tokens, count, out, std::make_integer_sequence<uint32_t, 8>());
}

using EqualsFn = bool (*)(const uint8_t*, const uint32_t*, uint32_t);
using PackFn = void (*)(const uint32_t*, uint32_t, uint8_t*);

template <uint32_t... kWidths>
constexpr std::array<PackFn, sizeof...(kWidths) + 1> MakePackTable(
    std::integer_sequence<uint32_t, kWidths...>) {
  return {nullptr, &PackAtWidth<kWidths + 1>...};
}

template <uint32_t... kWidths>
constexpr std::array<EqualsFn, sizeof...(kWidths) + 1> MakeEqualsTable(
    std::integer_sequence<uint32_t, kWidths...>) {
  return {nullptr, &EqualsAtWidth<kWidths + 1>...};
}
// By width, 1 to 32.
constexpr auto kEqualsAtWidth = MakeEqualsTable(std::make_integer_sequence<uint32_t, 32>());
constexpr auto kPackAtWidth = MakePackTable(std::make_integer_sequence<uint32_t, 32>());

}  // namespace

PackedTokens::PackedTokens(uint32_t num_slots, uint32_t tokens_per_slot)
    : num_slots_(num_slots), tokens_per_slot_(tokens_per_slot) {
  SetWidth(kInitialWidth);
  bytes_ = Allocate(width_);
}

std::unique_ptr<PackedTokens> PackedTokens::AtWidth(uint32_t num_slots, uint32_t tokens_per_slot,
                                                    uint32_t width) {
  auto store = std::make_unique<PackedTokens>(num_slots, tokens_per_slot);
  if (store->width_ != width) {
    store->SetWidth(width);
    store->bytes_ = store->Allocate(width);
  }
  return store;
}

std::unique_ptr<PackedTokens> PackedTokens::Clone() const {
  std::unique_ptr<PackedTokens> clone = AtWidth(num_slots_, tokens_per_slot_, width_);
  CopyInto(*clone);
  return clone;
}

std::unique_ptr<PackedTokens> PackedTokens::Resident(uint32_t num_slots, uint32_t tokens_per_slot,
                                                     uint32_t width) {
  std::unique_ptr<PackedTokens> store = AtWidth(num_slots, tokens_per_slot, width);
  // A large calloc leaves the kernel's zero pages unmapped: write one byte of each (volatile,
  // so that a compiler knowing calloc's memory is zero keeps the stores).
  volatile uint8_t* bytes = store->bytes_.get();
  const size_t size = store->num_slots_ * store->slot_bytes_ + sizeof(uint64_t);
  for (size_t offset = 0; offset < size; offset += 4096) bytes[offset] = 0;
  return store;
}

bool PackedTokens::CopyInto(PackedTokens& target) const {
  if (target.num_slots_ != num_slots_ || target.tokens_per_slot_ != tokens_per_slot_ ||
      target.width_ != width_) {
    return false;
  }
  std::memcpy(target.bytes_.get(), bytes_.get(), num_slots_ * slot_bytes_ + sizeof(uint64_t));
  return true;
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
  if ((all & ~mask_) != 0) Widen(WidthFor(static_cast<uint32_t>(std::bit_width(all))), live);
  kPackAtWidth[width_](tokens.data(), tokens_per_slot_, bytes_.get() + slot * slot_bytes_);
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
    kPackAtWidth[width_](tokens.data(), tokens_per_slot_, bytes_.get() + slot * slot_bytes_);
  }
}

void PackedTokens::CopyTo(uint32_t slot, uint32_t* out) const {
  for (uint32_t i = 0; i < tokens_per_slot_; ++i) out[i] = Get(slot, i);
}

bool PackedTokens::Equals(uint32_t slot, absl::Span<const uint32_t> tokens) const {
  if (tokens.size() != tokens_per_slot_) return false;
  return kEqualsAtWidth[width_](SlotBytes(slot), tokens.data(), tokens_per_slot_);
}

}  // namespace kvcache
