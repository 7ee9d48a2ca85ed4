#include "tiers/host_tier.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "common/status_macros.h"

namespace kvcache {

absl::StatusOr<std::unique_ptr<HostTier>> HostTier::Create(uint64_t capacity_bytes,
                                                           uint64_t block_bytes,
                                                           RecordChangeListener on_change,
                                                           HostMemoryRegistrar registrar) {
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
  if (registrar.register_memory) {
    // The whole pages the mapping holds (page-locking works on pages).
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    const absl::Status registered =
        registrar.register_memory(base, (mapped + page - 1) / page * page);
    if (!registered.ok()) {
      munmap(base, mapped);
      return absl::Status(registered.code(), absl::StrCat("host tier: ", registered.message()));
    }
  }
  return std::unique_ptr<HostTier>(
      new HostTier(static_cast<uint8_t*>(base), mapped, block_bytes, static_cast<uint32_t>(slots),
                   std::move(on_change),
                   registrar.register_memory ? std::move(registrar.unregister_memory) : nullptr));
}

HostTier::HostTier(uint8_t* base, uint64_t mapped_bytes, uint64_t block_bytes, uint32_t num_slots,
                   RecordChangeListener on_change, std::function<void(void*)> unregister_memory)
    : base_(base),
      mapped_bytes_(mapped_bytes),
      block_bytes_(block_bytes),
      num_slots_(num_slots),
      unregister_memory_(std::move(unregister_memory)),
      changes_(std::move(on_change)),
      slots_(num_slots) {
  free_slots_.reserve(num_slots);
  for (uint32_t i = num_slots; i > 0; --i) free_slots_.push_back(i - 1);
  index_.reserve(num_slots);
  counters_.capacity_bytes = mapped_bytes;
}

HostTier::~HostTier() {
  if (unregister_memory_) unregister_memory_(base_);
  munmap(base_, mapped_bytes_);
}

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
  FreeLocked(slot);
}

void HostTier::UnpinLocked(uint32_t slot) {
  Slot& s = slots_[slot];
  if (--s.pins > 0 || s.state != SlotState::kDropped) return;
  FreeLocked(slot);
}

void HostTier::FreeLocked(uint32_t slot) {
  Slot& s = slots_[slot];
  s.state = SlotState::kFree;
  s.pins = 0;
  s.below = false;
  s.reused = false;
  s.identity = BlockRecordIdentity{};
  free_slots_.push_back(slot);
}

absl::StatusOr<HostTier::StoreResult> HostTier::Store(const BlockRecordIdentity& identity,
                                                      const uint8_t* bytes, bool reused) {
  absl::StatusOr<PendingStore> pending = BeginStore(identity.hash);
  if (!pending.ok()) return pending.status();
  std::memcpy(pending->bytes, bytes, block_bytes_);
  RETURN_IF_ERROR(FinishStore(*pending, identity, reused, /*filled=*/true));
  return StoreResult{.evicted = std::move(pending->evicted)};
}

absl::StatusOr<HostTier::PendingStore> HostTier::BeginStore(const Hash128& hash) {
  PendingStore pending;
  std::function<void(const Hash128&)> hook;
  {
    absl::MutexLock lock(&mu_);
    if (index_.contains(hash)) {
      return absl::AlreadyExistsError(absl::StrCat("host tier already holds hash ", hash.ToHex()));
    }
    if (free_slots_.empty()) {
      // The least recently used record that no load is reading; pins are few (at most a batch per
      // load in flight), so this stays O(1) in practice.
      uint32_t victim = lru_.front();
      while (victim != kNoSlot && slots_[victim].pins > 0) victim = slots_[victim].lru.next;
      if (victim == kNoSlot) {
        ++counters_.store_rejections;
        return absl::ResourceExhaustedError("host tier: every slot is being read or filled");
      }
      pending.evicted = slots_[victim].identity;
      DropLocked(victim);
      ++counters_.evicted;
    }
    pending.slot = free_slots_.back();
    free_slots_.pop_back();
    Slot& s = slots_[pending.slot];
    s.state = SlotState::kFilling;
    s.pins = 1;
    hook = store_hook_;
  }
  pending.bytes = SlotBytes(pending.slot);
  changes_.Deliver();
  if (hook) hook(hash);
  return pending;
}

absl::Status HostTier::FinishStore(const PendingStore& pending, const BlockRecordIdentity& identity,
                                   bool reused, bool filled) {
  {
    // The slot was private until now: its bytes needed no lock.
    absl::MutexLock lock(&mu_);
    if (!filled) {
      FreeLocked(pending.slot);
      return absl::OkStatus();
    }
    if (index_.contains(identity.hash)) {
      // A concurrent store of the same hash won.
      FreeLocked(pending.slot);
      return absl::AlreadyExistsError(
          absl::StrCat("host tier already holds hash ", identity.hash.ToHex()));
    }
    Slot& s = slots_[pending.slot];
    s.pins = 0;
    s.state = SlotState::kStored;
    s.reused = reused;
    s.identity = identity;
    index_.emplace(identity.hash, pending.slot);
    LruPushBack(pending.slot);
    changes_.Add(RecordChange::Kind::kStored, identity);
    ++counters_.stored;
    ++counters_.records;
    counters_.bytes_used += block_bytes_;
  }
  changes_.Deliver();
  return absl::OkStatus();
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
  ASSIGN_OR_RETURN(const PinnedRecord pinned, PinForLoad(expected));
  std::memcpy(out, pinned.bytes, block_bytes_);
  return FinishLoad(pinned, BlockChecksum(out, block_bytes_) == pinned.checksum
                                ? LoadVerdict::kVerified
                                : LoadVerdict::kCorrupt);
}

