// ClusterTier: the tier below a node's own (DESIGN §10): block records in a Redis
// Cluster (redis/redis_cluster.h) that every node's daemon reads and writes, so a prefix computed
// on one node is a hit on every other. The cluster is a cache: a missing, evicted, foreign,
// truncated or corrupted value is a miss, counted, never an error to a client and never bytes.
//
// Keys: "kvc2:{H}" (2: record format 2) where H is XXH3-128 (hex) of the block's full identity:
// the pool's model id, layout fingerprint (shape and dtype), hash algorithm and block bytes, the
// namespace digest (tenant root with cache salt), the chain hash and the prefix digest. Tenants
// and models never share a key, so they never share a block through the cluster either, and two
// prefixes whose chain hashes collide do not overwrite each other; each load still checks the
// value's header (tiers/record_codec.h) against the request: pool identity, chain and parent
// hash, namespace, extra keys, tokens, prefix digest, and the bytes' checksum.
//
// Sealed (ClusterTierOptions::keyring set, tiers/record_seal.h): a value is the sealed head in
// place of the header, then the block's bytes encrypted under the tenant's key
// (BlockRecordIdentity::tenant), split the same way; and its key is "kvcs1:{D}", D the first 16
// bytes of HMAC-SHA-256 over the same identity under the tenant's name key, so that neither the
// values nor their names tell whoever reads the cluster anything, and a guessed prompt cannot be
// confirmed by its name. A load opens the head with the key of the tenant asking: a value
// sealed for another tenant, moved under another name, of another pool or changed anywhere does
// not open — a miss, counted per tenant (open_failures()). The names of a rotated key's records
// are those of its key: a load that finds nothing under the newest key's name asks under the
// older keys' names (one more round trip, only while the key file lists more than one key).
// Sealed and unsealed daemons sharing a cluster never see each other's values (other names).
//
// Values: the record header, then the block's bytes. Redis allocates values in jemalloc size
// classes (four per doubling), so a value just over a class — a 32 KiB block plus its header —
// would take 25% more memory than it holds, and maxmemory would evict that much early. With
// `fit_size_classes` a record whose header and bytes do not fit a class is split in two values
// under one hash tag (one slot, one node, one round trip): "kvc2:{H}" holding the header and as
// many bytes as fill a class (less Redis' own overhead), and "kvc2:{H}:t" the rest. The two are
// written tail first in the same pipeline (one connection, which Redis applies in order), and a
// head taken while its tail was refused is deleted again; a reader that finds one without the
// other, or halves of two different writes, fails the checksum: a miss.
//
// Superseding (DESIGN §13): a record's name does not depend on its parts (its extras digest's
// part mask), so a Store of the same block with more parts overwrites the value with fewer. A
// store cannot tell whether it overwrites a richer value; its caller asks StoredExtras first
// (the pool's mover does, for copies without every part) and sends only copies with more parts
// than what the cluster holds. Two nodes storing one block at once may still race: the last SET
// wins, and either value is a whole record with a mask true to its bytes.
//
// Thread safety: thread-safe (RedisCluster is; the counters are atomic).
#ifndef KVCACHE_TIERS_CLUSTER_TIER_H_
#define KVCACHE_TIERS_CLUSTER_TIER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/task_workers.h"
#include "redis/redis_cluster.h"
#include "tiers/block_record.h"
#include "tiers/record_seal.h"
#include "tiers/tenant_counters.h"
#include "tiers/tier_keyring.h"

