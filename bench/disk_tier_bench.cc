// Disk tier (tier 3) throughput, as ratios measured in one run on one file:
// - load: N blocks through DiskTier::LoadMany (read, verify identity and checksum, copy out;
//   `depth` reads in flight, each completed one verified while the next are read) vs raw io_uring
//   O_DIRECT reads of the same slots from the same file with `depth` reads in flight all the
//   time; O_DIRECT both, so the page cache plays no part;
// - store: N blocks through DiskTier::Store until durable, with batched fdatasync and with
//   RWF_DSYNC per write, vs raw O_DIRECT writes of the same slots into a fresh preallocated file
//   and one fdatasync;
// - warm restart: the time Open takes to scan a file's slot headers;
// - sealed (--tier_key_file: AES-256-GCM, tiers/record_seal.h) vs unsealed: the same loads from
//   a second file written sealed, in the same alternating rounds, and the same batched stores
//   (target >= 0.9x each).
// Usage: disk_tier_bench [DIR] [BLOCK_KIB] [BLOCKS]; DIR defaults to $TMPDIR or /tmp and must be
// on the disk to measure (not tmpfs). No timing is asserted. Exits 1 at the first error
// (bench/bench_run.h); KVCACHE_BENCH_SMOKE=1 scans 1024 slots at restart, not 65536.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_run.h"
#include "bench/raw_direct_reads.h"
#include "common/block_checksum.h"
#include "tiers/disk_tier.h"
#include "tiers/io_ring.h"
#include "tiers/record_codec.h"
#include "tiers/tier_keyring.h"

