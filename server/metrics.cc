#include "server/metrics.h"

#include <initializer_list>
#include <map>
#include <string>
#include <utility>

#include "server/process_metrics.h"

namespace kvcache {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;
using Labels = std::vector<ClientMetric::Label>;

// Families in the order they are declared, each added to as the sources are read.
class Exposition {
 public:
  // Declares a family; `Add*` then name it by the index returned.
  size_t Family(std::string name, std::string help, MetricType type) {
    families_.push_back(
        MetricFamily{.name = std::move(name), .help = std::move(help), .type = type, .metric = {}});
    return families_.size() - 1;
  }
  void Counter(size_t family, Labels labels, double value) {
    ClientMetric metric;
    metric.label = std::move(labels);
    metric.counter.value = value;
    families_[family].metric.push_back(std::move(metric));
  }
  void Gauge(size_t family, Labels labels, double value) {
    ClientMetric metric;
    metric.label = std::move(labels);
    metric.gauge.value = value;
    families_[family].metric.push_back(std::move(metric));
  }
  void Histogram(size_t family, Labels labels, const HistogramSnapshot& snapshot) {
    ClientMetric metric;
    metric.label = std::move(labels);
    metric.histogram.sample_count = snapshot.count;
    metric.histogram.sample_sum = snapshot.sum;
    for (size_t i = 0; i < snapshot.upper_bounds.size(); ++i) {
      metric.histogram.bucket.push_back(
          ClientMetric::Bucket{.cumulative_count = snapshot.cumulative_counts[i],
                               .upper_bound = snapshot.upper_bounds[i]});
    }
    families_[family].metric.push_back(std::move(metric));
  }
  // Families with no sample are left out: the text format wants none empty.
  std::vector<MetricFamily> Take() {
    std::vector<MetricFamily> families;
    for (MetricFamily& family : families_) {
      if (!family.metric.empty()) families.push_back(std::move(family));
    }
    return families;
  }

