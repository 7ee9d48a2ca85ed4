#include "tiers/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/block_checksum.h"
#include "common/status_macros.h"
#include "tiers/io_ring.h"
#include "tiers/record_codec.h"

namespace kvcache {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path, int error) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(error)));
}

// Creates the missing directories of `path`'s parent, owner-only; existing ones are left as
// they are (the parent may be a shared directory such as /tmp).
absl::Status MakeParentDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    const std::string directory = path.substr(0, slash);
    if (::mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) {
      return ErrnoError("mkdir", directory, errno);
    }
  }
  return absl::OkStatus();
}

constexpr uint64_t kNone = ~uint64_t{0};

}  // namespace

class DiskTier::Impl {
 public:
  Impl(DiskTierOptions options, int fd, bool direct_io, uint64_t slots)
      : options_(std::move(options)),
        fd_(fd),
        direct_io_(direct_io),
        io_backend_(options_.io == DiskTierOptions::Io::kIoUring    ? IoBackend::kIoUring
                    : options_.io == DiskTierOptions::Io::kSyscalls ? IoBackend::kSyscalls
                                                                    : IoRing::Probe()),
        header_bytes_(RecordHeaderSlotBytes(options_.tokens_per_block)),
        slot_bytes_(header_bytes_ + RoundUpToRecordAlignment(options_.pool.block_bytes)),
        slots_(slots),
        slot_(slots),
        lru_prev_(slots + 1, kNone),
        lru_next_(slots + 1, kNone),
        store_buffers_(slot_bytes_ * options_.max_queued_stores),
        changes_(options_.on_change) {
    lru_prev_[slots_] = lru_next_[slots_] = slots_;  // the sentinel
  }

  ~Impl() {
    {
      absl::MutexLock lock(&mu_);
      shutting_down_ = true;
    }
    if (writer_.joinable()) writer_.join();
    ::close(fd_);
  }

