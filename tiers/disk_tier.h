// DiskTier: tier 3 of one pool (DESIGN §10), block records in one preallocated file on local
// disk, read and written with io_uring and O_DIRECT, kept across restarts.
//
// The file is an array of fixed slots; slot i is at i * slot_bytes():
//   [record header (tiers/record_codec.h), padded to 4 KiB][block bytes, padded to 4 KiB]
// and is written as one piece. There is no other metadata: Open rebuilds the index by reading
// every slot's header, so what a restart serves is exactly what the headers say (records of
// another pool or of record format 1, which has no prefix digest, are skipped and counted).
//
// Durability rule: a record becomes visible to Find and Load only after its slot write completed
// and an fdatasync that followed it did (or, with Durability::kDsyncPerWrite, its RWF_DSYNC
// write did). Store only queues: a writer thread writes queued records in batches and syncs
// once per batch. A crash leaves at most torn slots, which a restart skips (header checksum) or
// a load catches (bytes checksum): never wrong bytes.
//
// Sealed (DiskTierOptions::keyring set, tiers/record_seal.h): each slot holds a sealed head in
// place of the plaintext header and the block's bytes encrypted under the tenant's key
// (BlockRecordIdentity::tenant); the writer thread seals each record just before writing it, so
// neither Store nor a load's caller pays for it. Open learns each record's tenant from its head
// (the tenant box); a record whose head does not open with the keyring (another master key, a
// key removed, a changed byte) is skipped, and so is a record of the other sealing: an unsealed
// one when the tier is sealed, a sealed one when it is not (counted apart, never served either
// way). A load opens the head with the key of the tenant that asks (LoadRequest::expected's
// tenant): a record sealed for another tenant, or changed anywhere, does not open — a miss,
// counted per tenant (open_failures()) and dropped like a corrupt one.
//
// Back-pressure: Store never waits. Past `max_queued_stores` records not yet durable it answers
// RESOURCE_EXHAUSTED at once, so a mover backs off and requests never wait on the disk; StoreRoom
// tells a mover beforehand how much the queue takes. After a write fails (ENOSPC, EIO, ...) the
// tier stops storing (UNAVAILABLE) and goes on serving loads.
//
// Loads: Find answers from memory (no I/O). Load reads the slot, decodes the header, checks the
// pool identity, the block identity against what the caller expects (RecordMismatch) and the
// bytes against the header's checksum, and only then copies the bytes out. A corrupt record is
// DATA_LOSS, counted and dropped (its slot is reused); a record of another identity is NOT_FOUND.
//
// When every slot holds a record, a store evicts the least recently stored-or-loaded one. A slot
// being read is pinned: neither evicted nor overwritten until its load ends.
//
// Superseding (DESIGN §13): a store of the same block with more parts than the record indexed
// under its hash (Supersedes, tiers/block_record.h) is accepted. Its record is written into a
// slot of its own like any other and, once durable, replaces the old one in the index; the old
// slot is freed then, or at the end of a load that reads it, never overwritten under it. Both
// may survive in the file: a restart keeps the newer of two records under one hash (the greater
// sequence), which is the superseding one, written after the record it replaced was indexed.
// A copy with more parts offered while one with fewer is still queued is ABORTED: offered again
// once that one is durable.
//
// What the tier holds is reported to DiskTierOptions::on_change (tiers/record_changes.h): a record
// that became visible (durable; a superseding one too, with no removal before it), one that left
// (evicted, erased, dropped as corrupt), in order, outside the tier's mutex, from the writer thread
// or a loading thread. Records found by Open's scan are not reported; Records() lists them.
//
// Thread safety: thread-safe. Store, Find, Load, LoadMany, Erase and stats may be called from any
// thread; loads run concurrently on `read_rings` io_uring instances.
#ifndef KVCACHE_TIERS_DISK_TIER_H_
#define KVCACHE_TIERS_DISK_TIER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "common/block_hash.h"
#include "common/task_workers.h"
#include "tiers/block_record.h"
#include "tiers/io_ring.h"
#include "tiers/record_changes.h"
#include "tiers/tenant_counters.h"
#include "tiers/tier_keyring.h"

