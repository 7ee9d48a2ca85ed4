// DiskTier::Impl: the disk tier behind DiskTier's pimpl (tiers/disk_tier.h), whose header comment
// is its contract. Internal to tiers/. Its code is in three files:
//   disk_tier.cc         the file: Open, the restart scan, the slot table (find, erase, evict);
//   disk_tier_writer.cc  the write queue (Store, Flush) and the writer thread;
//   disk_tier_reader.cc  the reader rings: loads, read and verified.
#ifndef KVCACHE_TIERS_DISK_TIER_IMPL_H_
#define KVCACHE_TIERS_DISK_TIER_IMPL_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/block_hash.h"
#include "tiers/block_record.h"
#include "tiers/disk_tier.h"
#include "tiers/io_ring.h"
#include "tiers/record_changes.h"
#include "tiers/record_codec.h"
#include "tiers/record_seal.h"
#include "tiers/slot_table.h"

namespace kvcache {

class DiskTier::Impl {
 public:
  Impl(DiskTierOptions options, int fd, bool direct_io, uint32_t slots);
  ~Impl();

  // Allocates the buffers and rings and starts the writer.
  absl::Status Start() ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Reads every slot header of the file's first `old_size` bytes and indexes the pool's own
  // records (oldest first in the LRU, by sequence); everything else becomes a free slot.
  absl::Status Scan(uint64_t old_size) ABSL_LOCKS_EXCLUDED(mu_);

  absl::Status Store(BlockRecordIdentity identity, absl::Span<const char> bytes)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::StatusOr<BlockRecordIdentity> Find(const Hash128& hash) const ABSL_LOCKS_EXCLUDED(mu_);
  bool Contains(const Hash128& hash) const ABSL_LOCKS_EXCLUDED(mu_);
  bool ContainsCopyOf(const Hash128& hash, uint64_t extras_digest) const ABSL_LOCKS_EXCLUDED(mu_);
  uint32_t store_room() const { return store_room_.load(std::memory_order_relaxed); }
  std::vector<absl::Status> LoadMany(absl::Span<const LoadRequest> requests)
      ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status Erase(const Hash128& hash) ABSL_LOCKS_EXCLUDED(mu_);
  std::vector<BlockRecordIdentity> Records() const ABSL_LOCKS_EXCLUDED(mu_);
  void Flush() ABSL_LOCKS_EXCLUDED(mu_);
  DiskTierStats stats() const ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status CheckInvariants() const ABSL_LOCKS_EXCLUDED(mu_);

  const TenantCounters& open_failures() const { return open_failures_; }
  bool sealed() const { return sealer_.has_value(); }
  bool direct_io() const { return direct_io_; }
  IoBackend io_backend() const { return io_backend_; }
  uint64_t slot_bytes() const { return slot_bytes_; }
  uint32_t read_depth() const { return options_.read_depth; }

  // INTERNAL: "<what> <path>: <strerror(error)>".
  static absl::Status ErrnoError(absl::string_view what, const std::string& path, int error);

 private:
  static constexpr uint32_t kNoSlot = SlotTable::kNoSlot;
  // What a stored slot holds, beside the table's bookkeeping; set when it is published.
  struct Record {
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
    uint32_t slot;
    uint64_t sequence;
  };
  // One concurrent loader: a ring and 2 x read_depth slot buffers.
  struct Reader {
    absl::Mutex mu;
    std::unique_ptr<IoRing> ring;
    std::unique_ptr<AlignedBuffer> buffers;
  };

  uint64_t SlotOffset(uint64_t slot) const { return slot * slot_bytes_; }

