// Control-plane rate and latency over gRPC: several concurrent clients on one channel to a real
// daemon on a Unix socket, measuring an empty RPC (Ping) and the sequence calls in the same run.
// Prints the ratio of each call's rate to Ping's. Then the cost of being watched: the same calls
// against a daemon that records no KV events and serves no metrics (the baseline) and against
// one with KV events recorded and streamed to a WatchEvents watcher and to a ZeroMQ subscriber,
// and /metrics scraped every 100 ms, alternated over several rounds, with the median ratio of their
// call rates (the issue's bar: >= 0.9x). Usage: rpc_bench [seconds] [clients]
#include <arpa/inet.h>
#include <grpcpp/create_channel.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
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

// One GET of http://HOST:PORT/metrics; the bytes read.
size_t ScrapeOnce(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(std::atoi(host_port.c_str() + colon + 1)));
  inet_pton(AF_INET, host_port.substr(0, colon).c_str(), &address.sin_addr);
  size_t total = 0;
  if (connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) == 0) {
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    if (write(fd, request.data(), request.size()) > 0) {
      char buffer[65536];
      ssize_t n;
      while ((n = read(fd, buffer, sizeof(buffer))) > 0) total += n;
    }
  }
  close(fd);
  return total;
}

double ProcessCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_utime.tv_sec + usage.ru_stime.tv_sec +
         (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1e-6;
}

struct SuiteResult {
  std::vector<Result> results;
  double mix_rate = 0;
  uint64_t events_watched = 0;
  uint64_t zmq_messages = 0;
  // Calls per CPU second of this whole process (daemon, clients, observers): what being watched
  // costs, unmoved by other tenants of the machine taking its cores.
  double calls_per_cpu_second = 0;
  uint64_t scrapes = 0;
};

// The calls against a fresh daemon; `observed`: KV events recorded and watched, /metrics on and
// scraped.
// Which observers the watched daemon has: KVCACHE_BENCH_OBSERVE, a comma-separated subset of
// metrics,events,watch,zmq (default: all), to tell what costs what.
bool Observes(absl::string_view part) {
  const char* parts = std::getenv("KVCACHE_BENCH_OBSERVE");
  if (parts == nullptr) return true;
  for (absl::string_view named : absl::StrSplit(parts, ',')) {
    if (named == part) return true;
  }
  return false;
}

