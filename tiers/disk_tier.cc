// The disk tier's file: Open, the restart scan and the slot table (tiers/disk_tier_impl.h).
#include "tiers/disk_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/status_macros.h"
#include "tiers/disk_tier_impl.h"
#include "tiers/record_codec.h"

namespace kvcache {
namespace {

// Creates the missing directories of `path`'s parent, owner-only; existing ones are left as
// they are (the parent may be a shared directory such as /tmp).
absl::Status MakeParentDirectories(const std::string& path) {
  for (size_t slash = path.find('/', 1); slash != std::string::npos;
       slash = path.find('/', slash + 1)) {
    const std::string directory = path.substr(0, slash);
    if (::mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) {
      return DiskTier::Impl::ErrnoError("mkdir", directory, errno);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status DiskTier::Impl::ErrnoError(absl::string_view what, const std::string& path,
                                        int error) {
  return absl::InternalError(absl::StrCat(what, " ", path, ": ", std::strerror(error)));
}

DiskTier::Impl::Impl(DiskTierOptions options, int fd, bool direct_io, uint32_t slots)
    : options_(std::move(options)),
      fd_(fd),
      direct_io_(direct_io),
      io_backend_(options_.io == DiskTierOptions::Io::kIoUring    ? IoBackend::kIoUring
                  : options_.io == DiskTierOptions::Io::kSyscalls ? IoBackend::kSyscalls
                                                                  : IoRing::Probe()),
      sealer_(options_.keyring == nullptr
                  ? std::nullopt
                  : std::make_optional<RecordSealer>(options_.keyring, options_.pool,
                                                     options_.tokens_per_block)),
      header_bytes_(SlotBytesFor(options_) - RoundUpToRecordAlignment(options_.pool.block_bytes)),
      slot_bytes_(SlotBytesFor(options_)),
      slots_(slots),
      queue_full_(absl::ResourceExhaustedError(absl::StrCat(
          "disk tier queue full (", options_.max_queued_stores, " records being written)"))),
      not_found_(absl::NotFoundError("not in the disk tier")),
      table_(slots),
      records_(slots),
      store_buffers_(slot_bytes_ * options_.max_queued_stores),
      changes_(options_.on_change) {}

DiskTier::Impl::~Impl() {
  {
    absl::MutexLock lock(&mu_);
    shutting_down_ = true;
  }
  if (writer_.joinable()) writer_.join();
  ::close(fd_);
}

absl::Status DiskTier::Impl::Start() {
  if (store_buffers_.data() == nullptr) return absl::ResourceExhaustedError("store buffers");
  for (uint32_t i = options_.max_queued_stores; i > 0; --i) {
    free_buffers_.push_back(store_buffers_.data() + (i - 1) * slot_bytes_);
  }
  store_room_.store(options_.max_queued_stores, std::memory_order_relaxed);
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

absl::Status DiskTier::Impl::Scan(uint64_t old_size) {
  const absl::Time start = absl::Now();
  absl::MutexLock lock(&mu_);
  const uint64_t whole = std::min<uint64_t>(slots_, old_size / slot_bytes_);
  if (whole < slots_ && old_size > whole * slot_bytes_) ++stats_.restart_torn;  // cut slot
  absl::flat_hash_map<Hash128, uint32_t> found;  // the records kept: hash -> slot
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
        IndexScannedLocked(first + completion.tag, buffer.data() + completion.tag * header_bytes_,
                           &found);
      }
    }
  }
  std::vector<std::pair<uint64_t, uint32_t>> by_sequence;  // (sequence, slot) of records
  by_sequence.reserve(found.size());
  for (const auto& [hash, slot] : found) by_sequence.emplace_back(records_[slot].sequence, slot);
  std::sort(by_sequence.begin(), by_sequence.end());
  // Oldest first, each the most recent so far: the newest ends most recently used. The other
  // slots stay free, taken lowest first.
  for (const auto& [sequence, slot] : by_sequence)
    table_.Restore(slot, records_[slot].identity.hash);
  stats_.restart_scan_time = absl::Now() - start;
  return absl::OkStatus();
}

absl::StatusOr<BlockRecordIdentity> DiskTier::Impl::Find(const Hash128& hash) const {
  absl::MutexLock lock(&mu_);
  const uint32_t slot = table_.Find(hash);
  if (slot == kNoSlot) return not_found_;  // shared: every open's probe past tier 2 may miss
  return records_[slot].identity;
}

bool DiskTier::Impl::Contains(const Hash128& hash) const {
  absl::MutexLock lock(&mu_);
  return table_.Find(hash) != kNoSlot;
}

bool DiskTier::Impl::ContainsCopyOf(const Hash128& hash, uint64_t extras_digest) const {
  absl::MutexLock lock(&mu_);
  const uint32_t slot = table_.Find(hash);
  return slot != kNoSlot && !HasMoreParts(extras_digest, records_[slot].identity.extras_digest);
}

absl::Status DiskTier::Impl::Erase(const Hash128& hash) {
  {
    absl::MutexLock lock(&mu_);
    const uint32_t slot = table_.Find(hash);
    if (slot == kNoSlot) return absl::NotFoundError("not in the disk tier");
    ++stats_.erases;
    DropLocked(slot);
  }
  changes_.Deliver();
  return absl::OkStatus();
}

std::vector<BlockRecordIdentity> DiskTier::Impl::Records() const {
  absl::MutexLock lock(&mu_);
  std::vector<BlockRecordIdentity> records;
  records.reserve(table_.records());
  for (uint32_t slot = 0; slot < slots_; ++slot) {
    if (table_.state(slot) == SlotTable::State::kStored) records.push_back(records_[slot].identity);
  }
  return records;
}

DiskTierStats DiskTier::Impl::stats() const {
  absl::MutexLock lock(&mu_);
  DiskTierStats stats = stats_;
  stats.slots = slots_;
  stats.slot_bytes = slot_bytes_;
  stats.records = table_.records();
  stats.queued = outstanding_;
  return stats;
}

void DiskTier::Impl::IndexScannedLocked(uint32_t slot, const char* header_bytes,
                                        absl::flat_hash_map<Hash128, uint32_t>* found) {
  OpenedHead opened;
  const absl::Status read = ReadHeader(header_bytes, nullptr, &opened);
  if (absl::IsNotFound(read)) {
    ++stats_.restart_empty;
    return;
  }
  // The other sealing's records and sealed ones that do not open are never served: their slots
  // are free.
  const RecordSealing sealing = RecordSealingOf(absl::string_view(header_bytes, 8));
  if (sealing == (sealer_.has_value() ? RecordSealing::kUnsealed : RecordSealing::kSealed)) {
    ++stats_.restart_other_sealing;
    return;
  }
  if (absl::IsUnauthenticated(read)) {
    ++stats_.restart_unopened;
    return;
  }
  if (absl::IsFailedPrecondition(read)) {
    ++stats_.restart_old_format;  // intact, but not verifiable by this build: its slot is free
    return;
  }
  if (!read.ok()) {
    ++stats_.restart_torn;
    return;
  }
  if (!PoolMismatch(opened.header.pool, options_.pool).empty() ||
      opened.header.block.tokens.size() != options_.tokens_per_block) {
    ++stats_.restart_foreign;
    return;
  }
  next_sequence_ = std::max(next_sequence_, opened.header.sequence + 1);
  auto [it, inserted] = found->try_emplace(opened.header.block.hash, slot);
  if (inserted) {
    ++stats_.restart_records;
  } else {
    // Two slots under one hash: a record stored again after its first slot was evicted but not
    // yet overwritten, or one superseded by a copy with more parts (always the newer: it was
    // stored after the one it replaced was indexed). The newer one stays; the other slot is free.
    ++stats_.restart_duplicates;
    if (records_[it->second].sequence > opened.header.sequence) return;
    it->second = slot;
  }
  records_[slot] = Record{opened.header.sequence, std::move(opened.header.block)};
}

void DiskTier::Impl::DropLocked(uint32_t slot) {
  changes_.Add(RecordChange::Kind::kRemoved, records_[slot].identity);
  table_.Drop(slot);
}

uint32_t DiskTier::Impl::TakeSlotLocked() {
  const SlotTable::Taken taken = table_.Take();
  if (taken.evicted) {
    changes_.Add(RecordChange::Kind::kRemoved, records_[taken.slot].identity);
    ++stats_.evictions;
  }
  return taken.slot;
}

absl::Status DiskTier::Impl::CheckInvariants() const {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(table_.CheckInvariants("disk tier"));
  for (uint32_t slot = 0; slot < slots_; ++slot) {
    if (table_.state(slot) != SlotTable::State::kStored) continue;
    // Queued again only to supersede it.
    auto queued = queued_hashes_.find(records_[slot].identity.hash);
    if (queued != queued_hashes_.end() &&
        !HasMoreParts(queued->second, records_[slot].identity.extras_digest)) {
      return absl::InternalError(absl::StrCat("disk tier record in slot ", slot, " is queued too"));
    }
  }
  return absl::OkStatus();
}

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
  if (options.read_rings == 0 || options.read_depth == 0) {
    return absl::InvalidArgumentError("disk tier: read_rings and read_depth must be > 0");
  }
  options.max_queued_stores = QueuedStoresFor(options);
  const uint64_t slot_bytes = SlotBytesFor(options);
  const uint64_t slots = options.capacity_bytes / slot_bytes;
  if (slots == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("disk tier: ", options.capacity_bytes, " bytes hold no slot of ", slot_bytes));
  }
  if (slots >= SlotTable::kNoSlot) {
    return absl::InvalidArgumentError(absl::StrCat("disk tier: ", options.capacity_bytes,
                                                   " bytes hold ", slots, " slots; at most ",
                                                   SlotTable::kNoSlot - 1, " are supported"));
  }
  RETURN_IF_ERROR(MakeParentDirectories(options.path));
  const std::string& path = options.path;
  bool direct_io = true;
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_DIRECT, 0600);
  if (fd < 0 && errno == EINVAL) {
    direct_io = false;  // the file system has no O_DIRECT: buffered I/O, still fdatasync'ed
    fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  }
  if (fd < 0) return Impl::ErrnoError("open", path, errno);
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
    return fail(Impl::ErrnoError("flock", path, errno));
  }
  if (::fchmod(fd, 0600) != 0) return fail(Impl::ErrnoError("fchmod", path, errno));
  struct stat st;
  if (::fstat(fd, &st) != 0) return fail(Impl::ErrnoError("fstat", path, errno));
  const uint64_t old_size = st.st_size;
  const uint64_t size = slots * slot_bytes;

  // Reserve the whole file, so that a full disk shows at Open, not in the middle of a store.
  struct statvfs fs;
  if (::fstatvfs(fd, &fs) != 0) return fail(Impl::ErrnoError("fstatvfs", path, errno));
  const uint64_t allocated = static_cast<uint64_t>(st.st_blocks) * 512;
  const uint64_t available = static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize;
  if (size > allocated && size - allocated > available) {
    return fail(absl::ResourceExhaustedError(absl::StrCat(
        "disk tier ", path, " needs ", size - allocated, " more bytes; ", available, " are free")));
  }
  auto impl =
      std::make_unique<Impl>(std::move(options), fd, direct_io, static_cast<uint32_t>(slots));
  RETURN_IF_ERROR(impl->Scan(old_size));  // the Impl owns fd now
  if (old_size > size && ::ftruncate(fd, size) != 0)
    return Impl::ErrnoError("ftruncate", path, errno);
  if (::fallocate(fd, 0, 0, size) != 0) {
    if (errno == ENOSPC) return absl::ResourceExhaustedError(absl::StrCat("fallocate ", path));
    if (errno != EOPNOTSUPP) return Impl::ErrnoError("fallocate", path, errno);
    if (::ftruncate(fd, size) != 0) return Impl::ErrnoError("ftruncate", path, errno);
  }
  RETURN_IF_ERROR(impl->Start());
  return std::unique_ptr<DiskTier>(new DiskTier(std::move(impl)));
}

