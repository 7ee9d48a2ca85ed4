// The page calls through a device mapping (CUDA IPC, issue 31) against the copy they stand in
// for, on a batch of 128 pages of 64 KiB (8 MiB; parts kv 60 KiB + state 4 KiB), all in one run:
//   calls   KvCacheClient::WritePages from device buffers (reserve, one kernel copying the batch
//           into the daemon's device pool and checksumming each page, commit) and ReadPagesInto
//           device buffers (acquire, the same kernel out of the pool, verify, release) vs one
//           cudaMemcpy of the same 8 MiB, device to device, synchronized;
//   kernel  kernels::CopyPagesChecksummedCuda of the batch alone vs the same cudaMemcpy: what the
//           checksums cost on the device, apart from the round trips;
//   parts   each call's round trips alone (no byte copied) and the client's device copy alone
//           (list up, kernel, checksums down, synchronized), in microseconds per batch; and the
//           same round trips committing without the writer's checksums, which the daemon then
//           computes on its device in one launch (PoolMemory::ChecksumBlocks), against with them.
// The daemon is kvcache-manager --device cuda:0 on a Unix socket, a child process.
//
// Usage: device_pages_bench [seconds per comparison]. Exits 1 at the first failed call or wrong
// byte (bench/bench_run.h), 77 without a CUDA device; KVCACHE_BENCH_SMOKE=1 runs batches of 8.
#include <cuda_runtime.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "bench/bench_run.h"
#include "bench/child_process.h"
#include "bench/interleaved_rates.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"
#include "client/mapped_pool_cuda.h"
#include "common/block_checksum.h"
#include "common/cuda/cuda_device.h"
#include "common/cuda/cuda_status.h"
#include "kernels/page_checksum.h"

