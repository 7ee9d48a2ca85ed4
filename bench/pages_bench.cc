// The page calls (pages named by the engine's keys, issue 31) against what they stand in for, on
// a batch of 128 pages of 64 KiB (8 MiB; parts kv 60 KiB + state 4 KiB), all in one run, with
// kvcache-manager and redis-server as processes beside this one:
//   same node   KvCacheClient::WritePages (reserve, copy into the mapped pool checksumming each
//               page on the way, commit: the daemon publishes) and ReadPagesInto (acquire, verify
//               each page's checksum while copying it out, release) vs memcpy of the same 8 MiB
//               (target >= 0.8x). The client copies a batch on the caller's thread and its page
//               copy threads (ClientOptions::page_copy_threads; memcpy is one thread); a second
//               row has the caller's thread alone, as the client did before them (PutPages
//               checksums its pages on those threads too: the same second row).
//               Each is compared with the copy that moves its bytes between memory like its
//               own: the reads reread one pinned batch into one buffer, as memcpy between two
//               8 MiB buffers does; the writes' fresh pages walk the 64 MiB pool, so their
//               memcpy walks a 64 MiB destination too (on the 2-core VM it runs as fast as the
//               in-cache copy, 12.7 vs 13.2 GB/s: the ratio is the same either way);
//   other node  PutPages (checksums computed here, the daemon verifies before publishing) and
//               GetPages (every page verified here) over a Unix socket vs Redis MSET / MGET of the
//               same values on a Unix socket (target >= 1.0x);
//   lookup      ExistsPages of 4096 present keys, calls/s vs Ping on the same channel.
// Writes use fresh keys each time (a key present already is a duplicate: nothing is copied);
// Redis overwrites the same keys. Rates are medians of 5 interleaved slices, ratios the medians
// of the slices' side-by-side ratios (bench/interleaved_rates.h).
// Usage: pages_bench [seconds per comparison]; pages_bench SECONDS write|read|put|get|exists|
// reserve-commit|acquire-release runs that alone, for perf (the last two: a same-node call's
// round trips with no byte copied). Exits 1 at the first failed call or wrong byte
// (bench/bench_run.h); KVCACHE_BENCH_SMOKE=1 runs batches of 8 pages (and 64 keys to look up).
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_run.h"
#include "bench/child_process.h"
#include "bench/interleaved_rates.h"
#include "bench/redis_peer.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"
#include "common/rpc/grpc_tuning.h"
#include "common/rpc/malloc_tuning.h"

