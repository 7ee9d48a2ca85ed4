// A channel given SetConnectionSendBuffer connects with that send buffer: the test listens on a
// plain Unix socket of its own, lets a gRPC channel connect to it, and reads SO_SNDBUF from the
// channel's socket, which lives in this process.
#include "common/rpc/socket_send_buffer.h"

#include <dirent.h>
#include <grpcpp/create_channel.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <optional>
#include <string>

namespace kvcache {
namespace {

int WmemMax() {
  std::ifstream file("/proc/sys/net/core/wmem_max");
  int bytes = 0;
  file >> bytes;
  return bytes;
}

// What SO_SNDBUF reads back after asking for `bytes`: the kernel doubles the ask (for its
// bookkeeping), capped by net.core.wmem_max.
int GrantedSendBuffer(int bytes) { return 2 * std::min(bytes, WmemMax()); }

class Listener {
 public:
  Listener() {
    char dir_template[] = "/tmp/kvcache-sndbuf-XXXXXX";
    dir_ = mkdtemp(dir_template);
    path_ = dir_ + "/s.sock";
    fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::memcpy(address.sun_path, path_.data(), path_.size());
    EXPECT_EQ(bind(fd_, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    EXPECT_EQ(listen(fd_, 4), 0);
  }
  ~Listener() {
    if (accepted_ >= 0) close(accepted_);
    close(fd_);
    unlink(path_.c_str());
    rmdir(dir_.c_str());
  }

  const std::string& path() const { return path_; }

  // Waits (up to a minute, a bound, not a measurement) for a connection and accepts it.
  bool Accept() {
    pollfd waiting{.fd = fd_, .events = POLLIN, .revents = 0};
    if (poll(&waiting, 1, 60000) != 1) return false;
    accepted_ = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    return accepted_ >= 0;
  }

 private:
  std::string dir_, path_;
  int fd_ = -1;
  int accepted_ = -1;
};

// The send buffer of this process's socket connected to `path`; nullopt when there is none.
std::optional<int> SendBufferOfSocketConnectedTo(const std::string& path) {
  DIR* fds = opendir("/proc/self/fd");
  std::optional<int> found;
  while (dirent* entry = readdir(fds)) {
    const int fd = atoi(entry->d_name);
    sockaddr_un peer{};
    socklen_t size = sizeof(peer);
    if (getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &size) != 0 ||
        peer.sun_family != AF_UNIX || path != peer.sun_path) {
      continue;
    }
    int bytes = 0;
    socklen_t bytes_size = sizeof(bytes);
    if (getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, &bytes_size) == 0) found = bytes;
  }
  closedir(fds);
  return found;
}

std::optional<int> SendBufferOfChannelTo(const Listener& listener, grpc::ChannelArguments args) {
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(
      "unix:" + listener.path(), grpc::InsecureChannelCredentials(), args);
  channel->GetState(/*try_to_connect=*/true);
  if (!const_cast<Listener&>(listener).Accept()) return std::nullopt;
  return SendBufferOfSocketConnectedTo(listener.path());
}

TEST(SocketSendBufferTest, ChannelConnectsWithTheAskedSendBuffer) {
  const int asked = 1 << 20;
  Listener listener;
  grpc::ChannelArguments args;
  SetConnectionSendBuffer(&args, asked);
  EXPECT_EQ(SendBufferOfChannelTo(listener, args), GrantedSendBuffer(asked));
}

TEST(SocketSendBufferTest, BlockStreamSizeIsGrantedUpToTheKernelsCap) {
  Listener listener;
  grpc::ChannelArguments args;
  SetConnectionSendBuffer(&args, kBlockStreamSendBufferBytes);
  EXPECT_EQ(SendBufferOfChannelTo(listener, args), GrantedSendBuffer(kBlockStreamSendBufferBytes));
}

TEST(SocketSendBufferTest, WithoutItTheChannelKeepsTheDefault) {
  const int asked = 1 << 20;
  Listener listener;
  const std::optional<int> plain = SendBufferOfChannelTo(listener, grpc::ChannelArguments());
  ASSERT_TRUE(plain.has_value());
  EXPECT_NE(*plain, GrantedSendBuffer(asked));
}

}  // namespace
}  // namespace kvcache