namespace kvcache {

struct ClusterTierOptions {
  RedisClusterOptions redis;
  PoolIdentity pool;
  uint32_t tokens_per_block = 16;
  bool fit_size_classes = true;
  // Set: values are sealed and named with the keyring's keys (see the header comment).
  std::shared_ptr<const TierKeyring> keyring;
  // Sealed: the threads that seal stored values and open loaded ones beside the thread talking to
  // Redis (may be null: on that thread). Shared; must outlive the tier.
  std::shared_ptr<TaskWorkers> seal_workers;
};

struct ClusterTierCounters {
  uint64_t stored = 0;          // records written (both values acknowledged)
  uint64_t store_failures = 0;  // records a node refused or did not acknowledge
  uint64_t loaded = 0;          // records read and verified
  uint64_t absent = 0;          // loads that found no value (never stored, or evicted)
  uint64_t unavailable = 0;     // loads whose node was down or slow
  uint64_t past_deadline = 0;   // loads cut by the request's deadline (max_load_ms)
  uint64_t foreign = 0;         // a value of another pool identity or record format under the key
  uint64_t mismatched = 0;      // a value of another block (a key collision) under the key
  uint64_t corrupt = 0;         // a torn, truncated or garbled value, or bytes failing the checksum
  // Sealed: values under the record's name that did not open for the tenant asking (another
  // tenant's, moved, changed, or sealed with a key no longer in the key file).
  uint64_t unopened = 0;
};

// The largest jemalloc size class (4 per doubling above 128 bytes) that is at most `bytes`.
uint64_t SizeClassAtMost(uint64_t bytes);

class ClusterTier {
 public:
  // INVALID_ARGUMENT for bad Redis options or a pool identity without block bytes.
  static absl::StatusOr<std::unique_ptr<ClusterTier>> Create(ClusterTierOptions options);

  const PoolIdentity& pool() const { return options_.pool; }
  RedisCluster& redis() { return *redis_; }

  // The key of the record's first value: "kvc2:{H}", or sealed "kvcs1:{D}" under the newest key
  // (empty if OpenSSL fails, which it does not).
  std::string KeyOf(const BlockRecordIdentity& identity) const;
  bool sealed() const { return sealer_.has_value(); }
  // Sealed: loads and probes whose value did not open, by the tenant that asked.
  const TenantCounters& open_failures() const { return open_failures_; }
  // How many of a record's bytes go into its first value (all of them unless it is split).
  uint64_t HeadDataBytes() const { return head_data_bytes_; }

  struct Record {
    BlockRecordIdentity identity;  // checksum: BlockChecksum of `bytes`
    absl::string_view bytes;       // block_bytes
  };
  // Writes each record; per record OK, UNAVAILABLE (its node is down or slow) or INTERNAL (the
  // node refused, e.g. out of memory under noeviction).
  std::vector<absl::Status> Store(absl::Span<const Record> records);

  // Reads the records `expected` names, a chain in order, and copies each verified one's bytes
  // into out[i] (block_bytes each); stops at the first that does not verify. Returns how many
  // leading records were loaded; out[i] past that holds nothing to use. What has not come back
  // by `deadline` (a request's max_load_ms) is a miss (`past_deadline`); a node that said nothing
  // at all by then is rested like a failed one, so the loads that follow skip it (`unavailable`)
  // instead of each waiting out its deadline on it. `found_extras`, when given, receives each
  // loaded record's extras digest: a page's part mask, which a request expecting kAnyPartMask
  // learns here.
  size_t LoadPrefix(absl::Span<const BlockRecordIdentity> expected, absl::Span<uint8_t* const> out,
                    absl::Time deadline = absl::InfiniteFuture(),
                    std::vector<uint64_t>* found_extras = nullptr);

  // For lookups that load nothing (pages' Exists, DESIGN §13): the extras digests of the leading
  // records of `expected` the cluster holds under a matching identity, their headers checked
  // (their bytes are verified when a load brings them up). One pipelined read of the records'
  // heads; what has not come back by `deadline` ends the prefix.
  std::vector<uint64_t> ProbePrefix(absl::Span<const BlockRecordIdentity> expected,
                                    absl::Time deadline);

  // For each of `records`, the extras digest (part mask) of the value a Store would overwrite —
  // under its name of the newest key — when that value is the same block's (its head checked as
  // ProbePrefix checks it; any parts); nullopt when there is none, it is another's or did not
  // come back by `deadline`. One pipelined read of the heads.
  std::vector<std::optional<uint64_t>> StoredExtras(absl::Span<const BlockRecordIdentity> records,
                                                    absl::Time deadline);

