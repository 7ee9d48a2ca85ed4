// Block byte bandwidth: PutBlocks / GetBlocks over a Unix socket and TCP loopback, next to a plain
// memcpy of the same bytes, Redis SET / GET of the same values (redis-server on loopback, started
// here), and a copy out of the shared-memory pool — all measured in one run.
// Usage: data_plane_bench [seconds per case]; data_plane_bench SECONDS PATH [unix|tcp] [layers]
// runs one path alone on blocks of `layers` layers (1, 4, 16, 32: 64 KiB to 2 MiB), for perf; PATH
// is client, visit, stub, put, redis (GET), redis-into or redis-set. Exits 1 at the first failed
// operation or wrong byte (bench/bench_run.h); KVCACHE_BENCH_SMOKE=1 runs the smallest block size
// only.
#include <fcntl.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/support/channel_arguments.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "bench/bench_run.h"
#include "bench/child_process.h"
#include "bench/interleaved_rates.h"
#include "bench/redis_peer.h"
#include "client/kv_cache_client.h"
#include "common/rpc/grpc_tuning.h"
#include "common/rpc/http2_tuning.h"
#include "common/rpc/malloc_tuning.h"
#include "kvcache/v1/kvcache.grpc.pb.h"

namespace kvcache {
namespace {

using bench::Bandwidth;
using bench::InterleavedRates;

constexpr uint64_t kBytesPerOp = 8 << 20;  // each put/get moves 8 MiB of whole blocks
constexpr uint32_t kChunkBytes = 2 << 20;
constexpr uint32_t kBlockSize = 16;
constexpr uint32_t kLayerCounts[] = {1, 4, 16, 32};  // 64 KiB, 256 KiB, 1 MiB, 2 MiB blocks
constexpr uint64_t kPoolBytes = 64 << 20;

PoolLayout LayoutFor(uint32_t layers) {
  // 8 KV heads * 128 dims * fp16 = 2 KiB per token per K or V; 64 KiB per layer per block.
  return PoolLayout{.num_layers = layers,
                    .num_kv_heads = 8,
                    .head_dim = 128,
                    .block_size = kBlockSize,
                    .dtype = DType::kFloat16};
}

// The daemon as deployed: a kvcache-manager process beside this one (in-process, its gRPC
// threads and this client's shared one poller, and the client's thread ran the daemon's writes).
class DaemonPeer {
 public:
  // `listen`: unix://PATH, or 127.0.0.1:PORT (then --insecure). The daemon logs to `log_path`.
  DaemonPeer(const std::string& listen, const std::string& log_path) {
    std::string pools;
    for (uint32_t layers : kLayerCounts) {
      absl::StrAppend(&pools, pools.empty() ? "" : ",", "l", layers, ":model=bench:layers=", layers,
                      ":kv_heads=8:head_dim=128:block_size=", kBlockSize,
                      ":dtype=fp16:bytes=", kPoolBytes);
    }
    std::vector<std::string> args = {bench::SiblingBinary("kvcache-manager"), "--listen=" + listen,
                                     "--pool=" + pools, "--session_ttl=10m"};
    if (!absl::StartsWith(listen, "unix:")) args.push_back("--insecure");
    ClientOptions client_options;
    client_options.max_message_bytes = 64 << 20;
    absl::StatusOr<bench::ChildProcess> daemon = bench::ChildProcess::Start(
        args,
        [&] {
          absl::StatusOr<std::unique_ptr<KvCacheClient>> client =
              KvCacheClient::Connect(listen, client_options);
          if (!client.ok() ||
              !(*client)->OpenSession("", "data_plane_bench", absl::Minutes(10)).ok()) {
            return false;
          }
          client_ = *std::move(client);
          return true;
        },
        log_path);
    if (!daemon.ok()) {
      std::fprintf(stderr, "kvcache-manager: %s\n", daemon.status().ToString().c_str());
      std::exit(1);
    }
    daemon_.emplace(*std::move(daemon));
    grpc::ChannelArguments args_for_stub;
    args_for_stub.SetMaxReceiveMessageSize(64 << 20);
    args_for_stub.SetMaxSendMessageSize(64 << 20);
    args_for_stub.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
    args_for_stub.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kHttp2WindowBytes);
    stub_ = v1::KvCache::NewStub(
        grpc::CreateCustomChannel(listen, grpc::InsecureChannelCredentials(), args_for_stub));
    grpc::ClientContext context;
    v1::OpenSessionRequest request;
    request.set_ttl_ms(600000);
    v1::OpenSessionResponse response;
    stub_->OpenSession(&context, request, &response);
    session_ = response.session_id();
  }

