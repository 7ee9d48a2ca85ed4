// DaemonMetrics: the daemon's Prometheus exposition, built at each scrape from the figures the
// core and the server already keep (pool stats per tenant, residency histograms, session
// counters, the KV event log's counters, RpcMetrics, the data streams' byte counters), so nothing
// is counted twice and the core knows nothing of Prometheus.
//
// Conventions (vLLM's semantics, Prometheus' naming): every name starts with kvcache_, counters
// end in _total, prefix-cache queries and hits are counted in tokens (a hit rate is a query's
// ratio, never a gauge), usage is 0-1, labels are pool, tenant, method, code, direction, state,
// sink, limit, op and manifest (a manifest digest's first 16 hex digits, a few per tenant:
// cache/page_counters.h): never token ids, block hashes, page keys or session ids. Every family has
// HELP. After ours come kvcache_build_info and the process_* families every Prometheus client
// exports (server/process_metrics.h).
//
// Thread safety: thread-safe (Collect reads only thread-safe sources).
#ifndef KVCACHE_SERVER_METRICS_H_
#define KVCACHE_SERVER_METRICS_H_

#include <prometheus/collectable.h>
#include <prometheus/metric_family.h>

#include <functional>
#include <vector>

#include "cache/cache_manager.h"
#include "server/call_limits.h"
#include "server/rpc_metrics.h"

namespace kvcache {

class DaemonMetrics final : public prometheus::Collectable {
 public:
  // The pointers must outlive the metrics' last scrape; `call_limits` may be null.
  // `zmq_published` (may be empty) counts the messages the ZeroMQ publisher sent.
  DaemonMetrics(CacheManager* manager, RpcMetrics* rpc, const CallLimits* call_limits = nullptr,
                std::function<uint64_t()> zmq_published = nullptr)
      : manager_(manager),
        rpc_(rpc),
        call_limits_(call_limits),
        zmq_published_(std::move(zmq_published)) {}

  std::vector<prometheus::MetricFamily> Collect() const override;

 private:
  CacheManager* const manager_;
  RpcMetrics* const rpc_;
  const CallLimits* const call_limits_;
  const std::function<uint64_t()> zmq_published_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_METRICS_H_
