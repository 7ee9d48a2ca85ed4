// The disk tier's write queue and writer thread (tiers/disk_tier_impl.h): Store only queues a
// copy; the writer writes queued records in batches, syncs once per batch and only then
// publishes them.
#include <limits.h>
#include <sys/uio.h>

#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "tiers/disk_tier_impl.h"
#include "tiers/record_codec.h"

namespace kvcache {
namespace {

// A batch entry's error when the writer could not seal it (never an errno).
constexpr int kNotSealed = -1;
// One write of consecutive slots stays within what one system call writes whole (Linux stops
// at 2 GiB, and at IOV_MAX buffers).
constexpr size_t kMaxRunBytes = size_t{1} << 30;
constexpr size_t kMaxRunRecords = IOV_MAX;

}  // namespace

absl::Status DiskTier::Impl::Store(BlockRecordIdentity identity, absl::Span<const char> bytes) {
  if (bytes.size() != options_.pool.block_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "block of ", bytes.size(), " bytes; the pool's blocks have ", options_.pool.block_bytes));
  }
  if (identity.tokens.size() != options_.tokens_per_block) {
    return absl::InvalidArgumentError(absl::StrCat("block of ", identity.tokens.size(),
                                                   " tokens; the pool's blocks have ",
                                                   options_.tokens_per_block));
  }
  char* buffer = nullptr;
  uint64_t sequence = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!write_error_.ok()) {
      ++stats_.stores_refused_stopped;
      return absl::UnavailableError(
          absl::StrCat("disk tier stopped storing after: ", write_error_.message()));
    }
    if (auto queued = queued_hashes_.find(identity.hash); queued != queued_hashes_.end()) {
      if (HasMoreParts(identity.extras_digest, queued->second)) {
        ++stats_.stores_deferred;
        return absl::AbortedError("a copy of the block with fewer parts is being written");
      }
      ++stats_.stores_duplicate;
      return absl::AlreadyExistsError("block already stored or queued");
    }
    if (const uint32_t present = table_.Find(identity.hash);
        present != kNoSlot && !Supersedes(identity, records_[present].identity)) {
      ++stats_.stores_duplicate;
      return absl::AlreadyExistsError("block already stored or queued");
    }
    if (free_buffers_.empty()) {
      ++stats_.stores_refused_full;
      return queue_full_;  // a shared copy: a mover may be refused for every eviction
    }
    buffer = free_buffers_.back();
    free_buffers_.pop_back();
    UpdateStoreRoomLocked();
    queued_hashes_.emplace(identity.hash, identity.extras_digest);
    sequence = next_sequence_++;
    ++outstanding_;
  }
  // Outside the lock: the copy and the checksum are the expensive part of a store, and are one
  // pass over the bytes. A sealed record's header is sealed with its bytes by the writer
  // (SealSlot), off the caller's thread.
  absl::Status status;
  if (ChecksumWhileCopying(buffer + header_bytes_, bytes.data(), bytes.size(),
                           CopyStores::kCached) != identity.checksum) {
    status = absl::DataLossError("block bytes do not match the record's checksum");
  } else if (!sealer_.has_value()) {
    // The header writes all of its own bytes; only the page's rest is zeroed.
    const uint64_t encoded = RecordHeaderBytes(options_.tokens_per_block);
    std::memset(buffer + encoded, 0, header_bytes_ - encoded);
    status = EncodeRecordHeader(options_.pool, identity, sequence,
                                absl::MakeSpan(buffer, header_bytes_));
  }
  absl::MutexLock lock(&mu_);
  if (!status.ok()) {
    ReleaseStoreLocked(identity.hash, buffer);
    return status;
  }
  ++stats_.stores_accepted;
  queue_.push_back({std::move(identity), buffer, sequence});
  return absl::OkStatus();
}

void DiskTier::Impl::Flush() {
  {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(
        +[](uint64_t* outstanding) { return *outstanding == 0; }, &outstanding_));
  }
  // The writer may not have delivered its last batch's changes yet: after this, it has (or
  // this call did).
  changes_.Deliver();
}

