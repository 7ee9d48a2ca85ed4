// UnixListener: the daemon's Unix socket, accepted here and handed to gRPC connection by
// connection, so that each connection gets a send buffer sized for block streams. gRPC exposes no
// public way to set socket options on the connections it accepts, and a Unix stream socket's
// throughput is paced by its sender's buffer: at the default 208 KiB a multi-MiB get makes client
// and daemon take turns (perf stat: 17k recvmsg and 7.7k context switches per GB; 7.7k and 2.7k
// with 4 MiB).
//
// It is also where a Unix peer's identity comes from: each connection's SO_PEERCRED (uid, gid,
// pid as the kernel saw them at connect) is recorded under the name gRPC gives the connection,
// "fd:N", before gRPC sees a byte of it. The record outlives any reuse of N: gRPC closes the
// descriptor only once the connection's last call is gone, and the next connection accepted on N
// overwrites the record before it is handed over.
//
// Thread safety: Bind, then Serve once; Stop (also the destructor) from any thread. PeerOf is
// thread-safe.
#ifndef KVCACHE_SERVER_UNIX_LISTENER_H_
#define KVCACHE_SERVER_UNIX_LISTENER_H_

#include <grpcpp/server.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kvcache {

class UnixListener {
 public:
  // Send buffer asked for on each connection; the kernel caps it at net.core.wmem_max.
  static constexpr int kSendBufferBytes = 4 << 20;

  // Binds and listens on `path` with permissions `mode` (owner-only, 0600, unless the daemon
  // authenticates other uids by an identity file). UNAVAILABLE when that fails.
  static absl::StatusOr<std::unique_ptr<UnixListener>> Bind(const std::string& path,
                                                            mode_t mode = 0600);
  ~UnixListener();
  UnixListener(const UnixListener&) = delete;
  UnixListener& operator=(const UnixListener&) = delete;

  // Accepts connections on a thread of its own and adds each to `server` (started, outliving
  // this listener's Stop).
  void Serve(grpc::Server* server);
  // Stops accepting; connections already handed over stay with the server.
  void Stop();

  // The kernel's credentials of the peer on the connection gRPC calls `peer` ("fd:N", as in
  // ServerContext::peer()); nullopt for any other peer.
  std::optional<ucred> PeerOf(absl::string_view peer) const;

 private:
  explicit UnixListener(int fd) : fd_(fd) {}
  void AcceptLoop(grpc::Server* server);

  const int fd_;
  std::thread thread_;
  mutable absl::Mutex peers_mu_;
  absl::flat_hash_map<int, ucred> peers_ ABSL_GUARDED_BY(peers_mu_);  // by descriptor
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_UNIX_LISTENER_H_
