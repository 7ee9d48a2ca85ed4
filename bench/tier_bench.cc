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
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <initializer_list>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "bench/bench_run.h"
#include "bench/raw_direct_reads.h"
#include "cache/cuda_pool_memory.h"
#include "cache/pool.h"
#include "common/block_checksum.h"
#include "common/task_workers.h"
#include "tiers/host_tier.h"
#include "tiers/io_ring.h"
#include "tiers/record_codec.h"
#include "tiers/tier_keyring.h"

namespace kvcache {
namespace {

using SteadyClock = std::chrono::steady_clock;

// The calling thread's time on a CPU and waiting for one (runnable, not running: what a busy
// shared machine costs a loop that must run to reap and refill its reads), in seconds.
struct ThreadTimes {
  double on_cpu = 0;
  double waiting = 0;
};
ThreadTimes ThreadTimesNow() {
  unsigned long long on_cpu_ns = 0, waiting_ns = 0;
  std::FILE* file = std::fopen("/proc/thread-self/schedstat", "r");
  if (file != nullptr) {
    if (std::fscanf(file, "%llu %llu", &on_cpu_ns, &waiting_ns) != 2) on_cpu_ns = waiting_ns = 0;
    std::fclose(file);
  }
  return {on_cpu_ns * 1e-9, waiting_ns * 1e-9};
}

struct Measured {
  double rate = 0;        // bytes per second
  double cpu_share = 0;   // this thread's time on a CPU per second of the phase
  double wait_share = 0;  // this thread's time waiting for a CPU per second of the phase
};

// Calls `step()` (which moves `bytes_per_step`) until `seconds` pass.
template <typename Step>
Measured Rate(double seconds, uint64_t bytes_per_step, Step step) {
  step();  // warm: page faults are not measured
  uint64_t steps = 0;
  const ThreadTimes times_start = ThreadTimesNow();
  const auto start = SteadyClock::now();
  const auto stop = start + std::chrono::duration<double>(seconds);
  while (SteadyClock::now() < stop) {
    step();
    ++steps;
  }
  const double elapsed = std::chrono::duration<double>(SteadyClock::now() - start).count();
  const ThreadTimes times = ThreadTimesNow();
  return {steps * bytes_per_step / elapsed, (times.on_cpu - times_start.on_cpu) / elapsed,
          (times.waiting - times_start.waiting) / elapsed};
}

// `a` and `b` (each moving `bytes_per_step` per call) measured in turn, in short alternating
// phases over `rounds` rounds, so that the shared machine's drift hits both alike.
struct Comparison {
  double a_rate = 0, b_rate = 0;  // bytes per second, over all rounds
  double a_cpu = 0, b_cpu = 0;    // CPU share of the measuring thread, over all rounds
  double a_wait = 0, b_wait = 0;  // share of the time it waited for a CPU
  double median_ratio = 0;        // of the rounds' a/b
};
template <typename A, typename B>
Comparison Compare(double seconds, uint64_t bytes_per_step, A a, B b, int rounds = 9) {
  std::vector<double> ratios;
  Comparison result;
  for (int round = 0; round < rounds; ++round) {
    const double phase = seconds / rounds;
    const Measured first = round % 2 == 0 ? Rate(phase, bytes_per_step, a) : Measured{};
    const Measured rb = Rate(phase, bytes_per_step, b);
    const Measured ra = round % 2 == 0 ? first : Rate(phase, bytes_per_step, a);
    result.a_rate += ra.rate / rounds;
    result.b_rate += rb.rate / rounds;
    result.a_cpu += ra.cpu_share / rounds;
    result.b_cpu += rb.cpu_share / rounds;
    result.a_wait += ra.wait_share / rounds;
    result.b_wait += rb.wait_share / rounds;
    ratios.push_back(ra.rate / rb.rate);
  }
  std::sort(ratios.begin(), ratios.end());
  result.median_ratio = ratios[ratios.size() / 2];
  return result;
}

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

// A pool of `num_blocks` with a tier 2 of `tier_blocks`, whose mover runs only when the bench
// calls OffloadForTesting.
PoolOptions ManualTierOptions(const std::string& name, const PoolLayout& layout,
                              uint32_t num_blocks, uint64_t tier_blocks) {
  PoolOptions options;
  options.name = name;
  options.model_id = name;
  options.layout = layout;
  options.num_blocks = num_blocks;
  options.host_tier_bytes = tier_blocks * layout.BlockBytes();
  options.testing_manual_offload = true;
  return options;
}

// Opens `tokens`, writes each full block with bytes of its own, commits and releases: a prompt
// computed once, left evictable in tier 1.
bool ComputeOnce(Pool& pool, const Session& session, const std::vector<uint32_t>& tokens) {
  auto opened = pool.Open(session, SequenceSpec{tokens});
  if (!opened.ok()) return false;
  const PoolLayout& layout = pool.options().layout;
  std::string bytes(layout.BlockBytes(), '\0');
  for (size_t i = 0; i < tokens.size() / layout.block_size; ++i) {
    for (size_t b = 0; b < bytes.size(); ++b) bytes[b] = static_cast<char>(tokens[i] + b);
    if (!pool.WriteBlock(opened->block_ids[i], 0, bytes).ok()) return false;
  }
  return pool.Commit(session, opened->sequence_id, tokens.size()).ok() &&
         pool.Release(session, opened->sequence_id).ok();
}

// The chain hashes `pool` computes for `tokens` in `session`'s tenant.
std::vector<Hash128> ChainOf(Pool& pool, const Session& session,
                             const std::vector<uint32_t>& tokens) {
  BlockHasher hasher(pool.options().hash_algorithm);
  const HashNamespace ns{pool.options().model_id, pool.layout_fingerprint(), session.tenant, ""};
  std::vector<Hash128> chain;
  hasher.ExtendChain(hasher.Root(ns), tokens, pool.options().layout.block_size, ExtraKeys{},
                     &chain);
  return chain;
}

// Opens and releases each of `prompts`; returns how many did not load the whole `tokens` of
// their prefix from the tier whose count `loaded_from` names.
uint64_t OpenAndRelease(Pool& pool, const Session& session,
                        std::initializer_list<const std::vector<uint32_t>*> prompts,
                        uint32_t tokens, uint32_t OpenedSequence::*loaded_from) {
  uint64_t short_loads = 0;
  for (const std::vector<uint32_t>* prompt : prompts) {
    auto opened = pool.Open(session, SequenceSpec{*prompt});
    if (!opened.ok() || (*opened).*loaded_from != tokens) ++short_loads;
    if (opened.ok()) (void)pool.Release(session, opened->sequence_id);
  }
  return short_loads;
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

// The slots of a disk tier's file (`path`, `slots` of `slot_bytes`) that hold `hashes`, in that
// order, read from the slots' headers; empty if one is missing.
std::vector<uint64_t> SlotsOf(const std::string& path, uint64_t slot_bytes, uint64_t slots,
                              uint32_t tokens_per_block, const std::vector<Hash128>& hashes) {
  absl::flat_hash_map<Hash128, uint64_t> slot_of;
  std::string header(RecordHeaderSlotBytes(tokens_per_block), '\0');
  const int fd = ::open(path.c_str(), O_RDONLY);
  for (uint64_t slot = 0; fd >= 0 && slot < slots; ++slot) {
    if (::pread(fd, header.data(), header.size(), slot * slot_bytes) !=
        static_cast<ssize_t>(header.size())) {
      break;
    }
    absl::StatusOr<RecordHeader> decoded = DecodeRecordHeader(header);
    if (decoded.ok()) slot_of[decoded->block.hash] = slot;
  }
  if (fd >= 0) ::close(fd);
  std::vector<uint64_t> in_order;
  for (const Hash128& hash : hashes) {
    auto it = slot_of.find(hash);
    if (it == slot_of.end()) return {};
    in_order.push_back(it->second);
  }
  return in_order;
}

// Open of a prompt whose `prefix_blocks` come up from tier 3 each time. Both prompts went down
// through an 8-slot tier 2 (its demotion window is all of it, so each record is passed on to
// disk before tier 2 evicts it), and a third prompt then took tier 2's slots: only the disk holds
// them. Tier 1 holds prefix_blocks + 1 blocks, so each open evicts the other prompt, and the
// mover never runs, so nothing comes back to tier 2. Per byte loaded, vs raw io_uring O_DIRECT
// reads of as many slots of the same file at the tier's read depth.
// A pool whose prompts `prompts` lie on disk only: each computed once and passed down through an
// 8-slot tier 2 (its demotion window is all of it, so each record is passed on to disk before
// tier 2 evicts it), the last (a filler of tier 2's size) taking tier 2's slots. Tier 1 holds
// prefix_blocks + 1 blocks, and the mover never runs, so nothing comes back to tier 2. Sealed
// with `keyring` when it is set.
struct DiskOnlyPool {
  std::unique_ptr<Pool> pool;
  PoolOptions options;
  uint64_t slot_bytes = 0;
  uint32_t disk_records = 0;
};
constexpr uint32_t kTier2Slots = 8;
DiskOnlyPool MakeDiskOnlyPool(const PoolLayout& layout, uint32_t prefix_blocks,
                              const std::string& path, std::shared_ptr<const TierKeyring> keyring,
                              const Session& session,
                              std::initializer_list<const std::vector<uint32_t>*> prompts) {
  DiskOnlyPool made;
  made.disk_records = 2 * prefix_blocks + 2 * kTier2Slots;
  made.options = ManualTierOptions("bench", layout, prefix_blocks + 1, kTier2Slots);
  made.options.disk_tier_path = path;
  static const auto workers = std::make_shared<TaskWorkers>(TaskWorkers::DefaultThreads());
  made.options.workers = workers;  // the daemon's
  made.options.tier_keyring = std::move(keyring);
  made.slot_bytes =
      DiskTier::SlotBytesFor(DiskTierOptions{.pool = {.block_bytes = layout.BlockBytes()},
                                             .tokens_per_block = layout.block_size,
                                             .keyring = made.options.tier_keyring});
  made.options.disk_tier_bytes = made.disk_records * made.slot_bytes;
  // One offload pass queues a whole prefix for the disk; a full queue would end the pass and let
  // tier 2 evict records that never reached the disk.
  const uint32_t queue = made.disk_records;
  made.options.testing_disk_tier_options = [queue](DiskTierOptions* disk) {
    disk->max_queued_stores = queue;
  };
  made.options.offload_window = made.options.num_blocks;  // the whole prefix goes down
  std::filesystem::create_directories(std::filesystem::path(path).parent_path());
  std::filesystem::remove(path);
  auto memory = HostPoolMemory::Create(layout.BlockBytes(), made.options.num_blocks);
  auto pool = Pool::Create(made.options, 0, *std::move(memory));
  bench::CheckOk(pool.status(), "Pool::Create");
  made.pool = *std::move(pool);
  for (const std::vector<uint32_t>* which : prompts) {
    if (!ComputeOnce(*made.pool, session, *which)) bench::Fail("a prompt could not be computed");
    made.pool->OffloadForTesting();
    made.pool->disk_tier()->Flush();
  }
  return made;
}

// Open of a prompt whose `prefix_blocks` come up from tier 3 each time (MakeDiskOnlyPool: two
// prompts on disk only; each open evicts the other prompt). Per byte loaded, vs raw io_uring
// O_DIRECT reads of as many slots of the same file at the tier's read depth.
void OpenFromDiskVsRawReads(const PoolLayout& layout, uint32_t prefix_blocks, double seconds,
                            const std::string& dir) {
  const uint64_t block_bytes = layout.BlockBytes();
  Session session(1, "uid:0", "tenant", "bench", absl::Seconds(600));
  const uint32_t tokens = prefix_blocks * layout.block_size;
  std::vector<uint32_t> prompt(tokens + 1), other(tokens + 1),
      tier2_filler(kTier2Slots * layout.block_size + 1);
  std::iota(prompt.begin(), prompt.end(), 0);
  std::iota(other.begin(), other.end(), 1u << 30);
  std::iota(tier2_filler.begin(), tier2_filler.end(), 2u << 30);
  DiskOnlyPool made = MakeDiskOnlyPool(layout, prefix_blocks, dir + "/tier_bench.kvt", nullptr,
                                       session, {&prompt, &other, &tier2_filler});
  std::unique_ptr<Pool>* const pool = &made.pool;
  const PoolOptions& options = made.options;
  const uint64_t slot_bytes = made.slot_bytes;
  const uint32_t disk_records = made.disk_records;
  DiskTier& disk = *(*pool)->disk_tier();
  const uint32_t depth = disk.read_depth();
  const int fd = ::open(options.disk_tier_path.c_str(), O_RDONLY | O_DIRECT);
  auto ring = IoRing::Create(depth);
  if (fd < 0) bench::Fail("cannot open the tier file with O_DIRECT (on tmpfs?)");
  bench::CheckOk(ring.status(), "IoRing::Create");
  AlignedBuffer buffers(2 * slot_bytes * depth);
  // The same slots in the order the walk reads them (each prompt's blocks in order), and, for
  // comparison, the same number of slots in the file's order. The walk's order is backwards: the
  // mover passes a released prompt down tail first, so its blocks sit in the file in reverse.
  std::vector<Hash128> hashes;
  for (const std::vector<uint32_t>* which : {&prompt, &other}) {
    const std::vector<Hash128> chain = ChainOf(**pool, session, *which);
    hashes.insert(hashes.end(), chain.begin(), chain.end());
  }
  const std::vector<uint64_t> walk_order =
      SlotsOf(options.disk_tier_path, slot_bytes, disk_records, layout.block_size, hashes);
  std::vector<uint64_t> file_order(walk_order.size());
  std::iota(file_order.begin(), file_order.end(), 0);
  if (walk_order.empty()) {
    std::fprintf(stderr, "ERROR: the prompts' records are not all in the tier file\n");
    std::exit(1);
  }
  const auto raw_reads = [&](bench::RawReadPipeline pipeline, const std::vector<uint64_t>& slots,
                             const bench::RawReadLayout& read_layout = {}) {
    bench::RawDirectReads(fd, slot_bytes, slots, depth, **ring, buffers, pipeline, read_layout);
  };
  uint64_t short_loads = 0;
  const DiskTierStats before = disk.stats();
  // Two opens per step, each loading the whole prefix of its prompt from disk (checked for every
  // open: the first open of `other` finds its head in tier 1 only if it comes before the first
  // open of `prompt`, which evicts it).
  const Comparison c = Compare(
      seconds, 2 * block_bytes * prefix_blocks,
      [&] {
        short_loads += OpenAndRelease(**pool, session, {&prompt, &other}, tokens,
                                      &OpenedSequence::num_disk_tier_tokens);
      },
      [&] { raw_reads(bench::RawReadPipeline::kContinuous, walk_order); });
  const Comparison drained = Compare(
      seconds, 2 * block_bytes * prefix_blocks,
      [&] { raw_reads(bench::RawReadPipeline::kDrainedBatches, walk_order); },
      [&] { raw_reads(bench::RawReadPipeline::kContinuous, walk_order); });
  // Where the walk's time goes: the disk tier alone, loading the same records into page-aligned
  // memory, in batches of its read depth as the walk calls it, and in one call.
  std::vector<BlockRecordIdentity> records;
  for (const Hash128& hash : hashes) {
    absl::StatusOr<BlockRecordIdentity> record = disk.Find(hash);
    bench::CheckOk(record.status(), "DiskTier::Find");
    records.push_back(*std::move(record));
  }
  AlignedBuffer out(block_bytes * prefix_blocks);
  const auto load_many = [&](size_t batch) {
    for (size_t first = 0; first < records.size(); first += batch) {
      std::vector<DiskTier::LoadRequest> requests;
      for (size_t i = first; i < std::min(records.size(), first + batch); ++i) {
        requests.push_back(
            {&records[i],
             absl::MakeSpan(out.data() + (i % prefix_blocks) * block_bytes, block_bytes)});
      }
      for (const absl::Status& status : disk.LoadMany(requests)) {
        if (!status.ok()) ++short_loads;
      }
    }
  };
  const Comparison batched = Compare(
      seconds, 2 * block_bytes * prefix_blocks, [&] { load_many(depth); },
      [&] { raw_reads(bench::RawReadPipeline::kContinuous, walk_order); });
  const Comparison whole = Compare(
      seconds, 2 * block_bytes * prefix_blocks, [&] { load_many(prefix_blocks); },
      [&] { raw_reads(bench::RawReadPipeline::kContinuous, walk_order); });
  const Comparison file_ordered = Compare(
      seconds, 2 * block_bytes * prefix_blocks,
      [&] { raw_reads(bench::RawReadPipeline::kContinuous, file_order); },
      [&] { raw_reads(bench::RawReadPipeline::kContinuous, walk_order); });
  const Comparison header_apart = Compare(
      seconds, 2 * block_bytes * prefix_blocks,
      [&] {
        raw_reads(bench::RawReadPipeline::kContinuous, walk_order,
                  {.header_bytes = RecordHeaderSlotBytes(layout.block_size)});
      },
      [&] { raw_reads(bench::RawReadPipeline::kContinuous, walk_order); });
  // The bytes of each prompt's reads into `out`'s blocks, as LoadMany and Open place them.
  AlignedBuffer raw_out(2 * block_bytes * prefix_blocks);
  const Comparison into_blocks = Compare(
      seconds, 2 * block_bytes * prefix_blocks,
      [&] {
        raw_reads(bench::RawReadPipeline::kContinuous, walk_order,
                  {.header_bytes = RecordHeaderSlotBytes(layout.block_size),
                   .bytes_out = raw_out.data()});
      },
      [&] { raw_reads(bench::RawReadPipeline::kContinuous, walk_order); });
  const Comparison checksummed = Compare(
      seconds, 2 * block_bytes * prefix_blocks,
      [&] {
        raw_reads(bench::RawReadPipeline::kContinuous, walk_order,
                  {.header_bytes = RecordHeaderSlotBytes(layout.block_size),
                   .bytes_out = raw_out.data(),
                   .checksum_bytes = true});
      },
      [&] { raw_reads(bench::RawReadPipeline::kContinuous, walk_order); });
  ::close(fd);
  const DiskTierStats after = disk.stats();
  const bool in_place = after.loads_in_place - before.loads_in_place == after.loads - before.loads;
  std::printf("%-22s %9llu KiB %8u %10.2f %10.2f %7.2fx %5.0f%% %5.0f%% %5.0f%% %5.0f%% %s\n",
              "Pool::Open from tier 3", static_cast<unsigned long long>(block_bytes >> 10),
              prefix_blocks, c.a_rate / 1e9, c.b_rate / 1e9, c.median_ratio, 100 * c.a_cpu,
              100 * c.b_cpu, 100 * c.a_wait, 100 * c.b_wait, in_place ? "" : "NOT READ IN PLACE");
  const auto row = [&](const char* path, const Comparison& comparison) {
    std::printf("%-22s %9llu KiB %8u %10.2f %10.2f %7.2fx %5.0f%% %5.0f%% %5.0f%% %5.0f%%\n", path,
                static_cast<unsigned long long>(block_bytes >> 10), prefix_blocks,
                comparison.a_rate / 1e9, comparison.b_rate / 1e9, comparison.median_ratio,
                100 * comparison.a_cpu, 100 * comparison.b_cpu, 100 * comparison.a_wait,
                100 * comparison.b_wait);
  };
  row("  raw, drained batches", drained);
  row("  LoadMany, batches", batched);
  row("  LoadMany, one call", whole);
  row("  raw, file order", file_ordered);
  row("  raw, header apart", header_apart);
  row("  raw, into 2 prefixes", into_blocks);
  row("  raw, + checksums", checksummed);
  pool->reset();
  std::filesystem::remove(options.disk_tier_path);
  std::filesystem::remove(dir);  // only if nothing else is in it
  if (short_loads != 0) {
    std::fprintf(stderr, "ERROR: %llu opens or loads fell short of a whole prefix from tier 3\n",
                 static_cast<unsigned long long>(short_loads));
    std::exit(1);
  }
}

// The same opens from a sealed disk tier (--tier_key_file: each record's header opened and its
// bytes decrypted and authenticated, AES-256-GCM) vs from an unsealed one, in alternating rounds
// of one run, each pool on a file of its own in `dir`.
void OpenFromSealedVsUnsealedDisk(const PoolLayout& layout, uint32_t prefix_blocks, double seconds,
                                  const std::string& dir) {
  Session session(1, "uid:0", "tenant", "bench", absl::Seconds(600));
  const uint32_t tokens = prefix_blocks * layout.block_size;
  std::vector<uint32_t> prompt(tokens + 1), other(tokens + 1),
      tier2_filler(kTier2Slots * layout.block_size + 1);
  std::iota(prompt.begin(), prompt.end(), 0);
  std::iota(other.begin(), other.end(), 1u << 30);
  std::iota(tier2_filler.begin(), tier2_filler.end(), 2u << 30);
  TierMasterKey key{.id = 1};
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = static_cast<uint8_t>(i * 97 + 5);
  auto keyring = TierKeyring::FromKeys({key});
  bench::CheckOk(keyring.status(), "TierKeyring::FromKeys");
  DiskOnlyPool plain = MakeDiskOnlyPool(layout, prefix_blocks, dir + "/tier_bench_plain.kvt",
                                        nullptr, session, {&prompt, &other, &tier2_filler});
  DiskOnlyPool sealed = MakeDiskOnlyPool(layout, prefix_blocks, dir + "/tier_bench_sealed.kvt",
                                         *keyring, session, {&prompt, &other, &tier2_filler});
  if (!sealed.pool->disk_tier()->sealed()) bench::Fail("the sealed pool's disk tier is not sealed");
  uint64_t short_loads = 0;
  const Comparison c = Compare(
      seconds, 2 * layout.BlockBytes() * prefix_blocks,
      [&] {
        short_loads += OpenAndRelease(*sealed.pool, session, {&prompt, &other}, tokens,
                                      &OpenedSequence::num_disk_tier_tokens);
      },
      [&] {
        short_loads += OpenAndRelease(*plain.pool, session, {&prompt, &other}, tokens,
                                      &OpenedSequence::num_disk_tier_tokens);
      });
  std::printf("%-22s %9llu KiB %8u %10.2f %10.2f %7.2fx %5.0f%% %5.0f%% %5.0f%% %5.0f%% %s\n",
              "Pool::Open tier 3 sealed",
              static_cast<unsigned long long>(layout.BlockBytes() >> 10), prefix_blocks,
              c.a_rate / 1e9, c.b_rate / 1e9, c.median_ratio, 100 * c.a_cpu, 100 * c.b_cpu,
              100 * c.a_wait, 100 * c.b_wait, short_loads == 0 ? "(vs unsealed)" : "SHORT LOADS");
  if (sealed.pool->disk_tier()->stats().load_unopened != 0)
    bench::Fail("sealed records did not open");
  plain.pool.reset();
  sealed.pool.reset();
  std::filesystem::remove(dir + "/tier_bench_plain.kvt");
  std::filesystem::remove(dir + "/tier_bench_sealed.kvt");
  std::filesystem::remove(dir);  // only if nothing else is in it
  if (short_loads != 0) bench::Fail("opens fell short of a whole prefix from tier 3");
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
}  // namespace kvcache

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
    kvcache::LoadVsMemcpy(block_bytes, static_cast<uint32_t>(bytes / block_bytes), seconds);
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
      kvcache::OpenFromTierVsCopy(*layout, prefix, seconds, false, workers,
                                  "Pool::Open from tier 2");
      kvcache::OpenFromTierVsCopy(*layout, prefix, seconds, false, nullptr, "  no workers");
    }
  }
  if (runs("device")) {
    std::printf(
        "\ntier 2 loads into a CUDA pool vs cudaMemcpyAsync H2D of the same page-locked "
        "slots\n");
    kvcache::OpenFromTierVsCopy(small, small_prefix, seconds, true, workers,
                                "Pool::Open tier 2->GPU");
    kvcache::OpenFromTierVsCopy(large, large_prefix, seconds, true, workers,
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
    kvcache::OpenFromDiskVsRawReads(small, small_prefix, seconds, dir + "/kvcache_tier_bench");
    kvcache::OpenFromDiskVsRawReads(large, 2 * large_prefix, seconds, dir + "/kvcache_tier_bench");
    std::printf("\nsealed tier 3 (--tier_key_file, AES-256-GCM) vs unsealed, the same opens\n");
    std::printf("%-22s %13s %8s %10s %10s %8s %6s %6s %6s %6s\n", "path", "block", "blocks", "GB/s",
                "unsealed", "ratio", "cpu", "unseal", "wait", "unseal");
    kvcache::OpenFromSealedVsUnsealedDisk(small, small_prefix, seconds,
                                          dir + "/kvcache_tier_bench");
    kvcache::OpenFromSealedVsUnsealedDisk(large, 2 * large_prefix, seconds,
                                          dir + "/kvcache_tier_bench");
  }
  if (runs("sweep")) {
    for (uint32_t lag : {1u, 8u}) kvcache::WindowSweep(lag);
  }
  if (runs("admission")) kvcache::AdmissionSweep(dir + "/kvcache_tier_bench_admission");
  if (runs("puts")) kvcache::LargePuts(seconds, dir + "/kvcache_tier_bench_puts");
}