absl::Status DiskTier::Impl::SealSlot(const Queued& queued) const {
  char* const body = queued.buffer + header_bytes_;
  std::memset(queued.buffer, 0, header_bytes_);
  return sealer_->Seal({options_.pool, queued.identity, queued.sequence},
                       {SealPiece{body, body, options_.pool.block_bytes}},
                       absl::MakeSpan(queued.buffer, header_bytes_));
}

void DiskTier::Impl::ReleaseStoreLocked(const Hash128& hash, char* buffer) {
  queued_hashes_.erase(hash);
  free_buffers_.push_back(buffer);
  --outstanding_;
  UpdateStoreRoomLocked();
}

void DiskTier::Impl::UpdateStoreRoomLocked() {
  store_room_.store(write_error_.ok() ? static_cast<uint32_t>(free_buffers_.size()) : 0,
                    std::memory_order_relaxed);
}

void DiskTier::Impl::WriterLoop() {
  std::vector<Queued> batch;
  std::vector<uint32_t> slots;
  std::vector<int> errors;
  std::vector<size_t> run_ends;  // by a write's first record (its tag): one past its last
  // The unsealed writes' buffers; never grows past the batch, so pointers into it hold.
  std::vector<iovec> iovecs;
  iovecs.reserve(options_.max_queued_stores);
  std::vector<IoRing::Completion> done;
  const bool dsync = options_.durability == DiskTierOptions::Durability::kDsyncPerWrite;
  while (true) {
    // Evictions made for the last batch and its records made visible.
    changes_.Deliver();
    batch.clear();
    slots.clear();
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &Impl::HasWorkLocked));
      if (queue_.empty()) return;  // shutting down, everything written
      while (!queue_.empty() && batch.size() < options_.max_queued_stores) {
        const uint32_t slot = TakeSlotLocked();
        // Every slot is this batch's or pinned by a load. Once the batch is durable its records
        // can be evicted, so the rest waits for the next batch: dropping it would lose the
        // newest records while older ones stay, and which ones would depend on how batches
        // fall. With no batch at all, every slot is being read: the store is dropped.
        if (slot == kNoSlot && !batch.empty()) break;
        Queued queued = std::move(queue_.front());
        queue_.pop_front();
        if (slot == kNoSlot) {
          ++stats_.stores_dropped;
          ReleaseStoreLocked(queued.identity.hash, queued.buffer);
          continue;
        }
        batch.push_back(std::move(queued));
        slots.push_back(slot);
      }
    }
    errors.assign(batch.size(), 0);
    run_ends.assign(batch.size(), 0);
    iovecs.clear();
    uint32_t submitted = 0;
    absl::Status ring_status;
    for (size_t i = 0; i < batch.size() && ring_status.ok(); ++i) {
      // Sealed here, on the writer's thread: a record that cannot be sealed is dropped alone.
      if (sealer_.has_value() && !SealSlot(batch[i]).ok()) errors[i] = kNotSealed;
      if (errors[i] == 0 && options_.testing_write_errno)
        errors[i] = options_.testing_write_errno();
      if (errors[i] != 0 || !sealer_.has_value()) continue;
      write_ring_->QueueWrite(fd_, batch[i].buffer, slot_bytes_, SlotOffset(slots[i]), i, dsync);
      run_ends[i] = i + 1;
      ++submitted;
      // A sealed record goes to the disk at once: the next one is sealed while it is written.
      ring_status = write_ring_->Submit();
    }
    // Unsealed: records in consecutive slots (a new file fills them in order, and evictions free
    // runs) go down as one write: one request, one extent update and one doorbell of a virtual
    // disk instead of one each, on the CPU the requests run on.
    for (size_t i = 0; i < batch.size() && !sealer_.has_value();) {
      if (errors[i] != 0) {
        ++i;
        continue;
      }
      size_t end = i + 1;
      while (end < batch.size() && errors[end] == 0 && slots[end] == slots[end - 1] + 1 &&
             end - i < kMaxRunRecords && (end - i + 1) * slot_bytes_ <= kMaxRunBytes) {
        ++end;
      }
      const size_t first_iovec = iovecs.size();
      for (size_t k = i; k < end; ++k) iovecs.push_back(iovec{batch[k].buffer, slot_bytes_});
      write_ring_->QueueWritev(fd_, &iovecs[first_iovec], static_cast<uint32_t>(end - i),
                               SlotOffset(slots[i]), i, dsync);
      run_ends[i] = end;
      ++submitted;
      i = end;
    }
    // The batch's fdatasync goes in the same submission, started once the writes are done, and
    // the writer wakes once for all of it: each wake-up costs the CPU the requests run on.
    const bool syncing = ring_status.ok() && !dsync && submitted > 0;
    const uint64_t sync_tag = batch.size();
    if (syncing) write_ring_->QueueFdatasync(fd_, sync_tag, /*after_earlier=*/true);
    done.clear();
    if (ring_status.ok()) ring_status = write_ring_->SubmitAndWait(&done);
    std::optional<int> sync_result;
    for (const IoRing::Completion& completion : done) {
      if (completion.tag == sync_tag) {
        sync_result = completion.result;
        continue;
      }
      // A write of a run fails (or comes up short) for all of its records.
      const size_t end = run_ends[completion.tag];
      if (completion.result != static_cast<int>((end - completion.tag) * slot_bytes_)) {
        for (size_t k = completion.tag; k < end; ++k) {
          errors[k] = completion.result < 0 ? -completion.result : EIO;
        }
      }
    }
    bool synced = dsync;
    if (syncing && ring_status.ok()) {
      synced = sync_result == 0;
      if (!synced)
        ring_status = ErrnoError("fdatasync", options_.path, -sync_result.value_or(-EIO));
    }
    absl::MutexLock lock(&mu_);
    if (!dsync && submitted > 0) ++stats_.syncs;
    for (size_t i = 0; i < batch.size(); ++i) {
      if (errors[i] == kNotSealed) {
        ++stats_.stores_dropped;  // nothing was written: the slot is free, the tier goes on
        table_.Free(slots[i]);
        ReleaseStoreLocked(batch[i].identity.hash, batch[i].buffer);
        continue;
      }
      absl::Status error = ring_status;
      if (error.ok() && errors[i] != 0) error = ErrnoError("writing", options_.path, errors[i]);
      if (error.ok() && synced) {
        stats_.bytes_written += slot_bytes_;
        const Hash128 hash = batch[i].identity.hash;
        if (PublishLocked(slots[i], batch[i])) {
          ++stats_.stores_durable;
        } else {
          ++stats_.stores_dropped;
          table_.Free(slots[i]);
        }
        ReleaseStoreLocked(hash, batch[i].buffer);
      } else {
        // The slot's contents are unknown now; a restart would skip or catch what is there.
        ++stats_.write_errors;
        ++stats_.stores_dropped;
        if (write_error_.ok()) write_error_ = error;
        UpdateStoreRoomLocked();
        table_.Free(slots[i]);
        ReleaseStoreLocked(batch[i].identity.hash, batch[i].buffer);
      }
    }
  }
}

bool DiskTier::Impl::PublishLocked(uint32_t slot, Queued& written) {
  if (const uint32_t present = table_.Find(written.identity.hash); present != kNoSlot) {
    // Store let it through only to supersede the record indexed then; nothing else under its
    // hash can have been indexed since (the hash was queued), but the rule is checked again.
    if (!Supersedes(written.identity, records_[present].identity)) return false;
    // Replaced, not removed: the block stays on disk, with more parts (announced below). A load
    // reading the old slot keeps it until it ends.
    table_.Drop(present);
    ++stats_.superseded;
  }
  Record& record = records_[slot];
  record = Record{written.sequence, std::move(written.identity)};
  table_.Publish(slot, record.identity.hash);
  changes_.Add(RecordChange::Kind::kStored, record.identity);
  return true;
}

bool DiskTier::Impl::HasWorkLocked() const { return !queue_.empty() || shutting_down_; }

}  // namespace kvcache
