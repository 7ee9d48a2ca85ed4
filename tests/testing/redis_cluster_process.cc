#include "tests/testing/redis_cluster_process.h"

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <random>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"

namespace kvcache::testing {
namespace {

// Debian's redis-server and redis-cli, or copies brought along to a host without them
// (scripts/bundle_for_gpu_host.sh), named by KVCACHE_REDIS_SERVER and KVCACHE_REDIS_CLI.
std::string RedisBinary(const char* variable, const char* installed) {
  const char* chosen = std::getenv(variable);
  return chosen != nullptr && *chosen != '\0' ? chosen : installed;
}
std::string RedisServer() { return RedisBinary("KVCACHE_REDIS_SERVER", "/usr/bin/redis-server"); }
std::string RedisCli() { return RedisBinary("KVCACHE_REDIS_CLI", "/usr/bin/redis-cli"); }

bool PortFree(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return false;
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  address.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0;
  close(fd);
  return free;
}

// A port P with P and its cluster bus port P + 10000 free.
absl::StatusOr<int> PickPort(std::mt19937& random, const std::vector<int>& taken) {
  std::uniform_int_distribution<int> pick(20000, 29999);
  for (int attempt = 0; attempt < 200; ++attempt) {
    const int port = pick(random);
    if (std::find(taken.begin(), taken.end(), port) != taken.end()) continue;
    if (PortFree(port) && PortFree(port + 10000)) return port;
  }
  return absl::UnavailableError("no free port pair for a Redis node");
}

}  // namespace

absl::StatusOr<std::string> RunCommand(const std::vector<std::string>& argv,
                                       absl::Duration timeout) {
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv);
  if (!process.ok()) return process.status();
  const absl::Time deadline = absl::Now() + timeout;
  std::string output;
  while (true) {
    absl::StatusOr<std::string> line = process->ReadLine(deadline - absl::Now());
    if (absl::IsOutOfRange(line.status())) break;
    if (!line.ok()) return line.status();
    absl::StrAppend(&output, *line, "\n");
  }
  absl::StatusOr<int> status = process->Wait(deadline - absl::Now());
  if (!status.ok()) return status.status();
  if (!WIFEXITED(*status) || WEXITSTATUS(*status) != 0) {
    return absl::InternalError(
        absl::StrCat(argv[0], " ", DescribeWaitStatus(*status), ": ", output));
  }
  return output;
}

absl::StatusOr<std::unique_ptr<RedisClusterProcess>> RedisClusterProcess::Start(
    const std::string& dir, int masters, std::vector<std::string> extra_config) {
  auto cluster =
      std::unique_ptr<RedisClusterProcess>(new RedisClusterProcess(dir, std::move(extra_config)));
  for (size_t i = 0; i + 1 < cluster->extra_config_.size(); ++i) {
    if (cluster->extra_config_[i] == "--requirepass") {
      cluster->password_ = cluster->extra_config_[i + 1];
    }
  }
  std::mt19937 random(static_cast<uint32_t>(getpid() ^ absl::ToUnixNanos(absl::Now())));
  for (int node = 0; node < masters; ++node) {
    absl::StatusOr<int> port = PickPort(random, cluster->ports_);
    if (!port.ok()) return port.status();
    cluster->ports_.push_back(*port);
    cluster->processes_.emplace_back();
    if (absl::Status started = cluster->StartNode(node); !started.ok()) return started;
  }
  std::vector<std::string> create = {RedisCli()};
  if (!cluster->password_.empty()) {
    create.push_back("-a");
    create.push_back(cluster->password_);
    create.push_back("--no-auth-warning");
  }
  create.push_back("--cluster");
  create.push_back("create");
  for (const std::string& address : cluster->addresses()) create.push_back(address);
  for (const char* arg : {"--cluster-replicas", "0", "--cluster-yes"}) create.push_back(arg);
  if (absl::Status created = RunCommand(create).status(); !created.ok()) return created;
  if (absl::Status ok = cluster->AwaitClusterOk(); !ok.ok()) return ok;
  return cluster;
}

