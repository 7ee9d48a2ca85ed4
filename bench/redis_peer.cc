#include "bench/redis_peer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace kvcache::bench {
namespace {

int ConnectOnce(const std::string& socket_path, int port) {
  if (!socket_path.empty()) {
    const int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    sockaddr_un address{};
    address.sun_family = AF_UNIX;
    std::strncpy(address.sun_path, socket_path.c_str(), sizeof(address.sun_path) - 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) return fd;
    close(fd);
    return -1;
  }
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(port);
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
  }
  close(fd);
  return -1;
}

}  // namespace

absl::StatusOr<std::unique_ptr<RedisPeer>> RedisPeer::Start(const std::string& dir, int port,
                                                            bool use_unix_socket) {
  // KVCACHE_REDIS_SERVER: a redis-server brought along, on a host where it is not installed.
  const char* chosen = std::getenv("KVCACHE_REDIS_SERVER");
  const std::string binary = chosen != nullptr ? chosen : "/usr/bin/redis-server";
  if (access(binary.c_str(), X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        binary, " is not there (apt-get install redis-server, or set KVCACHE_REDIS_SERVER)"));
  }
  const std::string socket_path = dir + "/redis.sock";
  const std::string port_text = absl::StrCat(port);
  std::vector<std::string> args = {binary,
                                   "--port",
                                   port_text,
                                   "--bind",
                                   "127.0.0.1",
                                   "--unixsocket",
                                   socket_path,
                                   "--save",
                                   "",
                                   "--appendonly",
                                   "no",
                                   "--dir",
                                   dir,
                                   "--logfile",
                                   dir + "/redis.log",
                                   "--proto-max-bulk-len",
                                   "1gb"};
  int fd = -1;
  ASSIGN_OR_RETURN(ChildProcess server, ChildProcess::Start(
                                            std::move(args),
                                            [&] {
                                              fd = ConnectOnce(use_unix_socket ? socket_path : "",
                                                               port);
                                              return fd >= 0;
                                            },
                                            dir + "/redis-server.out"));
  return std::unique_ptr<RedisPeer>(new RedisPeer(std::move(server), fd));
}

RedisPeer::~RedisPeer() { close(fd_); }

absl::Status RedisPeer::SendAll(const std::string& bytes) {
  size_t sent = 0;
  while (sent < bytes.size()) {
    const ssize_t n = write(fd_, bytes.data() + sent, bytes.size() - sent);
    if (n <= 0) return absl::UnavailableError("redis write failed");
    sent += n;
  }
  return absl::OkStatus();
}

absl::Status RedisPeer::Fill() {
  char chunk[1 << 16];
  const ssize_t n = read(fd_, chunk, sizeof(chunk));
  if (n <= 0) return absl::UnavailableError("redis read failed");
  buffer_.erase(0, buffer_pos_);
  buffer_pos_ = 0;
  buffer_.append(chunk, n);
  return absl::OkStatus();
}

absl::StatusOr<std::string> RedisPeer::ReadLine() {
  while (true) {
    const size_t end = buffer_.find("\r\n", buffer_pos_);
    if (end != std::string::npos) {
      std::string line = buffer_.substr(buffer_pos_, end - buffer_pos_);
      buffer_pos_ = end + 2;
      return line;
    }
    if (absl::Status s = Fill(); !s.ok()) return s;
  }
}

absl::Status RedisPeer::Skip(size_t size) {
  while (buffer_.size() - buffer_pos_ < size) {
    if (absl::Status s = Fill(); !s.ok()) return s;
  }
  buffer_pos_ += size;
  return absl::OkStatus();
}

absl::Status RedisPeer::ReadInto(char* out, size_t size) {
  const size_t buffered = std::min(size, buffer_.size() - buffer_pos_);
  std::memcpy(out, buffer_.data() + buffer_pos_, buffered);
  buffer_pos_ += buffered;
  size_t filled = buffered;
  while (filled < size) {
    const ssize_t n = read(fd_, out + filled, size - filled);
    if (n <= 0) return absl::UnavailableError("redis read failed");
    filled += n;
  }
  return absl::OkStatus();
}