  // disk_tier.cc: the slot table.
  // Keeps the record a scanned header describes, if it is this pool's and the newest of its
  // hash (`found`: hash -> slot of the records kept so far).
  void IndexScannedLocked(uint32_t slot, const char* header_bytes,
                          absl::flat_hash_map<Hash128, uint32_t>* found)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A free slot, else the least recently used unpinned record's (evicted); kNoSlot when every
  // slot is being written or read.
  uint32_t TakeSlotLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the record from the index; its slot is free once no load reads it.
  void DropLocked(uint32_t slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // disk_tier_writer.cc.
  void WriterLoop() ABSL_LOCKS_EXCLUDED(mu_);
  bool HasWorkLocked() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ReleaseStoreLocked(const Hash128& hash, char* buffer) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Publishes a durable record written into `slot`: indexed, superseding the record under its
  // hash (see the header). False when that record stays (it is not superseded): ours is not
  // published and the caller frees its slot.
  bool PublishLocked(uint32_t slot, Queued& written) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Mirrors the free places (none once a write failed) into store_room_.
  void UpdateStoreRoomLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // disk_tier_reader.cc.
  absl::Status PinLocked(const LoadRequest& request, size_t i, std::vector<Pinned>* pinned)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Counts the load's result (a failed open against `tenant`, the tenant that asked) and unpins.
  void UnpinLocked(const Pinned& pin, const absl::Status& result, absl::string_view tenant)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Reads and verifies the pinned slots on a free Reader (or waits for one), keeping read_depth
  // reads in flight: each completion queues the next read (into a free one of the reader's
  // 2 x read_depth buffers) before its own slot is verified and copied out. The analysis cannot
  // follow a mutex picked at run time; the reader's lock is held throughout.
  void ReadPinned(absl::Span<const Pinned> pinned, absl::Span<const LoadRequest> requests,
                  std::vector<absl::Status>* results) ABSL_NO_THREAD_SAFETY_ANALYSIS;
  // Answers a pinned load from its completed read: verified bytes are copied (or, sealed,
  // decrypted) out. A sealed record read in place has its bytes opened in `opening` (beside this
  // thread, with seal workers): its answer is final once `opening` has been waited for.
  void Answer(const Pinned& pin, const char* slot, int read_result,
              absl::Span<const LoadRequest> requests, std::vector<absl::Status>* results,
              TaskWorkers::Group* opening) const;
  // Whether a load reads the block's bytes straight into `out`: O_DIRECT needs the memory and
  // the length aligned (a pool's blocks are page-aligned, and real blocks whole pages).
  bool ReadsInPlace(absl::Span<char> out) const;
  // Checks a slot's header (`header_bytes`, header_bytes_) against the pool, the index's
  // `sequence` and the request; on OK `opened` holds it (sealed: opened for expected.tenant).
  absl::Status VerifyHeader(const char* header_bytes, uint64_t sequence,
                            const BlockRecordIdentity& expected, OpenedHead* opened) const;
  // Checks a verified header's block bytes (`bytes`, block_bytes) and puts them into `out` (which
  // may be `bytes`: sealed, decrypted in place); on OK sets *checksum (if given) to the record's.
  // `out` holds nothing to use unless OK.
  absl::Status VerifyBytes(const OpenedHead& opened, const char* bytes, char* out,
                           const BlockRecordIdentity& expected, uint64_t* checksum) const;
  // The header of a slot (header_bytes_ at `header_bytes`) into opened->header: sealed, opened
  // for `tenant` (null: the tenant its box names; see RecordSealer::OpenHead), else decoded.
  absl::Status ReadHeader(const char* header_bytes, const std::string* tenant,
                          OpenedHead* opened) const;
  // Sealed: seals a queued record's slot in place (its block bytes are in the buffer already).
  absl::Status SealSlot(const Queued& queued) const;

  // Constant after construction.
  const DiskTierOptions options_;
  const int fd_;
  const bool direct_io_;
  const IoBackend io_backend_;
  const std::optional<RecordSealer> sealer_;  // set: records are sealed
  const uint64_t header_bytes_;  // the (sealed) header's share of a slot, 4 KiB-aligned
  const uint64_t slot_bytes_;
  const uint32_t slots_;
  const absl::Status queue_full_;  // Store's RESOURCE_EXHAUSTED, made once
  const absl::Status not_found_;   // Find's NOT_FOUND, made once

  // Own synchronization: each Reader's mutex. Lock order: a Reader's mu, then mu_ (never both
  // held today: loads pin under mu_, read under the reader's, unpin under mu_).
  std::vector<std::unique_ptr<Reader>> readers_;
  std::atomic<uint32_t> next_reader_{0};

  // The writer thread's alone.
  std::unique_ptr<IoRing> write_ring_;
  std::thread writer_;

  mutable absl::Mutex mu_;
  // Indexed records, a slot being written (filling) and loads' pins (a pinned slot is off the
  // LRU: neither evicted nor overwritten until its load ends).
  SlotTable table_ ABSL_GUARDED_BY(mu_);
  std::vector<Record> records_ ABSL_GUARDED_BY(mu_);  // by slot
  // The queued records' hashes, each with its extras digest (its parts, for superseding).
  absl::flat_hash_map<Hash128, uint64_t> queued_hashes_ ABSL_GUARDED_BY(mu_);
  std::deque<Queued> queue_ ABSL_GUARDED_BY(mu_);
  AlignedBuffer store_buffers_;  // max_queued_stores slots
  RecordChanges changes_;        // added to under mu_, delivered without it
  std::vector<char*> free_buffers_ ABSL_GUARDED_BY(mu_);  // into store_buffers_
  // StoreRoom's answer, written under mu_ by UpdateStoreRoomLocked and read without it.
  std::atomic<uint32_t> store_room_{0};
  uint64_t outstanding_ ABSL_GUARDED_BY(mu_) = 0;  // accepted or reserved, not finished
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 1;
  absl::Status write_error_ ABSL_GUARDED_BY(mu_);  // latched: stores stop
  bool shutting_down_ ABSL_GUARDED_BY(mu_) = false;
  DiskTierStats stats_ ABSL_GUARDED_BY(mu_);
  TenantCounters open_failures_;  // own synchronization
};

}  // namespace kvcache

#endif  // KVCACHE_TIERS_DISK_TIER_IMPL_H_