  absl::Status Start() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    if (store_buffers_.data() == nullptr) return absl::ResourceExhaustedError("store buffers");
    for (uint32_t i = options_.max_queued_stores; i > 0; --i) {
      free_buffers_.push_back(store_buffers_.data() + (i - 1) * slot_bytes_);
    }
    ASSIGN_OR_RETURN(write_ring_, IoRing::Create(options_.max_queued_stores + 1, io_backend_));
    for (uint32_t i = 0; i < options_.read_rings; ++i) {
      auto reader = std::make_unique<Reader>();
      ASSIGN_OR_RETURN(reader->ring, IoRing::Create(options_.read_depth, io_backend_));
      reader->buffers = std::make_unique<AlignedBuffer>(2 * slot_bytes_ * options_.read_depth);
      if (reader->buffers->data() == nullptr) return absl::ResourceExhaustedError("read buffers");
      readers_.push_back(std::move(reader));
    }
    writer_ = std::thread([this] { WriterLoop(); });
    return absl::OkStatus();
  }

  // Reads every slot header of the file's first `old_size` bytes and indexes the pool's own
  // records (newest first in the LRU); everything else becomes a free slot.
  absl::Status Scan(uint64_t old_size) ABSL_LOCKS_EXCLUDED(mu_) {
    const absl::Time start = absl::Now();
    absl::MutexLock lock(&mu_);
    const uint64_t whole = std::min(slots_, old_size / slot_bytes_);
    if (whole < slots_ && old_size > whole * slot_bytes_) ++stats_.restart_torn;  // cut slot
    if (whole > 0) {
      ASSIGN_OR_RETURN(std::unique_ptr<IoRing> ring, IoRing::Create(64, io_backend_));
      AlignedBuffer buffer(header_bytes_ * ring->depth());
      if (buffer.data() == nullptr) return absl::ResourceExhaustedError("scan buffer");
      std::vector<IoRing::Completion> done;
      for (uint64_t first = 0; first < whole; first += ring->depth()) {
        const uint64_t count = std::min<uint64_t>(ring->depth(), whole - first);
        for (uint64_t i = 0; i < count; ++i) {
          ring->QueueRead(fd_, buffer.data() + i * header_bytes_, header_bytes_,
                          SlotOffset(first + i), i);
        }
        done.clear();
        RETURN_IF_ERROR(ring->SubmitAndWait(&done));
        for (const IoRing::Completion& completion : done) {
          if (completion.result != static_cast<int>(header_bytes_)) {
            ++stats_.restart_torn;  // an unreadable header (EIO): the slot is rewritten later
            continue;
          }
          IndexScannedLocked(first + completion.tag,
                             buffer.data() + completion.tag * header_bytes_);
        }
      }
    }
    std::vector<std::pair<uint64_t, uint64_t>> by_sequence;  // (sequence, slot) of records
    for (uint64_t slot = slots_; slot > 0; --slot) {
      if (slot_[slot - 1].state == SlotState::kFree) {
        free_slots_.push_back(slot - 1);  // popped from the back: lowest first
      } else {
        by_sequence.emplace_back(slot_[slot - 1].sequence, slot - 1);
      }
    }
    std::sort(by_sequence.begin(), by_sequence.end());
    for (const auto& [sequence, slot] : by_sequence) LruPushFrontLocked(slot);  // newest first
    stats_.restart_scan_time = absl::Now() - start;
    return absl::OkStatus();
  }

  absl::Status Store(const BlockRecordIdentity& identity, absl::Span<const char> bytes) {
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
      if (index_.contains(identity.hash) || queued_hashes_.contains(identity.hash)) {
        ++stats_.stores_duplicate;
        return absl::AlreadyExistsError("block already stored or queued");
      }
      if (free_buffers_.empty()) {
        ++stats_.stores_refused_full;
        return absl::ResourceExhaustedError(absl::StrCat(
            "disk tier queue full (", options_.max_queued_stores, " records being written)"));
      }
      buffer = free_buffers_.back();
      free_buffers_.pop_back();
      queued_hashes_.insert(identity.hash);
      sequence = next_sequence_++;
      ++outstanding_;
    }
    // Outside the lock: the copy and the checksum are the expensive part of a store.
    std::memcpy(buffer + header_bytes_, bytes.data(), bytes.size());
    absl::Status status;
    if (BlockChecksum(buffer + header_bytes_, bytes.size()) != identity.checksum) {
      status = absl::DataLossError("block bytes do not match the record's checksum");
    } else {
      std::memset(buffer, 0, header_bytes_);
      status = EncodeRecordHeader({options_.pool, identity, sequence},
                                  absl::MakeSpan(buffer, header_bytes_));
    }
    absl::MutexLock lock(&mu_);
    if (!status.ok()) {
      ReleaseStoreLocked(identity.hash, buffer);
      return status;
    }
    ++stats_.stores_accepted;
    queue_.push_back({identity, buffer, sequence});
    return absl::OkStatus();
  }

  absl::StatusOr<BlockRecordIdentity> Find(const Hash128& hash) const {
    absl::MutexLock lock(&mu_);
    auto it = index_.find(hash);
    if (it == index_.end()) return absl::NotFoundError("not in the disk tier");
    return slot_[it->second].identity;
  }

  std::vector<absl::Status> LoadMany(absl::Span<const LoadRequest> requests) {
    std::vector<absl::Status> results(requests.size());
    std::vector<Pinned> pinned;
    pinned.reserve(requests.size());
    {
      absl::MutexLock lock(&mu_);
      for (size_t i = 0; i < requests.size(); ++i) {
        results[i] = PinLocked(requests[i], i, &pinned);
      }
    }
    if (pinned.empty()) return results;
    ReadPinned(pinned, requests, &results);
    {
      absl::MutexLock lock(&mu_);
      for (const Pinned& pin : pinned) {
        UnpinLocked(pin, results[pin.request]);
        if (results[pin.request].ok() && ReadsInPlace(requests[pin.request].out)) {
          ++stats_.loads_in_place;
        }
      }
    }
    changes_.Deliver();
    return results;
  }

  absl::Status Erase(const Hash128& hash) {
    {
      absl::MutexLock lock(&mu_);
      auto it = index_.find(hash);
      if (it == index_.end()) return absl::NotFoundError("not in the disk tier");
      ++stats_.erases;
      DropLocked(it->second);
    }
    changes_.Deliver();
    return absl::OkStatus();
  }

  std::vector<BlockRecordIdentity> Records() const {
    absl::MutexLock lock(&mu_);
    std::vector<BlockRecordIdentity> records;
    records.reserve(index_.size());
    for (const Slot& slot : slot_) {
      if (slot.state == SlotState::kIndexed) records.push_back(slot.identity);
    }
    return records;
  }

  void Flush() {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](uint64_t* outstanding) { return *outstanding == 0; }, &outstanding_));
    }
    // The writer may not have delivered its last batch's changes yet: after this, it has (or
    // this call did).
    changes_.Deliver();
  }

  DiskTierStats stats() const {
    absl::MutexLock lock(&mu_);
    DiskTierStats stats = stats_;
    stats.slots = slots_;
    stats.slot_bytes = slot_bytes_;
    stats.records = index_.size();
    stats.queued = outstanding_;
    return stats;
  }

  bool direct_io() const { return direct_io_; }
  IoBackend io_backend() const { return io_backend_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t read_depth() const { return options_.read_depth; }

 private:
  enum class SlotState : uint8_t { kFree, kWriting, kIndexed, kDropped };
  struct Slot {
    SlotState state = SlotState::kFree;
    uint32_t pins = 0;  // loads reading it; a pinned slot is out of the LRU
    uint64_t sequence = 0;
    BlockRecordIdentity identity;
  };
  struct Queued {
    BlockRecordIdentity identity;
    char* buffer;  // header, then bytes: the whole slot as it is written
    uint64_t sequence;
  };
  struct Pinned {
    size_t request;
    uint64_t slot;
    uint64_t sequence;
  };
  // One concurrent loader: a ring and 2 x read_depth slot buffers.
  struct Reader {
    absl::Mutex mu;
    std::unique_ptr<IoRing> ring;
    std::unique_ptr<AlignedBuffer> buffers;
  };

  uint64_t SlotOffset(uint64_t slot) const { return slot * slot_bytes_; }

  void IndexScannedLocked(uint64_t slot, const char* header_bytes)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::StatusOr<RecordHeader> header =
        DecodeRecordHeader(absl::string_view(header_bytes, header_bytes_));
    if (absl::IsNotFound(header.status())) {
      ++stats_.restart_empty;
      return;
    }
    if (absl::IsFailedPrecondition(header.status())) {
      ++stats_.restart_old_format;  // intact, but not verifiable by this build: its slot is free
      return;
    }
    if (!header.ok()) {
      ++stats_.restart_torn;
      return;
    }
    if (!PoolMismatch(header->pool, options_.pool).empty() ||
        header->block.tokens.size() != options_.tokens_per_block) {
      ++stats_.restart_foreign;
      return;
    }
    next_sequence_ = std::max(next_sequence_, header->sequence + 1);
    auto [it, inserted] = index_.try_emplace(header->block.hash, slot);
    if (inserted) {
      ++stats_.restart_records;
    } else {
      // Two slots under one hash: a record stored again after its first slot was evicted but not
      // yet overwritten. The newer one stays; the other slot is free.
      ++stats_.restart_duplicates;
      const uint64_t older = it->second;
      if (slot_[older].sequence > header->sequence) return;
      slot_[older] = Slot{};
      it->second = slot;
    }
    slot_[slot] = Slot{SlotState::kIndexed, 0, header->sequence, std::move(header->block)};
  }

  absl::Status PinLocked(const LoadRequest& request, size_t i, std::vector<Pinned>* pinned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    ++stats_.loads;
    if (request.out.size() != options_.pool.block_bytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "load into ", request.out.size(), " bytes; blocks have ", options_.pool.block_bytes));
    }
    auto it = index_.find(request.expected->hash);
    if (it == index_.end()) {
      ++stats_.load_misses;
      return absl::NotFoundError("not in the disk tier");
    }
    Slot& slot = slot_[it->second];
    absl::string_view mismatch = RecordMismatch(slot.identity, *request.expected);
    if (!mismatch.empty()) {
      ++stats_.load_mismatches;
      return absl::NotFoundError(absl::StrCat("disk record differs in ", mismatch));
    }
    if (slot.pins++ == 0) LruRemoveLocked(it->second);
    pinned->push_back({i, it->second, slot.sequence});
    return absl::OkStatus();
  }

  void UnpinLocked(const Pinned& pin, const absl::Status& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Slot& slot = slot_[pin.slot];
    if (result.ok()) {
      ++stats_.load_hits;
      stats_.bytes_read += slot_bytes_;
    } else if (absl::IsDataLoss(result)) {
      ++stats_.load_corrupt;
    } else {
      ++stats_.read_errors;
    }
    --slot.pins;
    if (!result.ok() && slot.state == SlotState::kIndexed) {
      DropLocked(pin.slot);  // never served again; the slot is rewritten later
      return;
    }
    if (slot.pins > 0) return;
    if (slot.state == SlotState::kDropped) {
      FreeSlotLocked(pin.slot);
    } else {
      LruPushFrontLocked(pin.slot);  // a hit makes the record the most recently used
    }
  }

  // Removes the record from the index; its slot is free once no load reads it.
  void DropLocked(uint64_t slot_index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    Slot& slot = slot_[slot_index];
    changes_.Add(RecordChange::Kind::kRemoved, slot.identity);
    index_.erase(slot.identity.hash);
    if (slot.pins > 0) {
      slot.state = SlotState::kDropped;
      return;
    }
    LruRemoveLocked(slot_index);
    FreeSlotLocked(slot_index);
  }

  void FreeSlotLocked(uint64_t slot_index) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    slot_[slot_index] = Slot{};
    free_slots_.push_back(slot_index);
  }

  // A free slot, else the least recently used unpinned record's (evicted); kNone when every
  // slot is being written or read.
  uint64_t TakeSlotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    uint64_t slot = kNone;
    if (!free_slots_.empty()) {
      slot = free_slots_.back();
      free_slots_.pop_back();
    } else if (lru_prev_[slots_] != slots_) {
      slot = lru_prev_[slots_];
      LruRemoveLocked(slot);
      changes_.Add(RecordChange::Kind::kRemoved, slot_[slot].identity);
      index_.erase(slot_[slot].identity.hash);
      ++stats_.evictions;
    } else {
      return kNone;
    }
    slot_[slot] = Slot{};
    slot_[slot].state = SlotState::kWriting;
    return slot;
  }

  void LruRemoveLocked(uint64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (lru_next_[slot] == kNone) return;
    lru_next_[lru_prev_[slot]] = lru_next_[slot];
    lru_prev_[lru_next_[slot]] = lru_prev_[slot];
    lru_prev_[slot] = lru_next_[slot] = kNone;
  }
  void LruPushFrontLocked(uint64_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    lru_next_[slot] = lru_next_[slots_];
    lru_prev_[slot] = slots_;
    lru_prev_[lru_next_[slots_]] = slot;
    lru_next_[slots_] = slot;
  }

  void ReleaseStoreLocked(const Hash128& hash, char* buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    queued_hashes_.erase(hash);
    free_buffers_.push_back(buffer);
    --outstanding_;
  }

  // Reads and verifies the pinned slots on a free Reader (or waits for one), keeping read_depth
  // reads in flight: each completion queues the next read (into a free one of the reader's
  // 2 x read_depth buffers) before its own slot is verified and copied out. The analysis cannot
  // follow a mutex picked at run time; the reader's lock is held throughout.
  void ReadPinned(absl::Span<const Pinned> pinned, absl::Span<const LoadRequest> requests,
                  std::vector<absl::Status>* results) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    Reader* reader = nullptr;
    for (auto& candidate : readers_) {
      if (candidate->mu.TryLock()) {
        reader = candidate.get();
        break;
      }
    }
    if (reader == nullptr) {
      reader = readers_[next_reader_.fetch_add(1) % readers_.size()].get();
      reader->mu.Lock();
    }
    IoRing& ring = *reader->ring;
    const size_t buffers = 2 * options_.read_depth;
    auto buffer = [&](size_t i) { return reader->buffers->data() + i * slot_bytes_; };
    std::vector<size_t> free_buffers(buffers);
    for (size_t i = 0; i < buffers; ++i) free_buffers[i] = buffers - 1 - i;
    std::vector<size_t> owner(buffers);  // the pinned entry a buffer is read for
    std::vector<std::array<iovec, 2>> iovecs(buffers);
    size_t next = 0;  // pinned entries issued
    auto issue = [&] {
      const size_t i = free_buffers.back();
      free_buffers.pop_back();
      owner[i] = next;
      const Pinned& pin = pinned[next++];
      if (options_.testing_before_read) options_.testing_before_read();
      absl::Span<char> out = requests[pin.request].out;
      if (ReadsInPlace(out)) {
        // The header into the buffer, the bytes straight into the caller's memory: no copy.
        iovecs[i] = {iovec{buffer(i), header_bytes_}, iovec{out.data(), out.size()}};
        ring.QueueReadv(fd_, iovecs[i].data(), 2, SlotOffset(pin.slot), i);
      } else {
        ring.QueueRead(fd_, buffer(i), slot_bytes_, SlotOffset(pin.slot), i);
      }
    };
    while (next < std::min<size_t>(options_.read_depth, pinned.size())) issue();
    absl::Status status = ring.Submit();
    std::vector<bool> answered(pinned.size());
    for (size_t completed = 0; status.ok() && completed < pinned.size(); ++completed) {
      absl::StatusOr<IoRing::Completion> completion = ring.WaitOne();
      if (!completion.ok()) {
        status = completion.status();
        break;
      }
      if (next < pinned.size()) {
        issue();
        status = ring.Submit();
      }
      const size_t i = completion->tag;
      Answer(pinned[owner[i]], buffer(i), completion->result, requests, results);
      answered[owner[i]] = true;
      free_buffers.push_back(i);
    }
    // A failed ring fails every load not yet answered.
    for (size_t p = 0; p < pinned.size(); ++p) {
      if (!answered[p]) (*results)[pinned[p].request] = status;
    }
    reader->mu.Unlock();
  }

  // Answers a pinned load from its completed read: verified bytes are copied out.
  void Answer(const Pinned& pin, const char* slot, int read_result,
              absl::Span<const LoadRequest> requests, std::vector<absl::Status>* results) const {
    const LoadRequest& request = requests[pin.request];
    absl::Status& result = (*results)[pin.request];
    if (read_result != static_cast<int>(slot_bytes_)) {
      result = read_result < 0
                   ? ErrnoError("reading slot of", options_.path, -read_result)
                   : absl::InternalError(absl::StrCat("short read of a slot of ", options_.path));
      return;
    }
    if (ReadsInPlace(request.out)) {
      result = Verify(slot, request.out.data(), pin.sequence, *request.expected, request.checksum);
      return;
    }
    result = Verify(slot, slot + header_bytes_, pin.sequence, *request.expected, request.checksum);
    if (result.ok()) std::memcpy(request.out.data(), slot + header_bytes_, request.out.size());
  }

  // Whether a load reads the block's bytes straight into `out`: O_DIRECT needs the memory and
  // the length aligned (a pool's blocks are page-aligned, and real blocks whole pages).
  bool ReadsInPlace(absl::Span<char> out) const {
    return out.size() % kRecordAlignment == 0 &&
           reinterpret_cast<uintptr_t>(out.data()) % kRecordAlignment == 0;
  }

  // Checks a slot's header (`header`, header_bytes_) and block bytes (`bytes`, block_bytes); on
  // OK sets *checksum (if given) to the record's.
  absl::Status Verify(const char* header_bytes, const char* bytes, uint64_t sequence,
                      const BlockRecordIdentity& expected, uint64_t* checksum) const {
    absl::StatusOr<RecordHeader> header =
        DecodeRecordHeader(absl::string_view(header_bytes, header_bytes_));
    if (!header.ok()) {
      return absl::DataLossError(
          absl::StrCat("disk record header unreadable: ", header.status().message()));
    }
    absl::string_view foreign = PoolMismatch(header->pool, options_.pool);
    if (!foreign.empty()) return absl::DataLossError(absl::StrCat("disk record of ", foreign));
    // The index said this slot holds `sequence`: anything else means the slot changed under it.
    if (header->sequence != sequence) return absl::DataLossError("disk record replaced");
    absl::string_view mismatch = RecordMismatch(header->block, expected);
    if (!mismatch.empty()) {
      return absl::DataLossError(absl::StrCat("disk record differs in ", mismatch));
    }
    if (BlockChecksum(bytes, options_.pool.block_bytes) != header->block.checksum) {
      return absl::DataLossError("disk record bytes fail their checksum");
    }
    if (checksum != nullptr) *checksum = header->block.checksum;
    return absl::OkStatus();
  }

  void WriterLoop() {
    std::vector<Queued> batch;
    std::vector<uint64_t> slots;
    std::vector<int> errors;
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
          const uint64_t slot = TakeSlotLocked();
          // Every slot is this batch's or pinned by a load. Once the batch is durable its records
          // can be evicted, so the rest waits for the next batch: dropping it would lose the
          // newest records while older ones stay, and which ones would depend on how batches
          // fall. With no batch at all, every slot is being read: the store is dropped.
          if (slot == kNone && !batch.empty()) break;
          Queued queued = std::move(queue_.front());
          queue_.pop_front();
          if (slot == kNone) {
            ++stats_.stores_dropped;
            ReleaseStoreLocked(queued.identity.hash, queued.buffer);
            continue;
          }
          batch.push_back(std::move(queued));
          slots.push_back(slot);
        }
      }
      errors.assign(batch.size(), 0);
      uint32_t submitted = 0;
      for (size_t i = 0; i < batch.size(); ++i) {
        if (options_.testing_write_errno) errors[i] = options_.testing_write_errno();
        if (errors[i] != 0) continue;
        write_ring_->QueueWrite(fd_, batch[i].buffer, slot_bytes_, SlotOffset(slots[i]), i, dsync);
        ++submitted;
      }
      done.clear();
      absl::Status ring_status = write_ring_->SubmitAndWait(&done);
      for (const IoRing::Completion& completion : done) {
        if (completion.result != static_cast<int>(slot_bytes_)) {
          errors[completion.tag] = completion.result < 0 ? -completion.result : EIO;
        }
      }
      bool synced = dsync;
      if (ring_status.ok() && !dsync && submitted > 0) {
        write_ring_->QueueFdatasync(fd_, 0);
        done.clear();
        ring_status = write_ring_->SubmitAndWait(&done);
        synced = ring_status.ok() && !done.empty() && done[0].result == 0;
        if (ring_status.ok() && !synced) {
          ring_status = ErrnoError("fdatasync", options_.path, -done[0].result);
        }
      }
      absl::MutexLock lock(&mu_);
      if (!dsync && submitted > 0) ++stats_.syncs;
      for (size_t i = 0; i < batch.size(); ++i) {
        absl::Status error = ring_status;
        if (error.ok() && errors[i] != 0) error = ErrnoError("writing", options_.path, errors[i]);
        if (error.ok() && synced) {
          Slot& slot = slot_[slots[i]];
          slot = Slot{SlotState::kIndexed, 0, batch[i].sequence, std::move(batch[i].identity)};
          index_[slot.identity.hash] = slots[i];
          LruPushFrontLocked(slots[i]);
          changes_.Add(RecordChange::Kind::kStored, slot.identity);
          ++stats_.stores_durable;
          stats_.bytes_written += slot_bytes_;
          ReleaseStoreLocked(slot.identity.hash, batch[i].buffer);
        } else {
          // The slot's contents are unknown now; a restart would skip or catch what is there.
          ++stats_.write_errors;
          ++stats_.stores_dropped;
          if (write_error_.ok()) write_error_ = error;
          FreeSlotLocked(slots[i]);
          ReleaseStoreLocked(batch[i].identity.hash, batch[i].buffer);
        }
      }
    }
  }

  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return !queue_.empty() || shutting_down_;
  }

  // Constant after construction.
  const DiskTierOptions options_;
  const int fd_;
  const bool direct_io_;
  const IoBackend io_backend_;
  const uint64_t header_bytes_;  // the header's share of a slot, 4 KiB-aligned
  const uint64_t slot_bytes_;
  const uint64_t slots_;

  // Own synchronization: each Reader's mutex. Lock order: a Reader's mu, then mu_ (never both
  // held today: loads pin under mu_, read under the reader's, unpin under mu_).
  std::vector<std::unique_ptr<Reader>> readers_;
  std::atomic<uint32_t> next_reader_{0};

  // The writer thread's alone.
  std::unique_ptr<IoRing> write_ring_;
  std::thread writer_;

  mutable absl::Mutex mu_;
  std::vector<Slot> slot_ ABSL_GUARDED_BY(mu_);
  // LRU of unpinned indexed slots, most recent first, as links over slot numbers; index slots_
  // is the sentinel; kNone links mark a slot outside the list.
  std::vector<uint64_t> lru_prev_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> lru_next_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> free_slots_ ABSL_GUARDED_BY(mu_);              // popped from the back
  absl::flat_hash_map<Hash128, uint64_t> index_ ABSL_GUARDED_BY(mu_);  // hash -> slot
  absl::flat_hash_set<Hash128> queued_hashes_ ABSL_GUARDED_BY(mu_);
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  AlignedBuffer store_buffers_;  // max_queued_stores slots
  RecordChanges changes_;        // added to under mu_, delivered without it
  std::vector<char*> free_buffers_ ABSL_GUARDED_BY(mu_);  // into store_buffers_
  uint64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;         // accepted or reserved, not finished
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status write_error_ ABSL_GUARDED_BY(mu_);  // latched: stores stop
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  DiskTierStats stats_ ABSL_GUARDED_BY(mu_);
};