namespace kvcache {

struct DiskTierOptions {
  std::string path;             // the pool's file; created 0600, its missing directories 0700
  uint64_t capacity_bytes = 0;  // SIZE: the file holds capacity_bytes / slot_bytes slots
  PoolIdentity pool;
  uint32_t tokens_per_block = 16;

  enum class Durability {
    kBatchFdatasync,  // batch of writes, then one fdatasync (default; docs/benchmarks.md)
    kDsyncPerWrite,   // each write with RWF_DSYNC
  };
  Durability durability = Durability::kBatchFdatasync;
  // Records accepted and not yet durable; each holds one slot-sized aligned buffer. 0: as many
  // as kDefaultQueuedStoreBytes of slots, at least kMinQueuedStores and at most kMaxQueuedStores.
  // The writer takes all that is queued as one batch, and a batch's fdatasync and wake-ups cost
  // much the same for 30 records as for 1,000: with 8 KiB slots, a queue of 32 kept a third of
  // rpc_bench's evictions on the 2-core VM and one of 1,024 kept all of them, at the same
  // request rate (docs/benchmarks.md).
  uint32_t max_queued_stores = 0;
  // Concurrent loaders; each ring keeps `read_depth` reads in flight and has twice as many slot
  // buffers (a completed read is verified while the next ones are read).
  uint32_t read_rings = 2;
  uint32_t read_depth = 16;

  // kAuto: io_uring where the kernel grants it, else plain system calls (io_ring.h), e.g. under a
  // container runtime's default seccomp profile. The others force one (tests, benches).
  enum class Io { kAuto, kIoUring, kSyscalls };
  Io io = Io::kAuto;

  // How long Open waits for another process's lock on the file to go (a killed daemon's lives
  // on briefly while the kernel tears down its io_uring rings).
  absl::Duration lock_timeout = absl::Seconds(5);

  // Hears of every record made visible or removed after Open (may be empty).
  RecordChangeListener on_change;

  // Set: every record is sealed with the keyring's keys (see the header comment); null: records
  // are plaintext, as before sealing existed.
  std::shared_ptr<const TierKeyring> keyring;
  // Sealed: the threads that open loaded records' bytes beside the reading thread (may be null:
  // on the reading thread). Shared; must outlive the tier.
  std::shared_ptr<TaskWorkers> seal_workers;

  // Test seam: called before each slot write; a nonzero errno fails that write as the kernel
  // would (ENOSPC: a full disk) without touching the file.
  std::function<int()> testing_write_errno;
  // Test seam: called before each slot read is queued (e.g. to make reads take time).
  std::function<void()> testing_before_read;
};

// Counters since Open; each is a running total unless said otherwise.
struct DiskTierStats {
  uint64_t slots = 0;       // capacity: file size / slot_bytes
  uint64_t slot_bytes = 0;  // header and block, each padded to 4 KiB
  uint64_t records = 0;     // indexed now (Find would answer them)
  uint64_t queued = 0;      // accepted, not yet durable (now)

  uint64_t stores_accepted = 0;
  uint64_t stores_durable = 0;          // published
  uint64_t stores_refused_full = 0;     // queue full: back-pressure
  uint64_t stores_refused_stopped = 0;  // after a write error
  uint64_t stores_duplicate = 0;        // hash already indexed or queued (ALREADY_EXISTS)
  // A copy with more parts of a record queued with fewer (ABORTED: offered again later).
  uint64_t stores_deferred = 0;
  uint64_t superseded = 0;      // records replaced in the index by a durable copy with more parts
  uint64_t stores_dropped = 0;  // accepted but not published: no slot, write error
  uint64_t write_errors = 0;
  uint64_t syncs = 0;      // fdatasync calls
  uint64_t evictions = 0;  // records evicted to make room
  uint64_t erases = 0;

