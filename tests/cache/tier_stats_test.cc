#include "cache/tier_stats.h"

#include <gtest/gtest.h>

namespace kvcache {
namespace {

TEST(TierStatsRowsTest, NoTiersNoRows) {
  EXPECT_TRUE(TierStatsRows(std::nullopt, std::nullopt, std::nullopt).empty());
}

TEST(TierStatsRowsTest, HostRowTakesTheStoreAndThePoolFigures) {
  PoolHostTierStats host{.hit_blocks = 1,
                         .offloaded_blocks = 2,
                         .load_failures = 3,
                         .deadline_blocks = 4,
                         .evicted_from_above = 5,
                         .evicted_unsaved = 14,
                         .request_waits = 6};
  host.store = HostTierCounters{.stored = 7,
                                .evicted = 8,
                                .verify_failures = 9,
                                .store_rejections = 10,
                                .superseded = 15,
                                .records = 11,
                                .bytes_used = 12,
                                .capacity_bytes = 13};
  const std::vector<TierStatsRow> rows = TierStatsRows(host, std::nullopt, std::nullopt);
  ASSERT_EQ(rows.size(), 1u);
  const TierStatsRow& row = rows[0];
  EXPECT_EQ(row.tier, "host");
  EXPECT_EQ(row.hit_blocks, 1u);
  EXPECT_EQ(row.load_failures, 3u);
  EXPECT_EQ(row.deadline_blocks, 4u);
  EXPECT_EQ(row.evicted_from_above, 5u);
  EXPECT_EQ(row.request_waits, 6u);
  EXPECT_EQ(row.stored_blocks, 7u);
  EXPECT_EQ(row.evicted_blocks, 8u);
  EXPECT_EQ(row.verify_failures, 9u);
  EXPECT_EQ(row.store_failures, 10u);
  EXPECT_EQ(row.records, 11u);
  EXPECT_EQ(row.bytes_used, 12u);
  EXPECT_EQ(row.capacity_bytes, 13u);
  EXPECT_EQ(row.lost_from_above, 14u);
  EXPECT_EQ(row.superseded, 15u);
  EXPECT_EQ(row.poorer_kept_back, 0u);
}

// The disk's refusals (queue full, writer stopped) are store failures, as for the other tiers.
TEST(TierStatsRowsTest, DiskRowCountsRefusalsAsStoreFailures) {
  PoolDiskTierStats disk{.hit_blocks = 1, .load_failures = 2, .deadline_blocks = 3};
  disk.evicted_from_above = 4;
  disk.evicted_unsaved = 11;
  disk.store.slots = 10;
  disk.store.slot_bytes = 4096;
  disk.store.records = 6;
  disk.store.stores_durable = 20;
  disk.store.stores_refused_full = 5;
  disk.store.stores_refused_stopped = 7;
  disk.store.evictions = 8;
  disk.store.load_corrupt = 9;
  disk.store.write_errors = 1;
  disk.store.restart_records = 30;
  disk.store.restart_torn = 1;
  disk.store.restart_foreign = 2;
  disk.store.restart_old_format = 3;
  disk.store.restart_duplicates = 4;
  disk.store.superseded = 13;
  const std::vector<TierStatsRow> rows = TierStatsRows(std::nullopt, disk, std::nullopt);
  ASSERT_EQ(rows.size(), 1u);
  const TierStatsRow& row = rows[0];
  EXPECT_EQ(row.tier, "disk");
  EXPECT_EQ(row.hit_blocks, 1u);
  EXPECT_EQ(row.load_failures, 2u);
  EXPECT_EQ(row.deadline_blocks, 3u);
  EXPECT_EQ(row.evicted_from_above, 4u);
  EXPECT_EQ(row.stored_blocks, 20u);
  EXPECT_EQ(row.store_failures, 12u);
  EXPECT_EQ(row.evicted_blocks, 8u);
  EXPECT_EQ(row.verify_failures, 9u);
  EXPECT_EQ(row.records, 6u);
  EXPECT_EQ(row.bytes_used, 6u * 4096);
  EXPECT_EQ(row.capacity_bytes, 10u * 4096);
  EXPECT_EQ(row.write_errors, 1u);
  EXPECT_EQ(row.restored_records, 30u);
  EXPECT_EQ(row.restore_skipped, 10u);
  EXPECT_EQ(row.lost_from_above, 11u);
  EXPECT_EQ(row.superseded, 13u);
}

TEST(TierStatsRowsTest, ClusterRowSumsItsMissesByKind) {
  PoolClusterTierStats cluster{
      .hit_blocks = 1, .stored_blocks = 2, .backlog_dropped = 12, .poorer_kept_back = 13};
  cluster.store = ClusterTierCounters{.stored = 99,
                                      .store_failures = 3,
                                      .absent = 50,
                                      .unavailable = 4,
                                      .past_deadline = 5,
                                      .foreign = 6,
                                      .mismatched = 7,
                                      .corrupt = 8};
  cluster.redis.node_failures = 9;
  cluster.redis.skipped = 12;
  cluster.redis.moved = 10;
  cluster.redis.ask = 11;
  const std::vector<TierStatsRow> rows = TierStatsRows(std::nullopt, std::nullopt, cluster);
  ASSERT_EQ(rows.size(), 1u);
  const TierStatsRow& row = rows[0];
  EXPECT_EQ(row.tier, "cluster");
  EXPECT_EQ(row.hit_blocks, 1u);
  EXPECT_EQ(row.stored_blocks, 2u);  // the pool's count of what it wrote
  EXPECT_EQ(row.store_failures, 3u);
  EXPECT_EQ(row.lost_from_above, 12u);  // the pass-downs the mover's backlog had no room for
  EXPECT_EQ(row.verify_failures, 8u);
  EXPECT_EQ(row.load_failures, 8u + 6 + 7 + 4);  // absent is a plain miss, not a failure
  EXPECT_EQ(row.deadline_blocks, 5u);
  EXPECT_EQ(row.node_failures, 9u);
  EXPECT_EQ(row.skipped_commands, 12u);
  EXPECT_EQ(row.redirects, 21u);
  EXPECT_EQ(row.evicted_blocks, 0u);
  EXPECT_EQ(row.poorer_kept_back, 13u);
  EXPECT_EQ(row.superseded, 0u);
}

TEST(TierStatsRowsTest, RowsComeTopDown) {
  const std::vector<TierStatsRow> rows =
      TierStatsRows(PoolHostTierStats{}, PoolDiskTierStats{}, PoolClusterTierStats{});
  ASSERT_EQ(rows.size(), 3u);
  EXPECT_EQ(rows[0].tier, "host");
  EXPECT_EQ(rows[1].tier, "disk");
  EXPECT_EQ(rows[2].tier, "cluster");
}

}  // namespace
}  // namespace kvcache