absl::Status RedisPeer::SetAll(const std::vector<std::string>& keys,
                               const std::vector<std::string>& values) {
  for (size_t i = 0; i < keys.size(); ++i) {
    if (absl::Status s = SendAll(absl::StrCat("*3\r\n$3\r\nSET\r\n$", keys[i].size(), "\r\n",
                                              keys[i], "\r\n$", values[i].size(), "\r\n"));
        !s.ok()) {
      return s;
    }
    if (absl::Status s = SendAll(values[i] + "\r\n"); !s.ok()) return s;
  }
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<std::string> line = ReadLine();
    if (!line.ok()) return line.status();
    if (*line != "+OK") return absl::InternalError(absl::StrCat("redis SET: ", *line));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RedisPeer::GetAll(const std::vector<std::string>& keys,
                                           std::string* scratch) {
  return GetEach(keys, /*one_command=*/false, [scratch](uint64_t, size_t size) {
    scratch->resize(size);
    return scratch->data();
  });
}

namespace {

// Places each value after the one before in `destination`; nullptr past its end.
auto Consecutive(absl::Span<char> destination) {
  return [destination](uint64_t offset, size_t size) -> char* {
    return offset + size <= destination.size() ? destination.data() + offset : nullptr;
  };
}

}  // namespace

absl::StatusOr<uint64_t> RedisPeer::GetAllInto(const std::vector<std::string>& keys,
                                               absl::Span<char> destination) {
  return GetEach(keys, /*one_command=*/false, Consecutive(destination));
}

absl::StatusOr<uint64_t> RedisPeer::MGetInto(const std::vector<std::string>& keys,
                                             absl::Span<char> destination) {
  return GetEach(keys, /*one_command=*/true, Consecutive(destination));
}

absl::Status RedisPeer::MSet(const std::vector<std::string>& keys,
                             const std::vector<std::string>& values) {
  // The command's framing, then each value from where it lies, in writev batches.
  std::vector<std::string> headers;
  headers.reserve(keys.size() + 1);
  headers.push_back(absl::StrCat("*", 1 + 2 * keys.size(), "\r\n$4\r\nMSET\r\n"));
  for (size_t i = 0; i < keys.size(); ++i) {
    headers.push_back(absl::StrCat(i == 0 ? "" : "\r\n", "$", keys[i].size(), "\r\n", keys[i],
                                   "\r\n$", values[i].size(), "\r\n"));
  }
  static constexpr char kEnd[] = "\r\n";
  std::vector<iovec> pieces;
  pieces.push_back({headers[0].data(), headers[0].size()});
  for (size_t i = 0; i < keys.size(); ++i) {
    pieces.push_back({headers[i + 1].data(), headers[i + 1].size()});
    pieces.push_back({const_cast<char*>(values[i].data()), values[i].size()});
  }
  pieces.push_back({const_cast<char*>(kEnd), 2});
  size_t next = 0;
  while (next < pieces.size()) {
    const int count = static_cast<int>(std::min<size_t>(IOV_MAX, pieces.size() - next));
    const ssize_t n = writev(fd_, pieces.data() + next, count);
    if (n <= 0) return absl::UnavailableError("redis write failed");
    // Drop what went out; a piece half sent keeps its rest.
    size_t left = static_cast<size_t>(n);
    while (left > 0 && left >= pieces[next].iov_len) left -= pieces[next++].iov_len;
    if (left > 0) {
      pieces[next].iov_base = static_cast<char*>(pieces[next].iov_base) + left;
      pieces[next].iov_len -= left;
    }
  }
  absl::StatusOr<std::string> line = ReadLine();
  if (!line.ok()) return line.status();
  if (*line != "+OK") return absl::InternalError(absl::StrCat("redis MSET: ", *line));
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RedisPeer::GetEach(
    const std::vector<std::string>& keys, bool one_command,
    absl::FunctionRef<char*(uint64_t offset, size_t size)> place) {
  std::string request;
  if (one_command) absl::StrAppend(&request, "*", 1 + keys.size(), "\r\n$4\r\nMGET\r\n");
  for (const std::string& key : keys) {
    absl::StrAppend(&request, one_command ? "" : "*2\r\n$3\r\nGET\r\n", "$", key.size(), "\r\n",
                    key, "\r\n");
  }
  if (absl::Status s = SendAll(request); !s.ok()) return s;
  if (one_command) {  // one array of the values
    absl::StatusOr<std::string> line = ReadLine();
    if (!line.ok()) return line.status();
    if (*line != absl::StrCat("*", keys.size())) {
      return absl::InternalError(absl::StrCat("redis MGET: ", *line));
    }
  }
  uint64_t total = 0;
  for (size_t i = 0; i < keys.size(); ++i) {
    absl::StatusOr<std::string> line = ReadLine();
    if (!line.ok()) return line.status();
    size_t size = 0;
    if (line->empty() || (*line)[0] != '$' || !absl::SimpleAtoi(line->substr(1), &size)) {
      return absl::InternalError(absl::StrCat("redis GET: ", *line));
    }
    char* value = place(total, size);
    if (value == nullptr) return absl::OutOfRangeError("redis GET: the values overflow the buffer");
    if (absl::Status s = ReadInto(value, size); !s.ok()) return s;
    // The value's CRLF, read with what follows it (the next reply's header), as ReadLine would.
    if (absl::Status s = Skip(2); !s.ok()) return s;
    total += size;
  }
  return total;
}

}  // namespace kvcache::bench