  uint64_t loads = 0;            // blocks asked of Load/LoadMany
  uint64_t load_hits = 0;        // verified and delivered into the caller's memory
  uint64_t loads_in_place = 0;   // hits read straight into the caller's memory (no copy)
  uint64_t load_misses = 0;      // not indexed
  uint64_t load_mismatches = 0;  // indexed under the hash with another identity (NOT_FOUND)
  uint64_t load_corrupt = 0;     // header or bytes failed verification (DATA_LOSS; dropped)
  // Sealed: records that did not open for the tenant asking (UNAUTHENTICATED; dropped); per
  // tenant in DiskTier::open_failures().
  uint64_t load_unopened = 0;
  uint64_t read_errors = 0;  // the read itself failed (INTERNAL)
  uint64_t bytes_read = 0;
  uint64_t bytes_written = 0;

  // What Open found in an existing file (zero for a new one).
  uint64_t restart_records = 0;     // indexed
  uint64_t restart_empty = 0;       // never-written slots
  uint64_t restart_torn = 0;        // header unreadable or failed to decode, or slot cut by EOF
  uint64_t restart_foreign = 0;     // another pool identity
  uint64_t restart_old_format = 0;  // an older record format (version 1: no prefix digest)
  uint64_t restart_duplicates = 0;  // a hash already indexed from a newer record
  // Sealed records the keyring did not open (another master key, a key removed from the file, a
  // changed byte): none of them is served.
  uint64_t restart_unopened = 0;
  // Records of the other sealing: unsealed ones found by a sealed tier, sealed ones by a tier
  // without a keyring.
  uint64_t restart_other_sealing = 0;
  absl::Duration restart_scan_time;
};

class DiskTier {
 public:
  // The bytes of a slot of a tier with these options: the (sealed) header and the block, each
  // padded to 4 KiB.
  static uint64_t SlotBytesFor(const DiskTierOptions& options);

  // DiskTierOptions::max_queued_stores's default: the store buffers' memory (a block of 2 MiB
  // and more has kMinQueuedStores, as every block size had before), and the most records one
  // batch takes.
  static constexpr uint64_t kDefaultQueuedStoreBytes = uint64_t{64} << 20;
  static constexpr uint32_t kMinQueuedStores = 32;
  static constexpr uint32_t kMaxQueuedStores = 1024;
  // The queue's length for these options: theirs, else the default's.
  static uint32_t QueuedStoresFor(const DiskTierOptions& options);

  // Opens or creates the file and indexes the records already in it (see the header comment).
  // INVALID_ARGUMENT: bad options (no path, a capacity below one slot, block_bytes 0, a model id
  // longer than kMaxRecordModelIdBytes); RESOURCE_EXHAUSTED: the file system has less free space
  // than the capacity still needs; FAILED_PRECONDITION: another process has the file open
  // (flock, after lock_timeout), or Io::kIoUring was asked and io_uring is unavailable; INTERNAL:
  // any other system call failure, with errno.
  static absl::StatusOr<std::unique_ptr<DiskTier>> Open(DiskTierOptions options);

  // Writes the queued records (a bounded wait) and stops the writer.
  ~DiskTier();
  DiskTier(const DiskTier&) = delete;
  DiskTier& operator=(const DiskTier&) = delete;

  // Queues the block for writing; `bytes` is copied before Store returns. OK: accepted (it
  // becomes visible once durable; superseding the record indexed under its hash, if it has more
  // parts). ALREADY_EXISTS: the hash is indexed (and `identity` does not supersede its record) or
  // queued. ABORTED: the hash is queued with fewer parts than `identity` (offer it again).
  // RESOURCE_EXHAUSTED: the queue is full (retry later). UNAVAILABLE: stopped after a write
  // error. INVALID_ARGUMENT: bytes.size() != block_bytes or tokens.size() != tokens_per_block.
  // DATA_LOSS: BlockChecksum(bytes) != identity.checksum.
  absl::Status Store(BlockRecordIdentity identity, absl::Span<const char> bytes);

