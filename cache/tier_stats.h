// The lower tiers' figures, computed once in the core. Each tier has its own detailed figures
// (PoolHostTierStats, PoolDiskTierStats, PoolClusterTierStats: the store's own counters and what
// the pool counted of it), and one row of the same shape for every tier (TierStatsRow), which is
// what GetStats and /metrics report, field for field, so they cannot disagree.
#ifndef KVCACHE_CACHE_TIER_STATS_H_
#define KVCACHE_CACHE_TIER_STATS_H_

#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/string_view.h"
#include "redis/redis_cluster.h"
#include "tiers/cluster_tier.h"
#include "tiers/disk_tier.h"
#include "tiers/host_tier.h"

namespace kvcache {

// A pool's tier 2, pool-wide (tenant stats carry the same figures).
struct PoolHostTierStats {
  uint64_t hit_blocks = 0;        // blocks loaded into tier 1 and returned as cached
  uint64_t offloaded_blocks = 0;  // blocks the mover stored
  // Blocks a request stored on evicting them, the mover not having reached them (a request
  // larger than the offload window, or a mover behind).
  uint64_t passed_down_on_eviction = 0;
  uint64_t load_failures = 0;       // matched records that failed their load (gone, corrupt)
  uint64_t deadline_blocks = 0;     // matched records left to compute by max_load_ms
  uint64_t evicted_from_above = 0;  // tier-1 evictions whose victim was already in tier 2
  // Tier-1 evictions of a published block no lower tier had taken (every slot being read, a
  // device fault): a block lost on the way down.
  uint64_t evicted_unsaved = 0;
  uint64_t request_waits = 0;  // requests that waited for a mover batch's pinned blocks
  HostTierCounters store;      // the store's own counters
};

// A pool's tier 3, pool-wide.
struct PoolDiskTierStats {
  uint64_t hit_blocks = 0;       // blocks loaded into tier 1 and returned as cached
  uint64_t load_failures = 0;    // matched records that failed their load (gone, corrupt, I/O)
  uint64_t deadline_blocks = 0;  // matched records left to compute by max_load_ms
  // Tier-2 records passed down (stores accepted): by the mover ahead of their eviction, or on it.
  uint64_t demoted_blocks = 0;
  uint64_t evicted_from_above = 0;  // tier-2 evictions whose record was already on disk
  // Tier-2 evictions of an admitted record the disk had not taken and refused to take then (its
  // queue full, or stopped): a record lost on the way down.
  uint64_t evicted_unsaved = 0;
  DiskTierStats store;  // the store's own counters
};

// A pool's cluster tier, pool-wide.
struct PoolClusterTierStats {
  uint64_t hit_blocks = 0;     // blocks loaded into tier 1 and returned as cached
  uint64_t stored_blocks = 0;  // blocks the mover wrote to the cluster
  // Blocks requests passed down on evicting them whose copies the mover could not send: its
  // backlog was full (LowerTiers::kClusterBacklogBytes).
  uint64_t backlog_dropped = 0;
  // Copies without every part not sent because the cluster held the block with no fewer parts
  // (DESIGN §13: a poorer copy never overwrites a richer one).
  uint64_t poorer_kept_back = 0;
  ClusterTierCounters store;   // the store's own counters (misses by kind)
  RedisClusterCounters redis;  // its client's: node failures, redirects, reconnects
};

// One lower tier's figures in the shape every tier shares; a figure a tier does not have is 0.
struct TierStatsRow {
  absl::string_view tier;  // "host", "disk" or "cluster"
  // Blocks loaded into tier 1, verified, and returned as cached.
  uint64_t hit_blocks = 0;
  // Records the tier took: host, stored; disk, written and durable; cluster, acknowledged.
  uint64_t stored_blocks = 0;
  // Copies the tier did not take, each a block that is not below: host, every slot being read;
  // disk, its write queue full or its writer stopped after an error; cluster, a node down, slow
  // or refusing.
  uint64_t store_failures = 0;
  // Records the tier dropped to make room (its back-pressure; the cluster evicts unseen: 0).
  uint64_t evicted_blocks = 0;
  // Evictions from the tier above whose block this tier already held (saved from recompute).
  uint64_t evicted_from_above = 0;
  // Evictions from the tier above whose block never reached this tier: lost on the way down
  // because this tier refused it (host, every slot being read or a device fault; disk, its queue
  // full or its writer stopped; cluster, the mover's backlog full). Never because a batch was
  // large: the evicting request passes its victims down.
  uint64_t lost_from_above = 0;
  // Host, disk: records replaced by a copy of the same block with more parts (a page whose other
  // parts were stored later), in place, never announced as removed.
  uint64_t superseded = 0;
  // Cluster: copies lacking some parts not sent because the cluster held the block with no fewer
  // (a poorer copy never overwrites a richer one).
  uint64_t poorer_kept_back = 0;
  // Loads whose bytes failed their checksum (dropped; recomputed).
  uint64_t verify_failures = 0;
  // Sealed disk and cluster tiers (--tier_key_file): records that did not open for the tenant
  // asking — another tenant's, changed, moved, or sealed with a key no longer in the key file —
  // each a miss. Pool-wide in a pool's row; a tenant's own in its share (Pool::Stats(tenant)).
  uint64_t open_failures = 0;
  // Matched records that did not load: host and disk, runs an open could not finish (verify
  // failures, records that did not open, records gone, I/O); cluster, corrupt + foreign +
  // mismatched + unavailable + unopened values.
  uint64_t load_failures = 0;
  // Matched records left to compute because the request's max_load_ms passed.
  uint64_t deadline_blocks = 0;
  // Host: requests that waited for blocks the mover was copying down (a pool nearly full).
  uint64_t request_waits = 0;
  uint64_t records = 0;         // host, disk: records held now
  uint64_t bytes_used = 0;      // host, disk: records' bytes (disk: whole slots)
  uint64_t capacity_bytes = 0;  // host, disk
  // Disk: what the daemon found in the tier's file when it started (a warm restart) — records
  // indexed, and slots skipped as torn, foreign, of an older format, superseded, sealed and not
  // opening with the key file, or of the other sealing; and failed writes (after one the tier
  // stops storing).
  uint64_t restored_records = 0;
  uint64_t restore_skipped = 0;
  uint64_t write_errors = 0;
  // Cluster: Redis nodes found down, slow or hung and rested (each opens the node's breaker),
  // commands skipped because their node was resting (its blocks misses, its copies not taken),
  // and MOVED/ASK replies followed.
  uint64_t node_failures = 0;
  uint64_t skipped_commands = 0;
  uint64_t redirects = 0;
};

// The rows of the tiers a pool has, top down: host, disk, cluster.
std::vector<TierStatsRow> TierStatsRows(const std::optional<PoolHostTierStats>& host,
                                        const std::optional<PoolDiskTierStats>& disk,
                                        const std::optional<PoolClusterTierStats>& cluster);

}  // namespace kvcache

#endif  // KVCACHE_CACHE_TIER_STATS_H_
