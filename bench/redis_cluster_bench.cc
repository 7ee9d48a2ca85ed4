// redis_cluster_bench: the cluster tier (tiers/cluster_tier.h) and its Redis Cluster client
// (redis/redis_cluster.h) against raw hiredis pipelined GETs of the same values from the same
// 3-master cluster (what redis-benchmark -P does), measured in alternating rounds of one run; and
// the bytes of Redis memory per byte of KV stored: for raw values on a jemalloc size class and
// just below one, and for the tier's records of 32 KiB blocks whole and split to fit the classes
// (shared/research/peers_2026.md §5, the size-class trap); and stores in the mover's batches
// against one pipelined SET batch of the same values per batch. Loads and stores of the tier
// sealed (--tier_key_file: AES-256-GCM, tiers/record_seal.h) against the tier unsealed, in the
// same alternating rounds (target >= 0.9x each). The allocator is tuned as kvcache-manager tunes
// it (TuneMallocForBlockStreams): a sealed store's value buffers of a block's size each would
// otherwise come from fresh mappings, page-faulted anew every batch, as they do not in the daemon.
//
//   redis_cluster_bench [BLOCK_BYTES] [BLOCKS] [ROUNDS]   (defaults 262144 400 9)
//
// Exits 1 at the first failed store, load or reply (bench/bench_run.h).
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
#include "bench/bench_run.h"
#include "common/block_checksum.h"
#include "common/rpc/malloc_tuning.h"
#include "redis/redis_cluster.h"
#include "tests/testing/redis_cluster_process.h"
#include "tiers/cluster_tier.h"
#include "tiers/record_codec.h"
#include "tiers/tier_keyring.h"