absl::StatusOr<std::unique_ptr<DiskTier>> DiskTier::Open(DiskTierOptions options) {
  if (options.path.empty()) return absl::InvalidArgumentError("disk tier: no path");
  if (options.pool.block_bytes == 0 || options.tokens_per_block == 0 ||
      options.tokens_per_block > kMaxRecordTokens) {
    return absl::InvalidArgumentError("disk tier: block_bytes and tokens_per_block must be > 0");
  }
  if (options.pool.model_id.size() > kMaxRecordModelIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk tier: model id longer than ", kMaxRecordModelIdBytes, " bytes"));
  }
  if (options.max_queued_stores == 0 || options.read_rings == 0 || options.read_depth == 0) {
    return absl::InvalidArgumentError(
        "disk tier: max_queued_stores, read_rings and read_depth must be > 0");
  }
  const uint64_t slot_bytes = RecordHeaderSlotBytes(options.tokens_per_block) +
                              RoundUpToRecordAlignment(options.pool.block_bytes);
  const uint64_t slots = options.capacity_bytes / slot_bytes;
  if (slots == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk tier: ", options.capacity_bytes, " bytes hold no slot of ", slot_bytes));
  }
  RETURN_IF_ERROR(MakeParentDirectories(options.path));
  const std::string& path = options.path;
  bool direct_io = true;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {
    direct_io = false;  // the file system has no O_DIRECT: buffered I/O, still fdatasync'ed
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  }
  if (fd < 0) return ErrnoError("open", path, errno);
  auto fail = [fd](absl::Status status) {
    ::close(fd);
    return status;
  };
  // A process killed with SIGKILL holds its lock until the kernel has torn down its io_uring
  // rings, which happens after the process is gone: a restart waits that out, within a bound.
  const absl::Time lock_deadline = absl::Now() + options.lock_timeout;
  while (::flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK &&
         absl::Now() < lock_deadline) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == EWOULDBLOCK) {
      return fail(absl::FailedPreconditionError(
          absl::StrCat("disk tier file ", path, " is in use by another process")));
    }
    return fail(ErrnoError("flock", path, errno));
  }
  if (::fchmod(fd, 0600) != 0) return fail(ErrnoError("fchmod", path, errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail(ErrnoError("fstat", path, errno));
  const uint64_t old_size = st.st_size;
  const uint64_t size = slots * slot_bytes;

  // Reserve the whole file, so that a full disk shows at Open, not in the middle of a store.
  struct statvfs fs;
  if (::fstatvfs(fd, &fs) != 0) return fail(ErrnoError("fstatvfs", path, errno));
  const uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
  const uint64_t available = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (size > allocated && size - allocated > available) {
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        "disk tier ", path, " needs ", size - allocated, " more bytes; ", available, " are free")));
  }
  auto impl = std::make_unique<Impl>(std::move(options), fd, direct_io, slots);
  RETURN_IF_ERROR(impl->Scan(old_size));  // the Impl owns fd now
  if (old_size > size && ::ftruncate(fd, size) != 0) return ErrnoError("ftruncate", path, errno);
  if (::fallocate(fd, 0, 0, size) != 0) {
    if (errno == ENOSPC) return absl::ResourceExhaustedError(absl::StrCat("fallocate ", path));
    if (errno != EOPNOTSUPP) return ErrnoError("fallocate", path, errno);
    if (::ftruncate(fd, size) != 0) return ErrnoError("ftruncate", path, errno);
  }
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<DiskTier>(new DiskTier(std::move(impl)));
}

