// Control-plane rate and latency over gRPC: several concurrent clients on one channel to a real
// daemon on a Unix socket, measuring an empty RPC (Ping) and the sequence calls in the same run,
// in turns of short phases. Prints the ratio of each call's rate to Ping's, and the median of the
// rounds' mix/Ping ratios (the bar: >= 0.9x). Then the cost of being watched: the same calls
// against a daemon that records no KV events and serves no metrics (the baseline) and against
// one with KV events recorded and streamed to a WatchEvents watcher and to a ZeroMQ subscriber,
// and /metrics scraped every 100 ms: both daemons live side by side and are measured in turn, in
// short phases over many rounds, with the median ratio of their call rates (the bar:
// >= 0.9x). Last, the same mix against a small, evicting pool with a host tier (tier 2: its mover
// and every open's probe) vs without (the bar: >= 0.9x), then with tiers 2 and 3 (the mover
// passing tier 2's oldest records on to a disk file as fast as the pool evicts). Usage: rpc_bench
// [seconds] [clients] [rounds] [mix: only the mix vs Ping | observed: only events+metrics on vs
// off | tier: only the tier comparisons | alone-NAME: one daemon of MakeDaemon's alone, for a
// profiler]. Exits 1 when any call failed (bench/bench_run.h);
// KVCACHE_BENCH_SMOKE=1 lets phases be shorter than 0.25 s.
#include <arpa/inet.h>
#include <grpcpp/create_channel.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_run.h"
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

// Every failed call of the run, for the exit status: a rate of failed calls is no figure.
std::atomic<uint64_t> failed_calls{0};

