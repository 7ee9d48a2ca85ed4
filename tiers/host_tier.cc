#include "tiers/host_tier.h"

#include <sys/mman.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"

namespace kvcache {

absl::StatusOr<std::unique_ptr<HostTier>> HostTier::Create(uint64_t capacity_bytes,
                                                           uint64_t block_bytes,
                                                           RecordChangeListener on_change) {
  if (block_bytes == 0) return absl::InvalidArgumentError("host tier block_bytes must be > 0");
  const uint64_t slots = capacity_bytes / block_bytes;
  if (slots == 0 || slots >= kNoSlot) {
    return absl::InvalidArgumentError(
        absl::StrCat("host_tier=", capacity_bytes, " bytes holds ", slots, " blocks of ",
                     block_bytes, " bytes; give at least ", block_bytes,
                     " bytes (one block) and fewer than ", kNoSlot, " blocks"));
  }
  const uint64_t mapped = slots * block_bytes;
  void* base = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (base == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrCat("host tier: cannot map ", mapped, " bytes: ", std::strerror(errno)));
  }
  return std::unique_ptr<HostTier>(new HostTier(static_cast<uint8_t*>(base), mapped, block_bytes,
                                                static_cast<uint32_t>(slots),
                                                std::move(on_change)));
}

HostTier::HostTier(uint8_t* base, uint64_t mapped_bytes, uint64_t block_bytes, uint32_t num_slots,
                   RecordChangeListener on_change)
    : base_(base),
      mapped_bytes_(mapped_bytes),
      block_bytes_(block_bytes),
      num_slots_(num_slots),
      changes_(std::move(on_change)),
      slots_(num_slots) {
  free_slots_.reserve(num_slots);
  for (uint32_t i = num_slots; i > 0; --i) free_slots_.push_back(i - 1);
  index_.reserve(num_slots);
  counters_.capacity_bytes = mapped_bytes;
}

HostTier::~HostTier() { munmap(base_, mapped_bytes_); }

void HostTier::DropLocked(uint32_t slot) {
  Slot& s = slots_[slot];
  changes_.Add(RecordChange::Kind::kRemoved, s.identity);
  index_.erase(s.identity.hash);
  LruRemove(slot);
  --counters_.records;
  counters_.bytes_used -= block_bytes_;
  if (s.pins > 0) {
    s.state = SlotState::kDropped;  // the last UnpinLocked frees it
    return;
  }
  s.state = SlotState::kFree;
  s.below = false;
  s.reused = false;
  s.identity = BlockRecordIdentity{};
  free_slots_.push_back(slot);
}

void HostTier::UnpinLocked(uint32_t slot) {
  Slot& s = slots_[slot];
  if (--s.pins > 0 || s.state != SlotState::kDropped) return;
  s.state = SlotState::kFree;
  s.below = false;
  s.reused = false;
  s.identity = BlockRecordIdentity{};
  free_slots_.push_back(slot);
}

absl::StatusOr<HostTier::StoreResult> HostTier::Store(const BlockRecordIdentity& identity,
                                                      const uint8_t* bytes, bool reused) {
  absl::StatusOr<StoreResult> result = StoreAndIndex(identity, bytes, reused);
  changes_.Deliver();
  return result;
}

