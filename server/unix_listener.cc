#include "server/unix_listener.h"

#include <grpcpp/server_posix.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace kvcache {

absl::StatusOr<std::unique_ptr<UnixListener>> UnixListener::Bind(const std::string& path,
                                                                 mode_t mode) {
  sockaddr_un address{};
  if (path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("socket path ", path, " is longer than ",
                                                   sizeof(address.sun_path) - 1, " bytes"));
  }
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  // Created under umask 0077, so the socket is never reachable by others, not even briefly.
  const mode_t old_umask = umask(0077);
  const bool bound = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  const int bind_errno = errno;
  umask(old_umask);
  if (!bound || listen(fd, SOMAXCONN) != 0) {
    const int error = bound ? errno : bind_errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", path, ": ", std::strerror(error)));
  }
  chmod(path.c_str(), mode);
  return std::unique_ptr<UnixListener>(new UnixListener(fd));
}

UnixListener::~UnixListener() {
  Stop();
  close(fd_);
}

void UnixListener::Serve(grpc::Server* server) {
  thread_ = std::thread([this, server] { AcceptLoop(server); });
}

void UnixListener::Stop() {
  // Wakes the accept below (it then fails with EINVAL) without closing the descriptor under it.
  shutdown(fd_, SHUT_RDWR);
  if (thread_.joinable()) thread_.join();
}

void UnixListener::AcceptLoop(grpc::Server* server) {
  while (true) {
    const int connection =
        accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);  // gRPC needs non-blocking
    if (connection < 0) {
      if (errno == EINTR || errno == ECONNABORTED || errno == EMFILE || errno == ENFILE) {
        if (errno == EMFILE || errno == ENFILE) usleep(10000);  // wait for a descriptor
        continue;
      }
      return;  // Stop shut the socket down
    }
    ucred peer{};
    socklen_t peer_size = sizeof(peer);
    if (getsockopt(connection, SOL_SOCKET, SO_PEERCRED, &peer, &peer_size) != 0) {
      close(connection);  // a peer without credentials could not be told apart from another
      continue;
    }
    {
      absl::MutexLock lock(&peers_mu_);
      peers_[connection] = peer;
    }
    const int send_buffer = kSendBufferBytes;
    setsockopt(connection, SOL_SOCKET, SO_SNDBUF, &send_buffer, sizeof(send_buffer));
    grpc::AddInsecureChannelFromFd(server, connection);
  }
}

std::optional<ucred> UnixListener::PeerOf(absl::string_view peer) const {
  int fd = -1;
  if (!absl::ConsumePrefix(&peer, "fd:") || !absl::SimpleAtoi(peer, &fd)) return std::nullopt;
  absl::ReaderMutexLock lock(&peers_mu_);
  auto it = peers_.find(fd);
  if (it == peers_.end()) return std::nullopt;
  return it->second;
}

}  // namespace kvcache