  // What a user of the client library gets: every block's checksum verified, the bytes in the
  // caller's buffer (reused, as the Redis client reuses its own).
  uint64_t ClientGet(const std::string& pool, const std::vector<uint32_t>& tokens,
                     std::string* buffer) {
    absl::StatusOr<KvCacheClient::GetInfo> got = client_->GetBlocksInto(
        pool, tokens, absl::MakeSpan(buffer->data(), buffer->size()), "", {}, kChunkBytes);
    return got.ok() ? got->num_blocks * got->block_bytes : 0;
  }

  // The copy-free client path: every block verified, each piece visited where gRPC received it
  // (as Redis's reply lands in its client's read buffer).
  uint64_t ClientVisit(const std::string& pool, const std::vector<uint32_t>& tokens) {
    uint64_t visited = 0;
    absl::StatusOr<KvCacheClient::GetInfo> got = client_->GetBlocksVisit(
        pool, tokens,
        [&visited](uint32_t, uint64_t, absl::string_view piece) {
          visited += piece.size();
          return absl::OkStatus();
        },
        "", {}, kChunkBytes);
    return got.ok() ? visited : 0;
  }

  // What a user of the client library does: every block's checksum computed here, and the bytes
  // sent from where they lie (lent to gRPC, not copied into messages).
  uint64_t Put(const std::string& pool, const std::vector<uint32_t>& tokens,
               const std::string& bytes) {
    absl::StatusOr<KvCacheClient::PutResult> put =
        client_->PutBlocks(pool, tokens, bytes, "", {}, kChunkBytes);
    return put.ok() ? bytes.size() : 0;
  }

  // Bytes land in one parsed message per chunk, as Redis replies land in one buffer per value;
  // `out`, when given, also collects them (for checking, not while measuring).
  uint64_t Get(const std::string& pool, const std::vector<uint32_t>& tokens,
               std::string* out = nullptr) {
    grpc::ClientContext context;
    v1::GetBlocksRequest request;
    request.set_session_id(session_);
    request.set_pool(pool);
    request.mutable_tokens()->Add(tokens.begin(), tokens.end());
    request.set_max_chunk_bytes(kChunkBytes);
    auto reader = stub_->GetBlocks(&context, request);
    v1::GetBlocksResponse response;
    uint64_t received = 0;
    if (out != nullptr) out->clear();
    while (reader->Read(&response)) {
      received += response.data().size();
      if (out != nullptr) out->append(response.data());
    }
    return reader->Finish().ok() ? received : 0;
  }

  // The hit blocks of `tokens` (plus one token so the whole prefix may hit), held open.
  std::vector<uint32_t> HitBlocks(const std::string& pool, std::vector<uint32_t> tokens) {
    tokens.push_back(7);
    grpc::ClientContext context;
    v1::OpenSequenceRequest request;
    request.set_session_id(session_);
    request.set_pool(pool);
    request.mutable_tokens()->Add(tokens.begin(), tokens.end());
    v1::OpenSequenceResponse response;
    stub_->OpenSequence(&context, request, &response);
    const uint32_t hits = response.num_cached_tokens() / kBlockSize;
    return {response.block_ids().begin(), response.block_ids().begin() + hits};
  }

