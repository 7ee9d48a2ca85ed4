// tier_bench's tier-3 parts (tier_bench.cc says what each measures): Pool::Open of a prefix only
// the disk holds vs raw io_uring O_DIRECT reads, and sealed vs unsealed disk opens.
#include "bench/tier_bench_common.h"

namespace kvcache::tier_bench {
namespace {

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

// The prompts of a disk-only pool: two of `prefix_blocks` full blocks and a token (each open
// evicts the other's prefix) and one filling tier 2's slots, none sharing a token.
struct DiskPrompts {
  DiskPrompts(const PoolLayout& layout, uint32_t prefix_blocks)
      : tokens(prefix_blocks * layout.block_size),
        prompt(tokens + 1),
        other(tokens + 1),
        tier2_filler(kTier2Slots * layout.block_size + 1) {
    std::iota(prompt.begin(), prompt.end(), 0);
    std::iota(other.begin(), other.end(), 1u << 30);
    std::iota(tier2_filler.begin(), tier2_filler.end(), 2u << 30);
  }
  uint32_t tokens;  // of each prompt's full blocks
  std::vector<uint32_t> prompt, other, tier2_filler;
};

}  // namespace

// Open of a prompt whose `prefix_blocks` come up from tier 3 each time (MakeDiskOnlyPool: two
// prompts on disk only; each open evicts the other prompt). Per byte loaded, vs raw io_uring
// O_DIRECT reads of as many slots of the same file at the tier's read depth.
void OpenFromDiskVsRawReads(const PoolLayout& layout, uint32_t prefix_blocks, double seconds,
                            const std::string& dir) {
  const uint64_t block_bytes = layout.BlockBytes();
  Session session(1, "uid:0", "tenant", "bench", absl::Seconds(600));
  const DiskPrompts prompts(layout, prefix_blocks);
  const uint32_t tokens = prompts.tokens;
  DiskOnlyPool made =
      MakeDiskOnlyPool(layout, prefix_blocks, dir + "/tier_bench.kvt", nullptr, session,
                       {&prompts.prompt, &prompts.other, &prompts.tier2_filler});
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
  for (const std::vector<uint32_t>* which : {&prompts.prompt, &prompts.other}) {
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
        short_loads += OpenAndRelease(**pool, session, {&prompts.prompt, &prompts.other}, tokens,
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
  const DiskPrompts prompts(layout, prefix_blocks);
  const uint32_t tokens = prompts.tokens;
  TierMasterKey key{.id = 1};
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = static_cast<uint8_t>(i * 97 + 5);
  auto keyring = TierKeyring::FromKeys({key});
  bench::CheckOk(keyring.status(), "TierKeyring::FromKeys");
  DiskOnlyPool plain =
      MakeDiskOnlyPool(layout, prefix_blocks, dir + "/tier_bench_plain.kvt", nullptr, session,
                       {&prompts.prompt, &prompts.other, &prompts.tier2_filler});
  DiskOnlyPool sealed =
      MakeDiskOnlyPool(layout, prefix_blocks, dir + "/tier_bench_sealed.kvt", *keyring, session,
                       {&prompts.prompt, &prompts.other, &prompts.tier2_filler});
  if (!sealed.pool->disk_tier()->sealed()) bench::Fail("the sealed pool's disk tier is not sealed");
  uint64_t short_loads = 0;
  const Comparison c = Compare(
      seconds, 2 * layout.BlockBytes() * prefix_blocks,
      [&] {
        short_loads += OpenAndRelease(*sealed.pool, session, {&prompts.prompt, &prompts.other},
                                      tokens, &OpenedSequence::num_disk_tier_tokens);
      },
      [&] {
        short_loads += OpenAndRelease(*plain.pool, session, {&prompts.prompt, &prompts.other},
                                      tokens, &OpenedSequence::num_disk_tier_tokens);
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

}  // namespace kvcache::tier_bench