namespace kvcache {
namespace {

constexpr uint32_t kTokens = 16;
constexpr uint32_t kDepth = 16;
constexpr uint32_t kLoadBatch = 128;  // a 2k-token prefix of 16-token blocks
constexpr int kRounds = 5;

double Seconds(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

BlockRecordIdentity Identity(uint64_t i, const std::string& bytes) {
  BlockRecordIdentity identity;
  identity.tenant = "bench";
  identity.hash = {i * 0x9e3779b97f4a7c15ULL + 1, ~i};
  identity.parent_hash = {i, i};
  for (uint32_t t = 0; t < kTokens; ++t) identity.tokens.push_back(i * kTokens + t);
  identity.checksum = BlockChecksum(bytes.data(), bytes.size());
  return identity;
}

// The keys of the sealed runs: one master key, as a key file of one line gives.
std::shared_ptr<const TierKeyring> BenchKeyring() {
  TierMasterKey key{.id = 1};
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = static_cast<uint8_t>(i * 131 + 1);
  return bench::ValueOrFail(TierKeyring::FromKeys({key}), "TierKeyring::FromKeys");
}

// The daemon's seal workers (TaskWorkers::DefaultThreads()).
std::shared_ptr<TaskWorkers> BenchTaskWorkers() {
  static const auto workers = std::make_shared<TaskWorkers>(TaskWorkers::DefaultThreads());
  return workers;
}

DiskTierOptions Options(const std::string& path, uint64_t block_bytes, uint64_t blocks,
                        std::shared_ptr<const TierKeyring> keyring = nullptr) {
  DiskTierOptions options;
  options.path = path;
  options.pool = {.model_id = "bench", .layout_fingerprint = 1, .block_bytes = block_bytes};
  options.tokens_per_block = kTokens;
  if (keyring != nullptr) options.seal_workers = BenchTaskWorkers();
  options.keyring = std::move(keyring);
  options.capacity_bytes = blocks * DiskTier::SlotBytesFor(options);
  options.read_depth = kDepth;
  options.read_rings = 1;
  return options;
}

// Stores every block and waits until durable; seconds.
double StoreAll(DiskTier& tier, const std::vector<BlockRecordIdentity>& identities,
                const std::string& bytes) {
  const auto start = std::chrono::steady_clock::now();
  for (const BlockRecordIdentity& identity : identities) {
    absl::Status stored;
    while (absl::IsResourceExhausted(stored = tier.Store(identity, bytes))) {
      std::this_thread::yield();  // the write queue is full
    }
    bench::CheckOk(stored, "DiskTier::Store");
  }
  tier.Flush();
  return Seconds(start);
}

// Raw O_DIRECT writes of `blocks` slots (rounds of kDepth), then one fdatasync; seconds.
double RawWrites(int fd, uint64_t slot_bytes, uint64_t blocks, IoRing& ring, const char* data) {
  std::vector<IoRing::Completion> done;
  const auto start = std::chrono::steady_clock::now();
  for (uint64_t first = 0; first < blocks; first += kDepth) {
    const uint64_t count = std::min<uint64_t>(kDepth, blocks - first);
    for (uint64_t i = 0; i < count; ++i) {
      ring.QueueWrite(fd, data, slot_bytes, (first + i) * slot_bytes, i, false);
    }
    done.clear();
    bench::CheckOk(ring.SubmitAndWait(&done), "raw writes");
  }
  ring.QueueFdatasync(fd, 0);
  done.clear();
  bench::CheckOk(ring.SubmitAndWait(&done), "fdatasync");
  return Seconds(start);
}

// Loads blocks [first, first + count) through the tier with one LoadMany (a prefix walk loads a
// run of blocks at once); seconds.
double TierLoads(DiskTier& tier, const std::vector<BlockRecordIdentity>& identities, uint64_t first,
                 uint64_t count, std::vector<AlignedBuffer>& out) {
  std::vector<DiskTier::LoadRequest> requests;
  for (uint64_t i = first; i < first + count; ++i) {
    requests.push_back(
        {&identities[i], absl::MakeSpan(out[i - first].data(), out[i - first].size())});
  }
  const auto start = std::chrono::steady_clock::now();
  for (const absl::Status& status : tier.LoadMany(requests)) {
    bench::CheckOk(status, "DiskTier::LoadMany");
  }
  return Seconds(start);
}

int Run(const std::string& dir, uint64_t block_bytes, uint64_t blocks) {
  std::filesystem::create_directories(dir);
  const std::string path = dir + "/disk_tier_bench.kvt";
  std::filesystem::remove(path);
  std::string bytes(block_bytes, '\0');
  for (uint64_t i = 0; i < block_bytes; ++i) bytes[i] = static_cast<char>(i * 131 + 7);
  std::vector<BlockRecordIdentity> identities;
  for (uint64_t i = 0; i < blocks; ++i) identities.push_back(Identity(i, bytes));
  const double gib = static_cast<double>(block_bytes * blocks) / (1 << 30);
  std::printf("disk_tier_bench: %llu blocks of %llu KiB (%.2f GiB) in %s, depth %u\n",
              static_cast<unsigned long long>(blocks),
              static_cast<unsigned long long>(block_bytes >> 10), gib, dir.c_str(), kDepth);

  // Stores: batched fdatasync, then RWF_DSYNC per write, then batched sealed, each on a fresh
  // file.
  const std::shared_ptr<const TierKeyring> keyring = BenchKeyring();
  double store_batch = 1e9, store_dsync = 1e9, store_sealed = 1e9, raw_write = 1e9;
  uint64_t slot_bytes = 0, syncs = 0;
  auto ring = IoRing::Create(kDepth + 1);
  bench::CheckOk(ring.status(), "IoRing::Create");
  for (int round = 0; round < 2; ++round) {
    for (auto durability : {DiskTierOptions::Durability::kBatchFdatasync,
                            DiskTierOptions::Durability::kDsyncPerWrite}) {
      std::filesystem::remove(path);
      DiskTierOptions options = Options(path, block_bytes, blocks);
      options.durability = durability;
      auto tier = DiskTier::Open(options);
      bench::CheckOk(tier.status(), "DiskTier::Open");
      if (!(*tier)->direct_io()) std::printf("  (the file system refused O_DIRECT)\n");
      slot_bytes = (*tier)->slot_bytes();
      const double seconds = StoreAll(**tier, identities, bytes);
      if (durability == DiskTierOptions::Durability::kBatchFdatasync) {
        store_batch = std::min(store_batch, seconds);
        syncs = (*tier)->stats().syncs;
      } else {
        store_dsync = std::min(store_dsync, seconds);
      }
    }
    {
      std::filesystem::remove(path);
      auto tier = DiskTier::Open(Options(path, block_bytes, blocks, keyring));
      bench::CheckOk(tier.status(), "DiskTier::Open");
      store_sealed = std::min(store_sealed, StoreAll(**tier, identities, bytes));
    }
    // Raw writes of the same slots into a fresh preallocated file, as the tier's first stores.
    const std::string raw_path = path + ".raw";
    const int fd = ::open(raw_path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd < 0 || ::fallocate(fd, 0, 0, slot_bytes * blocks) != 0) {
      bench::Fail("cannot create and preallocate " + raw_path + " with O_DIRECT");
    }
    AlignedBuffer slot(slot_bytes);
    raw_write = std::min(raw_write, RawWrites(fd, slot_bytes, blocks, **ring, slot.data()));
    ::close(fd);
    std::filesystem::remove(raw_path);
  }
  std::printf("store   raw O_DIRECT + 1 fdatasync %7.2f GiB/s\n", gib / raw_write);
  std::printf("store   batched fdatasync          %7.2f GiB/s  %.2fx raw  (%llu syncs)\n",
              gib / store_batch, raw_write / store_batch, static_cast<unsigned long long>(syncs));
  std::printf("store   RWF_DSYNC per write        %7.2f GiB/s  %.2fx raw\n", gib / store_dsync,
              raw_write / store_dsync);
  std::printf(
      "store   sealed, batched fdatasync  %7.2f GiB/s  %.2fx unsealed (sealed by the "
      "writer)\n",
      gib / store_sealed, store_batch / store_sealed);

  // Loads: a file written by the tier, read by the tier and raw, alternating; and a second file
  // written sealed, read by a sealed tier in the same rounds.
  const std::string sealed_path = path + ".sealed";
  std::filesystem::remove(path);
  std::filesystem::remove(sealed_path);
  double scan_seconds = 0, sealed_scan_seconds = 0;
  {
    auto tier = DiskTier::Open(Options(path, block_bytes, blocks));
    bench::CheckOk(tier.status(), "DiskTier::Open");
    StoreAll(**tier, identities, bytes);
    auto sealed = DiskTier::Open(Options(sealed_path, block_bytes, blocks, keyring));
    bench::CheckOk(sealed.status(), "DiskTier::Open");
    StoreAll(**sealed, identities, bytes);
  }
  auto tier = DiskTier::Open(Options(path, block_bytes, blocks));
  bench::CheckOk(tier.status(), "DiskTier::Open");
  scan_seconds = absl::ToDoubleSeconds((*tier)->stats().restart_scan_time);
  auto sealed_tier = DiskTier::Open(Options(sealed_path, block_bytes, blocks, keyring));
  bench::CheckOk(sealed_tier.status(), "DiskTier::Open");
  sealed_scan_seconds = absl::ToDoubleSeconds((*sealed_tier)->stats().restart_scan_time);
  if ((*sealed_tier)->stats().restart_records != blocks) bench::Fail("sealed records lost");
  const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) bench::Fail("cannot open " + path + " with O_DIRECT");
  AlignedBuffer raw_buffers(slot_bytes * kDepth);
  // Page-aligned destinations, as a pool's blocks: the tier reads straight into them.
  std::vector<AlignedBuffer> out;
  for (uint32_t i = 0; i < kLoadBatch; ++i) out.emplace_back(block_bytes);
  // Paired: each run of kLoadBatch slots is read both ways back to back, so both see the same
  // device state (a VM's disk varies widely from run to run), in alternating order, so neither
  // gains from a cache below the guest having just read the same slots.
  // The sealed loads alternate with the unsealed ones the same way.
  double raw = 0, loaded = 0, sealed_loaded = 0;
  bool raw_first = true;
  for (int round = 0; round < kRounds; ++round) {
    for (uint64_t first = 0; first < blocks; first += kLoadBatch, raw_first = !raw_first) {
      const uint64_t count = std::min<uint64_t>(kLoadBatch, blocks - first);
      if (!raw_first) {
        loaded += TierLoads(**tier, identities, first, count, out);
        sealed_loaded += TierLoads(**sealed_tier, identities, first, count, out);
      }
      std::vector<uint64_t> slots(count);
      std::iota(slots.begin(), slots.end(), first);
      raw += bench::RawDirectReads(fd, slot_bytes, slots, kDepth, **ring, raw_buffers);
      if (raw_first) {
        sealed_loaded += TierLoads(**sealed_tier, identities, first, count, out);
        loaded += TierLoads(**tier, identities, first, count, out);
      }
    }
  }
  raw /= kRounds;
  loaded /= kRounds;
  sealed_loaded /= kRounds;
  ::close(fd);
  std::printf("load    raw O_DIRECT reads         %7.2f GiB/s\n", gib / raw);
  std::printf(
      "load    DiskTier::LoadMany         %7.2f GiB/s  %.2fx raw (verified, read in place)\n",
      gib / loaded, raw / loaded);
  std::printf(
      "load    DiskTier::LoadMany sealed  %7.2f GiB/s  %.2fx unsealed (opened, decrypted in "
      "place; %d seal workers)\n",
      gib / sealed_loaded, loaded / sealed_loaded, BenchTaskWorkers()->threads());
  std::printf("restart scan of %llu slots         %7.1f ms (%.1f us a slot)\n",
              static_cast<unsigned long long>(blocks), scan_seconds * 1e3,
              scan_seconds * 1e6 / blocks);
  std::printf("restart scan of %llu sealed slots  %7.1f ms (%.1f us a slot)\n",
              static_cast<unsigned long long>(blocks), sealed_scan_seconds * 1e3,
              sealed_scan_seconds * 1e6 / blocks);
  tier->reset();
  sealed_tier->reset();
  std::filesystem::remove(path);
  std::filesystem::remove(sealed_path);

  // Warm restart at a realistic slot count: 65536 slots is a 128 GiB file of 2 MiB blocks; the
  // scan reads one 4 KiB header a slot, so 4 KiB blocks give the same scan at 1/256 of the disk.
  const uint64_t kScanSlots = bench::FullOrSmoke(65536, 1024);
  std::vector<BlockRecordIdentity> small_ids;
  const std::string small(4096, 's');
  for (uint64_t i = 0; i < kScanSlots; ++i) small_ids.push_back(Identity(i, small));
  {
    auto filler = DiskTier::Open(Options(path, small.size(), kScanSlots));
    bench::CheckOk(filler.status(), "DiskTier::Open");
    StoreAll(**filler, small_ids, small);
  }
  auto reopened = DiskTier::Open(Options(path, small.size(), kScanSlots));
  bench::CheckOk(reopened.status(), "DiskTier::Open");
  const DiskTierStats stats = (*reopened)->stats();
  std::printf("restart scan of %llu slots (%llu records) %7.1f ms\n",
              static_cast<unsigned long long>(kScanSlots),
              static_cast<unsigned long long>(stats.restart_records),
              absl::ToDoubleMilliseconds(stats.restart_scan_time));
  reopened->reset();
  std::filesystem::remove(path);
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = argc > 1 ? argv[1] : std::string(tmp != nullptr ? tmp : "/tmp");
  const uint64_t block_kib = argc > 2 ? std::strtoull(argv[2], nullptr, 10) : 1024;
  const uint64_t blocks = argc > 3 ? std::strtoull(argv[3], nullptr, 10) : 512;
  return kvcache::Run(dir + "/kvcache_disk_tier_bench", block_kib << 10, blocks);
}