absl::Status RedisClusterProcess::StartNode(int node) {
  const std::string port = absl::StrCat(ports_[node]);
  std::vector<std::string> argv = {RedisServer(),
                                   "--port",
                                   port,
                                   "--bind",
                                   "127.0.0.1",
                                   "--dir",
                                   dir_,
                                   "--cluster-enabled",
                                   "yes",
                                   "--cluster-config-file",
                                   "nodes-" + port + ".conf",
                                   "--cluster-node-timeout",
                                   "2000",
                                   "--cluster-require-full-coverage",
                                   "no",
                                   "--save",
                                   "",
                                   "--appendonly",
                                   "no",
                                   "--logfile",
                                   dir_ + "/redis-" + port + ".log"};
  argv.insert(argv.end(), extra_config_.begin(), extra_config_.end());
  absl::StatusOr<Subprocess> process = Subprocess::Start(argv);
  if (!process.ok()) return process.status();
  processes_[node].emplace(*std::move(process));
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    absl::StatusOr<std::string> pong = Cli(node, {"PING"});
    if (pong.ok() && absl::StartsWith(*pong, "PONG")) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(20));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("redis-server on port ", port, " never answered"));
}

std::string RedisClusterProcess::address(int node) const {
  return absl::StrCat("127.0.0.1:", ports_[node]);
}

std::vector<std::string> RedisClusterProcess::addresses() const {
  std::vector<std::string> out;
  for (int node = 0; node < size(); ++node) out.push_back(address(node));
  return out;
}

absl::StatusOr<std::string> RedisClusterProcess::Cli(int node,
                                                     const std::vector<std::string>& args) const {
  std::vector<std::string> argv = {RedisCli(), "-p", absl::StrCat(ports_[node])};
  if (!password_.empty()) {
    argv.push_back("-a");
    argv.push_back(password_);
    argv.push_back("--no-auth-warning");
  }
  argv.insert(argv.end(), args.begin(), args.end());
  return RunCommand(argv, absl::Seconds(10));
}

absl::StatusOr<std::string> RedisClusterProcess::NodeId(int node) const {
  absl::StatusOr<std::string> id = Cli(node, {"CLUSTER", "MYID"});
  if (!id.ok()) return id.status();
  return std::string(absl::StripAsciiWhitespace(*id));
}

absl::StatusOr<int> RedisClusterProcess::NodeOfSlot(int slot) const {
  // Each line of `CLUSTER NODES`: id addr flags master ping pong epoch state slot-ranges...
  for (int node = 0; node < size(); ++node) {
    if (!processes_[node].has_value()) continue;
    absl::StatusOr<std::string> nodes = Cli(node, {"CLUSTER", "NODES"});
    if (!nodes.ok()) continue;
    for (absl::string_view line : absl::StrSplit(*nodes, '\n', absl::SkipEmpty())) {
      std::vector<absl::string_view> fields = absl::StrSplit(line, ' ');
      if (fields.size() < 9) continue;
      for (size_t f = 8; f < fields.size(); ++f) {
        std::vector<absl::string_view> range = absl::StrSplit(fields[f], '-');
        int start = 0, end = 0;
        if (!absl::SimpleAtoi(range[0], &start)) continue;
        end = start;
        if (range.size() == 2 && !absl::SimpleAtoi(range[1], &end)) continue;
        if (slot < start || slot > end) continue;
        const std::string address(fields[1].substr(0, fields[1].find('@')));
        for (int owner = 0; owner < size(); ++owner) {
          if (this->address(owner) == address) return owner;
        }
      }
    }
    break;
  }
  return absl::NotFoundError(absl::StrCat("no node serves slot ", slot));
}

absl::Status RedisClusterProcess::Kill(int node) {
  if (!processes_[node].has_value()) return absl::FailedPreconditionError("node not running");
  absl::Status killed = processes_[node]->Signal(SIGKILL);
  processes_[node]->Wait(absl::Seconds(10)).IgnoreError();
  processes_[node].reset();
  return killed;
}

absl::Status RedisClusterProcess::Signal(int node, int signal_number) {
  if (!processes_[node].has_value()) return absl::FailedPreconditionError("node not running");
  return processes_[node]->Signal(signal_number);
}

absl::Status RedisClusterProcess::Restart(int node) {
  if (absl::Status started = StartNode(node); !started.ok()) return started;
  return AwaitClusterOk();
}

absl::Status RedisClusterProcess::AwaitClusterOk() const {
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (absl::Now() < deadline) {
    bool all_ok = true;
    for (int node = 0; node < size() && all_ok; ++node) {
      if (!processes_[node].has_value()) continue;
      absl::StatusOr<std::string> info = Cli(node, {"CLUSTER", "INFO"});
      all_ok = info.ok() && absl::StrContains(*info, "cluster_state:ok");
    }
    if (all_ok) return absl::OkStatus();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError("the Redis Cluster never reached cluster_state:ok");
}

}  // namespace kvcache::testing