 private:
  std::vector<MetricFamily> families_;
};

Labels PoolTenant(const std::string& pool, const std::string& tenant) {
  return {{"pool", pool}, {"tenant", tenant}};
}

constexpr MetricType kCounter = MetricType::Counter;
constexpr MetricType kGauge = MetricType::Gauge;
constexpr MetricType kHistogram = MetricType::Histogram;

// Pools, whole and per tenant: tokens, blocks, residency, transfers, pages by namespace.
void AddPools(Exposition& out, CacheManager& manager) {
  const size_t queries = out.Family(
      "kvcache_prefix_cache_queries_total",
      "Prompt tokens asked for by OpenSequence (vLLM's prefix_cache_queries).", kCounter);
  const size_t hits = out.Family(
      "kvcache_prefix_cache_hits_total",
      "Of those, tokens served from the cache: prefill saved (vLLM's prefix_cache_hits).",
      kCounter);
  const size_t blocks = out.Family(
      "kvcache_blocks",
      "Blocks by state: free, evictable (unreferenced, still cached), referenced.", kGauge);
  const size_t capacity = out.Family("kvcache_blocks_capacity", "Blocks in the pool.", kGauge);
  const size_t usage = out.Family(
      "kvcache_usage_ratio",
      "Referenced blocks over capacity, 0 to 1 (vLLM's kv_cache_usage_perc): evictable blocks "
      "count as free, since any allocation may take them.",
      kGauge);
  const size_t referenced = out.Family("kvcache_tenant_referenced_blocks",
                                       "Blocks held by the tenant's sequences.", kGauge);
  const size_t sequences =
      out.Family("kvcache_open_sequences", "Sequences open in the pool.", kGauge);
  const size_t hit_blocks =
      out.Family("kvcache_hit_blocks_total", "Blocks served from the cache on open.", kCounter);
  const size_t miss_blocks =
      out.Family("kvcache_miss_blocks_total", "Blocks freshly allocated on open.", kCounter);
  const size_t evicted = out.Family(
      "kvcache_evicted_blocks_total",
      "Cached blocks evicted to make room (their hashes leave the index), by owning tenant.",
      kCounter);
  const size_t resurrected = out.Family(
      "kvcache_resurrected_blocks_total",
      "Of the hit blocks, those found soft-freed (evictable): KV brought back before it was "
      "reused.",
      kCounter);
  const size_t published =
      out.Family("kvcache_published_blocks_total", "Blocks added to the prefix index.", kCounter);
  const size_t duplicates = out.Family(
      "kvcache_duplicate_blocks_total",
      "Committed blocks whose hash was already indexed (computed twice; kept private).", kCounter);
  const size_t lifetime = out.Family(
      "kvcache_block_lifetime_seconds",
      "Time from a block's allocation to its eviction (vLLM's kv_block_lifetime_seconds).",
      kHistogram);
  const size_t idle = out.Family(
      "kvcache_block_idle_before_evict_seconds",
      "Time from a block's last release to its eviction: how long soft-freed KV survives.",
      kHistogram);
  const size_t reuse =
      out.Family("kvcache_block_reuse_gap_seconds",
                 "Time between consecutive accesses (allocation or hit) of a block when it is hit.",
                 kHistogram);
  const size_t bytes = out.Family(
      "kvcache_transfer_bytes_total",
      "Block bytes received by PutBlocks (direction put) and sent by GetBlocks (get).", kCounter);
  const size_t failures = out.Family(
      "kvcache_transfer_failures_total",
      "PutBlocks and GetBlocks streams that ended with an error or were cut off.", kCounter);
  const size_t pages = out.Family(
      "kvcache_pages_total",
      "Pages named by engine keys, per namespace (tenant, and manifest: the first 16 hex digits "
      "of its digest, \"other\" past a tenant's 8th in the pool), by op: exists (found by "
      "ExistsPages), hit and miss (served or not by AcquirePages and GetPages), published and "
      "duplicate (by CommitPages and PutPages).",
      kCounter);
  for (const Pool* pool : manager.pools()) {
    const std::string& name = pool->options().name;
    for (const PageCounters::Row& row : pool->page_counters().Rows()) {
      for (size_t op = 0; op < kNumPageOps; ++op) {
        out.Counter(pages,
                    {{"pool", name},
                     {"tenant", row.tenant},
                     {"manifest", row.manifest},
                     {"op", std::string(PageOpName(static_cast<PageOp>(op)))}},
                    row.pages[op]);
      }
    }
    const PoolStatsSnapshot whole = pool->Stats();
    const double total = pool->options().num_blocks;
    out.Gauge(blocks, {{"pool", name}, {"state", "free"}}, whole.free);
    out.Gauge(blocks, {{"pool", name}, {"state", "evictable"}}, whole.evictable);
    out.Gauge(blocks, {{"pool", name}, {"state", "referenced"}}, whole.referenced);
    out.Gauge(capacity, {{"pool", name}}, total);
    out.Gauge(usage, {{"pool", name}}, total == 0 ? 0 : whole.referenced / total);
    for (const std::string& tenant : pool->Tenants()) {
      const PoolStatsSnapshot share = pool->Stats(tenant);
      out.Counter(queries, PoolTenant(name, tenant), share.prompt_tokens);
      out.Counter(hits, PoolTenant(name, tenant), share.hit_tokens);
      out.Gauge(referenced, PoolTenant(name, tenant), share.referenced);
      out.Gauge(sequences, PoolTenant(name, tenant), share.open_sequences);
      out.Counter(hit_blocks, PoolTenant(name, tenant), share.hit_blocks);
      out.Counter(miss_blocks, PoolTenant(name, tenant), share.miss_blocks);
      out.Counter(evicted, PoolTenant(name, tenant), share.pool.evictions);
      out.Counter(resurrected, PoolTenant(name, tenant), share.pool.resurrections);
      out.Counter(published, PoolTenant(name, tenant), share.pool.published);
      out.Counter(duplicates, PoolTenant(name, tenant), share.pool.duplicates);
    }
    const PoolResidency residency = pool->Residency();
    out.Histogram(lifetime, {{"pool", name}}, residency.lifetime);
    out.Histogram(idle, {{"pool", name}}, residency.idle_before_evict);
    out.Histogram(reuse, {{"pool", name}}, residency.reuse_gap);
    const PoolTransferCounters& transfers = pool->transfers();
    out.Counter(bytes, {{"pool", name}, {"direction", "put"}}, transfers.put_bytes.load());
    out.Counter(bytes, {{"pool", name}, {"direction", "get"}}, transfers.got_bytes.load());
    out.Counter(failures, {{"pool", name}, {"direction", "put"}}, transfers.put_failures.load());
    out.Counter(failures, {{"pool", name}, {"direction", "get"}}, transfers.get_failures.load());
  }
}

// Lower tiers (DESIGN §10), per pool and tier.
void AddLowerTiers(Exposition& out, CacheManager& manager) {
  const size_t tier_hits = out.Family(
      "kvcache_tier_hit_blocks_total",
      "Blocks loaded from a lower tier into the pool, verified, and returned as cached.", kCounter);
  const size_t tier_stored =
      out.Family("kvcache_tier_stored_blocks_total",
                 "Blocks copied into a lower tier ahead of eviction.", kCounter);
  const size_t tier_evicted =
      out.Family("kvcache_tier_evicted_blocks_total",
                 "Records a full lower tier dropped to make room (its back-pressure).", kCounter);
  const size_t tier_rejected =
      out.Family("kvcache_tier_store_rejections_total",
                 "Copies a lower tier did not take (host: every slot being read; disk: its write "
                 "queue full or its writer stopped; cluster: a node down, slow or refusing).",
                 kCounter);
  const size_t tier_saved =
      out.Family("kvcache_tier_saved_evictions_total",
                 "Evictions from the tier above whose block was already in this tier.", kCounter);
  const size_t tier_lost = out.Family(
      "kvcache_tier_lost_evictions_total",
      "Evictions from the tier above whose block never reached this tier (it refused the copy).",
      kCounter);
  const size_t tier_superseded = out.Family(
      "kvcache_tier_superseded_total",
      "Records of a lower tier replaced by a copy of the same block with more parts.", kCounter);
  const size_t tier_kept_back = out.Family(
      "kvcache_tier_poorer_kept_back_total",
      "Copies lacking some parts not sent to the cluster tier, which held the block with no fewer.",
      kCounter);
  const size_t tier_verify = out.Family(
      "kvcache_tier_verify_failures_total",
      "Loads from a lower tier whose bytes failed their checksum (dropped, recomputed).", kCounter);
  const size_t tier_open_failures = out.Family(
      "kvcache_tier_open_failures_total",
      "Records of a sealed lower tier (--tier_key_file) that did not open for the tenant asking "
      "(another tenant's, changed, moved, or sealed with a key no longer in the file): misses.",
      kCounter);
  const size_t tier_load_failures = out.Family(
      "kvcache_tier_load_failures_total",
      "Matched lower-tier records that did not load (verify failures, records gone).", kCounter);
  const size_t tier_deadline = out.Family(
      "kvcache_tier_deadline_blocks_total",
      "Matched lower-tier records left to compute because the request's max_load_ms passed.",
      kCounter);
  const size_t tier_waits = out.Family(
      "kvcache_tier_request_waits_total",
      "Requests that waited for blocks the mover was copying down (a pool nearly full).", kCounter);
  const size_t tier_bytes =
      out.Family("kvcache_tier_used_bytes", "Bytes of records a lower tier holds.", kGauge);
  const size_t tier_capacity =
      out.Family("kvcache_tier_capacity_bytes", "Bytes a lower tier can hold.", kGauge);
  const size_t tier_load = out.Family(
      "kvcache_tier_load_seconds",
      "Time an open spent loading its prefix from a lower tier (the whole verified run), one "
      "sample per open that loaded from the tier.",
      kHistogram);
  const size_t cluster_node_failures = out.Family(
      "kvcache_cluster_tier_node_failures_total",
      "Redis nodes found down, slow or hung by the cluster tier (each then rested: its breaker "
      "opens and its keys are misses until a probe finds it answering).",
      kCounter);
  const size_t cluster_skipped = out.Family(
      "kvcache_cluster_tier_skipped_commands_total",
      "Redis commands the cluster tier did not send because their node was resting after a "
      "failure (each a miss, or a copy not taken).",
      kCounter);
  const size_t cluster_redirects = out.Family(
      "kvcache_cluster_tier_redirects_total",
      "MOVED and ASK replies the cluster tier followed (slots migrating or a stale slot map).",
      kCounter);
  const size_t disk_write_errors = out.Family(
      "kvcache_disk_tier_write_errors_total",
      "Failed writes to a pool's disk tier; after one it stops storing (loads go on).", kCounter);
  const size_t disk_restored = out.Family(
      "kvcache_disk_tier_restored_records",
      "Records a pool's disk tier found in its file when the daemon started (a warm restart).",
      kGauge);
  const size_t disk_skipped = out.Family(
      "kvcache_disk_tier_restore_skipped_records",
      "Slots of the disk tier's file skipped when the daemon started: torn, foreign or superseded.",
      kGauge);
  for (const Pool* pool : manager.pools()) {
    const std::string& name = pool->options().name;
    const PoolStatsSnapshot whole = pool->Stats();
    for (const TierStatsRow& row : whole.tiers) {
      const Labels labels{{"pool", name}, {"tier", std::string(row.tier)}};
      out.Counter(tier_hits, labels, row.hit_blocks);
      out.Counter(tier_stored, labels, row.stored_blocks);
      out.Counter(tier_rejected, labels, row.store_failures);
      out.Counter(tier_verify, labels, row.verify_failures);
      out.Counter(tier_load_failures, labels, row.load_failures);
      out.Counter(tier_deadline, labels, row.deadline_blocks);
      out.Counter(tier_lost, labels, row.lost_from_above);
      out.Counter(tier_superseded, labels, row.superseded);
      out.Counter(tier_kept_back, labels, row.poorer_kept_back);
      if (row.tier == "cluster") {
        // The cluster evicts unseen and holds no count of its own records.
        out.Counter(cluster_node_failures, {{"pool", name}}, row.node_failures);
        out.Counter(cluster_skipped, {{"pool", name}}, row.skipped_commands);
        out.Counter(cluster_redirects, {{"pool", name}}, row.redirects);
        continue;
      }
      out.Counter(tier_evicted, labels, row.evicted_blocks);
      out.Counter(tier_saved, labels, row.evicted_from_above);
      out.Gauge(tier_bytes, labels, row.bytes_used);
      out.Gauge(tier_capacity, labels, row.capacity_bytes);
      if (row.tier == "host") out.Counter(tier_waits, labels, row.request_waits);
      if (row.tier == "disk") {
        out.Counter(disk_write_errors, {{"pool", name}}, row.write_errors);
        out.Gauge(disk_restored, {{"pool", name}}, row.restored_records);
        out.Gauge(disk_skipped, {{"pool", name}}, row.restore_skipped);
      }
    }
    // Sealed tiers, per tenant: every tenant of the pool (0 until one fails), and whoever else
    // a record failed to open for.
    std::map<std::pair<std::string, std::string>, uint64_t> open_failures;
    for (absl::string_view tier : pool->lower_tiers().SealedTiers()) {
      for (const std::string& tenant : pool->Tenants()) open_failures[{std::string(tier), tenant}];
    }
    for (const LowerTiers::TenantOpenFailures& failed :
         pool->lower_tiers().OpenFailuresByTenant()) {
      open_failures[{std::string(failed.tier), failed.tenant}] = failed.count;
    }
    for (const auto& [tier_tenant, count] : open_failures) {
      out.Counter(tier_open_failures,
                  {{"pool", name}, {"tier", tier_tenant.first}, {"tenant", tier_tenant.second}},
                  count);
    }
    const PoolTierLoadLatency& loads = pool->tier_load_latency();
    if (whole.host_tier.has_value()) {
      out.Histogram(tier_load, {{"pool", name}, {"tier", "host"}}, loads.host.Snapshot());
    }
    if (whole.disk_tier.has_value()) {
      out.Histogram(tier_load, {{"pool", name}, {"tier", "disk"}}, loads.disk.Snapshot());
    }
    if (whole.cluster_tier.has_value()) {
      out.Histogram(tier_load, {{"pool", name}, {"tier", "cluster"}}, loads.cluster.Snapshot());
    }
  }
}

void AddSessions(Exposition& out, CacheManager& manager) {
  const size_t open = out.Family("kvcache_sessions_open", "Sessions (leases) open now.", kGauge);
  const size_t opened = out.Family("kvcache_sessions_opened_total", "Sessions opened.", kCounter);
  const size_t closed =
      out.Family("kvcache_sessions_closed_total", "Sessions closed by their client.", kCounter);
  const size_t expired = out.Family(
      "kvcache_sessions_expired_total",
      "Sessions whose lease ran out (a client that died or stopped its keep-alives); their "
      "sequences were released.",
      kCounter);
  for (const auto& [tenant, counts] : manager.sessions().Counters()) {
    out.Gauge(open, {{"tenant", tenant}}, counts.open);
    out.Counter(opened, {{"tenant", tenant}}, counts.opened);
    out.Counter(closed, {{"tenant", tenant}}, counts.closed);
    out.Counter(expired, {{"tenant", tenant}}, counts.expired);
  }
}

void AddRpcs(Exposition& out, RpcMetrics& rpc) {
  const size_t requests = out.Family("kvcache_rpc_requests_total",
                                     "Calls finished, by method and gRPC status code.", kCounter);
  const size_t duration =
      out.Family("kvcache_rpc_duration_seconds",
                 "Time from a call's arrival to its status being sent (streams: their whole life).",
                 kHistogram);
  for (const auto& method : rpc.methods()) {
    uint64_t calls = 0;
    for (int code = 0; code < kNumGrpcCodes; ++code) {
      const uint64_t count = method->calls[code].load(std::memory_order_relaxed);
      if (count == 0) continue;
      calls += count;
      out.Counter(requests, {{"method", method->label}, {"code", GrpcCodeName(code)}}, count);
    }
    if (calls > 0)
      out.Histogram(duration, {{"method", method->label}}, method->duration.Snapshot());
  }
}

}  // namespace