DiskTier::DiskTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskTier::~DiskTier() = default;

absl::Status DiskTier::Store(const BlockRecordIdentity& identity, absl::Span<const char> bytes) {
  return impl_->Store(identity, bytes);
}
absl::StatusOr<BlockRecordIdentity> DiskTier::Find(const Hash128& hash) const {
  return impl_->Find(hash);
}
absl::Status DiskTier::Load(const BlockRecordIdentity& expected, absl::Span<char> out) {
  const LoadRequest request{&expected, out};
  return impl_->LoadMany(absl::MakeConstSpan(&request, 1))[0];
}
std::vector<absl::Status> DiskTier::LoadMany(absl::Span<const LoadRequest> requests) {
  return impl_->LoadMany(requests);
}
absl::Status DiskTier::Erase(const Hash128& hash) { return impl_->Erase(hash); }
void DiskTier::Flush() { impl_->Flush(); }
DiskTierStats DiskTier::stats() const { return impl_->stats(); }
std::vector<BlockRecordIdentity> DiskTier::Records() const { return impl_->Records(); }
uint32_t DiskTier::read_depth() const { return impl_->read_depth(); }
IoBackend DiskTier::io_backend() const { return impl_->io_backend(); }
bool DiskTier::direct_io() const { return impl_->direct_io(); }
uint64_t DiskTier::slot_bytes() const { return impl_->slot_bytes(); }

}  // namespace kvcache
