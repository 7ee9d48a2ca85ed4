// UnixListener: the daemon's Unix socket, accepted here and handed to gRPC connection by
// connection, so that each connection gets a send buffer sized for block streams. gRPC exposes no
// public way to set socket options on the connections it accepts, and a Unix stream socket's
// throughput is paced by its sender's buffer: at the default 208 KiB a multi-MiB get makes client
// and daemon take turns (perf stat: 17k recvmsg and 7.7k context switches per GB; 7.7k and 2.7k
// with 4 MiB).
//
// Thread safety: Bind, then Serve once; Stop (also the destructor) from any thread.
#ifndef KVCACHE_SERVER_UNIX_LISTENER_H_
#define KVCACHE_SERVER_UNIX_LISTENER_H_

#include <grpcpp/server.h>

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"

namespace kvcache {

class UnixListener {
 public:
  // Send buffer asked for on each connection; the kernel caps it at net.core.wmem_max.
  static constexpr int kSendBufferBytes = 4 << 20;

  // Binds and listens on `path`, owner-only (0600). UNAVAILABLE when that fails.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(const std::string& path);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Accepts connections on a thread of its own and adds each to `server` (started, outliving
  // this listener's Stop).
  void Serve(grpc::Server* server);
  // Stops accepting; connections already handed over stay with the server.
  void Stop();

 private:
  explicit UnixListener(int fd) : fd_(fd) {}
  void AcceptLoop(grpc::Server* server);

  const int fd_;
  std::thread thread_;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_UNIX_LISTENER_H_
