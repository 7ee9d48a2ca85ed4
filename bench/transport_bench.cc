// Host transport bandwidth: shipping blocks from one daemon's pool to another's with the shm
// transport (same node) and the stream transport (PutBlocks), per block size, next to a memcpy of
// the same bytes in the same run. Then the nccl transport's copy on one GPU: a single-rank NCCL
// channel's SelfCopyBlocks from one device buffer into another (as the transport copies from the
// sender's pool into the receiver's), next to cudaMemcpyAsync device-to-device of the same blocks
// on the same stream; skipped with a message without a GPU or in a build without NCCL. (The
// whole nccl Ship needs daemons in other processes, since a process cannot map its own CUDA IPC
// handles; the block copy is what moves the bytes.) The receiving daemon's clients authenticate
// as every client on a Unix socket does (the caller's own tenant, from its uid). Exits 1 at the
// first failed call (bench/bench_run.h); KVCACHE_BENCH_SMOKE=1 runs one small block size.
// Usage: transport_bench [seconds per case]
#include <stdlib.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <optional>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_run.h"
#include "bench/child_process.h"
#include "common/rpc/grpc_tuning.h"
#include "common/rpc/malloc_tuning.h"
#include "server/daemon.h"
#include "transfer/block_transport.h"

#if KVCACHE_TRANSPORT_BENCH_NCCL
#include <cuda_runtime_api.h>

#include <numeric>

#include "transfer/nccl_channel.h"
#include "transfer/nccl_transport.h"
#endif