namespace kvcache {
namespace {

using bench::InterleavedRates;

constexpr uint64_t kPageBytes = 64 << 10;
constexpr uint64_t kStateBytes = 4 << 10;
constexpr uint32_t kPageTokens = 16;
constexpr uint32_t kPoolPages = 1024;  // 64 MiB: the reads' batch and room for the writes'

void CheckCuda(cudaError_t error, const char* what) {
  bench::CheckOk(CudaStatus(error, what), what);
}

std::vector<std::string> Keys(const std::string& prefix, size_t count) {
  std::vector<std::string> keys;
  for (size_t i = 0; i < count; ++i) keys.push_back(absl::StrCat(prefix, "/", i));
  return keys;
}

int Run(const std::string& dir, double seconds) {
  const size_t batch = bench::FullOrSmoke<size_t>(128, 8);
  const uint64_t bytes = batch * kPageBytes;
  const std::string target = "unix://" + dir + "/kv.sock";
  const std::string pool =
      absl::StrCat("pages:model=bench:layers=1:kv_heads=8:head_dim=128:block_size=", kPageTokens,
                   ":dtype=fp16:blocks=", kPoolPages, ":parts=kv/60K+state/4K/trailing1");
  const bench::ChildProcess daemon =
      bench::ValueOrFail(bench::ChildProcess::Start(
                             {bench::SiblingBinary("kvcache-manager"), "--listen=" + target,
                              "--device=cuda:0", "--pool=" + pool, "--session_ttl=10m"},
                             [&] { return access((dir + "/kv.sock").c_str(), F_OK) == 0; },
                             dir + "/kvcache-manager.log"),
                         "starting kvcache-manager");
  // Declared after the daemon: closed before it stops.
  std::unique_ptr<KvCacheClient> client =
      bench::ValueOrFail(KvCacheClient::Connect(target), "connecting");
  bench::CheckOk(client
                     ->OpenSession("", "device_pages_bench", absl::Minutes(10),
                                   ManifestFields{.model_id = "bench",
                                                  .model_config_digest = "device-pages-bench",
                                                  .kv_dtype = "fp16",
                                                  .page_tokens = kPageTokens,
                                                  .parts = {{"kv", kPageBytes - kStateBytes},
                                                            {"state", kStateBytes}}})
                     .status(),
                 "opening a session");
  const std::unique_ptr<MappedPool> mapped = bench::ValueOrFail(
      MappedPool::Map(bench::ValueOrFail(client->DescribePool("pages"), "DescribePool")),
      "mapping the pool");

  // The batch: random bytes on the device, page i at byte i * kPageBytes; a buffer to read into.
  std::string host(bytes, '\0');
  std::mt19937_64 rng(1);
  for (char& byte : host) byte = static_cast<char>(rng());
  char* sources = nullptr;
  char* destinations = nullptr;
  CheckCuda(cudaMalloc(&sources, bytes), "cudaMalloc");
  CheckCuda(cudaMalloc(&destinations, bytes), "cudaMalloc");
  CheckCuda(cudaMemcpy(sources, host.data(), bytes, cudaMemcpyHostToDevice), "uploading");
  std::vector<absl::string_view> pages;
  std::vector<absl::Span<char>> outs;
  for (size_t i = 0; i < batch; ++i) {
    pages.emplace_back(sources + i * kPageBytes, kPageBytes);
    outs.emplace_back(destinations + i * kPageBytes, kPageBytes);
  }
  const std::vector<std::string> cached = Keys("cached", batch);
  uint64_t next_batch = 0;

  // Every path once, checked byte for byte before anything is timed.
  const auto write = [&] {
    const KvCacheClient::PagesStored stored = bench::ValueOrFail(
        client->WritePages(*mapped, Keys(absl::StrCat("fresh-", next_batch++), batch), pages),
        "WritePages");
    return stored.num_published == batch ? bytes : 0;
  };
  const auto read = [&] {
    return bench::ValueOrFail(client->ReadPagesInto(*mapped, cached, outs), "ReadPagesInto")
                       .num_pages == batch
               ? bytes
               : 0;
  };
  if (bench::ValueOrFail(client->WritePages(*mapped, cached, pages), "WritePages").num_published !=
      batch) {
    bench::Fail("WritePages did not publish the batch");
  }
  // Held for the run: the writes' fresh pages would otherwise evict the batch the reads read.
  if (bench::ValueOrFail(client->PinPages("pages", cached, absl::Minutes(10)), "PinPages") !=
      batch) {
    bench::Fail("PinPages did not hold every page");
  }
  if (read() == 0) bench::Fail("ReadPagesInto read less than the batch");
  std::string out(bytes, '\0');
  CheckCuda(cudaMemcpy(out.data(), destinations, bytes, cudaMemcpyDeviceToHost), "downloading");
  if (out != host) bench::Fail("ReadPagesInto returned other bytes");
  const KvCacheClient::GotPages got =
      bench::ValueOrFail(client->GetPages("pages", cached), "GetPages");
  for (size_t i = 0; i < batch; ++i) {
    if (got.pages[i] != host.substr(i * kPageBytes, kPageBytes)) {
      bench::Fail("GetPages returned other bytes than WritePages wrote");
    }
  }

  // The kernel alone, its list and checksums in mapped page-locked memory.
  void* list = nullptr;
  CheckCuda(cudaHostAlloc(&list, batch * (sizeof(kernels::PageCopy) + sizeof(uint64_t)),
                          cudaHostAllocMapped),
            "cudaHostAlloc");
  auto* copies = static_cast<kernels::PageCopy*>(list);
  auto* checksums = reinterpret_cast<uint64_t*>(copies + batch);
  for (size_t i = 0; i < batch; ++i) {
    copies[i] = {reinterpret_cast<const uint8_t*>(sources) + i * kPageBytes,
                 reinterpret_cast<uint8_t*>(destinations) + i * kPageBytes};
  }
  const auto kernel = [&] {
    bench::CheckOk(kernels::CopyPagesChecksummedCuda(copies, batch, kPageBytes, checksums, nullptr),
                   "CopyPagesChecksummedCuda");
    CheckCuda(cudaStreamSynchronize(nullptr), "the kernel");
    return bytes;
  };
  kernel();
  for (size_t i = 0; i < batch; ++i) {
    if (checksums[i] != BlockChecksum(host.data() + i * kPageBytes, kPageBytes)) {
      bench::Fail("the kernel's checksum is not XXH3-64's");
    }
  }
  const auto device_memcpy = [&] {
    CheckCuda(cudaMemcpyAsync(destinations, sources, bytes, cudaMemcpyDeviceToDevice, nullptr),
              "cudaMemcpyAsync");
    CheckCuda(cudaStreamSynchronize(nullptr), "cudaMemcpy");
    return bytes;
  };

  // Where a call's time goes: its round trips with no byte copied (a reservation committed with
  // the batch's checksums, whatever the blocks hold; an acquire released), and the client's
  // device copy alone (the list up, the kernel, the checksums down, synchronized).
  std::vector<uint64_t> batch_checksums(checksums, checksums + batch);
  const auto write_round_trips = [&] {
    const KvCacheClient::PageReservation reservation = bench::ValueOrFail(
        client->ReservePages("pages", Keys(absl::StrCat("fresh-", next_batch++), batch)),
        "ReservePages");
    const KvCacheClient::PagesStored stored = bench::ValueOrFail(
        client->CommitPages(reservation.sequence_id, batch_checksums), "CommitPages");
    return stored.num_published == batch ? bytes : 0;
  };
  // Committed without checksums: the daemon hashes the batch on its device. Checked once first:
  // pages copied in plainly, committed so, read back verified against what the daemon computed.
  const auto reserve_copy_commit = [&](bool copy) {
    const KvCacheClient::PageReservation reservation = bench::ValueOrFail(
        client->ReservePages("pages", Keys(absl::StrCat("fresh-", next_batch++), batch)),
        "ReservePages");
    if (copy) {
      for (size_t i = 0; i < batch; ++i) {
        CheckCuda(cudaMemcpyAsync(mapped->Block(reservation.block_ids[i]), sources + i * kPageBytes,
                                  kPageBytes, cudaMemcpyDeviceToDevice, nullptr),
                  "cudaMemcpyAsync");
      }
      CheckCuda(cudaStreamSynchronize(nullptr), "copying the pages in");
    }
    const KvCacheClient::PagesStored stored =
        bench::ValueOrFail(client->CommitPages(reservation.sequence_id), "CommitPages");
    return stored.num_published == batch ? bytes : 0;
  };
  {
    const std::vector<std::string> unsummed = Keys(absl::StrCat("fresh-", next_batch), batch);
    if (reserve_copy_commit(/*copy=*/true) == 0) bench::Fail("CommitPages published less");
    const KvCacheClient::GotPages unsummed_got =
        bench::ValueOrFail(client->GetPages("pages", unsummed), "GetPages");
    if (unsummed_got.pages.size() != batch) bench::Fail("GetPages found less than was committed");
    for (size_t i = 0; i < batch; ++i) {
      if (unsummed_got.pages[i] != host.substr(i * kPageBytes, kPageBytes)) {
        bench::Fail("pages committed without checksums read back other bytes");
      }
    }
  }
  const auto daemon_checksummed_round_trips = [&] { return reserve_copy_commit(/*copy=*/false); };
  const auto read_round_trips = [&] {
    const KvCacheClient::AcquiredPages acquired =
        bench::ValueOrFail(client->AcquirePages("pages", cached), "AcquirePages");
    bench::CheckOk(client->ReleaseSequence(acquired.sequence_id), "ReleaseSequence");
    return acquired.block_ids.size() == batch ? bytes : 0;
  };
  std::vector<kernels::PageCopy> client_copies(copies, copies + batch);
  const auto client_copy = [&] {
    bench::CheckOk(
        mapped_pool_internal::CopyPagesChecksummed(mapped->device(), client_copies, kPageBytes,
                                                   absl::MakeSpan(batch_checksums)),
        "CopyPagesChecksummed");
    return bytes;
  };

  enum { kWrite, kRead, kKernel, kMemcpy, kWriteTrips, kReadTrips, kClientCopy, kDaemonSummed };
  const InterleavedRates rates(seconds, 5,
                               {write, read, kernel, device_memcpy, write_round_trips,
                                read_round_trips, client_copy, daemon_checksummed_round_trips});
  std::printf("batch of %zu pages of %llu KiB (%.1f MiB); GB/s (1e9 bytes/s)\n", batch,
              static_cast<unsigned long long>(kPageBytes >> 10), bytes / 1048576.0);
  std::printf(
      "device pool: WritePages %7.2f  ReadPagesInto %7.2f  kernel %7.2f  cudaMemcpy D2D %7.2f  "
      "write/memcpy %.2fx  read/memcpy %.2fx  kernel/memcpy %.2fx\n",
      rates.Median(kWrite), rates.Median(kRead), rates.Median(kKernel), rates.Median(kMemcpy),
      rates.Ratio(kWrite, kMemcpy), rates.Ratio(kRead, kMemcpy), rates.Ratio(kKernel, kMemcpy));
  const auto micros = [&](size_t op) { return bytes / (rates.Median(op) * 1e3); };
  std::printf(
      "per batch, us: WritePages %.0f = reserve+commit round trips %.0f + device copy %.0f; "
      "ReadPagesInto %.0f = acquire+release %.0f + device copy; kernel alone %.0f, memcpy %.0f\n",
      micros(kWrite), micros(kWriteTrips), micros(kClientCopy), micros(kRead), micros(kReadTrips),
      micros(kKernel), micros(kMemcpy));
  std::printf(
      "reserve+commit round trips, us per batch: with the writer's checksums %.0f, without them "
      "(the daemon checksums the batch on its device) %.0f\n",
      micros(kWriteTrips), micros(kDaemonSummed));
  cudaFreeHost(list);
  cudaFree(sources);
  cudaFree(destinations);
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  if (!kvcache::CudaDeviceAvailable()) {
    std::printf("device_pages_bench: skipped: no CUDA device\n");
    return kvcache::bench::kSkipped;
  }
  const double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
  char dir_template[] = "/tmp/kvcache-device-pages-bench-XXXXXX";
  const std::string dir = mkdtemp(dir_template);
  const int status = kvcache::Run(dir, seconds);
  std::string cleanup = "rm -rf " + dir;
  return system(cleanup.c_str()) == 0 ? status : 1;
}
