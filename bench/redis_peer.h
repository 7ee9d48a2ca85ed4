// RedisPeer: a redis-server child on loopback and a minimal RESP client, so the data-plane
// benchmark can compare our block streams with what users pick today as a remote KV store.
// Bench-only code; not thread-safe.
#ifndef KVCACHE_BENCH_REDIS_PEER_H_
#define KVCACHE_BENCH_REDIS_PEER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/child_process.h"

namespace kvcache::bench {

class RedisPeer {
 public:
  // Starts redis-server (persistence off) on `port` and a Unix socket in `dir`, and connects over
  // `use_unix_socket` ? the socket : TCP. FAILED_PRECONDITION if redis-server is not installed.
  static absl::StatusOr<std::unique_ptr<RedisPeer>> Start(const std::string& dir, int port,
                                                          bool use_unix_socket);
  ~RedisPeer();

  // Pipelines one SET per value, then reads every reply.
  absl::Status SetAll(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  // Pipelines one GET per key; returns the total bytes received.
  absl::StatusOr<uint64_t> GetAll(const std::vector<std::string>& keys, std::string* scratch);

 private:
  RedisPeer(ChildProcess server, int fd) : server_(std::move(server)), fd_(fd) {}
  absl::Status SendAll(const std::string& bytes);
  absl::StatusOr<std::string> ReadLine();
  absl::Status ReadExact(size_t size, std::string* out);

  ChildProcess server_;  // destroyed after the connection is closed
  int fd_;
  std::string buffer_;
  size_t buffer_pos_ = 0;
};

}  // namespace kvcache::bench

#endif  // KVCACHE_BENCH_REDIS_PEER_H_