namespace kvcache::worker {
namespace {

using Clock = std::chrono::steady_clock;
constexpr uint32_t kBlockSize = 16;
constexpr uint64_t kBytesPerShipment = 32 << 20;
// Device copies run at ~1.5 TB/s, so a 32 MiB copy mostly measures launch and sync latency.
constexpr uint64_t kBytesPerDeviceCopy = uint64_t{512} << 20;

// 64 KiB, 256 KiB, 1 MiB and 2 MiB blocks; a smoke run, the smallest only.
std::vector<uint32_t> LayerCounts() {
  return bench::FullOrSmoke<std::vector<uint32_t>>({1, 4, 16, 32}, {1});
}

PoolOptions Pool(uint32_t layers) {
  PoolOptions pool;
  pool.name = "p";
  pool.model_id = "bench";
  // 8 KV heads * 128 dims * fp16: 64 KiB per layer per block.
  pool.layout = PoolLayout{
      .num_layers = layers, .num_kv_heads = 8, .head_dim = 128, .block_size = kBlockSize};
  pool.num_blocks = static_cast<uint32_t>((256ull << 20) / pool.layout.BlockBytes());
  return pool;
}

double GBps(double seconds, const std::function<uint64_t()>& op) {
  op();  // warm up
  uint64_t bytes = 0;
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::duration<double>(seconds)) bytes += op();
  return bytes / std::chrono::duration<double>(Clock::now() - start).count() / 1e9;
}

// A node: a kvcache-manager process, as deployed, and a client with an open session.
struct Node {
  std::optional<bench::ChildProcess> daemon;
  std::unique_ptr<KvCacheClient> client;  // destroyed before the daemon stops
};

Node StartNode(const std::string& dir, const std::string& name, uint32_t layers) {
  const std::string listen = "unix://" + dir + "/" + name + ".sock";
  const PoolOptions pool = Pool(layers);
  const std::string pool_flag =
      absl::StrCat("--pool=", pool.name, ":model=", pool.model_id, ":layers=", layers,
                   ":kv_heads=", pool.layout.num_kv_heads, ":head_dim=", pool.layout.head_dim,
                   ":block_size=", pool.layout.block_size, ":blocks=", pool.num_blocks);
  Node node;
  absl::StatusOr<bench::ChildProcess> daemon = bench::ChildProcess::Start(
      {bench::SiblingBinary("kvcache-manager"), "--listen=" + listen, pool_flag,
       "--session_ttl=10m"},
      [&] {
        absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(listen);
        if (!client.ok() || !(*client)->OpenSession("", "transport_bench").ok()) return false;
        node.client = *std::move(client);
        return true;
      },
      dir + "/" + name + ".log");
  node.daemon.emplace(bench::ValueOrFail(std::move(daemon), "kvcache-manager"));
  return node;
}

void RunCase(const std::string& dir, uint32_t layers, double seconds) {
  Node sender = StartNode(dir, "a" + std::to_string(layers), layers);
  Node receiver = StartNode(dir, "b" + std::to_string(layers), layers);
  auto source = bench::ValueOrFail(
      MappedPool::Map(bench::ValueOrFail(sender.client->DescribePool("p"), "DescribePool")),
      "MappedPool::Map");
  const uint64_t block_bytes = source->block_bytes();
  const uint32_t blocks = kBytesPerShipment / block_bytes;
  // The sender's sequence: blocks + 1 tokens' worth, its bytes random.
  std::vector<uint32_t> tokens(blocks * kBlockSize + 1);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = i;
  auto held = bench::ValueOrFail(sender.client->OpenSequence("p", tokens), "OpenSequence");
  std::mt19937 rng(layers);
  for (uint32_t i = 0; i < blocks; ++i) {
    uint8_t* block = source->Block(held.block_ids[i]);
    for (uint64_t b = 0; b < block_bytes; b += 64) block[b] = static_cast<uint8_t>(rng());
  }
  auto shm = bench::ValueOrFail(MakeShmTransport(receiver.client.get(), "p"), "MakeShmTransport");
  // "": the receiver's session's own tenant, as kvcache-worker's default --tenant; naming another
  // tenant is refused (PERMISSION_DENIED) to all but an admin.
  auto stream = MakeStreamTransport(receiver.client.get(), "", "p");
  uint32_t round = 0;
  // Fresh tokens each time (a new first token changes every hash), so every block is sent.
  auto ship = [&](BlockTransport& transport) -> uint64_t {
    std::vector<uint32_t> shipment_tokens = tokens;
    shipment_tokens[0] = 1000000 + ++round;
    return bench::ValueOrFail(transport.Ship(Shipment{.tokens = shipment_tokens,
                                                      .source = source.get(),
                                                      .source_blocks = held.block_ids}),
                              "Ship")
        .bytes_sent;
  };
  // The baseline copies the same bytes into destinations that rotate through a pool-sized buffer,
  // as shipments' blocks rotate through the receiver's pool: into one fixed 32 MiB buffer, source
  // and destination stayed in a large last-level cache (an H100 host's 105 MiB), and the
  // baseline measured cache bandwidth against a transport that writes DRAM.
  const uint64_t pool_bytes = uint64_t{Pool(layers).num_blocks} * block_bytes;
  std::vector<uint8_t> from(blocks * block_bytes, 1), to(pool_bytes, 0);
  uint64_t next_slot = 0;
  const double memcpy_rate = GBps(seconds, [&] {
    if ((next_slot + 1) * from.size() > to.size()) next_slot = 0;
    std::memcpy(to.data() + next_slot++ * from.size(), from.data(), from.size());
    return from.size();
  });
  const double shm_rate = GBps(seconds, [&] { return ship(*shm); });
  const double stream_rate = GBps(seconds, [&] { return ship(*stream); });
  std::printf("%6llu KiB %6u %10.2f %10.2f %7.2fx %10.2f %7.2fx\n",
              static_cast<unsigned long long>(block_bytes >> 10), blocks, memcpy_rate, shm_rate,
              shm_rate / memcpy_rate, stream_rate, stream_rate / memcpy_rate);
  bench::CheckOk(sender.client->ReleaseSequence(held.sequence_id), "ReleaseSequence");
}

#if KVCACHE_TRANSPORT_BENCH_NCCL
void CheckCuda(cudaError_t error, const char* what) {
  if (error != cudaSuccess) bench::Fail(what, absl::InternalError(cudaGetErrorString(error)));
}

// One block size: 512 MiB of blocks copied block by block, NCCL self-send vs cudaMemcpyAsync.
void RunNcclCase(NcclChannel& channel, uint32_t layers, double seconds) {
  const uint64_t block_bytes = Pool(layers).layout.BlockBytes();
  const uint32_t blocks = kBytesPerDeviceCopy / block_bytes;
  const uint64_t bytes = uint64_t{blocks} * block_bytes;
  uint8_t* from = nullptr;
  uint8_t* to = nullptr;
  CheckCuda(cudaMalloc(reinterpret_cast<void**>(&from), bytes), "cudaMalloc");
  CheckCuda(cudaMalloc(reinterpret_cast<void**>(&to), bytes), "cudaMalloc");
  CheckCuda(cudaMemset(from, 1, bytes), "cudaMemset");
  std::vector<uint32_t> ids(blocks);
  std::iota(ids.begin(), ids.end(), 0u);
  cudaStream_t stream = static_cast<cudaStream_t>(channel.stream());
  const double d2d_rate = GBps(seconds, [&]() -> uint64_t {
    for (uint32_t i = 0; i < blocks; ++i) {
      CheckCuda(cudaMemcpyAsync(to + uint64_t{i} * block_bytes, from + uint64_t{i} * block_bytes,
                                block_bytes, cudaMemcpyDeviceToDevice, stream),
                "cudaMemcpyAsync");
    }
    CheckCuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    return bytes;
  });
  const double nccl_rate = GBps(seconds, [&]() -> uint64_t {
    bench::CheckOk(channel.SelfCopyBlocks(from, to, block_bytes, ids, ids), "SelfCopyBlocks");
    bench::CheckOk(channel.Synchronize(absl::Seconds(60)), "NcclChannel::Synchronize");
    return bytes;
  });
  std::printf("%6llu KiB %6u %10.2f %10.2f %7.2fx\n",
              static_cast<unsigned long long>(block_bytes >> 10), blocks, d2d_rate, nccl_rate,
              nccl_rate / d2d_rate);
  cudaFree(from);
  cudaFree(to);
}
#endif

void RunNccl(const std::string& dir, double seconds) {
  std::printf(
      "\nnccl transport's copy on one GPU: 512 MiB of blocks per copy, a single-rank "
      "channel's send-to-self vs cudaMemcpy device-to-device; GB/s\n");
#if KVCACHE_TRANSPORT_BENCH_NCCL
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    cudaGetLastError();
    std::printf("nccl: skipped (no CUDA device)\n");
    return;
  }
  // The channel's NCCL id is published through a daemon session, as the worker's is.
  Node node = StartNode(dir, "nccl", 1);
  absl::StatusOr<std::unique_ptr<NcclChannel>> channel = NcclChannel::Connect(
      node.client.get(), FreshRendezvousKey("transport_bench"), 0, 1, 0, absl::Seconds(60));
  // A GPU is here: a channel that cannot start is an error, not a skip.
  bench::CheckOk(channel.status(), "NcclChannel::Connect");
  bench::CheckOk((*channel)->Warm(0, absl::Seconds(60)), "NcclChannel::Warm");
  std::printf("%10s %6s %10s %10s %8s\n", "block", "blocks", "d2d", "nccl", "nccl/d2d");
  for (uint32_t layers : LayerCounts()) RunNcclCase(**channel, layers, seconds);
#else
  std::printf("nccl: skipped (built without CUDA or NCCL)\n");
#endif
}

}  // namespace
}  // namespace kvcache::worker

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  kvcache::TuneGrpcForBlockStreams();  // as the workers do
  kvcache::TuneMallocForBlockStreams();
  char dir[] = "/tmp/kvcache-transport-bench-XXXXXX";
  const std::string run_dir = mkdtemp(dir);
  std::printf(
      "32 MiB of blocks per shipment between two kvcache-manager processes on this node; GB/s\n");
  std::printf("%10s %6s %10s %10s %8s %10s %8s\n", "block", "blocks", "memcpy", "shm", "shm/mc",
              "stream", "str/mc");
  for (uint32_t layers : kvcache::worker::LayerCounts()) {
    kvcache::worker::RunCase(run_dir, layers, seconds);
  }
  kvcache::worker::RunNccl(run_dir, seconds);
  std::filesystem::remove_all(run_dir);  // the daemons' sockets and logs
  return 0;
}
