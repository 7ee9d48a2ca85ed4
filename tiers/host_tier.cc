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
      table_(num_slots),
      records_(num_slots) {
  counters_.capacity_bytes = mapped_bytes;
}

HostTier::~HostTier() {
  if (unregister_memory_) unregister_memory_(base_);
  munmap(base_, mapped_bytes_);
}

void HostTier::RemovedLocked(uint32_t slot) {
  changes_.Add(RecordChange::Kind::kRemoved, records_[slot].identity);
  UncountLocked(slot);
}

void HostTier::UncountLocked(uint32_t slot) {
  UnmarkScannedLocked(slot);
  --counters_.records;
  counters_.bytes_used -= block_bytes_;
}

void HostTier::DropLocked(uint32_t slot) {
  RemovedLocked(slot);
  table_.Drop(slot);
}

void HostTier::UnmarkScannedLocked(uint32_t slot) {
  Record& record = records_[slot];
  if (record.scan_pass == demotion_pass_ && demotion_scanned_ > 0) --demotion_scanned_;
  record.scan_pass = 0;
}

absl::StatusOr<HostTier::StoreResult> HostTier::Store(const BlockRecordIdentity& identity,
                                                      const uint8_t* bytes, bool reused) {
  absl::StatusOr<PendingStore> pending = BeginStore(identity);
  if (!pending.ok()) return pending.status();
  std::memcpy(pending->bytes, bytes, block_bytes_);
  RETURN_IF_ERROR(FinishStore(*pending, identity, reused, /*filled=*/true));
  return StoreResult{.evicted = std::move(pending->evicted)};
}

absl::StatusOr<HostTier::PendingStore> HostTier::BeginStore(const BlockRecordIdentity& identity) {
  const Hash128& hash = identity.hash;
  PendingStore pending;
  std::function<void(const Hash128&)> hook;
  {
    absl::MutexLock lock(&mu_);
    const uint32_t present = table_.Find(hash);
    if (present != kNoSlot && !Supersedes(identity, records_[present].identity)) {
      return absl::AlreadyExistsError(absl::StrCat("host tier already holds hash ", hash.ToHex()));
    }
    const SlotTable::Taken taken = table_.Take();
    if (taken.slot == kNoSlot) {
      ++counters_.store_rejections;
      return absl::ResourceExhaustedError("host tier: every slot is being read or filled");
    }
    if (taken.evicted) {
      pending.evicted_below = records_[taken.slot].below;
      pending.evicted_reused = records_[taken.slot].reused;
      RemovedLocked(taken.slot);
      // Moved, not copied: the record is reset below (a mover evicts one per block it stores).
      pending.evicted = std::move(records_[taken.slot].identity);
      ++counters_.evicted;
    }
    pending.slot = taken.slot;
    records_[taken.slot] = Record{};
    hook = store_hook_;
  }
  pending.bytes = SlotBytes(pending.slot);
  changes_.Deliver();
  if (hook) hook(hash);
  return pending;
}

absl::Status HostTier::FinishStore(const PendingStore& pending, BlockRecordIdentity identity,
                                   bool reused, bool filled) {
  {
    // The slot was private until now: its bytes needed no lock.
    absl::MutexLock lock(&mu_);
    if (!filled) {
      table_.Free(pending.slot);
      return absl::OkStatus();
    }
    const uint32_t present = table_.Find(identity.hash);
    bool present_reused = false;
    if (present != kNoSlot) {
      if (!Supersedes(identity, records_[present].identity)) {
        // A concurrent store of the same hash won.
        table_.Free(pending.slot);
        return absl::AlreadyExistsError(
            absl::StrCat("host tier already holds hash ", identity.hash.ToHex()));
      }
      // Replaced in the index, not removed: the block stays in the tier, now with more parts (its
      // store below announces them). A load reading the old slot keeps it until it ends.
      present_reused = records_[present].reused;
      UncountLocked(present);
      table_.Drop(present);
      ++counters_.superseded;
    }
    Record& record = records_[pending.slot];
    record.reused = reused || present_reused;
    record.identity = std::move(identity);
    table_.Publish(pending.slot, record.identity.hash);
    changes_.Add(RecordChange::Kind::kStored, record.identity);
    ++counters_.stored;
    ++counters_.records;
    counters_.bytes_used += block_bytes_;
  }
  changes_.Deliver();
  return absl::OkStatus();
}