absl::StatusOr<HostTier::StoreResult> HostTier::StoreAndIndex(const BlockRecordIdentity& identity,
                                                              const uint8_t* bytes, bool reused) {
  StoreResult result;
  uint32_t slot = kNoSlot;
  std::function<void(const Hash128&)> hook;
  {
    absl::MutexLock lock(&mu_);
    if (index_.contains(identity.hash)) {
      return absl::AlreadyExistsError(
          absl::StrCat("host tier already holds hash ", identity.hash.ToHex()));
    }
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      // The least recently used record that no load is reading; pins are few (one per load in
      // flight), so this stays O(1) in practice.
      uint32_t victim = lru_.front();
      while (victim != kNoSlot && slots_[victim].pins > 0) victim = slots_[victim].lru.next;
      if (victim == kNoSlot) {
        ++counters_.store_rejections;
        return absl::ResourceExhaustedError("host tier: every slot is being read");
      }
      result.evicted = slots_[victim].identity;
      DropLocked(victim);
      ++counters_.evicted;
      slot = free_slots_.back();
      free_slots_.pop_back();
    }
    Slot& s = slots_[slot];
    s.state = SlotState::kFilling;
    s.pins = 1;
    hook = store_hook_;
  }
  if (hook) hook(identity.hash);
  // The slot is private until indexed: no lock needed for its bytes.
  std::memcpy(SlotBytes(slot), bytes, block_bytes_);
  absl::MutexLock lock(&mu_);
  Slot& s = slots_[slot];
  s.pins = 0;
  if (index_.contains(identity.hash)) {
    // A concurrent store of the same hash won.
    s.state = SlotState::kFree;
    free_slots_.push_back(slot);
    return absl::AlreadyExistsError(
        absl::StrCat("host tier already holds hash ", identity.hash.ToHex()));
  }
  s.state = SlotState::kStored;
  s.reused = reused;
  s.identity = identity;
  index_.emplace(identity.hash, slot);
  LruPushBack(slot);
  changes_.Add(RecordChange::Kind::kStored, identity);
  ++counters_.stored;
  ++counters_.records;
  counters_.bytes_used += block_bytes_;
  return result;
}

std::optional<BlockRecordIdentity> HostTier::Find(const Hash128& hash) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end()) return std::nullopt;
  return slots_[it->second].identity;
}

TierProbe HostTier::Probe(const BlockRecordIdentity& expected) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(expected.hash);
  if (it == index_.end()) return TierProbe::kAbsent;
  return RecordMismatch(slots_[it->second].identity, expected).empty() ? TierProbe::kMatch
                                                                       : TierProbe::kMismatch;
}

bool HostTier::Contains(const Hash128& hash) const {
  absl::MutexLock lock(&mu_);
  return index_.contains(hash);
}

absl::Status HostTier::Load(const BlockRecordIdentity& expected, uint8_t* out) {
  absl::Status loaded = CopyOutVerified(expected, out);
  changes_.Deliver();
  return loaded;
}

absl::Status HostTier::CopyOutVerified(const BlockRecordIdentity& expected, uint8_t* out) {
  uint32_t slot = kNoSlot;
  uint64_t checksum = 0;
  std::function<void(const Hash128&)> hook;
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(expected.hash);
    if (it == index_.end()) {
      ++counters_.misses;
      return absl::NotFoundError(
          absl::StrCat("host tier holds no record of hash ", expected.hash.ToHex()));
    }
    slot = it->second;
    Slot& s = slots_[slot];
    const absl::string_view mismatch = RecordMismatch(s.identity, expected);
    if (!mismatch.empty()) {
      ++counters_.misses;
      ++counters_.mismatches;
      return absl::NotFoundError(absl::StrCat("host tier record of hash ", expected.hash.ToHex(),
                                              " differs in ", mismatch));
    }
    ++s.pins;
    checksum = s.identity.checksum;
    LruRemove(slot);
    LruPushBack(slot);
    hook = load_hook_;
  }
  if (hook) hook(expected.hash);
  std::memcpy(out, SlotBytes(slot), block_bytes_);
  const bool verified = BlockChecksum(out, block_bytes_) == checksum;
  absl::MutexLock lock(&mu_);
  if (verified) {
    ++counters_.loaded;
    slots_[slot].reused = true;
    UnpinLocked(slot);
    return absl::OkStatus();
  }
  ++counters_.misses;
  ++counters_.verify_failures;
  if (slots_[slot].state == SlotState::kStored) DropLocked(slot);
  UnpinLocked(slot);
  return absl::DataLossError(absl::StrCat("host tier record of hash ", expected.hash.ToHex(),
                                          " failed its checksum; dropped"));
}

std::vector<HostTier::Demotion> HostTier::PinForDemotion(uint32_t window, size_t max,
                                                         bool reused_only) {
  std::vector<Demotion> batch;
  absl::MutexLock lock(&mu_);
  if (free_slots_.size() >= window) return batch;
  uint32_t scanned = 0;
  for (uint32_t slot = lru_.front(); slot != kNoSlot && scanned < window && batch.size() < max;
       slot = slots_[slot].lru.next, ++scanned) {
    Slot& s = slots_[slot];
    // A pinned record is being loaded (it just became the most recent) or already demoted.
    if (s.below || s.pins > 0 || (reused_only && !s.reused)) continue;
    ++s.pins;
    batch.push_back(Demotion{.slot = slot, .identity = s.identity, .bytes = SlotBytes(slot)});
  }
  return batch;
}

