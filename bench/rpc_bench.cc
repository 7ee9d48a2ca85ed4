// Control-plane rate and latency over gRPC: several concurrent clients on one channel to a real
// daemon on a Unix socket, measuring an empty RPC (Ping) and the sequence calls in the same run.
// Prints the ratio of each call's rate to Ping's. Usage: rpc_bench [seconds] [clients]
#include <grpcpp/create_channel.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/v1/kvcache.grpc.pb.h"
#include "server/daemon.h"

namespace kvcache {
namespace {

using Clock = std::chrono::steady_clock;

struct Samples {
  std::vector<double> latencies_us;
  uint64_t errors = 0;
};

struct Result {
  std::string name;
  double rate = 0;
  double mean_us = 0, p50_us = 0, p99_us = 0;
  uint64_t errors = 0;
};

Result Summarize(std::string name, std::vector<Samples> per_thread, double seconds) {
  Samples all;
  for (Samples& samples : per_thread) {
    all.latencies_us.insert(all.latencies_us.end(), samples.latencies_us.begin(),
                            samples.latencies_us.end());
    all.errors += samples.errors;
  }
  std::sort(all.latencies_us.begin(), all.latencies_us.end());
  Result result{.name = std::move(name), .errors = all.errors};
  if (all.latencies_us.empty()) return result;
  result.rate = all.latencies_us.size() / seconds;
  result.mean_us = std::accumulate(all.latencies_us.begin(), all.latencies_us.end(), 0.0) /
                   all.latencies_us.size();
  result.p50_us = all.latencies_us[all.latencies_us.size() / 2];
  result.p99_us = all.latencies_us[all.latencies_us.size() * 99 / 100];
  return result;
}

// Runs `body(thread, samples)` on `clients` threads for `seconds`; body records one latency per
// RPC it makes.
template <typename Body>
std::vector<Samples> RunClients(int clients, double seconds, Body body) {
  std::vector<Samples> samples(clients);
  std::vector<std::thread> threads;
  const auto stop = Clock::now() + std::chrono::duration<double>(seconds);
  for (int i = 0; i < clients; ++i) {
    threads.emplace_back([&, i] {
      while (Clock::now() < stop) body(i, &samples[i]);
    });
  }
  for (std::thread& thread : threads) thread.join();
  return samples;
}

template <typename Call>
void Timed(Samples* samples, Call call) {
  const auto start = Clock::now();
  const grpc::Status status = call();
  samples->latencies_us.push_back(
      std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  if (!status.ok()) ++samples->errors;
}

int Main(double seconds, int clients) {
  char dir_template[] = "/tmp/kvcache-bench-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  DaemonOptions options;
  options.listen = "unix://" + dir + "/kv.sock";
  PoolOptions pool;
  pool.name = "bench";
  pool.model_id = "bench";
  pool.layout = PoolLayout{.num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_size = 16};
  pool.num_blocks = 1 << 16;
  options.pools.push_back(pool);
  auto daemon = Daemon::Start(options);
  if (!daemon.ok()) {
    std::fprintf(stderr, "daemon: %s\n", daemon.status().ToString().c_str());
    return 1;
  }
  auto channel = grpc::CreateChannel(options.listen, grpc::InsecureChannelCredentials());
  auto stub = v1::KvCache::NewStub(channel);

  std::vector<uint64_t> sessions;
  for (int i = 0; i < clients; ++i) {
    grpc::ClientContext context;
    v1::OpenSessionRequest request;
    request.set_ttl_ms(600000);
    v1::OpenSessionResponse response;
    if (!stub->OpenSession(&context, request, &response).ok()) return 1;
    sessions.push_back(response.session_id());
  }

  // Warm the channel so connection setup is not measured.
  RunClients(clients, 0.2, [&](int, Samples* samples) {
    Timed(samples, [&] {
      grpc::ClientContext context;
      v1::PingResponse response;
      return stub->Ping(&context, v1::PingRequest(), &response);
    });
  });

  const Result ping =
      Summarize("Ping (empty)",
                RunClients(clients, seconds,
                           [&](int, Samples* s) {
                             Timed(s, [&] {
                               grpc::ClientContext context;
                               v1::PingResponse response;
                               return stub->Ping(&context, v1::PingRequest(), &response);
                             });
                           }),
                seconds);

  // 256-token prompts (16 blocks); half of each prompt is a prefix shared by every client.
  std::vector<Samples> open_samples(clients), commit_samples(clients), release_samples(clients);
  std::vector<uint32_t> counters(clients, 0);
  RunClients(clients, seconds, [&](int i, Samples*) {
    v1::OpenSequenceRequest open;
    open.set_session_id(sessions[i]);
    open.set_pool("bench");
    for (uint32_t t = 0; t < 128; ++t) open.add_tokens(t);
    for (uint32_t t = 0; t < 128; ++t)
      open.add_tokens(1000000 + i * 1000000 + counters[i] * 128 + t);
    ++counters[i];
    v1::OpenSequenceResponse opened;
    Timed(&open_samples[i], [&] {
      grpc::ClientContext context;
      return stub->OpenSequence(&context, open, &opened);
    });
    v1::CommitSequenceRequest commit;
    commit.set_session_id(sessions[i]);
    commit.set_sequence_id(opened.sequence_id());
    commit.set_num_written_tokens(256);
    Timed(&commit_samples[i], [&] {
      grpc::ClientContext context;
      v1::CommitSequenceResponse response;
      return stub->CommitSequence(&context, commit, &response);
    });
    v1::ReleaseSequenceRequest release;
    release.set_session_id(sessions[i]);
    release.set_sequence_id(opened.sequence_id());
    Timed(&release_samples[i], [&] {
      grpc::ClientContext context;
      v1::ReleaseSequenceResponse response;
      return stub->ReleaseSequence(&context, release, &response);
    });
  });
  std::vector<Result> results = {
      ping,
      Summarize("OpenSequence (256 tok)", open_samples, seconds),
      Summarize("CommitSequence", commit_samples, seconds),
      Summarize("ReleaseSequence", release_samples, seconds),
  };
  uint64_t loop_calls = 0;
  for (int i = 0; i < clients; ++i) {
    loop_calls += open_samples[i].latencies_us.size() + commit_samples[i].latencies_us.size() +
                  release_samples[i].latencies_us.size();
  }

  std::printf("control plane over gRPC: %d clients, one channel, unix socket, %.1f s per phase\n",
              clients, seconds);
  // With `clients` closed-loop callers, a call type's sustainable rate is clients / mean latency
  // (Little's law); for Ping that matches its measured rate.
  std::printf("%-24s %12s %12s %10s %10s %8s %7s\n", "call", "measured/s", "capacity/s", "p50 us",
              "p99 us", "vs Ping", "errors");
  const double ping_capacity = clients / (ping.mean_us * 1e-6);
  for (const Result& r : results) {
    const double capacity = clients / (r.mean_us * 1e-6);
    std::printf("%-24s %12.0f %12.0f %10.1f %10.1f %7.2fx %7llu\n", r.name.c_str(), r.rate,
                capacity, r.p50_us, r.p99_us, capacity / ping_capacity,
                static_cast<unsigned long long>(r.errors));
  }
  std::printf("%-24s %12.0f %12s %10s %10s %7.2fx\n", "open+commit+release mix",
              loop_calls / seconds, "", "", "", loop_calls / seconds / ping.rate);
  (*daemon)->Shutdown();
  rmdir(dir.c_str());
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 3.0;
  const int clients = argc > 2 ? std::atoi(argv[2]) : 4;
  return kvcache::Main(seconds, clients);
}
