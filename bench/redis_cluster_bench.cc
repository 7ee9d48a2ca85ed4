// redis_cluster_bench: the cluster tier's Redis Cluster client (redis/redis_cluster.h) against
// raw hiredis pipelined GETs of the same values from the same 3-master cluster (what
// redis-benchmark -P does), measured in alternating rounds of one run; and the bytes of Redis
// memory per byte of value stored, for a value size on a jemalloc size class and just below one
// (docs: shared/research/peers_2026.md §5, the size-class trap).
//
//   redis_cluster_bench [VALUE_BYTES] [VALUES] [ROUNDS]   (defaults 262080 400 9)
#include <hiredis/hiredis.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "redis/redis_cluster.h"
#include "tests/testing/redis_cluster_process.h"

namespace kvcache {
namespace {

using ::kvcache::testing::RedisClusterProcess;

uint64_t UsedMemory(const RedisClusterProcess& redis) {
  uint64_t total = 0;
  for (int node = 0; node < redis.size(); ++node) {
    absl::StatusOr<std::string> info = redis.Cli(node, {"INFO", "memory"});
    if (!info.ok()) continue;
    for (absl::string_view line : absl::StrSplit(*info, '\n')) {
      if (absl::ConsumePrefix(&line, "used_memory:")) {
        uint64_t bytes = 0;
        if (absl::SimpleAtoi(absl::StripAsciiWhitespace(line), &bytes)) total += bytes;
      }
    }
  }
  return total;
}

// Raw hiredis: every node's GETs appended, then every reply read (one pipeline per node).
double RawPipelinedGets(const std::map<int, std::vector<std::string>>& keys_by_node,
                        std::map<int, redisContext*>& contexts, uint64_t* bytes) {
  const absl::Time start = absl::Now();
  for (const auto& [node, keys] : keys_by_node) {
    for (const std::string& key : keys) {
      const char* argv[] = {"GET", key.data()};
      const size_t lengths[] = {3, key.size()};
      redisAppendCommandArgv(contexts[node], 2, argv, lengths);
    }
    int done = 0;
    while (done == 0) redisBufferWrite(contexts[node], &done);
  }
  for (const auto& [node, keys] : keys_by_node) {
    for (size_t i = 0; i < keys.size(); ++i) {
      redisReply* reply = nullptr;
      if (redisGetReply(contexts[node], reinterpret_cast<void**>(&reply)) != REDIS_OK) std::abort();
      *bytes += reply->len;
      freeReplyObject(reply);
    }
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

int Main(int argc, char** argv) {
  uint64_t value_bytes = 262080;  // 256 KiB - 64: just under a jemalloc size class
  int values = 400;
  int rounds = 9;
  if (argc > 1) (void)absl::SimpleAtoi(argv[1], &value_bytes);
  if (argc > 2) (void)absl::SimpleAtoi(argv[2], &values);
  if (argc > 3) (void)absl::SimpleAtoi(argv[3], &rounds);
  char dir[] = "/tmp/kvcache-redis-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  absl::StatusOr<std::unique_ptr<RedisClusterProcess>> redis = RedisClusterProcess::Start(dir);
  if (!redis.ok()) {
    std::fprintf(stderr, "redis_cluster_bench: %s\n", redis.status().ToString().c_str());
    return 1;
  }
  RedisClusterOptions options;
  options.seeds = (*redis)->addresses();
  options.io_timeout = absl::Seconds(10);
  absl::StatusOr<std::unique_ptr<RedisCluster>> cluster = RedisCluster::Create(options);
  if (!cluster.ok()) return 1;

  // Memory per byte stored: the value size asked for, and the size class just above it.
  for (const uint64_t size : {value_bytes, value_bytes + 64}) {
    const uint64_t before = UsedMemory(**redis);
    std::vector<std::pair<std::string, std::string>> entries;
    for (int i = 0; i < values; ++i) {
      entries.emplace_back(absl::StrCat("mem", size, ":", i), std::string(size, 'k'));
    }
    for (const absl::Status& status : (*cluster)->Set(entries)) {
      if (!status.ok()) std::fprintf(stderr, "SET: %s\n", status.ToString().c_str());
    }
    const uint64_t after = UsedMemory(**redis);
    std::printf(
        "memory: %d values of %llu bytes: %.3f bytes of Redis used_memory per byte stored\n",
        values, static_cast<unsigned long long>(size),
        static_cast<double>(after - before) / (static_cast<double>(size) * values));
    std::vector<std::string> keys;
    for (const auto& [key, value] : entries) keys.push_back(key);
    (*cluster)->Delete(keys);
  }

  std::vector<std::pair<std::string, std::string>> entries;
  std::vector<std::string> keys;
  std::map<int, std::vector<std::string>> keys_by_node;
  for (int i = 0; i < values; ++i) {
    const std::string key = absl::StrCat("kv:", i);
    entries.emplace_back(key, std::string(value_bytes, static_cast<char>(i)));
    keys.push_back(key);
    absl::StatusOr<int> node = (*redis)->NodeOfSlot(RedisCluster::KeySlot(key));
    if (!node.ok()) return 1;
    keys_by_node[*node].push_back(key);
  }
  (*cluster)->Set(entries);
  std::map<int, redisContext*> contexts;
  for (const auto& [node, node_keys] : keys_by_node) {
    contexts[node] = redisConnect("127.0.0.1", (*redis)->port(node));
  }

  std::vector<double> ratios;
  double client_best = 1e9, raw_best = 1e9;
  for (int round = 0; round < rounds; ++round) {
    uint64_t raw_bytes = 0, client_bytes = 0;
    double raw = 0, client = 0;
    const auto run_client = [&] {
      const absl::Time start = absl::Now();
      const std::vector<absl::Status> got = (*cluster)->Get(
          keys, [&](size_t, absl::string_view value) { client_bytes += value.size(); });
      client = absl::ToDoubleSeconds(absl::Now() - start);
      for (const absl::Status& status : got) {
        if (!status.ok()) std::abort();
      }
    };
    if (round % 2 == 0) {
      raw = RawPipelinedGets(keys_by_node, contexts, &raw_bytes);
      run_client();
    } else {
      run_client();
      raw = RawPipelinedGets(keys_by_node, contexts, &raw_bytes);
    }
    if (raw_bytes != client_bytes) std::abort();
    ratios.push_back(raw / client);  // throughput of the client over the baseline's
    client_best = std::min(client_best, client);
    raw_best = std::min(raw_best, raw);
  }
  std::sort(ratios.begin(), ratios.end());
  const double gb = static_cast<double>(value_bytes) * values / 1e9;
  std::printf(
      "load %d values of %llu bytes from a 3-master cluster: RedisCluster %.2f GB/s, raw hiredis "
      "pipelined GETs %.2f GB/s (best of %d); median ratio %.2fx\n",
      values, static_cast<unsigned long long>(value_bytes), gb / client_best, gb / raw_best, rounds,
      ratios[ratios.size() / 2]);
  for (auto& [node, context] : contexts) redisFree(context);
  cluster->reset();
  redis->reset();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) { return kvcache::Main(argc, argv); }