SuiteResult RunSuite(double seconds, int clients, bool observed) {
  char dir_template[] = "/tmp/kvcache-bench-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  DaemonOptions options;
  options.listen = "unix://" + dir + "/kv.sock";
  options.record_kv_events = observed && Observes("events");
  if (observed && Observes("metrics")) options.metrics_listen = "127.0.0.1:0";
  if (observed && Observes("zmq")) {
    options.kv_events.endpoint = "ipc://" + dir + "/events.sock";
    options.kv_events.topic = "kv@bench@bench";
  }
  PoolOptions pool;
  pool.name = "bench";
  pool.model_id = "bench";
  pool.layout = PoolLayout{.num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_size = 16};
  pool.num_blocks = 1 << 16;
  options.pools.push_back(pool);
  auto daemon = Daemon::Start(options);
  if (!daemon.ok()) {
    std::fprintf(stderr, "daemon: %s\n", daemon.status().ToString().c_str());
    std::exit(1);
  }
  auto channel = grpc::CreateChannel(options.listen, grpc::InsecureChannelCredentials());
  auto stub = v1::KvCache::NewStub(channel);

  // The observers: a router's watcher on its own channel, and a Prometheus scraping often.
  SuiteResult suite;
  std::atomic<bool> stop_observers{false};
  std::vector<std::thread> observers;
  grpc::ClientContext watch_context;
  if (observed && Observes("watch")) {
    auto watch_channel = grpc::CreateChannel(options.listen, grpc::InsecureChannelCredentials());
    observers.emplace_back([&, watch_channel] {
      auto watch_stub = v1::KvCache::NewStub(watch_channel);
      auto reader = watch_stub->WatchEvents(&watch_context, v1::WatchEventsRequest());
      v1::WatchEventsResponse response;
      while (reader->Read(&response)) suite.events_watched += response.events_size();
      reader->Finish();
    });
  }
  if (observed && Observes("zmq")) {
    observers.emplace_back([&, endpoint = options.kv_events.endpoint] {
      zmq::context_t context;
      zmq::socket_t sub(context, zmq::socket_type::sub);
      sub.set(zmq::sockopt::subscribe, "kv@");
      sub.set(zmq::sockopt::rcvtimeo, 100);
      sub.connect(endpoint);
      while (!stop_observers.load()) {
        std::vector<zmq::message_t> frames;
        if (zmq::recv_multipart(sub, std::back_inserter(frames))) ++suite.zmq_messages;
      }
    });
  }
  if (observed && Observes("metrics")) {
    const std::string metrics_address = (*daemon)->metrics_address();
    observers.emplace_back([&, metrics_address] {
      while (!stop_observers.load()) {
        if (ScrapeOnce(metrics_address) > 0) ++suite.scrapes;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }

  std::vector<uint64_t> sessions;
  for (int i = 0; i < clients; ++i) {
    grpc::ClientContext context;
    v1::OpenSessionRequest request;
    request.set_ttl_ms(600000);
    v1::OpenSessionResponse response;
    if (!stub->OpenSession(&context, request, &response).ok()) std::exit(1);
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
  const double cpu_before = ProcessCpuSeconds();
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
  suite.results = {
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
  suite.mix_rate = loop_calls / seconds;
  suite.calls_per_cpu_second = loop_calls / (ProcessCpuSeconds() - cpu_before);
  stop_observers = true;
  watch_context.TryCancel();
  for (std::thread& observer : observers) observer.join();
  (*daemon)->Shutdown();
  rmdir(dir.c_str());
  return suite;
}

int Main(double seconds, int clients, int rounds) {
  const SuiteResult plain = RunSuite(seconds, clients, false);
  const std::vector<Result>& results = plain.results;
  const Result& ping = results[0];

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
  std::printf("%-24s %12.0f %12s %10s %10s %7.2fx\n", "open+commit+release mix", plain.mix_rate, "",
              "", "", plain.mix_rate / ping.rate);

  // Watched vs not, alternated (off-on, then on-off) so that drift in the machine's speed hits
  // both alike; the verdict is the median of the rounds' ratios, which one noisy phase cannot
  // move.
  std::printf("\nKV events + metrics on vs off (open+commit+release mix, calls/s)\n");
  std::printf("%-6s %10s %10s %7s %12s %12s %7s %9s %9s %8s\n", "round", "off", "on", "on/off",
              "off/cpu-s", "on/cpu-s", "on/off", "watched", "zmq msgs", "scrapes");
  std::vector<double> ratios, cpu_ratios;
  double off_total = 0, on_total = 0;
  for (int round = 1; round <= rounds; ++round) {
    SuiteResult on, off;
    if (round % 2 == 1) {
      off = round == 1 ? plain : RunSuite(seconds, clients, false);
      on = RunSuite(seconds, clients, true);
    } else {
      on = RunSuite(seconds, clients, true);
      off = RunSuite(seconds, clients, false);
    }
    off_total += off.mix_rate;
    on_total += on.mix_rate;
    ratios.push_back(on.mix_rate / off.mix_rate);
    cpu_ratios.push_back(on.calls_per_cpu_second / off.calls_per_cpu_second);
    std::printf("%-6d %10.0f %10.0f %6.2fx %12.0f %12.0f %6.2fx %9llu %9llu %8llu\n", round,
                off.mix_rate, on.mix_rate, ratios.back(), off.calls_per_cpu_second,
                on.calls_per_cpu_second, cpu_ratios.back(),
                static_cast<unsigned long long>(on.events_watched),
                static_cast<unsigned long long>(on.zmq_messages),
                static_cast<unsigned long long>(on.scrapes));
  }
  std::sort(ratios.begin(), ratios.end());
  std::sort(cpu_ratios.begin(), cpu_ratios.end());
  std::printf("%-6s %10.0f %10.0f %6.2fx\n", "total", off_total, on_total, on_total / off_total);
  std::printf("median of the rounds' on/off ratios: calls/s %.2fx, calls per CPU second %.2fx\n",
              ratios[ratios.size() / 2], cpu_ratios[cpu_ratios.size() / 2]);
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  // As kvcache-manager runs (manager_main.cc): Debian's abseil otherwise checks every Mutex
  // acquisition against a global lock graph, a cost the daemon does not pay.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const double seconds = argc > 1 ? std::atof(argv[1]) : 3.0;
  const int clients = argc > 2 ? std::atoi(argv[2]) : 4;
  const int rounds = argc > 3 ? std::max(1, std::atoi(argv[3])) : 5;
  return kvcache::Main(seconds, clients, rounds);
}