  // The identity of the durable record under `hash`, from memory. NOT_FOUND when there is none.
  absl::StatusOr<BlockRecordIdentity> Find(const Hash128& hash) const;
  // Whether Find would answer `hash`, without copying the identity out (a mover asks it per
  // eviction).
  bool Contains(const Hash128& hash) const;
  // Whether Find would answer `hash` with a record a store of a copy with `extras_digest` would
  // leave in place (it has no more parts: HasMoreParts).
  bool ContainsCopyOf(const Hash128& hash, uint64_t extras_digest) const;
  // How many stores the queue would accept now: its free places, 0 once stopped after a write
  // error. A hint read without the tier's mutex (the writer may free places at any moment), so
  // that a mover offers only what the writer can take instead of building records to be refused.
  uint32_t StoreRoom() const;

  // Reads the record under expected.hash into `out` (block_bytes bytes) and verifies it (and,
  // sealed, opens it for expected.tenant); `out` is left unspecified unless OK. When `out` is 4
  // KiB-aligned and block_bytes a multiple of 4 KiB (a pool's blocks), the bytes are read straight
  // into it; otherwise through a buffer. NOT_FOUND: no record, or one whose identity differs from
  // `expected` (the message names the field). DATA_LOSS: the slot's header or bytes failed
  // verification. UNAUTHENTICATED: sealed, and the record did not open for expected.tenant.
  // INTERNAL: the read failed. After any of these three the record is dropped. INVALID_ARGUMENT:
  // out.size() != block_bytes.
  absl::Status Load(const BlockRecordIdentity& expected, absl::Span<char> out);

  struct LoadRequest {
    const BlockRecordIdentity* expected;
    absl::Span<char> out;
    uint64_t* checksum = nullptr;  // when set and OK: the verified record's checksum
  };
  // Load for many blocks at once, up to read_depth reads in flight; one status per request, in
  // order, each as Load would answer it.
  std::vector<absl::Status> LoadMany(absl::Span<const LoadRequest> requests);

  // Forgets the record (its slot is reused; until then a restart may index it again, which is
  // harmless: loads verify). NOT_FOUND when there is none.
  absl::Status Erase(const Hash128& hash);

  // The identities of the records indexed now, in slot order: after Open, what a restart
  // restored.
  std::vector<BlockRecordIdentity> Records() const;

  // Waits until no accepted record is still queued (each is durable or dropped) and on_change
  // has heard of it; stores that keep arriving are waited for too. For tests, benches and shutdown;
  // a mover never needs it.
  void Flush();

  DiskTierStats stats() const;
  // Sealed: loads whose record did not open, by the tenant that asked.
  const TenantCounters& open_failures() const;
  bool sealed() const;
  // Index, LRU, free slots and queue agree. O(slots). For tests.
  absl::Status CheckInvariants() const;
  // False when the file system refused O_DIRECT (tmpfs before Linux 6.6) and the tier uses
  // buffered I/O.
  bool direct_io() const;
  // What does the I/O; with DiskTierOptions::Io::kAuto, io_uring unless the kernel refused it.
  IoBackend io_backend() const;
  uint64_t slot_bytes() const;
  // Reads LoadMany keeps in flight (DiskTierOptions::read_depth).
  uint32_t read_depth() const;
  // Byte offset of slot i in the file. A new file fills slots 0, 1, 2, ... in that order.
  uint64_t SlotOffset(uint64_t slot) const { return slot * slot_bytes(); }

  class Impl;

 private:
  explicit DiskTier(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvcache

#endif  // KVCACHE_TIERS_DISK_TIER_H_
