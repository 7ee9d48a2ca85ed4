// RedisPeer: a redis-server child on loopback and a minimal RESP client, so the data-plane
// benchmark can compare our block streams with what users pick today as a remote KV store.
// Bench-only code; not thread-safe.
#ifndef KVCACHE_BENCH_REDIS_PEER_H_
#define KVCACHE_BENCH_REDIS_PEER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
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
  // Pipelines one GET per key; returns the total bytes received. GetAll reads each value into
  // `scratch` (reused, as a client's read buffer is); GetAllInto places the values one after
  // another in `destination`, as a cache connector fills a prompt's buffer.
  absl::StatusOr<uint64_t> GetAll(const std::vector<std::string>& keys, std::string* scratch);
  absl::StatusOr<uint64_t> GetAllInto(const std::vector<std::string>& keys,
                                      absl::Span<char> destination);
  // The same as one command each, MSET (the values sent from where they lie) and MGET (the
  // values placed one after another in `destination`): a batch as one round trip.
  absl::Status MSet(const std::vector<std::string>& keys, const std::vector<std::string>& values);
  absl::StatusOr<uint64_t> MGetInto(const std::vector<std::string>& keys,
                                    absl::Span<char> destination);

 private:
  RedisPeer(ChildProcess server, int fd) : server_(std::move(server)), fd_(fd) {}
  absl::Status SendAll(const std::string& bytes);
  absl::Status Fill();  // appends what one read of up to 64 KiB gets to buffer_
  absl::StatusOr<std::string> ReadLine();
  absl::Status Skip(size_t size);
  // Reads `size` bytes into `out`: what ReadLine buffered first, the rest straight from the socket.
  absl::Status ReadInto(char* out, size_t size);
  // GETs every key (one MGET when `one_command`); `place` says where the value at byte `offset`
  // of them all, of `size` bytes, goes (nullptr: nowhere, an error).
  absl::StatusOr<uint64_t> GetEach(const std::vector<std::string>& keys, bool one_command,
                                   absl::FunctionRef<char*(uint64_t offset, size_t size)> place);

  ChildProcess server_;  // destroyed after the connection is closed
  int fd_;
  std::string buffer_;
  size_t buffer_pos_ = 0;
};

}  // namespace kvcache::bench

#endif  // KVCACHE_BENCH_REDIS_PEER_H_