namespace kvcache {
namespace {

using bench::InterleavedRates;

constexpr uint64_t kPageBytes = 64 << 10;  // 1 layer x 2 x 16 tokens x 8 heads x 128 x fp16
constexpr uint64_t kStateBytes = 4 << 10;
constexpr uint32_t kPageTokens = 16;
constexpr uint32_t kPoolPages = 1024;           // 64 MiB: room for the reads' batch and the writes'
constexpr uint64_t kLookupPageBytes = 4 << 10;  // the lookup pool: 1 layer, 1 head of 64 x fp16
constexpr uint32_t kLookupBatch = 1024;         // lookup pages put per call (4 MiB)

ManifestFields Manifest(std::vector<PagePart> parts) {
  return ManifestFields{.model_id = "bench",
                        .model_config_digest = "pages-bench",
                        .kv_dtype = "fp16",
                        .page_tokens = kPageTokens,
                        .parts = std::move(parts)};
}

std::vector<std::string> Keys(const std::string& prefix, size_t count) {
  std::vector<std::string> keys;
  for (size_t i = 0; i < count; ++i) keys.push_back(absl::StrCat(prefix, "/", i));
  return keys;
}

std::unique_ptr<KvCacheClient> Connect(const std::string& target, const std::string& name,
                                       const ManifestFields& manifest, int page_copy_threads = -1) {
  ClientOptions options;
  options.max_message_bytes = 64 << 20;
  options.page_copy_threads = page_copy_threads;
  std::unique_ptr<KvCacheClient> client =
      bench::ValueOrFail(KvCacheClient::Connect(target, options), "connecting");
  bench::CheckOk(client->OpenSession("", name, absl::Minutes(10), manifest).status(),
                 "opening a session");
  return client;
}

void Run(const std::string& dir, double seconds, const std::string& only) {
  const size_t batch = bench::FullOrSmoke<size_t>(128, 8);
  const size_t lookup_keys = bench::FullOrSmoke<size_t>(kMaxPagesPerCall, 64);
  const std::string target = "unix://" + dir + "/kv.sock";
  const std::string pools =
      absl::StrCat("pages:model=bench:layers=1:kv_heads=8:head_dim=128:block_size=", kPageTokens,
                   ":dtype=fp16:blocks=", kPoolPages, ":parts=kv/60K+state/4K/trailing1",
                   ",lookup:model=bench:layers=1:kv_heads=1:head_dim=64:block_size=", kPageTokens,
                   ":dtype=fp16:blocks=", kMaxPagesPerCall + 64);
  const ManifestFields manifest =
      Manifest({{"kv", kPageBytes - kStateBytes}, {"state", kStateBytes}});
  const bench::ChildProcess daemon =
      bench::ValueOrFail(bench::ChildProcess::Start(
                             {bench::SiblingBinary("kvcache-manager"), "--listen=" + target,
                              "--pool=" + pools, "--session_ttl=10m"},
                             [&] { return access((dir + "/kv.sock").c_str(), F_OK) == 0; },
                             dir + "/kvcache-manager.log"),
                         "starting kvcache-manager");
  // Declared after the daemon: closed before it stops.
  const std::unique_ptr<KvCacheClient> client = Connect(target, "pages_bench", manifest);
  const std::unique_ptr<KvCacheClient> lookup_client =
      Connect(target, "pages_bench-lookup", Manifest({{"kv", kLookupPageBytes}}));
  // The same-node calls again with the caller's thread alone copying (page_copy_threads 0).
  const std::unique_ptr<KvCacheClient> one_thread_client =
      Connect(target, "pages_bench-one-thread", manifest, /*page_copy_threads=*/0);
  std::unique_ptr<bench::RedisPeer> redis = bench::ValueOrFail(
      bench::RedisPeer::Start(dir, 46381, /*use_unix_socket=*/true), "starting redis-server");
  const std::unique_ptr<MappedPool> mapped = bench::ValueOrFail(
      MappedPool::Map(bench::ValueOrFail(client->DescribePool("pages"), "DescribePool")),
      "mapping the pool");
  if (mapped->block_bytes() != kPageBytes) bench::Fail("the pool's pages are not 64 KiB");

  // The batch: random bytes, page i at byte i * kPageBytes; a second buffer to read into.
  std::mt19937_64 rng(1);
  std::string bytes(batch * kPageBytes, '\0');
  for (size_t i = 0; i < bytes.size(); i += 8) {
    const uint64_t word = rng();
    std::memcpy(bytes.data() + i, &word, 8);
  }
  std::string out(bytes.size(), '\0');
  std::vector<std::string> values;  // the same pages, as Redis values
  std::vector<absl::string_view> pages;
  std::vector<absl::Span<char>> destinations;
  for (size_t i = 0; i < batch; ++i) {
    values.push_back(bytes.substr(i * kPageBytes, kPageBytes));
    pages.push_back(absl::string_view(bytes).substr(i * kPageBytes, kPageBytes));
    destinations.push_back(absl::MakeSpan(out).subspan(i * kPageBytes, kPageBytes));
  }
  const std::vector<std::string> cached = Keys("cached", batch);
  const std::vector<std::string> redis_keys = Keys("redis", batch);
  uint64_t next_batch = 0;
  const auto fresh_keys = [&] { return Keys(absl::StrCat("fresh-", next_batch++), batch); };

  // Every path once, checked byte for byte before anything is timed.
  const auto check_stored = [&](absl::StatusOr<KvCacheClient::PagesStored> stored,
                                const char* what) {
    if (bench::ValueOrFail(std::move(stored), what).num_published != batch) {
      bench::Fail(absl::StrCat(what, " did not publish every page"));
    }
  };
  check_stored(client->WritePages(*mapped, cached, pages), "WritePages");
  // Held for the run: the writes' fresh pages would otherwise evict the batch the reads read.
  if (bench::ValueOrFail(client->PinPages("pages", cached, absl::Minutes(10)), "PinPages") !=
      batch) {
    bench::Fail("PinPages did not hold every page");
  }
  const auto read_into_by = [&](KvCacheClient& reader) {
    return bench::ValueOrFail(reader.ReadPagesInto(*mapped, cached, destinations), "ReadPagesInto")
                       .num_pages == batch
               ? bytes.size()
               : 0;
  };
  const auto read_into = [&] { return read_into_by(*client); };
  if (read_into() == 0 || out != bytes) bench::Fail("ReadPagesInto returned other bytes");
  std::fill(out.begin(), out.end(), '\0');
  if (read_into_by(*one_thread_client) == 0 || out != bytes) {
    bench::Fail("ReadPagesInto (one copy thread) returned other bytes");
  }
  check_stored(client->PutPages("pages", fresh_keys(), pages), "PutPages");
  const auto get = [&] {
    KvCacheClient::GotPages got = bench::ValueOrFail(client->GetPages("pages", cached), "GetPages");
    return got.pages.size() == batch ? bytes.size() : 0;
  };
  if (KvCacheClient::GotPages got =
          bench::ValueOrFail(client->GetPages("pages", cached), "GetPages");
      got.pages != values) {
    bench::Fail("GetPages returned other bytes");
  }
  bench::CheckOk(redis->MSet(redis_keys, values), "redis MSET");
  std::fill(out.begin(), out.end(), '\0');
  if (bench::ValueOrFail(redis->MGetInto(redis_keys, absl::MakeSpan(out)), "redis MGET") !=
          bytes.size() ||
      out != bytes) {
    bench::Fail("Redis MGET returned other bytes");
  }

  // The lookup: every key present, so the daemon walks all of them.
  const std::vector<std::string> lookup = Keys("lookup", lookup_keys);
  const std::string lookup_page(kLookupPageBytes, 'p');
  for (size_t first = 0; first < lookup.size(); first += kLookupBatch) {
    const size_t count = std::min<size_t>(kLookupBatch, lookup.size() - first);
    const std::vector<absl::string_view> lookup_pages(count, lookup_page);
    bench::ValueOrFail(
        lookup_client->PutPages("lookup", absl::MakeConstSpan(lookup).subspan(first, count),
                                lookup_pages),
        "PutPages (lookup pool)");
  }
  const auto exists = [&] {
    const uint32_t found =
        bench::ValueOrFail(lookup_client->ExistsPages("lookup", lookup), "ExistsPages").num_pages;
    return found == lookup.size() ? uint64_t{1} : uint64_t{0};
  };
  if (!only.empty()) {  // one path alone, for a profiler
    const auto put = [&] {
      check_stored(client->PutPages("pages", fresh_keys(), pages), "PutPages");
      return bytes.size();
    };
    const auto write = [&] {
      check_stored(client->WritePages(*mapped, fresh_keys(), pages), "WritePages");
      return bytes.size();
    };
    if (only == "write") std::printf("WritePages: %.2f GB/s\n", bench::Bandwidth(seconds, write));
    if (only == "read") {
      std::printf("ReadPagesInto: %.2f GB/s\n", bench::Bandwidth(seconds, read_into));
    }
    if (only == "put") std::printf("PutPages: %.2f GB/s\n", bench::Bandwidth(seconds, put));
    if (only == "get") std::printf("GetPages: %.2f GB/s\n", bench::Bandwidth(seconds, get));
    if (only == "exists") {
      std::printf("ExistsPages: %.0f calls/s\n", bench::Bandwidth(seconds, exists) * 1e9);
    }
    // The same-node calls' round trips alone, no byte copied (a reservation committed with
    // checksums whatever its blocks hold; an acquire released): batches per second.
    if (only == "reserve-commit") {
      const std::vector<uint64_t> checksums(batch, 1);
      std::printf(
          "ReservePages+CommitPages: %.0f batches/s\n",
          bench::Bandwidth(seconds, [&] {
            const KvCacheClient::PageReservation reservation =
                bench::ValueOrFail(client->ReservePages("pages", fresh_keys()), "ReservePages");
            check_stored(client->CommitPages(reservation.sequence_id, checksums), "CommitPages");
            return uint64_t{1};
          }) * 1e9);
    }
    if (only == "acquire-release") {
      std::printf("AcquirePages+ReleaseSequence: %.0f batches/s\n",
                  bench::Bandwidth(seconds, [&] {
                    const KvCacheClient::AcquiredPages acquired =
                        bench::ValueOrFail(client->AcquirePages("pages", cached), "AcquirePages");
                    bench::CheckOk(client->ReleaseSequence(acquired.sequence_id),
                                   "ReleaseSequence");
                    return uint64_t{acquired.block_ids.size() == batch};
                  }) * 1e9);
    }
    return;
  }
  // The writes' baseline: the batch copied to the next stretch of a buffer the pool's size.
  std::string walked(uint64_t{kPoolPages} * kPageBytes, '\1');
  size_t walk_at = 0;
  const auto memcpy_walking = [&] {
    if (walk_at + bytes.size() > walked.size()) walk_at = 0;
    std::memcpy(walked.data() + walk_at, bytes.data(), bytes.size());
    walk_at += bytes.size();
    return bytes.size();
  };
  const auto write_by = [&](KvCacheClient& writer) {
    check_stored(writer.WritePages(*mapped, fresh_keys(), pages), "WritePages");
    return bytes.size();
  };
  enum { kWrite, kRead, kMemcpy, kMemcpyWalking, kWriteOneThread, kReadOneThread };
  const InterleavedRates same_node(seconds, 5,
                                   {[&] { return write_by(*client); }, read_into,
                                    [&] {
                                      std::memcpy(out.data(), bytes.data(), bytes.size());
                                      return bytes.size();
                                    },
                                    memcpy_walking, [&] { return write_by(*one_thread_client); },
                                    [&] { return read_into_by(*one_thread_client); }});
  const auto put_by = [&](KvCacheClient& writer) {
    check_stored(writer.PutPages("pages", fresh_keys(), pages), "PutPages");
    return bytes.size();
  };
  enum { kPut, kGet, kMSet, kMGet, kPutOneThread };
  const InterleavedRates other_node(
      seconds, 5,
      {[&] { return put_by(*client); }, get,
       [&] {
         bench::CheckOk(redis->MSet(redis_keys, values), "redis MSET");
         return bytes.size();
       },
       [&] {
         return bench::ValueOrFail(redis->MGetInto(redis_keys, absl::MakeSpan(out)), "redis MGET");
       },
       [&] { return put_by(*one_thread_client); }});

  enum { kExists, kPing };
  const InterleavedRates lookups(seconds, 5, {exists, [&] {
                                                bench::ValueOrFail(lookup_client->Ping(), "Ping");
                                                return uint64_t{1};
                                              }});

  std::printf("batch of %zu pages of %llu KiB (%.1f MiB); GB/s (1e9 bytes/s)\n", batch,
              static_cast<unsigned long long>(kPageBytes >> 10), bytes.size() / 1048576.0);
  std::printf(
      "same node:  WritePages %6.2f  ReadPagesInto %6.2f  memcpy %6.2f  memcpy over 64 MiB %6.2f  "
      "write/memcpy over 64 MiB %.2fx  read/memcpy %.2fx  (target >= 0.8x; write/memcpy %.2fx)\n",
      same_node.Median(kWrite), same_node.Median(kRead), same_node.Median(kMemcpy),
      same_node.Median(kMemcpyWalking), same_node.Ratio(kWrite, kMemcpyWalking),
      same_node.Ratio(kRead, kMemcpy), same_node.Ratio(kWrite, kMemcpy));
  std::printf(
      "  the caller's thread alone copying (page_copy_threads 0): WritePages %6.2f  "
      "ReadPagesInto %6.2f  write/memcpy over 64 MiB %.2fx  read/memcpy %.2fx\n",
      same_node.Median(kWriteOneThread), same_node.Median(kReadOneThread),
      same_node.Ratio(kWriteOneThread, kMemcpyWalking), same_node.Ratio(kReadOneThread, kMemcpy));
  std::printf(
      "unix socket: PutPages %6.2f  GetPages %6.2f  redis MSET %6.2f  MGET %6.2f  "
      "put/MSET %.2fx  get/MGET %.2fx  (target >= 1.0x)\n",
      other_node.Median(kPut), other_node.Median(kGet), other_node.Median(kMSet),
      other_node.Median(kMGet), other_node.Ratio(kPut, kMSet), other_node.Ratio(kGet, kMGet));
  std::printf(
      "  the caller's thread alone checksumming (page_copy_threads 0): PutPages %6.2f  "
      "put/MSET %.2fx\n",
      other_node.Median(kPutOneThread), other_node.Ratio(kPutOneThread, kMSet));
  std::printf(
      "lookup:     ExistsPages of %zu keys %8.0f calls/s  Ping %8.0f calls/s  "
      "exists/ping %.2fx\n",
      lookup.size(), lookups.Median(kExists) * 1e9, lookups.Median(kPing) * 1e9,
      lookups.Ratio(kExists, kPing));
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  kvcache::TuneGrpcForBlockStreams();
  kvcache::TuneMallocForBlockStreams();
  char dir_template[] = "/tmp/kvcache-pages-bench-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  kvcache::Run(dir, seconds, argc > 2 ? argv[2] : "");
  std::string cleanup = "rm -rf " + dir;
  return system(cleanup.c_str()) == 0 ? 0 : 1;
}