std::optional<BlockRecordIdentity> HostTier::Find(const Hash128& hash) const {
  absl::MutexLock lock(&mu_);
  const uint32_t slot = table_.Find(hash);
  if (slot == kNoSlot) return std::nullopt;
  return records_[slot].identity;
}

TierProbe HostTier::Probe(const BlockRecordIdentity& expected) const {
  absl::MutexLock lock(&mu_);
  const uint32_t slot = table_.Find(expected.hash);
  if (slot == kNoSlot) return TierProbe::kAbsent;
  return RecordMismatch(records_[slot].identity, expected).empty() ? TierProbe::kMatch
                                                                   : TierProbe::kMismatch;
}

bool HostTier::Contains(const Hash128& hash) const {
  absl::MutexLock lock(&mu_);
  return table_.Contains(hash);
}

bool HostTier::ContainsCopyOf(const Hash128& hash, uint64_t extras_digest) const {
  absl::MutexLock lock(&mu_);
  const uint32_t slot = table_.Find(hash);
  return slot != kNoSlot && !HasMoreParts(extras_digest, records_[slot].identity.extras_digest);
}

absl::Status HostTier::Load(const BlockRecordIdentity& expected, uint8_t* out) {
  ASSIGN_OR_RETURN(const PinnedRecord pinned, PinForLoad(expected));
  const uint64_t checksum =
      ChecksumWhileCopying(out, pinned.bytes, block_bytes_, CopyStores::kCached);
  return FinishLoad(pinned,
                    checksum == pinned.checksum ? LoadVerdict::kVerified : LoadVerdict::kCorrupt);
}

absl::StatusOr<HostTier::PinnedRecord> HostTier::PinForLoad(const BlockRecordIdentity& expected) {
  PinnedRecord pinned;
  std::function<void(const Hash128&)> hook;
  {
    absl::MutexLock lock(&mu_);
    const uint32_t slot = table_.Find(expected.hash);
    if (slot == kNoSlot) {
      ++counters_.misses;
      return absl::NotFoundError(
          absl::StrCat("host tier holds no record of hash ", expected.hash.ToHex()));
    }
    const absl::string_view mismatch = RecordMismatch(records_[slot].identity, expected);
    if (!mismatch.empty()) {
      ++counters_.misses;
      ++counters_.mismatches;
      return absl::NotFoundError(absl::StrCat("host tier record of hash ", expected.hash.ToHex(),
                                              " differs in ", mismatch));
    }
    // A hit: the record becomes the most recently used when the load unpins it.
    UnmarkScannedLocked(slot);
    table_.Pin(slot);
    pinned = PinnedRecord{.slot = slot,
                          .bytes = SlotBytes(slot),
                          .checksum = records_[slot].identity.checksum,
                          .hash = expected.hash};
    hook = load_hook_;
  }
  if (hook) hook(expected.hash);
  return pinned;
}

absl::Status HostTier::FinishLoad(const PinnedRecord& pinned, LoadVerdict verdict) {
  {
    absl::MutexLock lock(&mu_);
    if (verdict != LoadVerdict::kCorrupt) {
      if (verdict == LoadVerdict::kVerified) {
        ++counters_.loaded;
        records_[pinned.slot].reused = true;
      }
      table_.Unpin(pinned.slot);
      return absl::OkStatus();
    }
    ++counters_.misses;
    ++counters_.verify_failures;
    if (table_.state(pinned.slot) == SlotTable::State::kStored) DropLocked(pinned.slot);
    table_.Unpin(pinned.slot);
  }
  changes_.Deliver();
  return absl::DataLossError(absl::StrCat("host tier record of hash ", pinned.hash.ToHex(),
                                          " failed its checksum; dropped"));
}