uint64_t DiskTier::SlotBytesFor(const DiskTierOptions& options) {
  const uint64_t header = options.keyring != nullptr ? SealedHeadBytes(options.tokens_per_block)
                                                     : RecordHeaderBytes(options.tokens_per_block);
  return RoundUpToRecordAlignment(header) + RoundUpToRecordAlignment(options.pool.block_bytes);
}

uint32_t DiskTier::QueuedStoresFor(const DiskTierOptions& options) {
  if (options.max_queued_stores != 0) return options.max_queued_stores;
  return static_cast<uint32_t>(std::clamp<uint64_t>(
      kDefaultQueuedStoreBytes / SlotBytesFor(options), kMinQueuedStores, kMaxQueuedStores));
}

DiskTier::DiskTier(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
DiskTier::~DiskTier() = default;

absl::Status DiskTier::Store(BlockRecordIdentity identity, absl::Span<const char> bytes) {
  return impl_->Store(std::move(identity), bytes);
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
bool DiskTier::Contains(const Hash128& hash) const { return impl_->Contains(hash); }
bool DiskTier::ContainsCopyOf(const Hash128& hash, uint64_t extras_digest) const {
  return impl_->ContainsCopyOf(hash, extras_digest);
}
uint32_t DiskTier::StoreRoom() const { return impl_->store_room(); }
absl::Status DiskTier::Erase(const Hash128& hash) { return impl_->Erase(hash); }
void DiskTier::Flush() { impl_->Flush(); }
DiskTierStats DiskTier::stats() const { return impl_->stats(); }
const TenantCounters& DiskTier::open_failures() const { return impl_->open_failures(); }
bool DiskTier::sealed() const { return impl_->sealed(); }
std::vector<BlockRecordIdentity> DiskTier::Records() const { return impl_->Records(); }
uint32_t DiskTier::read_depth() const { return impl_->read_depth(); }
IoBackend DiskTier::io_backend() const { return impl_->io_backend(); }
bool DiskTier::direct_io() const { return impl_->direct_io(); }
uint64_t DiskTier::slot_bytes() const { return impl_->slot_bytes(); }
absl::Status DiskTier::CheckInvariants() const { return impl_->CheckInvariants(); }

}  // namespace kvcache
