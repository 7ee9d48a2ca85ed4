// kvcache-flood-client: the misbehaving client of the overload test (overload_process_test.cc).
// Over one connection it parks --parked AwaitRendezvous calls that nothing answers (long calls
// that hold their places), reports how many were refused at once, then floods the daemon from
// --threads threads with unary calls (Lookup, OpenSequence + ReleaseSequence) and further long
// calls, as fast as it can, for --seconds or until SIGTERM. It prints
//   parked admitted=A refused=R other=O
//   flooding
//   flood calls=N calls_per_s=X refused=R errors=E
// and exits without closing anything: the parked calls end with the process.
//
// Thread safety: the flood threads share only atomic counters.
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "client/client_flags.h"
#include "client/kv_cache_client.h"
#include "common/command_line.h"

ABSL_FLAG(std::string, target, "", "the daemon, e.g. unix:///tmp/kv.sock");
ABSL_FLAG(std::string, pool, "default", "the pool to flood");
ABSL_FLAG(int, parked, 24, "long calls to park on the connection");
ABSL_FLAG(int, expect_refused, 0, "wait (up to 20 s) until this many parked calls were refused");
ABSL_FLAG(int, threads, 4, "flood threads");
ABSL_FLAG(double, seconds, 5, "how long to flood");

namespace kvcache::testing {
namespace {

std::atomic<bool> stop_flood{false};

struct Counts {
  std::atomic<uint64_t> ok{0};
  std::atomic<uint64_t> refused{0};  // RESOURCE_EXHAUSTED, at once
  std::atomic<uint64_t> other{0};

  void Count(const absl::Status& status) {
    if (status.ok()) {
      ok.fetch_add(1);
    } else if (absl::IsResourceExhausted(status)) {
      refused.fetch_add(1);
    } else {
      std::fprintf(stderr, "flood-client: %s\n", status.ToString().c_str());
      other.fetch_add(1);
    }
  }
};

int Main(int argc, char** argv) {
  ParseCommandLineFlags(argc, argv,
                        "kvcache-flood-client --target=unix:///path/kv.sock [--parked=N] "
                        "[--threads=N] [--seconds=S]: the overload test's flood");
  ClientOptions base;
  base.rpc_timeout = absl::Seconds(120);
  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags(base);
  if (!options.ok()) return 2;
  absl::StatusOr<std::unique_ptr<KvCacheClient>> connected =
      KvCacheClient::Connect(absl::GetFlag(FLAGS_target), *options);
  if (!connected.ok()) {
    std::fprintf(stderr, "flood-client: connect: %s\n", connected.status().ToString().c_str());
    return 1;
  }
  KvCacheClient& client = **connected;
  // A short lease (kept alive by the client library) ends soon after the process is killed.
  if (absl::Status opened = client.OpenSession("", "flood", absl::Seconds(2)).status();
      !opened.ok()) {
    std::fprintf(stderr, "flood-client: open session: %s\n", opened.ToString().c_str());
    return 1;
  }

  Counts parked;
  std::vector<std::thread> parkers;
  for (int i = 0; i < absl::GetFlag(FLAGS_parked); ++i) {
    parkers.emplace_back(
        [&] { parked.Count(client.AwaitRendezvous("flood-never", absl::Minutes(2)).status()); });
  }
  const absl::Time settle_by = absl::Now() + absl::Seconds(20);
  while (parked.refused.load() + parked.other.load() <
             static_cast<uint64_t>(absl::GetFlag(FLAGS_expect_refused)) &&
         absl::Now() < settle_by) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const uint64_t refused = parked.refused.load();
  const uint64_t other = parked.other.load();
  std::printf("parked admitted=%llu refused=%llu other=%llu\nflooding\n",
              static_cast<unsigned long long>(absl::GetFlag(FLAGS_parked) - refused - other),
              static_cast<unsigned long long>(refused), static_cast<unsigned long long>(other));
  std::fflush(stdout);

  signal(SIGTERM, [](int) { stop_flood.store(true); });
  Counts flood;
  std::vector<uint32_t> tokens(64);
  for (uint32_t i = 0; i < tokens.size(); ++i) tokens[i] = 90000 + i;
  const std::string pool = absl::GetFlag(FLAGS_pool);
  const absl::Time start = absl::Now();
  const absl::Time end = start + absl::Seconds(absl::GetFlag(FLAGS_seconds));
  std::vector<std::thread> flooders;
  for (int t = 0; t < absl::GetFlag(FLAGS_threads); ++t) {
    flooders.emplace_back([&] {
      while (absl::Now() < end && !stop_flood.load()) {
        flood.Count(client.Lookup(pool, "", tokens).status());
        absl::StatusOr<KvCacheClient::Sequence> sequence = client.OpenSequence(pool, tokens);
        flood.Count(sequence.status());
        if (sequence.ok()) flood.Count(client.ReleaseSequence(sequence->sequence_id));
        // One more long call on a full connection: refused at once.
        flood.Count(client.AwaitRendezvous("flood-never", absl::Minutes(2)).status());
      }
    });
  }
  for (std::thread& flooder : flooders) flooder.join();
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  const uint64_t calls = flood.ok.load() + flood.refused.load() + flood.other.load();
  std::printf("flood calls=%llu calls_per_s=%.0f refused=%llu errors=%llu\n",
              static_cast<unsigned long long>(calls), calls / seconds,
              static_cast<unsigned long long>(flood.refused.load()),
              static_cast<unsigned long long>(flood.other.load()));
  std::fflush(stdout);
  // The parked calls would wait minutes; they end with the process.
  _exit(0);
}

}  // namespace
}  // namespace kvcache::testing

int main(int argc, char** argv) { return kvcache::testing::Main(argc, argv); }
