// Tiers 2 and 3: loading blocks from them vs the plain copy or read of the same bytes,
// measured in one run. Per block size:
//   HostTier::Load   copy out of the tier's slot, XXH3-64 verified as it copies, vs memcpy of the
//                    same bytes between the same kind of buffers (target >= 0.8x);
//   Pool::Open       an OpenSequence whose whole prefix comes up from tier 2 (probe under the
//   from tier 2      pool mutex, load into fresh pool blocks, verify, publish), per byte loaded,
//                    vs the same memcpy (target >= 0.8x). As in the daemon, a batch of 1 MiB
//                    or more is copied on the open's thread and the pool's workers (a quarter of
//                    the cores, 1 to 4; memcpy is one thread); a second row without them;
//   Pool::Open       the same into a CUDA pool (H2D from page-locked tier 2, verified on the
//   tier 2->GPU      host meanwhile), vs cudaMemcpyAsync of the same slots in the same batches
//                    (target >= 0.8x; "device", needs a GPU, skipped without one);
//   Pool::Open       the same with the prefix only on disk (evicted from tiers 1 and 2), vs raw
//   from tier 3      io_uring O_DIRECT reads of as many slots of the same file at the tier's read
//                    depth (target >= 0.8x), and raw reads in drained batches of that depth (what
//                    a walk that loads one LoadMany batch at a time can reach at best);
//   Pool::Open       the same opens from a sealed tier 3 (--tier_key_file: AES-256-GCM, each
//   tier 3 sealed    record opened for its tenant) vs from an unsealed one (target >= 0.9x).
// Working sets exceed the last-level cache (both sides stream from memory). Then the offload
// window sweep: which share of tier 1 the mover should keep copied below (counts, no times).
// Last, puts larger than the offload window (issue 29): puts/s into a pool with tiers 2 and 3 and
// its mover running vs the same pool without tiers, and how many evicted blocks were below.
// No timing asserted. Exits 1 at the first error, a short load included (bench/bench_run.h);
// KVCACHE_BENCH_SMOKE=1 runs every part at small sizes.
// Usage: tier_bench [seconds per measurement] [all|load|open|device|disk|sweep|admission|puts]
// [DIR];
// DIR (default $TMPDIR or /tmp) holds the tier-3 file and must be on the disk to measure (not
// tmpfs).
#include "bench/tier_bench_common.h"

