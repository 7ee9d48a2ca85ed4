// MetricsHttpServer: the daemon's Prometheus /metrics port. It answers GET /metrics with one
// collectable's families in the text exposition format 0.0.4, and says so in its Content-Type
// (`text/plain; version=0.0.4; charset=utf-8`, what Prometheus and the Go client send), which
// prometheus::Exposer leaves out (it sends `text/plain; charset=utf-8`).
//
// Thread safety: scrapes run on the server's own threads, each calling the collectable's
// Collect (which must be thread-safe); Start and the destructor from one thread.
#ifndef KVCACHE_SERVER_METRICS_HTTP_SERVER_H_
#define KVCACHE_SERVER_METRICS_HTTP_SERVER_H_

#include <prometheus/collectable.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"

class CivetServer;

namespace kvcache {

// The Content-Type of the text exposition format.
inline constexpr char kMetricsContentType[] = "text/plain; version=0.0.4; charset=utf-8";

class MetricsHttpServer {
 public:
  // Serves `collectable` on `listen` ("HOST:PORT"; port 0 picks one). UNAVAILABLE when it
  // cannot listen there.
  static absl::StatusOr<std::unique_ptr<MetricsHttpServer>> Start(
      const std::string& listen, std::shared_ptr<prometheus::Collectable> collectable);
  // Stops serving; a scrape in flight completes first.
  ~MetricsHttpServer();

  // "HOST:PORT" with the port bound.
  const std::string& address() const { return address_; }

 private:
  class Handler;
  MetricsHttpServer() = default;

  std::unique_ptr<Handler> handler_;  // outlives server_
  std::unique_ptr<CivetServer> server_;
  std::string address_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_METRICS_HTTP_SERVER_H_