namespace kvcache {
namespace {

using ::kvcache::testing::RedisClusterProcess;

void CheckAllOk(const std::vector<absl::Status>& statuses, absl::string_view what) {
  for (const absl::Status& status : statuses) bench::CheckOk(status, what);
}

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
      if (redisGetReply(contexts[node], reinterpret_cast<void**>(&reply)) != REDIS_OK) {
        bench::Fail(absl::StrCat("GET from node ", node, ": ", contexts[node]->errstr));
      }
      if (reply->type != REDIS_REPLY_STRING) bench::Fail(absl::StrCat("GET ", keys[i]));
      *bytes += reply->len;
      freeReplyObject(reply);
    }
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

void FlushAll(const RedisClusterProcess& redis) {
  for (int node = 0; node < redis.size(); ++node) redis.Cli(node, {"FLUSHALL"}).IgnoreError();
}

// The keys of the sealed runs: one master key, as a key file of one line gives.
std::shared_ptr<const TierKeyring> BenchKeyring() {
  TierMasterKey key{.id = 1};
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = static_cast<uint8_t>(i * 29 + 3);
  return bench::ValueOrFail(TierKeyring::FromKeys({key}), "TierKeyring::FromKeys");
}

// The daemon's seal workers (TaskWorkers::DefaultThreads(), and the daemon's look-before-sleep
// time unless KVCACHE_BENCH_SEAL_SPIN_US says another: an experiment's knob).
std::shared_ptr<TaskWorkers> BenchTaskWorkers() {
  static const auto workers = [] {
    const char* spin_us = std::getenv("KVCACHE_BENCH_SEAL_SPIN_US");
    int64_t us = 0;
    return spin_us != nullptr && absl::SimpleAtoi(spin_us, &us)
               ? std::make_shared<TaskWorkers>(TaskWorkers::DefaultThreads(),
                                               absl::Microseconds(us))
               : std::make_shared<TaskWorkers>(TaskWorkers::DefaultThreads());
  }();
  return workers;
}

// Who ran the sealed tier's seal tasks since the last call: the workers, or the storing or
// loading thread itself while it waited for them.
std::string SealTaskShares() {
  static uint64_t workers_before = 0, callers_before = 0;
  const TaskWorkers& workers = *BenchTaskWorkers();
  const uint64_t on_workers = workers.ran_on_workers() - workers_before;
  const uint64_t by_callers = workers.ran_by_callers() - callers_before;
  workers_before = workers.ran_on_workers();
  callers_before = workers.ran_by_callers();
  return absl::StrCat(on_workers, " tasks on ", workers.threads(), " workers (looking ",
                      absl::ToInt64Microseconds(workers.spin()), " us before sleeping), ",
                      by_callers, " run by the calling thread");
}

std::unique_ptr<ClusterTier> MakeTier(const RedisClusterProcess& redis, uint64_t block_bytes,
                                      bool fit_size_classes,
                                      std::shared_ptr<const TierKeyring> keyring = nullptr) {
  ClusterTierOptions options;
  if (keyring != nullptr) options.seal_workers = BenchTaskWorkers();
  options.keyring = std::move(keyring);
  options.redis.seeds = redis.addresses();
  options.redis.io_timeout = absl::Seconds(10);
  options.pool = PoolIdentity{.model_id = "bench",
                              .layout_fingerprint = 1,
                              .hash_algorithm = HashAlgorithm::kXxh3_128,
                              .block_bytes = block_bytes};
  options.fit_size_classes = fit_size_classes;
  return bench::ValueOrFail(ClusterTier::Create(options), "ClusterTier::Create");
}

// A chain of `blocks` records of `block_bytes`: identities (namespace `space`) and bytes.
struct Chain {
  std::vector<BlockRecordIdentity> identities;
  std::vector<std::string> bytes;
};
Chain MakeChain(uint64_t block_bytes, int blocks, uint64_t space) {
  Chain chain;
  Hash128 parent{0, space};
  for (int i = 0; i < blocks; ++i) {
    std::string bytes(block_bytes, '\0');
    for (uint64_t b = 0; b < block_bytes; b += 64) bytes[b] = static_cast<char>(i + b);
    BlockRecordIdentity identity{.hash = Hash128{static_cast<uint64_t>(i) + 1, space},
                                 .parent_hash = parent,
                                 .namespace_digest = space,
                                 .extras_digest = 0,
                                 .tokens = std::vector<uint32_t>(16, static_cast<uint32_t>(i)),
                                 .checksum = BlockChecksum(bytes.data(), bytes.size()),
                                 .tenant = "bench"};
    parent = identity.hash;
    chain.identities.push_back(std::move(identity));
    chain.bytes.push_back(std::move(bytes));
  }
  return chain;
}

// Stores `chain` into `tier` in batches of `batch` records; the seconds it took.
double StoreInBatches(ClusterTier& tier, const Chain& chain, size_t batch) {
  const absl::Time start = absl::Now();
  for (size_t first = 0; first < chain.identities.size(); first += batch) {
    std::vector<ClusterTier::Record> records;
    for (size_t i = first; i < std::min(chain.identities.size(), first + batch); ++i) {
      records.push_back(ClusterTier::Record{chain.identities[i], chain.bytes[i]});
    }
    CheckAllOk(tier.Store(records), "ClusterTier::Store");
  }
  return absl::ToDoubleSeconds(absl::Now() - start);
}

// A chain of `blocks` records of `block_bytes`, stored into `tier`.
std::vector<BlockRecordIdentity> StoreChain(ClusterTier& tier, uint64_t block_bytes, int blocks) {
  Chain chain = MakeChain(block_bytes, blocks, 42);
  StoreInBatches(tier, chain, 1);
  return std::move(chain.identities);
}

// The mover's batch (cache/lower_tiers.h kOffloadBatch): what one ClusterTier::Store call carries.
constexpr size_t kMoverBatch = 8;

// Stores as the mover sends them, batches of kMoverBatch records: the tier's Store vs SETs of
// values of the same sizes and key layout (a head and, when split, a tail under one hash tag)
// in one RedisCluster::Set per batch — one pipeline per node, the floor for a batch. Alternating
// rounds; the median ratio of the tier's throughput to the floor's.
void MeasureStores(const RedisClusterProcess& redis, RedisCluster& cluster, uint64_t block_bytes,
                   int blocks, int rounds) {
  FlushAll(redis);
  std::unique_ptr<ClusterTier> tier = MakeTier(redis, block_bytes, true);
  std::unique_ptr<ClusterTier> sealed = MakeTier(redis, block_bytes, true, BenchKeyring());
  const Chain chain = MakeChain(block_bytes, blocks, 7);
  const uint64_t head_bytes = RecordHeaderBytes(16) + tier->HeadDataBytes();
  const uint64_t tail_bytes = block_bytes - tier->HeadDataBytes();
  std::vector<std::vector<std::pair<std::string, std::string>>> floor_batches;
  for (int first = 0; first < blocks; first += kMoverBatch) {
    auto& batch = floor_batches.emplace_back();
    for (int i = first; i < std::min<int>(blocks, first + kMoverBatch); ++i) {
      const std::string key = absl::StrCat("floor:{", i, "}");
      if (tail_bytes > 0) batch.emplace_back(key + ":t", std::string(tail_bytes, 't'));
      batch.emplace_back(key, std::string(head_bytes, 'h'));
    }
  }
  SealTaskShares();  // the stores' tasks from here
  std::vector<double> ratios, sealed_ratios;
  double tier_best = 1e9, floor_best = 1e9, sealed_best = 1e9;
  for (int round = 0; round < rounds; ++round) {
    double stored = 0, floor = 0, sealed_stored = 0;
    const auto run_floor = [&] {
      const absl::Time start = absl::Now();
      for (const auto& batch : floor_batches) CheckAllOk(cluster.Set(batch), "RedisCluster::Set");
      floor = absl::ToDoubleSeconds(absl::Now() - start);
    };
    // Each of the three goes first, second and third in turn.
    for (int step = 0; step < 3; ++step) {
      switch ((round + step) % 3) {
        case 0:
          run_floor();
          break;
        case 1:
          stored = StoreInBatches(*tier, chain, kMoverBatch);
          break;
        default:
          sealed_stored = StoreInBatches(*sealed, chain, kMoverBatch);
      }
    }
    ratios.push_back(floor / stored);
    sealed_ratios.push_back(stored / sealed_stored);
    tier_best = std::min(tier_best, stored);
    floor_best = std::min(floor_best, floor);
    sealed_best = std::min(sealed_best, sealed_stored);
  }
  std::sort(ratios.begin(), ratios.end());
  std::sort(sealed_ratios.begin(), sealed_ratios.end());
  std::printf(
      "store %d blocks of %llu bytes in batches of %zu: cluster tier %.0f blocks/s, one "
      "pipelined SET batch per batch (%s) %.0f blocks/s (best of %d); median ratio %.2fx\n",
      blocks, static_cast<unsigned long long>(block_bytes), kMoverBatch, blocks / tier_best,
      tail_bytes > 0 ? "head and tail" : "one value", blocks / floor_best, rounds,
      ratios[ratios.size() / 2]);
  std::printf(
      "store sealed (AES-256-GCM): %.0f blocks/s vs unsealed %.0f blocks/s (best of %d); median "
      "ratio %.2fx; %s\n",
      blocks / sealed_best, blocks / tier_best, rounds, sealed_ratios[sealed_ratios.size() / 2],
      SealTaskShares().c_str());
}

int Main(int argc, char** argv) {
  TuneMallocForBlockStreams();
  uint64_t block_bytes = 262144;
  int blocks = 400;
  int rounds = 9;
  if (argc > 1) (void)absl::SimpleAtoi(argv[1], &block_bytes);
  if (argc > 2) (void)absl::SimpleAtoi(argv[2], &blocks);
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
  bench::CheckOk(cluster.status(), "RedisCluster::Create");

  // Memory per byte stored, raw values: just under a size class, and on one.
  for (const uint64_t size : {uint64_t{262080}, uint64_t{262144}}) {
    FlushAll(**redis);
    const uint64_t before = UsedMemory(**redis);
    std::vector<std::pair<std::string, std::string>> entries;
    for (int i = 0; i < blocks; ++i) {
      entries.emplace_back(absl::StrCat("mem", size, ":", i), std::string(size, 'k'));
    }
    CheckAllOk((*cluster)->Set(entries), "RedisCluster::Set");
    std::printf(
        "memory: %d raw values of %llu bytes: %.3f bytes of used_memory per byte\n", blocks,
        static_cast<unsigned long long>(size),
        static_cast<double>(UsedMemory(**redis) - before) / (static_cast<double>(size) * blocks));
  }
  // Memory per KV byte, the tier's records of 32 KiB blocks (the default pool's).
  for (const bool fit : {false, true}) {
    FlushAll(**redis);
    const uint64_t before = UsedMemory(**redis);
    std::unique_ptr<ClusterTier> tier = MakeTier(**redis, 32 << 10, fit);
    StoreChain(*tier, 32 << 10, blocks);
    std::printf("memory: %d records of 32 KiB blocks, %s: %.3f bytes of used_memory per KV byte\n",
                blocks, fit ? "split to fit size classes" : "one value each",
                static_cast<double>(UsedMemory(**redis) - before) /
                    (static_cast<double>(32 << 10) * blocks));
  }

  MeasureStores(**redis, **cluster, block_bytes, blocks, rounds);

  // Loads: the tier (verified, copied out) vs raw pipelined GETs of the same values; and the
  // sealed tier (opened, decrypted) vs the tier, the same chain under its own names.
  FlushAll(**redis);
  std::unique_ptr<ClusterTier> tier = MakeTier(**redis, block_bytes, true);
  std::unique_ptr<ClusterTier> sealed = MakeTier(**redis, block_bytes, true, BenchKeyring());
  const std::vector<BlockRecordIdentity> identities = StoreChain(*tier, block_bytes, blocks);
  StoreChain(*sealed, block_bytes, blocks);
  std::map<int, std::vector<std::string>> keys_by_node;
  for (const BlockRecordIdentity& identity : identities) {
    std::vector<std::string> keys = {tier->KeyOf(identity)};
    if (tier->HeadDataBytes() < block_bytes) keys.push_back(keys[0] + ":t");
    for (const std::string& key : keys) {
      absl::StatusOr<int> node = (*redis)->NodeOfSlot(RedisCluster::KeySlot(key));
      bench::CheckOk(node.status(), "NodeOfSlot");
      keys_by_node[*node].push_back(key);
    }
  }
  std::map<int, redisContext*> contexts;
  for (const auto& [node, node_keys] : keys_by_node) {
    contexts[node] = redisConnect("127.0.0.1", (*redis)->port(node));
    if (contexts[node] == nullptr || contexts[node]->err != 0) {
      bench::Fail(absl::StrCat("cannot connect to node ", node));
    }
  }
  std::vector<std::string> out(identities.size(), std::string(block_bytes, '\0'));
  std::vector<uint8_t*> pointers;
  for (std::string& block : out) pointers.push_back(reinterpret_cast<uint8_t*>(block.data()));

  SealTaskShares();  // the loads' tasks from here
  std::vector<double> ratios, sealed_ratios;
  double tier_best = 1e9, raw_best = 1e9, sealed_best = 1e9;
  for (int round = 0; round < rounds; ++round) {
    uint64_t raw_bytes = 0;
    double raw = 0, loaded = 0, sealed_loaded = 0;
    const auto run_tier = [&](ClusterTier& which, double* seconds) {
      const absl::Time start = absl::Now();
      if (which.LoadPrefix(identities, pointers) != identities.size()) {
        bench::Fail("ClusterTier::LoadPrefix loaded a short prefix");
      }
      *seconds = absl::ToDoubleSeconds(absl::Now() - start);
    };
    // Each of the three goes first, second and third in turn.
    for (int step = 0; step < 3; ++step) {
      switch ((round + step) % 3) {
        case 0:
          raw = RawPipelinedGets(keys_by_node, contexts, &raw_bytes);
          break;
        case 1:
          run_tier(*tier, &loaded);
          break;
        default:
          run_tier(*sealed, &sealed_loaded);
      }
    }
    ratios.push_back(raw / loaded);  // the tier's throughput over the baseline's
    sealed_ratios.push_back(loaded / sealed_loaded);
    tier_best = std::min(tier_best, loaded);
    raw_best = std::min(raw_best, raw);
    sealed_best = std::min(sealed_best, sealed_loaded);
  }
  std::sort(ratios.begin(), ratios.end());
  std::sort(sealed_ratios.begin(), sealed_ratios.end());
  const double gb = static_cast<double>(block_bytes) * blocks / 1e9;
  std::printf(
      "load %d blocks of %llu bytes from a 3-master cluster: cluster tier (verified, copied out) "
      "%.2f GB/s, raw hiredis pipelined GETs of the same values %.2f GB/s (best of %d); median "
      "ratio %.2fx\n",
      blocks, static_cast<unsigned long long>(block_bytes), gb / tier_best, gb / raw_best, rounds,
      ratios[ratios.size() / 2]);
  std::printf(
      "load sealed (AES-256-GCM: opened, decrypted in place): %.2f GB/s vs unsealed %.2f GB/s "
      "(best of %d); median ratio %.2fx; %s\n",
      gb / sealed_best, gb / tier_best, rounds, sealed_ratios[sealed_ratios.size() / 2],
      SealTaskShares().c_str());
  if (sealed->counters().unopened != 0) bench::Fail("sealed values did not open");
  for (auto& [node, context] : contexts) redisFree(context);
  tier.reset();
  sealed.reset();
  cluster->reset();
  redis->reset();
  std::filesystem::remove_all(dir);
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) { return kvcache::Main(argc, argv); }