namespace kvcache::tier_bench {
namespace {

BlockRecordIdentity RecordFor(uint64_t i, const uint8_t* bytes, uint64_t size) {
  return BlockRecordIdentity{.hash = {i + 1, i * 31 + 7},
                             .parent_hash = {i, i},
                             .namespace_digest = 1,
                             .tokens = std::vector<uint32_t>(16, static_cast<uint32_t>(i)),
                             .checksum = BlockChecksum(bytes, size)};
}

// HostTier::Load of `blocks` records, round robin, vs memcpy between buffers of the same size.
void LoadVsMemcpy(uint64_t block_bytes, uint32_t blocks, double seconds) {
  auto tier = HostTier::Create(block_bytes * blocks, block_bytes);
  bench::CheckOk(tier.status(), "HostTier::Create");
  std::vector<uint8_t> source(block_bytes * blocks), out(block_bytes * blocks);
  for (size_t i = 0; i < source.size(); ++i)
    source[i] = static_cast<uint8_t>(i * 2654435761u >> 13);
  std::vector<BlockRecordIdentity> records;
  for (uint32_t i = 0; i < blocks; ++i) {
    const uint8_t* bytes = source.data() + i * block_bytes;
    records.push_back(RecordFor(i, bytes, block_bytes));
    bench::CheckOk((*tier)->Store(records.back(), bytes).status(), "HostTier::Store");
  }
  // The baseline copies the very same bytes from the very same addresses: memcpy's speed depends
  // on where source and destination lie relative to each other.
  std::vector<const uint8_t*> slots;
  for (const BlockRecordIdentity& record : records) {
    slots.push_back((*tier)->RecordBytesForTesting(record.hash));
  }
  uint64_t failures = 0;
  const Comparison c = Compare(
      seconds, block_bytes * blocks,
      [&] {
        for (uint32_t i = 0; i < blocks; ++i) {
          failures += !(*tier)->Load(records[i], out.data() + i * block_bytes).ok();
        }
      },
      [&] {
        for (uint32_t i = 0; i < blocks; ++i) {
          std::memcpy(out.data() + i * block_bytes, slots[i], block_bytes);
        }
      });
  std::printf("%-22s %9llu KiB %8u %10.2f %10.2f %7.2fx %s\n", "HostTier::Load",
              static_cast<unsigned long long>(block_bytes >> 10), blocks, c.a_rate / 1e9,
              c.b_rate / 1e9, c.median_ratio, failures == 0 ? "" : "LOAD FAILURES");
  if (failures != 0) bench::Fail("HostTier::Load failed");
}

// Open of a prompt whose `prefix_blocks` come up from tier 2 each time: a pool of exactly
// prefix_blocks + 1 blocks is refilled by another prompt between opens, so every open loads the
// whole prefix again. Per byte loaded, vs the plain copy of as many bytes from the same slots:
// memcpy for a host pool; for a CUDA pool (`on_device`), one batch of cudaMemcpyAsync H2D copies
// from the same page-locked slots and one synchronization (PoolMemory::CopyFromHost).
// `workers`: the pool's workers (the daemon's: TaskWorkers::DefaultThreads()), or none (the
// open copies on its own thread); `label` names the row.
void OpenFromTierVsCopy(const PoolLayout& layout, uint32_t prefix_blocks, double seconds,
                        bool on_device, std::shared_ptr<TaskWorkers> workers, const char* label) {
  // Offload is not what is measured; the whole prefix goes down.
  PoolOptions options =
      ManualTierOptions("bench", layout, prefix_blocks + 1, 2 * prefix_blocks + 2);
  options.offload_window = options.num_blocks;
  options.workers = std::move(workers);
  const uint64_t block_bytes = layout.BlockBytes();
  const auto create_memory = [&](uint32_t blocks) -> absl::StatusOr<std::unique_ptr<PoolMemory>> {
    if (on_device) return CreateCudaPoolMemory(0, block_bytes, blocks);
    auto host = HostPoolMemory::Create(block_bytes, blocks);
    if (!host.ok()) return host.status();
    return std::unique_ptr<PoolMemory>(*std::move(host));
  };
  absl::StatusOr<std::unique_ptr<PoolMemory>> memory = create_memory(options.num_blocks);
  // The device baseline's destination: blocks of their own, on the same device.
  absl::StatusOr<std::unique_ptr<PoolMemory>> destination = create_memory(prefix_blocks);
  if (on_device && (!memory.ok() || !destination.ok())) {
    std::printf("%-22s %9llu KiB: skipped (%s)\n", "Pool::Open from tier 2",
                static_cast<unsigned long long>(block_bytes >> 10),
                (memory.ok() ? destination.status() : memory.status()).ToString().c_str());
    return;
  }
  bench::CheckOk(memory.status(), "pool memory");
  bench::CheckOk(destination.status(), "pool memory");
  auto pool = Pool::Create(options, 0, *std::move(memory));
  bench::CheckOk(pool.status(), "Pool::Create");
  Session session(1, "uid:0", "tenant", "bench", absl::Seconds(600));
  const uint32_t tokens = prefix_blocks * layout.block_size;
  std::vector<uint32_t> prompt(tokens + 1), other(tokens + 1);
  std::iota(prompt.begin(), prompt.end(), 0);
  std::iota(other.begin(), other.end(), 1u << 30);
  for (const std::vector<uint32_t>* which : {&prompt, &other}) {
    if (!ComputeOnce(**pool, session, *which)) bench::Fail("a prompt could not be computed");
    (*pool)->OffloadForTesting();
  }
  uint64_t short_loads = 0;
  // The baseline copies the same records' bytes, from where tier 2 keeps them.
  std::vector<const uint8_t*> slots;
  for (const std::vector<uint32_t>* which : {&prompt, &other}) {
    const std::vector<Hash128> chain = ChainOf(**pool, session, *which);
    for (uint32_t i = 0; i < prefix_blocks; ++i) {
      slots.push_back((*pool)->host_tier()->RecordBytesForTesting(chain[i]));
      if (slots.back() == nullptr) bench::Fail("a prefix block is not in tier 2");
    }
  }
  AlignedBuffer out(block_bytes * prefix_blocks);
  std::vector<PoolMemory::HostCopy> copies;
  for (size_t i = 0; i < slots.size(); ++i) {
    copies.push_back(PoolMemory::HostCopy{.block = static_cast<uint32_t>(i % prefix_blocks),
                                          .host = const_cast<uint8_t*>(slots[i])});
  }
  uint64_t copy_failures = 0;
  // Two opens per step, each loading the whole prefix of its prompt (the other prompt's blocks
  // are what tier 1 holds), so a step moves twice the prefix.
  const Comparison c = Compare(
      seconds, 2 * block_bytes * prefix_blocks,
      [&] {
        short_loads += OpenAndRelease(**pool, session, {&prompt, &other}, tokens,
                                      &OpenedSequence::num_host_tier_tokens);
      },
      [&] {
        if (on_device) {
          // As the pool loads: one batch (kLoadBatch records) per synchronization.
          for (size_t i = 0; i < copies.size(); i += LowerTiers::kLoadBatch) {
            const size_t n = std::min(LowerTiers::kLoadBatch, copies.size() - i);
            if (!(*destination)->CopyFromHost(absl::MakeConstSpan(copies).subspan(i, n), {}).ok()) {
              ++copy_failures;
            }
          }
          return;
        }
        for (size_t i = 0; i < slots.size(); ++i) {
          std::memcpy(out.data() + (i % prefix_blocks) * block_bytes, slots[i], block_bytes);
        }
      });
  std::printf("%-22s %9llu KiB %8u %10.2f %10.2f %7.2fx %s\n", label,
              static_cast<unsigned long long>(block_bytes >> 10), prefix_blocks, c.a_rate / 1e9,
              c.b_rate / 1e9, c.median_ratio,
              short_loads + copy_failures == 0 ? "" : "SHORT LOADS OR FAILED COPIES");
  if (short_loads + copy_failures != 0) bench::Fail("short loads or failed copies");
}

// Where a replay's prompt tokens came from.
struct TierTokenCounts {
  uint64_t tier1 = 0;
  uint64_t tier2 = 0;
  uint64_t disk = 0;
  uint64_t prompt = 0;
  uint64_t computed() const { return prompt - tier1 - tier2 - disk; }
};

// The sweeps' workload: `requests` prompts, each one of `documents` shared `prefix_blocks`-block
// prefixes drawn Zipf 1.0 (a fixed seed) plus a unique `suffix_blocks`-block suffix, each opened,
// committed (KV is whatever the pool holds: the sweeps count blocks, not bytes) and released;
// `after_request(r)` runs after request r. False if a call fails.
bool ReplaySharedDocuments(Pool& pool, uint32_t documents, uint32_t prefix_blocks,
                           uint32_t suffix_blocks, uint32_t requests,
                           absl::FunctionRef<void(uint32_t)> after_request,
                           TierTokenCounts* counts) {
  const uint32_t block_size = pool.options().layout.block_size;
  std::vector<double> cdf(documents);
  double total = 0;
  for (uint32_t d = 0; d < documents; ++d) cdf[d] = total += 1.0 / (d + 1);
  Session session(1, "uid:0", "tenant", "bench", absl::Seconds(600));
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> uniform(0, total);
  std::vector<uint32_t> prompt((prefix_blocks + suffix_blocks) * block_size + 1);
  for (uint32_t r = 0; r < requests; ++r) {
    const uint32_t document =
        static_cast<uint32_t>(std::lower_bound(cdf.begin(), cdf.end(), uniform(rng)) - cdf.begin());
    for (uint32_t t = 0; t < prefix_blocks * block_size; ++t) prompt[t] = document * 100000 + t;
    for (uint32_t t = prefix_blocks * block_size; t < prompt.size(); ++t) {
      prompt[t] = (1u << 30) + r * 1000 + t;
    }
    auto opened = pool.Open(session, SequenceSpec{prompt});
    if (!opened.ok() || !pool.Commit(session, opened->sequence_id, prompt.size()).ok() ||
        !pool.Release(session, opened->sequence_id).ok()) {
      return false;
    }
    counts->tier1 +=
        opened->num_cached_tokens - opened->num_host_tier_tokens - opened->num_disk_tier_tokens;
    counts->tier2 += opened->num_host_tier_tokens;
    counts->disk += opened->num_disk_tier_tokens;
    counts->prompt += prompt.size();
    after_request(r);
  }
  return true;
}

// How far ahead the mover should work: a workload replayed against pools that differ only in
// their offload window. Prompts are one of `kDocuments` shared 32-block prefixes (Zipf 1.0) plus
// a 2-block unique suffix, more than tier 1 holds; the mover runs every `lag` requests (a mover
// that falls behind by that much). Deterministic: counts, not times.
void WindowSweep(uint32_t lag) {
  constexpr uint32_t kPoolBlocks = 1024, kTierBlocks = 8192, kDocuments = 200;
  constexpr uint32_t kPrefixBlocks = 32, kSuffixBlocks = 2;
  const uint32_t kRequests = bench::FullOrSmoke(20000, 1000);
  const PoolLayout layout{.num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_size = 16};
  std::printf(
      "\nmover lag %u requests (pool %u blocks, tier 2 %u, %u documents of %u blocks, "
      "Zipf 1.0, %u requests)\n",
      lag, kPoolBlocks, kTierBlocks, kDocuments, kPrefixBlocks, kRequests);
  std::printf("%-10s %10s %10s %10s %12s %14s %16s\n", "window", "tier1 hit", "tier2 hit",
              "computed", "copies/req", "evictions saved", "of copies, by requests");
  for (uint32_t window : {16u, 64u, 128u, 256u, 512u, 1024u}) {
    PoolOptions options = ManualTierOptions("sweep", layout, kPoolBlocks, kTierBlocks);
    options.offload_window = window;
    auto memory = HostPoolMemory::Create(layout.BlockBytes(), kPoolBlocks);
    auto pool = Pool::Create(options, 0, *std::move(memory));
    bench::CheckOk(pool.status(), "Pool::Create");
    TierTokenCounts counts;
    if (!ReplaySharedDocuments(
            **pool, kDocuments, kPrefixBlocks, kSuffixBlocks, kRequests,
            [&](uint32_t r) {
              if ((r + 1) % lag == 0) (*pool)->OffloadForTesting();
            },
            &counts)) {
      bench::Fail("the window sweep's replay failed");
    }
    const PoolStatsSnapshot stats = (*pool)->Stats();
    const double evictions = stats.pool.evictions;
    // Copies by the mover and by requests that evicted blocks it had not reached.
    const double copies =
        stats.host_tier->offloaded_blocks + stats.host_tier->passed_down_on_eviction;
    std::printf("%-10u %9.1f%% %9.1f%% %9.1f%% %12.2f %13.1f%% %15.1f%%\n", window,
                100.0 * counts.tier1 / counts.prompt, 100.0 * counts.tier2 / counts.prompt,
                100.0 * counts.computed() / counts.prompt, copies / kRequests,
                evictions == 0 ? 0 : 100.0 * stats.pool.evicted_offloaded / evictions,
                copies == 0 ? 0 : 100.0 * stats.host_tier->passed_down_on_eviction / copies);
  }
}

// The disk tier's admission filter: the window sweep's workload (shared Zipf documents, a unique
// suffix per request) against tier 1 < tier 2 < disk, once passing every record near tier 2's
// eviction end down (all) and once only records of blocks hit at least once (reused). Counts:
// where prompt tokens came from, and disk writes per request (what wears an SSD).
void AdmissionSweep(const std::string& dir) {
  constexpr uint32_t kPoolBlocks = 512, kTierBlocks = 1024, kDiskBlocks = 16384;
  constexpr uint32_t kDocuments = 400, kPrefixBlocks = 32, kSuffixBlocks = 2;
  const uint32_t kRequests = bench::FullOrSmoke(20000, 1000);
  constexpr uint32_t kLag = 8;
  const PoolLayout layout{.num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_size = 16};
  std::printf(
      "\ndisk admission (pool %u blocks, tier 2 %u, disk %u, %u documents of %u blocks + %u "
      "unique, Zipf 1.0, %u requests, mover every %u)\n",
      kPoolBlocks, kTierBlocks, kDiskBlocks, kDocuments, kPrefixBlocks, kSuffixBlocks, kRequests,
      kLag);
  std::printf("%-10s %10s %10s %10s %10s %14s %16s\n", "admission", "tier1 hit", "tier2 hit",
              "disk hit", "computed", "disk writes/req", "disk hits/write");
  std::filesystem::create_directories(dir);
  for (DiskAdmission admission : {DiskAdmission::kAll, DiskAdmission::kReused}) {
    PoolOptions options = ManualTierOptions("admission", layout, kPoolBlocks, kTierBlocks);
    options.disk_tier_path = dir + "/admission.tier";
    options.disk_tier_bytes = uint64_t{kDiskBlocks} * (4096 + 4096);
    options.disk_admission = admission;
    std::filesystem::remove(options.disk_tier_path);
    auto memory = HostPoolMemory::Create(layout.BlockBytes(), kPoolBlocks);
    auto pool = Pool::Create(options, 0, *std::move(memory));
    if (!pool.ok()) {
      std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
      std::exit(1);
    }
    TierTokenCounts counts;
    const bool replayed = ReplaySharedDocuments(
        **pool, kDocuments, kPrefixBlocks, kSuffixBlocks, kRequests,
        [&](uint32_t r) {
          if ((r + 1) % kLag != 0) return;
          (*pool)->OffloadForTesting();
          // Visibility as of this pass: the counts do not race the disk's writer.
          (*pool)->disk_tier()->Flush();
        },
        &counts);
    if (!replayed) bench::Fail("the admission sweep's replay failed");
    const PoolStatsSnapshot stats = (*pool)->Stats();
    const double writes = stats.disk_tier->store.stores_durable;
    std::printf("%-10s %9.1f%% %9.1f%% %9.1f%% %9.1f%% %14.2f %16.2f\n",
                admission == DiskAdmission::kAll ? "all" : "reused",
                100.0 * counts.tier1 / counts.prompt, 100.0 * counts.tier2 / counts.prompt,
                100.0 * counts.disk / counts.prompt, 100.0 * counts.computed() / counts.prompt,
                writes / kRequests, writes == 0 ? 0 : stats.disk_tier->hit_blocks / writes);
    pool->reset();
    std::filesystem::remove(options.disk_tier_path);
  }
  std::filesystem::remove(dir);
}

// Puts larger than the offload window: 32-block puts (open, write every block, commit, release)
// into a 128-block pool of 32 KiB blocks (offload window 16) that evicts on every put, with a
// tier 2 of 4x the pool, a disk tier of 16x under it and the mover thread running, vs the same
// puts into a pool without tiers. Both pools live side by side, measured in turn in short phases
// (the median of the rounds' ratios). Then the share of evictions whose block was below: tier 1's
// victims in tier 2 (or on disk), and tier 2's victims durable on disk when evicted.
void LargePuts(double seconds, const std::string& dir) {
  constexpr uint32_t kPoolBlocks = 128, kPutBlocks = 32, kRounds = 9;
  const PoolLayout layout{.num_layers = 4,
                          .num_kv_heads = 2,
                          .head_dim = 64,
                          .block_size = 16,
                          .dtype = DType::kFloat16};
  std::filesystem::create_directories(dir);
  const auto make_pool = [&](const std::string& name, bool tiers) -> std::unique_ptr<Pool> {
    PoolOptions options = ManualTierOptions(name, layout, kPoolBlocks, tiers ? 4 * kPoolBlocks : 0);
    options.testing_manual_offload = false;
    if (tiers) {
      options.disk_tier_path = dir + "/" + name + ".tier";
      std::filesystem::remove(options.disk_tier_path);
      options.disk_tier_bytes = uint64_t{16 * kPoolBlocks} * (4096 + layout.BlockBytes());
    }
    auto memory = HostPoolMemory::Create(layout.BlockBytes(), kPoolBlocks);
    auto pool = Pool::Create(options, 0, *std::move(memory));
    if (!pool.ok()) {
      std::fprintf(stderr, "%s\n", pool.status().ToString().c_str());
      std::exit(1);
    }
    return *std::move(pool);
  };
  std::unique_ptr<Pool> plain = make_pool("plain", false);
  std::unique_ptr<Pool> tiered = make_pool("tiered", true);
  Session session(1, "uid:0", "tenant", "bench", absl::Seconds(600));
  std::string bytes(layout.BlockBytes(), 'k');
  uint32_t next_prompt = 0;
  const auto puts_per_second = [&](Pool& pool, double phase) {
    std::vector<uint32_t> tokens(kPutBlocks * layout.block_size);
    uint64_t puts = 0;
    const auto start = SteadyClock::now();
    double elapsed = 0;
    for (; elapsed < phase; ++puts) {
      std::iota(tokens.begin(), tokens.end(), ++next_prompt * 100000);
      auto opened = pool.Open(session, SequenceSpec{tokens}, OpenMode::kPut);
      if (!opened.ok()) {
        std::fprintf(stderr, "put: %s\n", opened.status().ToString().c_str());
        std::exit(1);
      }
      for (BlockId block : opened->block_ids) {
        bytes[0] = static_cast<char>(block);
        (void)pool.WriteBlock(block, 0, bytes);
      }
      (void)pool.Commit(session, opened->sequence_id, tokens.size());
      (void)pool.Release(session, opened->sequence_id);
      elapsed = std::chrono::duration<double>(SteadyClock::now() - start).count();
    }
    return puts / elapsed;
  };
  const double phase = std::max(0.1, seconds / 2);
  puts_per_second(*plain, phase);
  puts_per_second(*tiered, phase);
  const PoolStatsSnapshot warm = tiered->Stats();
  std::vector<double> ratios;
  double plain_rate = 0, tiered_rate = 0;
  for (uint32_t round = 0; round < kRounds; ++round) {
    const bool plain_first = round % 2 == 0;
    const double first = puts_per_second(plain_first ? *plain : *tiered, phase);
    const double second = puts_per_second(plain_first ? *tiered : *plain, phase);
    const double plain_puts = plain_first ? first : second;
    const double tiered_puts = plain_first ? second : first;
    plain_rate += plain_puts / kRounds;
    tiered_rate += tiered_puts / kRounds;
    ratios.push_back(tiered_puts / plain_puts);
  }
  std::sort(ratios.begin(), ratios.end());
  tiered->disk_tier()->Flush();
  const PoolStatsSnapshot stats = tiered->Stats();
  const double evictions = stats.pool.evictions - warm.pool.evictions;
  const double saved = stats.pool.evicted_offloaded - warm.pool.evicted_offloaded;
  const double tier2_evictions = stats.host_tier->store.evicted - warm.host_tier->store.evicted;
  const double on_disk = stats.disk_tier->evicted_from_above - warm.disk_tier->evicted_from_above;
  const double demoted = stats.disk_tier->demoted_blocks - warm.disk_tier->demoted_blocks;
  const double refused =
      stats.disk_tier->store.stores_refused_full - warm.disk_tier->store.stores_refused_full;
  std::printf(
      "\n%u-block puts of %llu KiB blocks into a %u-block pool (offload window %u), tiers 2+3 and "
      "the mover vs no tiers, %u rounds of two %.2f s phases\n",
      kPutBlocks, static_cast<unsigned long long>(layout.BlockBytes() >> 10), kPoolBlocks,
      tiered->offload_window(), kRounds, phase);
  std::printf("puts/s: no tiers %.0f, tiers %.0f; median ratio %.2fx\n", plain_rate, tiered_rate,
              ratios[ratios.size() / 2]);
  std::printf(
      "tier-1 evictions whose block was below: %.1f%% of %.0f; tier-2 evictions already durable "
      "on disk: %.1f%% of %.0f\n",
      evictions == 0 ? 0 : 100.0 * saved / evictions, evictions,
      tier2_evictions == 0 ? 0 : 100.0 * on_disk / tier2_evictions, tier2_evictions);
  std::printf("tier-2 records passed to disk: %.0f taken, %.0f refused (queue full)\n", demoted,
              refused);
  tiered.reset();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kvcache::tier_bench

int main(int argc, char** argv) {
  // As kvcache-manager runs (manager_main.cc): Debian's abseil otherwise checks every Mutex
  // acquisition against a global lock graph, a cost the daemon does not pay.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  const double seconds = argc > 1 ? std::atof(argv[1]) : 1.0;
  // Optional: one part only ("load", "open", "device", "disk", "sweep", "admission", "puts"; "all"
  // or none: every part).
  const std::string only = argc > 2 && std::string(argv[2]) != "all" ? argv[2] : "";
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = argc > 3 ? argv[3] : std::string(tmp != nullptr ? tmp : "/tmp");
  const auto runs = [&](const char* part) { return only.empty() || only == part; };
  std::printf("tier 2 loads vs memcpy (one thread) of the same bytes, %.1f s per figure\n",
              seconds);
  std::printf("%-22s %13s %8s %10s %10s %8s\n", "path", "block", "blocks", "GB/s", "memcpy",
              "median ratio of 9 alternating rounds");
  // 32 KiB: the default pool's block; 256 KiB and 2 MiB: larger models' blocks.
  for (uint64_t block_bytes : {32ull << 10, 256ull << 10, 2ull << 20}) {
    if (!runs("load")) break;
    const uint64_t bytes = kvcache::bench::FullOrSmoke(256ull << 20, 8ull << 20);
    kvcache::tier_bench::LoadVsMemcpy(block_bytes, static_cast<uint32_t>(bytes / block_bytes),
                                      seconds);
  }
  // Pool blocks of 32 KiB (the default layout) and 256 KiB (48 layers, 4 heads, 128 dims, fp16,
  // 16 tokens would be 1.5 MiB; 8 layers keeps the bench's memory small).
  const kvcache::PoolLayout small{.num_layers = 4,
                                  .num_kv_heads = 2,
                                  .head_dim = 64,
                                  .block_size = 16,
                                  .dtype = kvcache::DType::kFloat16};
  const kvcache::PoolLayout large{.num_layers = 8,
                                  .num_kv_heads = 4,
                                  .head_dim = 128,
                                  .block_size = 16,
                                  .dtype = kvcache::DType::kFloat16};
  // Prefixes of 64 MiB and 32 MiB (a smoke run's: 2 MiB and 1 MiB).
  const uint32_t small_prefix = kvcache::bench::FullOrSmoke(2048, 64);
  const uint32_t large_prefix = kvcache::bench::FullOrSmoke(128, 4);
  // The daemon's workers (kvcache-manager makes one set for every pool).
  const auto workers =
      std::make_shared<kvcache::TaskWorkers>(kvcache::TaskWorkers::DefaultThreads());
  if (runs("open")) {
    for (const kvcache::PoolLayout* layout : {&small, &large}) {
      const uint32_t prefix = layout == &small ? small_prefix : large_prefix;
      kvcache::tier_bench::OpenFromTierVsCopy(*layout, prefix, seconds, false, workers,
                                              "Pool::Open from tier 2");
      kvcache::tier_bench::OpenFromTierVsCopy(*layout, prefix, seconds, false, nullptr,
                                              "  no workers");
    }
  }
  if (runs("device")) {
    std::printf(
        "\ntier 2 loads into a CUDA pool vs cudaMemcpyAsync H2D of the same page-locked "
        "slots\n");
    kvcache::tier_bench::OpenFromTierVsCopy(small, small_prefix, seconds, true, workers,
                                            "Pool::Open tier 2->GPU");
    kvcache::tier_bench::OpenFromTierVsCopy(large, large_prefix, seconds, true, workers,
                                            "Pool::Open tier 2->GPU");
  }
  if (runs("disk")) {
    // 64 MiB prefixes of 32 KiB and 256 KiB blocks.
    std::printf("\ntier 3 loads vs raw io_uring O_DIRECT reads of as many slots, %s\n",
                (dir + "/kvcache_tier_bench").c_str());
    std::printf("%-22s %13s %8s %10s %10s %8s %6s %6s %6s %6s\n", "path", "block", "blocks", "GB/s",
                "raw", "ratio", "cpu", "raw", "wait", "raw");
    std::printf(
        "(ratio: the median of 9 alternating rounds; cpu: the measuring thread's time on a "
        "CPU per second, wait: its time runnable but waiting for one)\n");
    kvcache::tier_bench::OpenFromDiskVsRawReads(small, small_prefix, seconds,
                                                dir + "/kvcache_tier_bench");
    kvcache::tier_bench::OpenFromDiskVsRawReads(large, 2 * large_prefix, seconds,
                                                dir + "/kvcache_tier_bench");
    std::printf("\nsealed tier 3 (--tier_key_file, AES-256-GCM) vs unsealed, the same opens\n");
    std::printf("%-22s %13s %8s %10s %10s %8s %6s %6s %6s %6s\n", "path", "block", "blocks", "GB/s",
                "unsealed", "ratio", "cpu", "unseal", "wait", "unseal");
    kvcache::tier_bench::OpenFromSealedVsUnsealedDisk(small, small_prefix, seconds,
                                                      dir + "/kvcache_tier_bench");
    kvcache::tier_bench::OpenFromSealedVsUnsealedDisk(large, 2 * large_prefix, seconds,
                                                      dir + "/kvcache_tier_bench");
  }
  if (runs("sweep")) {
    for (uint32_t lag : {1u, 8u}) kvcache::tier_bench::WindowSweep(lag);
  }
  if (runs("admission")) kvcache::tier_bench::AdmissionSweep(dir + "/kvcache_tier_bench_admission");
  if (runs("puts")) kvcache::tier_bench::LargePuts(seconds, dir + "/kvcache_tier_bench_puts");
}