void HostTier::MarkReused(const Hash128& hash) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it != index_.end()) slots_[it->second].reused = true;
}

void HostTier::FinishDemotion(uint32_t slot, const absl::Status& stored) {
  {
    absl::MutexLock lock(&mu_);
    Slot& s = slots_[slot];
    if (s.state == SlotState::kStored) {
      if ((stored.ok() || absl::IsAlreadyExists(stored)) && !s.below) {
        s.below = true;
        ++counters_.demoted;
      } else if (absl::IsDataLoss(stored)) {
        ++counters_.verify_failures;
        DropLocked(slot);
      }
    }
    UnpinLocked(slot);
  }
  changes_.Deliver();
}

HostTierCounters HostTier::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

absl::Status HostTier::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  uint64_t stored = 0, free = 0, busy = 0;
  for (uint32_t slot = 0; slot < num_slots_; ++slot) {
    const Slot& s = slots_[slot];
    switch (s.state) {
      case SlotState::kStored: {
        ++stored;
        auto it = index_.find(s.identity.hash);
        if (it == index_.end() || it->second != slot) {
          return fail("host tier slot ", slot, " holds hash ", s.identity.hash.ToHex(),
                      " not indexed to it");
        }
        break;
      }
      case SlotState::kFree:
        ++free;
        if (s.pins != 0) return fail("free host tier slot ", slot, " is pinned");
        break;
      case SlotState::kFilling:
      case SlotState::kDropped:
        ++busy;
        if (s.pins == 0) return fail("host tier slot ", slot, " in flight without a pin");
        break;
    }
  }
  if (index_.size() != stored) {
    return fail("host tier index holds ", index_.size(), " hashes but ", stored, " slots");
  }
  if (free != free_slots_.size()) {
    return fail("host tier has ", free, " free slots but its free list ", free_slots_.size());
  }
  if (stored + free + busy != num_slots_) {
    return fail("host tier slots ", stored, " + ", free, " + ", busy, " != ", num_slots_);
  }
  uint64_t lru_length = 0;
  uint32_t previous = kNoSlot;
  for (uint32_t slot = lru_.front(); slot != kNoSlot; slot = slots_[slot].lru.next) {
    if (++lru_length > num_slots_) return fail("host tier LRU has a cycle");
    if (slots_[slot].lru.prev != previous) return fail("host tier LRU link broken at ", slot);
    if (slots_[slot].state != SlotState::kStored) return fail("unstored slot ", slot, " on LRU");
    previous = slot;
  }
  if (previous != lru_.back() || lru_length != stored) {
    return fail("host tier LRU holds ", lru_length, " of ", stored, " records");
  }
  if (counters_.records != stored || counters_.bytes_used != stored * block_bytes_) {
    return fail("host tier counts ", counters_.records, " records and ", counters_.bytes_used,
                " bytes but holds ", stored);
  }
  return absl::OkStatus();
}

const uint8_t* HostTier::RecordBytesForTesting(const Hash128& hash) const {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  return it == index_.end() ? nullptr : SlotBytes(it->second);
}

bool HostTier::CorruptForTesting(const Hash128& hash, uint64_t offset) {
  absl::MutexLock lock(&mu_);
  auto it = index_.find(hash);
  if (it == index_.end() || offset >= block_bytes_) return false;
  SlotBytes(it->second)[offset] ^= 0x5a;
  return true;
}

void HostTier::SetStoreHookForTesting(std::function<void(const Hash128&)> hook) {
  absl::MutexLock lock(&mu_);
  store_hook_ = std::move(hook);
}

void HostTier::SetLoadHookForTesting(std::function<void(const Hash128&)> hook) {
  absl::MutexLock lock(&mu_);
  load_hook_ = std::move(hook);
}

}  // namespace kvcache