  std::string ShmName(const std::string& pool) {
    grpc::ClientContext context;
    v1::DescribePoolRequest request;
    request.set_pool(pool);
    v1::DescribePoolResponse response;
    stub_->DescribePool(&context, request, &response);
    return response.pool().mapping().shm_name();
  }

 private:
  std::unique_ptr<KvCacheClient> client_;  // closed before the daemon stops
  std::optional<bench::ChildProcess> daemon_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  uint64_t session_ = 0;
};

void RunTransport(const std::string& name, const std::string& listen, bool unix_socket,
                  const std::string& dir, double seconds) {
  DaemonPeer daemon(listen, dir + "/kvcache-manager.log");
  auto redis = bench::RedisPeer::Start(dir, 46379, unix_socket);
  if (!redis.ok()) std::printf("(redis skipped: %s)\n", redis.status().ToString().c_str());
  std::mt19937 rng(1);
  for (uint32_t layers : kLayerCounts) {
    if (bench::SmokeRun() && layers != kLayerCounts[0]) break;
    const uint64_t block_bytes = LayoutFor(layers).BlockBytes();
    const size_t blocks = kBytesPerOp / block_bytes;
    const std::string pool = "l" + std::to_string(layers);
    std::string bytes(blocks * block_bytes, '\0');
    for (char& byte : bytes) byte = static_cast<char>(rng());
    std::vector<std::string> keys, values;
    for (size_t i = 0; i < blocks; ++i) {
      keys.push_back("block:" + std::to_string(i));
      values.push_back(bytes.substr(i * block_bytes, block_bytes));
    }
    uint32_t next_token = 1;
    auto fresh_tokens = [&] {
      std::vector<uint32_t> tokens(blocks * kBlockSize);
      for (uint32_t& token : tokens) token = next_token++;
      return tokens;
    };
    const std::vector<uint32_t> cached = fresh_tokens();
    daemon.Put(pool, cached, bytes);
    std::string received;
    daemon.Get(pool, cached, &received);
    if (received != bytes) bench::Fail("GetBlocks returned different bytes");
    // The same-node path: map the pool and copy the cached blocks out of it.
    const std::vector<uint32_t> hit_blocks = daemon.HitBlocks(pool, cached);
    if (hit_blocks.size() != blocks) bench::Fail("not every block put was hit");
    const int fd = shm_open(daemon.ShmName(pool).c_str(), O_RDONLY, 0);
    const size_t pool_bytes = kPoolBytes / block_bytes * block_bytes;
    const auto* base = static_cast<const char*>(
        mmap(nullptr, pool_bytes, PROT_READ, MAP_SHARED | MAP_POPULATE, fd, 0));
    close(fd);
    if (base == MAP_FAILED) bench::Fail("cannot map the pool " + daemon.ShmName(pool));
    // Page-aligned, as the pool's blocks are: with malloc's 16-byte offset, destination and
    // source sit 16 bytes apart modulo 4 KiB, and every store aliases the next loads (4K
    // aliasing), which had the first table row's copies at a third of memcpy's rate.
    const std::unique_ptr<char, decltype(&std::free)> copy_buffer(
        static_cast<char*>(std::aligned_alloc(4096, bytes.size())), &std::free);
    const absl::Span<char> copy(copy_buffer.get(), bytes.size());
    std::memset(copy.data(), 0, copy.size());
    std::string scratch;
    std::string client_buffer(bytes.size(), '\0');
    std::string redis_buffer(bytes.size(), '\0');
    if (redis.ok() && (*redis)->SetAll(keys, values).ok() &&
        (*redis)->GetAllInto(keys, absl::MakeSpan(redis_buffer)).ok() && redis_buffer != bytes) {
      bench::Fail("Redis returned different bytes");
    }
    auto unavailable = [] { return uint64_t{1}; };  // keeps a missing Redis from stalling the loop
    // In the order of the ops below.
    enum Op {
      kPut,
      kGet,
      kStubGet,
      kVisit,
      kRedisSet,
      kRedisGet,
      kRedisGetInto,
      kMemcpy,
      kShmCopy
    };
    const InterleavedRates rates(
        seconds, 5,
        {
            [&] { return daemon.Put(pool, fresh_tokens(), bytes); },
            [&] { return daemon.ClientGet(pool, cached, &client_buffer); },
            [&] { return daemon.Get(pool, cached); },
            [&] { return daemon.ClientVisit(pool, cached); },
            redis.ok() ? std::function<uint64_t()>(
                             [&] { return (*redis)->SetAll(keys, values).ok() ? bytes.size() : 0; })
                       : unavailable,
            redis.ok() ? std::function<uint64_t()>(
                             [&] { return (*redis)->GetAll(keys, &scratch).value_or(0); })
                       : unavailable,
            redis.ok() ? std::function<uint64_t()>([&] {
              return (*redis)->GetAllInto(keys, absl::MakeSpan(redis_buffer)).value_or(0);
            })
                       : unavailable,
            [&] {
              std::memcpy(copy.data(), bytes.data(), bytes.size());
              return bytes.size();
            },
            [&] {
              for (size_t i = 0; i < hit_blocks.size(); ++i) {
                std::memcpy(copy.data() + i * block_bytes, base + hit_blocks[i] * block_bytes,
                            block_bytes);
              }
              return hit_blocks.size() * block_bytes;
            },
        });
    if (std::memcmp(copy.data(), bytes.data(), bytes.size()) != 0) {
      bench::Fail("shared-memory blocks differ from what was put");
    }
    munmap(const_cast<char*>(base), pool_bytes);
    const bool with_redis = redis.ok();
    std::printf(
        "%-5s %5llu KiB %8.2f %8.2f %8.2f %8.2f %9.2f %9.2f %8.2f %7.2fx %7.2fx %7.2fx %8.2f "
        "%8.2f %6.2fx\n",
        name.c_str(), static_cast<unsigned long long>(block_bytes >> 10), rates.Median(kPut),
        rates.Median(kGet), rates.Median(kVisit), rates.Median(kStubGet),
        with_redis ? rates.Median(kRedisSet) : 0, with_redis ? rates.Median(kRedisGet) : 0,
        with_redis ? rates.Median(kRedisGetInto) : 0, with_redis ? rates.Ratio(kPut, kRedisSet) : 0,
        with_redis ? rates.Ratio(kGet, kRedisGetInto) : 0,
        with_redis ? rates.Ratio(kVisit, kRedisGet) : 0, rates.Median(kMemcpy),
        rates.Median(kShmCopy), rates.Ratio(kShmCopy, kMemcpy));
  }
}

// Runs one path (a get, the put, or a Redis GET or SET) on blocks of `layers` layers (64 KiB
// each) over the Unix socket (or TCP loopback) for `seconds`, for perf record and perf stat.
bool ProfileGet(const std::string& path, bool unix_socket, uint32_t layers, const std::string& dir,
                double seconds) {
  const std::string listen = unix_socket ? "unix://" + dir + "/kv.sock" : "127.0.0.1:46380";
  DaemonPeer daemon(listen, dir + "/kvcache-manager.log");
  const uint64_t block_bytes = LayoutFor(layers).BlockBytes();
  const size_t blocks = kBytesPerOp / block_bytes;
  const std::string pool = "l" + std::to_string(layers);
  std::string bytes(blocks * block_bytes, '\x5a');
  std::vector<uint32_t> tokens(blocks * kBlockSize);
  std::iota(tokens.begin(), tokens.end(), 1);
  daemon.Put(pool, tokens, bytes);
  std::string buffer(bytes.size(), '\0');
  std::unique_ptr<bench::RedisPeer> redis;
  std::vector<std::string> keys, values;
  const bool with_redis = absl::StartsWith(path, "redis");
  if (with_redis) {
    absl::StatusOr<std::unique_ptr<bench::RedisPeer>> started =
        bench::RedisPeer::Start(dir, 46379, unix_socket);
    if (!started.ok()) {
      std::fprintf(stderr, "redis: %s\n", started.status().ToString().c_str());
      return false;
    }
    redis = *std::move(started);
    for (size_t i = 0; i < blocks; ++i) {
      keys.push_back("block:" + std::to_string(i));
      values.push_back(bytes.substr(i * block_bytes, block_bytes));
    }
    (void)redis->SetAll(keys, values);
  }
  const double rate = Bandwidth(seconds, [&] {
    if (path == "redis") return redis->GetAll(keys, &buffer).value_or(0);
    if (path == "redis-into") return redis->GetAllInto(keys, absl::MakeSpan(buffer)).value_or(0);
    if (path == "redis-set") return redis->SetAll(keys, values).ok() ? bytes.size() : 0;
    if (path == "client") return daemon.ClientGet(pool, tokens, &buffer);
    if (path == "visit") return daemon.ClientVisit(pool, tokens);
    if (path == "put") {
      for (uint32_t& token : tokens) token += tokens.size();  // fresh blocks each time
      return daemon.Put(pool, tokens, bytes);
    }
    return daemon.Get(pool, tokens);
  });
  std::printf("%s: %.2f GB/s\n", path.c_str(), rate);
  return true;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  kvcache::TuneGrpcForBlockStreams();  // as a client that streams blocks should
  kvcache::TuneMallocForBlockStreams();
  char dir_template[] = "/tmp/kvcache-dataplane-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  if (argc >
      2) {  // one path alone, for a profiler: data_plane_bench SECONDS PATH [unix|tcp] [layers]
    const uint32_t layers = argc > 4 ? std::atoi(argv[4]) : kvcache::kLayerCounts[3];
    if (std::find(std::begin(kvcache::kLayerCounts), std::end(kvcache::kLayerCounts), layers) ==
        std::end(kvcache::kLayerCounts)) {
      std::fprintf(stderr, "layers: one of 1, 4, 16, 32 (64 KiB to 2 MiB blocks)\n");
      return 2;
    }
    const bool ran = kvcache::ProfileGet(argv[2], argc < 4 || std::string(argv[3]) != "tcp", layers,
                                         dir, seconds);
    std::string cleanup = "rm -rf " + dir;
    return system(cleanup.c_str()) == 0 && ran ? 0 : 1;
  }
  std::printf(
      "8 MiB of whole blocks per operation, %u KiB chunks; GB/s (1e9 bytes/s), each the\n"
      "median of 5 slices interleaved with the others; each ratio (x) the median of the\n"
      "5 rounds' ratios of side-by-side slices; kvcache-manager and redis-server\n"
      "run as processes. put: KvCacheClient::PutBlocks (checksums computed, bytes lent\n"
      "to gRPC). get: KvCacheClient::GetBlocksInto\n"
      "(every block's checksum verified, the bytes copied into the caller's buffer);\n"
      "visit: KvCacheClient::GetBlocksVisit (every block verified, the bytes left where\n"
      "gRPC received them); stub get: the typed stub, bytes left in the parsed messages,\n"
      "nothing verified. redis GET: each value read into one reused buffer (compare\n"
      "visit); GET into: the values read one after another into the prompt's buffer\n"
      "(compare get)\n",
      kvcache::kChunkBytes >> 10);
  std::printf("%-5s %9s %8s %8s %8s %8s %9s %9s %8s %8s %8s %8s %8s %8s %7s\n", "via", "block",
              "put", "get", "visit", "stub get", "redis SET", "redis GET", "GET into", "put/SET",
              "get/into", "visit/GET", "memcpy", "shm copy", "shm/mc");
  kvcache::RunTransport("unix", "unix://" + dir + "/kv.sock", true, dir, seconds);
  kvcache::RunTransport("tcp", "127.0.0.1:46380", false, dir, seconds);
  std::string cleanup = "rm -rf " + dir;
  return system(cleanup.c_str()) == 0 ? 0 : 1;
}