  ClusterTierCounters counters() const;

 private:
  // Why a record's value did not load.
  // kArrived: a sealed head of the right size, in, its opening left to the seal workers.
  enum class Found : uint8_t {
    kNothing,
    kArrived,
    kGood,
    kCorrupt,
    kForeign,
    kOtherBlock,
    kUnopened
  };
  // What one pass of pipelined GETs under one key's names loaded, and why it stopped.
  struct Run {
    size_t loaded = 0;
    absl::Status status;  // the stopping record's GET
    Found found = Found::kNothing;
  };

  ClusterTier(ClusterTierOptions options, std::unique_ptr<RedisCluster> redis);
  std::string TailKeyOf(const std::string& key) const { return key + ":t"; }
  // The key ids whose names a load tries, newest first: {0} when unsealed (one name).
  std::vector<uint32_t> KeyIds() const;
  // The record's first key under master key `key_id` (ignored when unsealed).
  absl::StatusOr<std::string> NameOf(const BlockRecordIdentity& identity, uint32_t key_id) const;
  // LoadPrefix under the names of `key_id`: the leading records it loaded.
  Run LoadRun(uint32_t key_id, absl::Span<const BlockRecordIdentity> expected,
              absl::Span<uint8_t* const> out, absl::Time deadline,
              std::vector<uint64_t>* found_extras);
  // ProbePrefix under the names of `key_id`; `stopped_absent`: it stopped at a record with no
  // value under that name.
  std::vector<uint64_t> ProbeRun(uint32_t key_id, absl::Span<const BlockRecordIdentity> expected,
                                 absl::Time deadline, bool* stopped_absent);
  // The heads of `expected` under the names of `key_id`, read in one pipeline: per record its
  // GET's status, its verdict and, when kGood, its extras digest (fewer entries when a name could
  // not be made: the records from there on).
  struct Heads {
    std::vector<absl::Status> results;
    std::vector<Found> verdicts;
    std::vector<std::optional<uint64_t>> extras;
  };
  Heads ReadHeads(uint32_t key_id, absl::Span<const BlockRecordIdentity> expected,
                  absl::Time deadline);
  // A head value's verdict; on kGood its header (and, sealed, what its body needs) in `opened`.
  // `with_data` false: `value` is the head's header alone (its data copied out already).
  Found CheckHead(absl::string_view value, const BlockRecordIdentity& expected, OpenedHead* opened,
                  bool with_data = true) const;
  // Counts a load that stopped short.
  void CountMiss(const Run& run, const BlockRecordIdentity& stopped_at);

  const ClusterTierOptions options_;
  const std::unique_ptr<RedisCluster> redis_;
  const std::optional<RecordSealer> sealer_;  // set: values are sealed
  const uint64_t header_bytes_;               // the (sealed) header's share of a head value
  const uint64_t head_data_bytes_;

  std::atomic<uint64_t> stored_{0};
  std::atomic<uint64_t> store_failures_{0};
  std::atomic<uint64_t> loaded_{0};
  std::atomic<uint64_t> absent_{0};
  std::atomic<uint64_t> unavailable_{0};
  std::atomic<uint64_t> past_deadline_{0};
  std::atomic<uint64_t> foreign_{0};
  std::atomic<uint64_t> mismatched_{0};
  std::atomic<uint64_t> corrupt_{0};
  std::atomic<uint64_t> unopened_{0};
  TenantCounters open_failures_;  // own synchronization

  // Sealed values' buffers (a record's head and tail, header_bytes_ + block_bytes), kept from one
  // Store for the next: a fresh one per record had its pages faulted in anew each batch.
  std::unique_ptr<char[]> TakeSealBuffer();
  void KeepSealBuffers(std::vector<std::unique_ptr<char[]>> buffers);
  absl::Mutex spare_mu_;
  std::vector<std::unique_ptr<char[]>> spare_seal_buffers_ ABSL_GUARDED_BY(spare_mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_TIERS_CLUSTER_TIER_H_