std::vector<MetricFamily> DaemonMetrics::Collect() const {
  Exposition out;
  AddPools(out, *manager_);
  AddLowerTiers(out, *manager_);
  AddSessions(out, *manager_);
  AddRpcs(out, *rpc_);

  // KV events.
  const KvEventLog& events = manager_->events();
  out.Counter(out.Family("kvcache_kv_events_published_total",
                         "KV events appended to the daemon's one sequence (AllBlocksCleared at "
                         "start included); WatchEvents and the ZeroMQ publisher carry them.",
                         kCounter),
              {}, events.next_sequence());
  const size_t dropped = out.Family(
      "kvcache_kv_events_dropped_total",
      "Events a consumer missed because they left the buffer first (a watcher then gets a "
      "snapshot; a ZeroMQ subscriber sees the gap).",
      kCounter);
  const size_t replays = out.Family(
      "kvcache_kv_events_replay_requests_total",
      "Replay requests served (ZeroMQ ROUTER socket) or watches resumed (gRPC).", kCounter);
  for (const auto& [sink, label] :
       {std::pair{KvEventSink::kGrpc, "grpc"}, std::pair{KvEventSink::kZmq, "zmq"}}) {
    out.Counter(dropped, {{"sink", label}}, events.dropped(sink));
    out.Counter(replays, {{"sink", label}}, events.replays(sink));
  }
  out.Counter(out.Family("kvcache_kv_events_snapshots_total",
                         "Index snapshots sent to watchers that could not resume.", kCounter),
              {}, events.snapshots());
  out.Gauge(out.Family("kvcache_kv_events_indexed_blocks",
                       "Blocks in the event log's copy of the prefix index (every pool).", kGauge),
            {}, events.indexed_blocks());
  if (zmq_published_) {
    out.Counter(out.Family("kvcache_kv_events_zmq_messages_total",
                           "Messages sent by the ZeroMQ publisher (one per event).", kCounter),
                {}, zmq_published_());
  }

  if (call_limits_ != nullptr) {
    const CallLimitUsage limits = call_limits_->Usage();
    out.Gauge(out.Family("kvcache_long_calls",
                         "Long calls open now (PutBlocks, GetBlocks, WatchEvents, parked "
                         "AwaitRendezvous), bounded by --max_streams.",
                         kGauge),
              {}, limits.streams);
    out.Gauge(out.Family("kvcache_put_bytes_in_flight",
                         "Bytes of puts not finished yet, bounded by --max_put_bytes.", kGauge),
              {}, static_cast<double>(limits.put_bytes));
    const size_t refused = out.Family(
        "kvcache_calls_refused_total",
        "Calls refused at once by a per-connection or daemon-wide bound (RESOURCE_EXHAUSTED or "
        "UNAVAILABLE), by what was bounded.",
        kCounter);
    out.Counter(refused, {{"limit", "streams"}}, limits.refused_streams);
    out.Counter(refused, {{"limit", "put_bytes"}}, limits.refused_puts);
  }

  out.Gauge(
      out.Family("kvcache_device_fault",
                 "1 once a pool-memory fault has latched (the daemon must be restarted).", kGauge),
      {}, manager_->device_faults().status().ok() ? 0 : 1);
  std::vector<MetricFamily> families = out.Take();
  for (MetricFamily& family : ProcessFamilies()) families.push_back(std::move(family));
  return families;
}

}  // namespace kvcache