std::vector<HostTier::Demotion> HostTier::PinForDemotion(uint32_t window, size_t max,
                                                         bool reused_only) {
  std::vector<Demotion> batch;
  absl::MutexLock lock(&mu_);
  if (table_.free_slots() >= window) {
    demotion_restart_ = true;
    return batch;
  }
  uint32_t slot = table_.cursor();
  if (slot == kNoSlot || demotion_restart_) {
    // A new pass from the front (the first, the last one reached the LRU's end, or restarted).
    slot = table_.Oldest();
    demotion_scanned_ = 0;
    ++demotion_pass_;
    demotion_restart_ = false;
  }
  for (uint32_t steps = 0; slot != kNoSlot && demotion_scanned_ < window && batch.size() < max &&
                           steps < kMaxDemotionScan;
       ++steps) {
    Record& record = records_[slot];
    const uint32_t next = table_.Newer(slot);
    if (!record.below && (!reused_only || record.reused)) {
      // Not a use: unless loaded meanwhile, it goes back where the scan stands, still passed.
      table_.Pin(slot, /*use=*/false);
      batch.push_back(
          Demotion{.slot = slot, .identity = record.identity, .bytes = SlotBytes(slot)});
    }
    record.scan_pass = demotion_pass_;
    ++demotion_scanned_;
    ++counters_.demotion_scanned;
    slot = next;
  }
  table_.set_cursor(slot);
  return batch;
}

void HostTier::MarkReused(const Hash128& hash) {
  absl::MutexLock lock(&mu_);
  const uint32_t slot = table_.Find(hash);
  if (slot != kNoSlot) records_[slot].reused = true;
}

void HostTier::FinishDemotion(uint32_t slot, const absl::Status& stored) {
  {
    absl::MutexLock lock(&mu_);
    Record& record = records_[slot];
    if (table_.state(slot) == SlotTable::State::kStored) {
      if ((stored.ok() || absl::IsAlreadyExists(stored)) && !record.below) {
        record.below = true;
        ++counters_.demoted;
      } else if (absl::IsDataLoss(stored)) {
        ++counters_.verify_failures;
        DropLocked(slot);
      } else if (!stored.ok() && !absl::IsAlreadyExists(stored)) {
        // Refused for now (the tier below is full or stopped): the next call starts a new pass,
        // which offers it again.
        demotion_restart_ = true;
      }
    }
    table_.Unpin(slot);
  }
  changes_.Deliver();
}

HostTierCounters HostTier::counters() const {
  absl::MutexLock lock(&mu_);
  return counters_;
}

absl::Status HostTier::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(table_.CheckInvariants("host tier"));
  auto fail = [](auto&&... parts) { return absl::InternalError(absl::StrCat(parts...)); };
  // What the demotion scan has passed lies before its cursor or is pinned by it, and it counts
  // all of it.
  uint64_t scanned = 0;
  bool past_cursor = false;
  for (uint32_t slot = table_.Oldest(); slot != kNoSlot; slot = table_.Newer(slot)) {
    past_cursor = past_cursor || slot == table_.cursor();
    if (records_[slot].scan_pass != demotion_pass_) continue;
    if (past_cursor) return fail("host tier slot ", slot, " scanned but past the cursor");
    ++scanned;
  }
  for (uint32_t slot = 0; slot < num_slots_; ++slot) {
    if (table_.pins(slot) > 0 && records_[slot].scan_pass == demotion_pass_) ++scanned;
  }
  if (scanned != demotion_scanned_) {
    return fail("host tier demotion scan counts ", demotion_scanned_, " records but marked ",
                scanned);
  }
  if (counters_.records != table_.records() ||
      counters_.bytes_used != uint64_t{table_.records()} * block_bytes_) {
    return fail("host tier counts ", counters_.records, " records and ", counters_.bytes_used,
                " bytes but holds ", table_.records());
  }
  return absl::OkStatus();
}

const uint8_t* HostTier::RecordBytesForTesting(const Hash128& hash) const {
  absl::MutexLock lock(&mu_);
  const uint32_t slot = table_.Find(hash);
  return slot == kNoSlot ? nullptr : SlotBytes(slot);
}

bool HostTier::CorruptForTesting(const Hash128& hash, uint64_t offset) {
  absl::MutexLock lock(&mu_);
  const uint32_t slot = table_.Find(hash);
  if (slot == kNoSlot || offset >= block_bytes_) return false;
  SlotBytes(slot)[offset] ^= 0x5a;
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
