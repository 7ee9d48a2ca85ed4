#include "cache/tier_stats.h"

namespace kvcache {

std::vector<TierStatsRow> TierStatsRows(const std::optional<PoolHostTierStats>& host,
                                        const std::optional<PoolDiskTierStats>& disk,
                                        const std::optional<PoolClusterTierStats>& cluster) {
  std::vector<TierStatsRow> rows;
  if (host.has_value()) {
    const HostTierCounters& store = host->store;
    rows.push_back(TierStatsRow{.tier = "host",
                                .hit_blocks = host->hit_blocks,
                                .stored_blocks = store.stored,
                                .store_failures = store.store_rejections,
                                .evicted_blocks = store.evicted,
                                .evicted_from_above = host->evicted_from_above,
                                .lost_from_above = host->evicted_unsaved,
                                .superseded = store.superseded,
                                .verify_failures = store.verify_failures,
                                .load_failures = host->load_failures,
                                .deadline_blocks = host->deadline_blocks,
                                .request_waits = host->request_waits,
                                .records = store.records,
                                .bytes_used = store.bytes_used,
                                .capacity_bytes = store.capacity_bytes});
  }
  if (disk.has_value()) {
    const DiskTierStats& store = disk->store;
    rows.push_back(
        TierStatsRow{.tier = "disk",
                     .hit_blocks = disk->hit_blocks,
                     .stored_blocks = store.stores_durable,
                     .store_failures = store.stores_refused_full + store.stores_refused_stopped,
                     .evicted_blocks = store.evictions,
                     .evicted_from_above = disk->evicted_from_above,
                     .lost_from_above = disk->evicted_unsaved,
                     .superseded = store.superseded,
                     .verify_failures = store.load_corrupt,
                     .open_failures = store.load_unopened,
                     .load_failures = disk->load_failures,
                     .deadline_blocks = disk->deadline_blocks,
                     .records = store.records,
                     .bytes_used = store.records * store.slot_bytes,
                     .capacity_bytes = store.slots * store.slot_bytes,
                     .restored_records = store.restart_records,
                     .restore_skipped = store.restart_torn + store.restart_foreign +
                                        store.restart_old_format + store.restart_duplicates +
                                        store.restart_unopened + store.restart_other_sealing,
                     .write_errors = store.write_errors});
  }
  if (cluster.has_value()) {
    const ClusterTierCounters& store = cluster->store;
    rows.push_back(TierStatsRow{.tier = "cluster",
                                .hit_blocks = cluster->hit_blocks,
                                .stored_blocks = cluster->stored_blocks,
                                .store_failures = store.store_failures,
                                .lost_from_above = cluster->backlog_dropped,
                                .poorer_kept_back = cluster->poorer_kept_back,
                                .verify_failures = store.corrupt,
                                .open_failures = store.unopened,
                                .load_failures = store.corrupt + store.foreign + store.mismatched +
                                                 store.unavailable + store.unopened,
                                .deadline_blocks = store.past_deadline,
                                .node_failures = cluster->redis.node_failures,
                                .skipped_commands = cluster->redis.skipped,
                                .redirects = cluster->redis.moved + cluster->redis.ask});
  }
  return rows;
}

}  // namespace kvcache
