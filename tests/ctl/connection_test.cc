// ProbeUnixSocket: kvcachectl's reason, said at once, for a unix:// target it cannot connect to
// (the socket missing, stale, not a socket), where gRPC waits out its deadline and names none.
#include "ctl/connection.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::ctl {
namespace {

using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

// A Unix socket bound at `path`; listening when `listen` (else a stale socket file).
int BoundSocket(const std::string& path, bool listen) {
  const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  EXPECT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0) << path;
  if (listen) {
    EXPECT_EQ(::listen(fd, 4), 0);
  }
  return fd;
}

TEST(ProbeUnixSocketTest, NamesEachReason) {
  ScopedTempDir dir("ctl_probe");
  EXPECT_THAT(ProbeUnixSocket("unix://" + dir.File("missing.sock")),
              StatusIs(absl::StatusCode::kNotFound,
                       HasSubstr("no such socket: " + dir.File("missing.sock"))));
  EXPECT_THAT(ProbeUnixSocket("unix://" + dir.File("no/such/dir/kv.sock")),
              StatusIs(absl::StatusCode::kNotFound));

  const int stale = BoundSocket(dir.File("stale.sock"), /*listen=*/false);
  EXPECT_THAT(ProbeUnixSocket("unix://" + dir.File("stale.sock")),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connection refused")));
  close(stale);

  std::ofstream(dir.File("file")) << "x";
  EXPECT_THAT(ProbeUnixSocket("unix://" + dir.File("file")),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a socket")));

  const int live = BoundSocket(dir.File("live.sock"), /*listen=*/true);
  EXPECT_OK(ProbeUnixSocket("unix://" + dir.File("live.sock")));
  EXPECT_OK(ProbeUnixSocket("unix:" + dir.File("live.sock")));
  close(live);
}

TEST(ProbeUnixSocketTest, LeavesOtherTargetsToGrpc) {
  EXPECT_OK(ProbeUnixSocket("127.0.0.1:1"));
  EXPECT_OK(ProbeUnixSocket("dns:///localhost:50051"));
}

}  // namespace
}  // namespace kvcache::ctl