template <typename Call>
void Timed(Samples* samples, Call call) {
  const auto start = Clock::now();
  const grpc::Status status = call();
  samples->latencies_us.push_back(
      std::chrono::duration<double, std::micro>(Clock::now() - start).count());
  if (status.ok()) return;
  ++samples->errors;
  if (failed_calls++ == 0) {
    std::fprintf(stderr, "first failed call: %d %s\n", static_cast<int>(status.error_code()),
                 status.error_message().c_str());
  }
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

// A daemon in this process, on its own socket, with `clients` sessions on one channel; when
// `observed`, KV events are recorded and streamed to a WatchEvents watcher and to a ZeroMQ
// subscriber, and /metrics is scraped every 100 ms while the daemon is measured.
class BenchDaemon {
 public:
  // `host_tier_bytes` > 0: the pool has a tier 2 of that size, and `pool_blocks` blocks;
  // `disk_tier_bytes` > 0: a disk tier below it, in the daemon's temp folder.
  BenchDaemon(int clients, bool observed, uint64_t host_tier_bytes = 0,
              uint32_t pool_blocks = 1 << 16, uint64_t disk_tier_bytes = 0)
      : clients_(clients) {
    char dir_template[] = "/tmp/kvcache-bench-XXXXXX";
    dir_ = mkdtemp(dir_template);
    DaemonOptions options;
    options.listen = "unix://" + dir_ + "/kv.sock";
    options.record_kv_events = observed && Observes("events");
    if (observed && Observes("metrics")) options.metrics_listen = "127.0.0.1:0";
    if (observed && Observes("zmq")) {
      options.kv_events.endpoint = "ipc://" + dir_ + "/events.sock";
      options.kv_events.topic = "kv@bench@bench";
    }
    PoolOptions pool;
    pool.name = "bench";
    pool.model_id = "bench";
    pool.layout = PoolLayout{.num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_size = 16};
    pool.num_blocks = pool_blocks;
    pool.host_tier_bytes = host_tier_bytes;
    if (disk_tier_bytes != 0) {
      pool.disk_tier_path = dir_ + "/bench.tier";
      pool.disk_tier_bytes = disk_tier_bytes;
    }
    options.pools.push_back(pool);
    auto daemon = Daemon::Start(options);
    if (!daemon.ok()) {
      std::fprintf(stderr, "daemon: %s\n", daemon.status().ToString().c_str());
      std::exit(1);
    }
    daemon_ = *std::move(daemon);
    stub_ = v1::KvCache::NewStub(
        grpc::CreateChannel(options.listen, grpc::InsecureChannelCredentials()));
    if (observed && Observes("watch")) StartWatcher(options.listen);
    if (observed && Observes("zmq")) StartSubscriber(options.kv_events.endpoint);
    if (observed && Observes("metrics")) StartScraper(daemon_->metrics_address());
    for (int i = 0; i < clients; ++i) {
      grpc::ClientContext context;
      v1::OpenSessionRequest request;
      request.set_ttl_ms(600000);
      v1::OpenSessionResponse response;
      const grpc::Status opened = stub_->OpenSession(&context, request, &response);
      if (!opened.ok()) bench::Fail("OpenSession: " + opened.error_message());
      sessions_.push_back(response.session_id());
    }
    counters_.assign(clients, 0);
  }

  ~BenchDaemon() {
    stop_observers_ = true;
    watch_context_.TryCancel();
    for (std::thread& observer : observers_) observer.join();
    daemon_->Shutdown();
    daemon_.reset();  // its pools close their disk tier's file
    std::filesystem::remove_all(dir_);
  }

  v1::KvCache::Stub& stub() { return *stub_; }

  struct Phase {
    double calls_per_second = 0;
    double calls_per_cpu_second = 0;  // this whole process's CPU: daemon, clients, observers
  };
  // `clients` threads run open+commit+release of 256-token prompts (half of each a prefix shared
  // by every client) for `seconds`; one latency sample per call into `samples` if given.
  Phase RunMix(double seconds, std::vector<Samples>* open_samples = nullptr,
               std::vector<Samples>* commit_samples = nullptr,
               std::vector<Samples>* release_samples = nullptr) {
    std::vector<Samples> open(clients_), commit(clients_), release(clients_);
    scraping_ = true;
    const double cpu_before = ProcessCpuSeconds();
    RunClients(clients_, seconds,
               [&](int i, Samples*) { OneRequest(i, &open[i], &commit[i], &release[i]); });
    const double cpu = ProcessCpuSeconds() - cpu_before;
    scraping_ = false;
    uint64_t calls = 0;
    for (int i = 0; i < clients_; ++i) {
      calls += open[i].latencies_us.size() + commit[i].latencies_us.size() +
               release[i].latencies_us.size();
    }
    if (open_samples != nullptr) *open_samples = std::move(open);
    if (commit_samples != nullptr) *commit_samples = std::move(commit);
    if (release_samples != nullptr) *release_samples = std::move(release);
    return Phase{.calls_per_second = calls / seconds, .calls_per_cpu_second = calls / cpu};
  }

  // The pool's tier-2 figures, when it has a tier 2.
  void PrintTier() {
    for (Pool* pool : daemon_->manager().pools()) {
      const PoolStatsSnapshot stats = pool->Stats();
      if (!stats.host_tier.has_value()) continue;
      std::printf(
          "tiered daemon: %llu evictions (%llu already in tier 2), %llu blocks stored, "
          "%llu tier-2 evictions, %llu tier-2 hits\n",
          static_cast<unsigned long long>(stats.pool.evictions),
          static_cast<unsigned long long>(stats.pool.evicted_offloaded),
          static_cast<unsigned long long>(stats.host_tier->store.stored),
          static_cast<unsigned long long>(stats.host_tier->store.evicted),
          static_cast<unsigned long long>(stats.host_tier->hit_blocks));
      if (!stats.disk_tier.has_value()) continue;
      std::printf(
          "disk tier: %llu records passed down, %llu durable in %llu syncs, %llu refused (queue "
          "full), %llu tier-2 evictions already on disk, %llu lost, %llu disk hits; tier 2 "
          "scanned %llu for demotion\n",
          static_cast<unsigned long long>(stats.disk_tier->demoted_blocks),
          static_cast<unsigned long long>(stats.disk_tier->store.stores_durable),
          static_cast<unsigned long long>(stats.disk_tier->store.syncs),
          static_cast<unsigned long long>(stats.disk_tier->store.stores_refused_full),
          static_cast<unsigned long long>(stats.disk_tier->evicted_from_above),
          static_cast<unsigned long long>(stats.disk_tier->evicted_unsaved),
          static_cast<unsigned long long>(stats.disk_tier->hit_blocks),
          static_cast<unsigned long long>(stats.host_tier->store.demotion_scanned));
    }
  }

  uint64_t events_watched() const { return events_watched_.load(); }
  uint64_t zmq_messages() const { return zmq_messages_.load(); }
  uint64_t scrapes() const { return scrapes_.load(); }

 private:
  void OneRequest(int i, Samples* open_samples, Samples* commit_samples, Samples* release_samples) {
    v1::OpenSequenceRequest open;
    open.set_session_id(sessions_[i]);
    open.set_pool("bench");
    for (uint32_t t = 0; t < 128; ++t) open.add_tokens(t);
    for (uint32_t t = 0; t < 128; ++t)
      open.add_tokens(1000000 + i * 1000000 + counters_[i] * 128 + t);
    ++counters_[i];
    v1::OpenSequenceResponse opened;
    Timed(open_samples, [&] {
      grpc::ClientContext context;
      return stub_->OpenSequence(&context, open, &opened);
    });
    v1::CommitSequenceRequest commit;
    commit.set_session_id(sessions_[i]);
    commit.set_sequence_id(opened.sequence_id());
    commit.set_num_written_tokens(256);
    Timed(commit_samples, [&] {
      grpc::ClientContext context;
      v1::CommitSequenceResponse response;
      return stub_->CommitSequence(&context, commit, &response);
    });
    v1::ReleaseSequenceRequest release;
    release.set_session_id(sessions_[i]);
    release.set_sequence_id(opened.sequence_id());
    Timed(release_samples, [&] {
      grpc::ClientContext context;
      v1::ReleaseSequenceResponse response;
      return stub_->ReleaseSequence(&context, release, &response);
    });
  }

  // A router's watcher, on its own channel.
  void StartWatcher(const std::string& target) {
    auto channel = grpc::CreateChannel(target, grpc::InsecureChannelCredentials());
    observers_.emplace_back([this, channel] {
      auto watch_stub = v1::KvCache::NewStub(channel);
      auto reader = watch_stub->WatchEvents(&watch_context_, v1::WatchEventsRequest());
      v1::WatchEventsResponse response;
      while (reader->Read(&response)) events_watched_ += response.events_size();
      reader->Finish();
    });
  }

  void StartSubscriber(const std::string& endpoint) {
    observers_.emplace_back([this, endpoint] {
      zmq::context_t context;
      zmq::socket_t sub(context, zmq::socket_type::sub);
      sub.set(zmq::sockopt::subscribe, "kv@");
      sub.set(zmq::sockopt::rcvtimeo, 100);
      sub.connect(endpoint);
      while (!stop_observers_.load()) {
        std::vector<zmq::message_t> frames;
        if (zmq::recv_multipart(sub, std::back_inserter(frames))) ++zmq_messages_;
      }
    });
  }

  // A Prometheus far more eager than any deployment's (15-30 s), while the daemon is measured.
  void StartScraper(const std::string& address) {
    observers_.emplace_back([this, address] {
      while (!stop_observers_.load()) {
        if (scraping_.load() && ScrapeOnce(address) > 0) ++scrapes_;
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    });
  }

  const int clients_;
  std::string dir_;
  std::unique_ptr<Daemon> daemon_;
  std::unique_ptr<v1::KvCache::Stub> stub_;
  std::vector<uint64_t> sessions_;
  std::vector<uint32_t> counters_;  // per client: prompts opened, so each is new past its prefix
  std::vector<std::thread> observers_;
  grpc::ClientContext watch_context_;
  std::atomic<bool> stop_observers_{false};
  std::atomic<bool> scraping_{false};
  std::atomic<uint64_t> events_watched_{0}, zmq_messages_{0}, scrapes_{0};
};

// Adds each thread's samples in `from` to the same thread's in `into`.
void Append(std::vector<Samples>* into, std::vector<Samples> from) {
  for (size_t i = 0; i < from.size(); ++i) {
    Samples& thread = (*into)[i];
    thread.latencies_us.insert(thread.latencies_us.end(), from[i].latencies_us.begin(),
                               from[i].latencies_us.end());
    thread.errors += from[i].errors;
  }
}

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// `off` and `on` live side by side for the whole comparison, measured in turn in short phases
// (off-on, then on-off) so that the machine's drift hits both alike; each round's ratio comes
// from two neighbouring phases, and the verdict is the median of the rounds', which one noisy
// phase cannot move. Both are warmed first.
void CompareDaemons(BenchDaemon& off, BenchDaemon& on, double phase, int rounds) {
  off.RunMix(phase);
  on.RunMix(phase);
  std::printf("%-6s %10s %10s %7s %12s %12s %7s\n", "round", "off", "on", "on/off", "off/cpu-s",
              "on/cpu-s", "on/off");
  std::vector<double> ratios, cpu_ratios;
  double off_total = 0, on_total = 0;
  for (int round = 1; round <= rounds; ++round) {
    BenchDaemon::Phase on_phase, off_phase;
    if (round % 2 == 1) {
      off_phase = off.RunMix(phase);
      on_phase = on.RunMix(phase);
    } else {
      on_phase = on.RunMix(phase);
      off_phase = off.RunMix(phase);
    }
    off_total += off_phase.calls_per_second;
    on_total += on_phase.calls_per_second;
    ratios.push_back(on_phase.calls_per_second / off_phase.calls_per_second);
    cpu_ratios.push_back(on_phase.calls_per_cpu_second / off_phase.calls_per_cpu_second);
    std::printf("%-6d %10.0f %10.0f %6.2fx %12.0f %12.0f %6.2fx\n", round,
                off_phase.calls_per_second, on_phase.calls_per_second, ratios.back(),
                off_phase.calls_per_cpu_second, on_phase.calls_per_cpu_second, cpu_ratios.back());
  }
  std::printf("%-6s %10.0f %10.0f %6.2fx\n", "total", off_total, on_total, on_total / off_total);
  std::printf("median of the rounds' on/off ratios: calls/s %.2fx, calls per CPU second %.2fx\n",
              Median(ratios), Median(cpu_ratios));
}

// The tier comparisons' pool: small enough to evict all the time (512-byte blocks).
constexpr uint32_t kTierPoolBlocks = 4096;

// The daemons compared: "unwatched" and "watched" (a 64Ki-block pool without and with events and
// metrics), and over the small evicting pool "plain" (no tiers), "tier2" (a host tier of 4x the
// pool: its mover offloads ahead of every eviction, every open probes it) and "tier3" (a host tier
// as large as the pool, so it passes its oldest records on to a disk tier all the time; 8 KiB
// slots: a header page and the block's page). Null for another name.
std::unique_ptr<BenchDaemon> MakeDaemon(absl::string_view name, int clients) {
  if (name == "unwatched") return std::make_unique<BenchDaemon>(clients, false);
  if (name == "watched") return std::make_unique<BenchDaemon>(clients, true);
  if (name == "plain") return std::make_unique<BenchDaemon>(clients, false, 0, kTierPoolBlocks);
  if (name == "tier2") {
    return std::make_unique<BenchDaemon>(clients, false, uint64_t{4 * kTierPoolBlocks} * 512,
                                         kTierPoolBlocks);
  }
  if (name == "tier3") {
    return std::make_unique<BenchDaemon>(clients, false, uint64_t{kTierPoolBlocks} * 512,
                                         kTierPoolBlocks, uint64_t{16 * kTierPoolBlocks} * 8192);
  }
  return nullptr;
}

// Watched vs not: two daemons side by side for the whole run, measured in turn in short phases
// (off-on, then on-off) so that the machine's drift hits both alike; each round's ratio comes
// from two neighbouring phases, and the verdict is the median of the rounds', which one noisy
// phase cannot move. Both daemons are warm and live through the same pool states.
void CompareObserved(int clients, double phase, int rounds) {
  std::printf(
      "\nKV events + metrics on vs off (open+commit+release mix, calls/s): %d rounds of two %.2f s "
      "phases, two live daemons\n",
      rounds, phase);
  const std::unique_ptr<BenchDaemon> off = MakeDaemon("unwatched", clients);
  const std::unique_ptr<BenchDaemon> on = MakeDaemon("watched", clients);
  CompareDaemons(*off, *on, phase, rounds);
  std::printf("observed daemon: %llu events watched, %llu ZeroMQ messages, %llu scrapes\n",
              static_cast<unsigned long long>(on->events_watched()),
              static_cast<unsigned long long>(on->zmq_messages()),
              static_cast<unsigned long long>(on->scrapes()));
}

void CompareTiers(int clients, double phase, int rounds) {
  std::printf(
      "\ntier 2 on vs off (open+commit+release mix, %u-block pool evicting, host tier of %u "
      "blocks): %d rounds of two %.2f s phases, two live daemons\n",
      kTierPoolBlocks, 4 * kTierPoolBlocks, rounds, phase);
  const std::unique_ptr<BenchDaemon> plain_pool = MakeDaemon("plain", clients);
  {
    const std::unique_ptr<BenchDaemon> tiered_pool = MakeDaemon("tier2", clients);
    CompareDaemons(*plain_pool, *tiered_pool, phase, rounds);
    tiered_pool->PrintTier();
  }
  std::printf(
      "\ntiers 2+3 on vs off (the same mix; host tier of %u blocks, disk tier of %u records)\n",
      kTierPoolBlocks, 16 * kTierPoolBlocks);
  const std::unique_ptr<BenchDaemon> disk_pool = MakeDaemon("tier3", clients);
  CompareDaemons(*plain_pool, *disk_pool, phase, rounds);
  disk_pool->PrintTier();
}

int Main(double seconds, int clients, int rounds, absl::string_view only) {
  const double phase = std::max(bench::FullOrSmoke(0.25, 0.02), seconds / 4);
  if (absl::ConsumePrefix(&only, "alone-")) {
    // One daemon alone for `seconds`, for a profiler to tell its threads' costs apart.
    std::unique_ptr<BenchDaemon> daemon = MakeDaemon(only, clients);
    if (daemon == nullptr) bench::Fail("no daemon '" + std::string(only) + "'");
    daemon->RunMix(bench::FullOrSmoke(0.5, 0.02));
    const BenchDaemon::Phase alone = daemon->RunMix(seconds);
    std::printf("%s daemon alone: %.0f calls/s, %.0f calls per CPU second\n",
                std::string(only).c_str(), alone.calls_per_second, alone.calls_per_cpu_second);
    daemon->PrintTier();
    return 0;
  }
  if (only == "tier") {
    CompareTiers(clients, phase, rounds);
    return 0;
  }
  if (only == "observed") {
    CompareObserved(clients, phase, rounds);
    return 0;
  }
  std::vector<Result> results;
  double mix_rate = 0;
  std::vector<double> mix_over_ping;  // per round
  const int ping_rounds = rounds;
  // Each call type gets `seconds` in all, as when Ping and the mix ran one after the other.
  const double turn = seconds / ping_rounds;
  {
    BenchDaemon plain(clients, false);
    auto ping_call = [&](int, Samples* samples) {
      Timed(samples, [&] {
        grpc::ClientContext context;
        v1::PingResponse response;
        return plain.stub().Ping(&context, v1::PingRequest(), &response);
      });
    };
    RunClients(clients, 0.2, ping_call);  // warm the channel: connection setup is not measured
    plain.RunMix(0.2);
    // Ping and the mix take turns in short phases (Ping first, then the mix first), so the
    // machine's drift hits both alike; the verdict is the median of neighbouring phases' ratios.
    std::vector<Samples> ping(clients), open(clients), commit(clients), release(clients);
    for (int round = 0; round < ping_rounds; ++round) {
      double ping_rate = 0, round_mix_rate = 0;
      auto run_ping = [&] {
        std::vector<Samples> samples = RunClients(clients, turn, ping_call);
        uint64_t calls = 0;
        for (const Samples& thread : samples) calls += thread.latencies_us.size();
        ping_rate = calls / turn;
        Append(&ping, std::move(samples));
      };
      auto run_mix = [&] {
        std::vector<Samples> round_open, round_commit, round_release;
        round_mix_rate =
            plain.RunMix(turn, &round_open, &round_commit, &round_release).calls_per_second;
        Append(&open, std::move(round_open));
        Append(&commit, std::move(round_commit));
        Append(&release, std::move(round_release));
      };
      if (round % 2 == 0) {
        run_ping();
        run_mix();
      } else {
        run_mix();
        run_ping();
      }
      mix_over_ping.push_back(round_mix_rate / ping_rate);
    }
    const double measured = ping_rounds * turn;
    results.push_back(Summarize("Ping (empty)", std::move(ping), measured));
    results.push_back(Summarize("OpenSequence (256 tok)", std::move(open), measured));
    results.push_back(Summarize("CommitSequence", std::move(commit), measured));
    results.push_back(Summarize("ReleaseSequence", std::move(release), measured));
    mix_rate = results[1].rate + results[2].rate + results[3].rate;
  }
  const Result& ping = results[0];

  std::printf(
      "control plane over gRPC: %d clients, one channel, unix socket, %d rounds of a %.2f s Ping "
      "phase and a %.2f s mix phase\n",
      clients, ping_rounds, turn, turn);
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
  std::printf("%-24s %12.0f %12s %10s %10s %7.2fx\n", "open+commit+release mix", mix_rate, "", "",
              "", mix_rate / ping.rate);
  std::printf("median of the rounds' mix/Ping ratios: %.2fx\n", Median(mix_over_ping));
  if (only == "mix") return 0;

  CompareObserved(clients, phase, rounds);
  CompareTiers(clients, phase, rounds);
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
  const int rounds = argc > 3 ? std::max(1, std::atoi(argv[3])) : 21;
  const int status = kvcache::Main(seconds, clients, rounds, argc > 4 ? argv[4] : "");
  if (kvcache::failed_calls > 0) {
    kvcache::bench::Fail(std::to_string(kvcache::failed_calls) + " calls failed");
  }
  return status;
}
