#include "server/unix_listener.h"

#include <dirent.h>
#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <string>

#include "tests/testing/grpc_kept_alive.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::PollUntil;
using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;

class UnixListenerTest : public ::testing::Test {
 protected:
  void SetUp() override { ::kvcache::testing::KeepGrpcInitialized(); }

  ScopedTempDir dir_{"kvcache_unix_listener"};
};

// The largest SO_SNDBUF among this process's sockets (the kernel reports twice what was set).
int LargestSendBuffer() {
  int largest = 0;
  DIR* fds = opendir("/proc/self/fd");
  while (dirent* entry = readdir(fds)) {
    const int fd = std::atoi(entry->d_name);
    int size = 0;
    socklen_t length = sizeof(size);
    if (fd > 2 && getsockopt(fd, SOL_SOCKET, SO_SNDBUF, &size, &length) == 0) {
      largest = std::max(largest, size);
    }
  }
  closedir(fds);
  return largest;
}

int ReadSysctl(const char* path) {
  std::ifstream file(path);
  int value = 0;
  file >> value;
  return value;
}

TEST_F(UnixListenerTest, AcceptedConnectionsGetTheLargerSendBuffer) {
  const int wmem_default = ReadSysctl("/proc/sys/net/core/wmem_default");
  const int wmem_max = ReadSysctl("/proc/sys/net/core/wmem_max");
  if (wmem_max <= wmem_default) GTEST_SKIP() << "net.core.wmem_max allows no larger buffer";
  const std::string path = dir_.File("kv.sock");
  absl::StatusOr<std::unique_ptr<UnixListener>> listener = UnixListener::Bind(path);
  ASSERT_OK(listener);
  grpc::ServerBuilder builder;
  grpc::CallbackGenericService service;  // a server needs a service to start
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  (*listener)->Serve(server.get());
  const int before = LargestSendBuffer();

  const int client = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(connect(client, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
  // The kernel caps the request at wmem_max and reports double the value it set.
  const int expected = 2 * std::min(UnixListener::kSendBufferBytes, wmem_max);
  EXPECT_LT(before, expected);
  EXPECT_TRUE(PollUntil([&] { return LargestSendBuffer() >= expected; }));
  close(client);
  (*listener)->Stop();
  server->Shutdown();
}

TEST_F(UnixListenerTest, BindFailuresAreStatuses) {
  EXPECT_THAT(UnixListener::Bind(dir_.File(std::string(200, 'x'))),
              StatusIs(absl::StatusCode::kInvalidArgument, ::testing::HasSubstr("longer than")));
  EXPECT_THAT(UnixListener::Bind(dir_.File("missing/kv.sock")),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("cannot listen")));
  absl::StatusOr<std::unique_ptr<UnixListener>> first = UnixListener::Bind(dir_.File("kv.sock"));
  ASSERT_OK(first);
  EXPECT_THAT(UnixListener::Bind(dir_.File("kv.sock")),
              StatusIs(absl::StatusCode::kUnavailable, ::testing::HasSubstr("in use")));
}

TEST_F(UnixListenerTest, StopWithoutServeAndTwiceIsFine) {
  absl::StatusOr<std::unique_ptr<UnixListener>> listener = UnixListener::Bind(dir_.File("kv.sock"));
  ASSERT_OK(listener);
  (*listener)->Stop();
  (*listener)->Stop();
}

}  // namespace
}  // namespace kvcache
