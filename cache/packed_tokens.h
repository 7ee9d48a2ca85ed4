// PackedTokens: the tokens of a pool's published blocks, `tokens_per_slot` of them per slot (a
// block id), each stored in `width` bits, one width for the whole store. A vocabulary of up to
// 2^18 ids (every common model's) takes 18 bits a token: 36 bytes for a 16-token block instead
// of 64. Storing a token that needs more bits widens the store to 24 bits, or 32: every live
// slot is repacked (O(slots); at most twice in the store's life, in practice never).
//
// Exact: Get returns what Store stored, and Equals compares every token in full (a token wider
// than the store never equals a stored one).
//
// Memory: slots never stored to cost no resident memory (the buffer is zero-filled by the
// kernel on first touch).
//
// Thread safety: none; the owner serializes.
#ifndef KVCACHE_CACHE_PACKED_TOKENS_H_
#define KVCACHE_CACHE_PACKED_TOKENS_H_

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"

namespace kvcache {

class PackedTokens {
 public:
  static constexpr uint32_t kInitialWidth = 18;
  // The width a store takes for tokens of `bits` bits: few widths, so few repacks.
  static uint32_t WidthFor(uint32_t bits) {
    return bits <= kInitialWidth ? kInitialWidth : bits <= 24 ? 24 : 32;
  }

  PackedTokens(uint32_t num_slots, uint32_t tokens_per_slot);

  PackedTokens(const PackedTokens&) = delete;
  PackedTokens& operator=(const PackedTokens&) = delete;

  // A copy of every slot (one copy of the buffer, at memcpy's speed): KvEventLog's snapshots copy
  // the log's tokens under its mutex and read them after.
  std::unique_ptr<PackedTokens> Clone() const;
  // A store of `num_slots` slots at `width` bits whose buffer is resident (every page written
  // once), for CopyInto to fill without a page fault: KvEventLog makes these before it takes its
  // mutex for a snapshot's copy, when most of that copy's time was page faults.
  static std::unique_ptr<PackedTokens> Resident(uint32_t num_slots, uint32_t tokens_per_slot,
                                                uint32_t width);
  // Copies every slot into `target` (one copy of the buffer) and returns true when it has this
  // store's slots and width; else copies nothing and returns false (this store widened since).
  bool CopyInto(PackedTokens& target) const;

  uint32_t width() const { return width_; }
  uint32_t tokens_per_slot() const { return tokens_per_slot_; }
  // Bytes a slot takes at the current width.
  size_t slot_bytes() const { return slot_bytes_; }

  // Stores `tokens` in `slot`, widening first when one needs more bits than width(): then every
  // slot `live` names is repacked. REQUIRES: tokens.size() == tokens_per_slot().
  void Store(uint32_t slot, absl::Span<const uint32_t> tokens,
             absl::FunctionRef<bool(uint32_t)> live);
  uint32_t Get(uint32_t slot, uint32_t i) const {
    const size_t bit = static_cast<size_t>(i) * width_;
    return static_cast<uint32_t>(Load(SlotBytes(slot) + bit / 8) >> (bit % 8)) & mask_;
  }
  // Starts loading the slot's bytes into the cache, for a comparison to come.
  void Prefetch(uint32_t slot) const { __builtin_prefetch(SlotBytes(slot)); }
  // Writes the slot's tokens_per_slot() tokens to `out`.
  void CopyTo(uint32_t slot, uint32_t* out) const;
  // Whether `tokens` are exactly what the slot holds.
  bool Equals(uint32_t slot, absl::Span<const uint32_t> tokens) const;

 private:
  struct FreeDeleter {
    void operator()(uint8_t* bytes) const { std::free(bytes); }
  };
  using Buffer = std::unique_ptr<uint8_t[], FreeDeleter>;

  // An empty store of `num_slots` slots at `width` bits (zero-filled, not yet resident).
  static std::unique_ptr<PackedTokens> AtWidth(uint32_t num_slots, uint32_t tokens_per_slot,
                                               uint32_t width);
  // A zero-filled buffer for the slots at `width` bits, with a word of slack at its end so that
  // every token is read and written as one unaligned 64-bit word.
  Buffer Allocate(uint32_t width) const;
  static uint64_t Load(const uint8_t* at) {
    uint64_t word;
    std::memcpy(&word, at, sizeof(word));
    return word;
  }
  const uint8_t* SlotBytes(uint32_t slot) const { return bytes_.get() + slot * slot_bytes_; }
  void Widen(uint32_t width, absl::FunctionRef<bool(uint32_t)> live);
  void SetWidth(uint32_t width);

  const uint32_t num_slots_;
  const uint32_t tokens_per_slot_;
  uint32_t width_ = 0;
  uint32_t mask_ = 0;
  size_t slot_bytes_ = 0;
  Buffer bytes_;
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_PACKED_TOKENS_H_