absl::StatusOr<HostTier::PinnedRecord> HostTier::PinForLoad(const BlockRecordIdentity& expected) {
  PinnedRecord pinned;
  std::function<void(const Hash128&)> hook;
  {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(expected.hash);
    if (it == index_.end()) {
      ++counters_.misses;
      return absl::NotFoundError(
          absl::StrCat("host tier holds no record of hash ", expected.hash.ToHex()));
    }
    Slot& s = slots_[it->second];
    const absl::string_view mismatch = RecordMismatch(s.identity, expected);
    if (!mismatch.empty()) {
      ++counters_.misses;
      ++counters_.mismatches;
      return absl::NotFoundError(absl::StrCat("host tier record of hash ", expected.hash.ToHex(),
                                              " differs in ", mismatch));
    }
    ++s.pins;
    pinned = PinnedRecord{.slot = it->second,
                          .bytes = SlotBytes(it->second),
                          .checksum = s.identity.checksum,
                          .hash = expected.hash};
    LruRemove(pinned.slot);
    LruPushBack(pinned.slot);
    hook = load_hook_;
  }
  if (hook) hook(expected.hash);
  return pinned;
}

absl::Status HostTier::FinishLoad(const PinnedRecord& pinned, LoadVerdict verdict) {
  {
    absl::MutexLock lock(&mu_);
    Slot& s = slots_[pinned.slot];
    if (verdict != LoadVerdict::kCorrupt) {
      if (verdict == LoadVerdict::kVerified) {
        ++counters_.loaded;
        s.reused = true;
      }
      UnpinLocked(pinned.slot);
      return absl::OkStatus();
    }
    ++counters_.misses;
    ++counters_.verify_failures;
    if (s.state == SlotState::kStored) DropLocked(pinned.slot);
    UnpinLocked(pinned.slot);
  }
  changes_.Deliver();
  return absl::DataLossError(absl::StrCat("host tier record of hash ", pinned.hash.ToHex(),
                                          " failed its checksum; dropped"));
}

void HostTier::LruRemove(uint32_t slot) {
  Slot& s = slots_[slot];
  if (slot == demotion_cursor_) demotion_cursor_ = s.lru.next;
  if (s.scan_pass == demotion_pass_ && demotion_scanned_ > 0) --demotion_scanned_;
  s.scan_pass = 0;
  lru_.Remove(slot, LruLinks());
}

std::vector<HostTier::Demotion> HostTier::PinForDemotion(uint32_t window, size_t max,
                                                         bool reused_only) {
  std::vector<Demotion> batch;
  absl::MutexLock lock(&mu_);
  if (free_slots_.size() >= window) {
    demotion_cursor_ = kNoSlot;
    return batch;
  }
  uint32_t slot = demotion_cursor_;
  if (slot == kNoSlot) {
    // A new pass from the front (the first, or the last one reached the LRU's end).
    slot = lru_.front();
    demotion_scanned_ = 0;
    ++demotion_pass_;
  }
  for (uint32_t steps = 0; slot != kNoSlot && demotion_scanned_ < window && batch.size() < max &&
                           steps < kMaxDemotionScan;
       ++steps) {
    Slot& s = slots_[slot];
    const uint32_t next = s.lru.next;
    // A pinned record is being loaded (it just became the most recent) or already demoted;
    // either way the next pass looks again.
    if (!s.below && s.pins == 0 && (!reused_only || s.reused)) {
      ++s.pins;
      batch.push_back(Demotion{.slot = slot, .identity = s.identity, .bytes = SlotBytes(slot)});
    }
    s.scan_pass = demotion_pass_;
    ++demotion_scanned_;
    ++counters_.demotion_scanned;
    slot = next;
  }
  demotion_cursor_ = slot;
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
      } else if (!stored.ok() && !absl::IsAlreadyExists(stored)) {
        // Refused for now (the tier below is full or stopped): the next call starts a new pass,
        // which offers it again.
        demotion_cursor_ = kNoSlot;
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
  uint64_t lru_length = 0, scanned = 0;
  bool past_cursor = false;
  uint32_t previous = kNoSlot;
  for (uint32_t slot = lru_.front(); slot != kNoSlot; slot = slots_[slot].lru.next) {
    if (++lru_length > num_slots_) return fail("host tier LRU has a cycle");
    if (slots_[slot].lru.prev != previous) return fail("host tier LRU link broken at ", slot);
    if (slots_[slot].state != SlotState::kStored) return fail("unstored slot ", slot, " on LRU");
    past_cursor = past_cursor || slot == demotion_cursor_;
    // What the scan has passed lies before its cursor, and it counts all of it.
    if (slots_[slot].scan_pass == demotion_pass_) {
      if (past_cursor) return fail("host tier slot ", slot, " scanned but past the cursor");
      ++scanned;
    }
    previous = slot;
  }
  if (previous != lru_.back() || lru_length != stored) {
    return fail("host tier LRU holds ", lru_length, " of ", stored, " records");
  }
  if (demotion_cursor_ != kNoSlot && !past_cursor) {
    return fail("host tier demotion cursor ", demotion_cursor_, " is off the LRU");
  }
  if (scanned != demotion_scanned_) {
    return fail("host tier demotion scan counts ", demotion_scanned_, " records but marked ",
                scanned);
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
