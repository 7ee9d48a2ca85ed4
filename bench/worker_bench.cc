// Prefill time saved by prefix hits: prompts whose first 0%, 50% or 90% is already in the daemon's
// pool, next to a cold in-process run of the same length; then the same 90% prefix served from
// each tier (tier 1, the pool; tier 2, host memory; tier 3, disk) next to recomputing it; plus
// decode tokens/s — all ratios measured in one run, on the CPU path. With a hybrid checkpoint
// (Qwen3-Next, scripts/make_tiny_checkpoint.py --variant hybrid) also the hybrid's prefill at
// 0/50/90% cached, its KV and state restored from pages of [kv | state], and the bytes of each.
// Exits 1 at the first failed call or a prefix not served from its tier; KVCACHE_BENCH_SMOKE=1
// runs one 128-token prompt (bench/bench_run.h).
// Usage: worker_bench CHECKPOINT_DIR [reps [HYBRID_CHECKPOINT_DIR]]
// The tests' tiny model (hidden 64) spends most of a long prefill in attention, which a cached
// prefix saves least; a wider one (scripts/make_tiny_checkpoint.py OUT --hidden 512
// --moe_intermediate 512 --layers 2) has the projection-dominated profile of real MoE models.
#include <stdlib.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "bench/bench_run.h"
#include "cache/pool_spec.h"
#include "common/status_macros.h"
#include "server/daemon.h"
#include "tiers/record_codec.h"
#include "worker/hybrid_pages.h"
#include "worker/kv_worker.h"
#include "worker/worker_model.h"

namespace kvcache::worker {
namespace {

constexpr uint32_t kBlockSize = 16;

double MedianMs(std::vector<absl::Duration> samples) {
  std::sort(samples.begin(), samples.end());
  return absl::ToDoubleMilliseconds(samples[samples.size() / 2]);
}

std::vector<uint32_t> Tokens(uint32_t seed, size_t n) {
  std::mt19937 rng(seed);
  std::vector<uint32_t> tokens(n);
  for (uint32_t& token : tokens) token = rng() % 256;
  return tokens;
}

// Prefill of a `prompt_tokens` prompt cold in-process and through the daemon at 0/50/90% cached.
int PrefillTable(const WorkerModel& model, KvWorker& worker, uint32_t prompt_tokens, int reps) {
  // Cold and cached runs alternate within each repetition so that they share the machine's noise.
  const std::vector<double> fractions = {0.0, 0.5, 0.9};
  std::vector<absl::Duration> cold;
  std::vector<std::vector<absl::Duration>> cached_times(fractions.size());
  std::vector<uint32_t> cached_tokens(fractions.size());
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms every shared prefix into the cache
    Sampler cold_sampler = Sampler::Greedy();
    absl::StatusOr<GenerationResult> reference =
        model.GenerateCold(Tokens(prompt_tokens * 100000 + rep, prompt_tokens), 1, cold_sampler,
                           kBlockSize, DType::kBFloat16);
    if (!reference.ok()) {
      std::fprintf(stderr, "cold run: %s\n", reference.status().ToString().c_str());
      return 1;
    }
    if (rep > 0) cold.push_back(reference->prefill_time);
    for (size_t f = 0; f < fractions.size(); ++f) {
      const size_t shared = static_cast<size_t>(prompt_tokens * fractions[f]);
      std::vector<uint32_t> prompt = Tokens(prompt_tokens * 10 + 7 + f, shared);
      const std::vector<uint32_t> suffix =
          Tokens(prompt_tokens * 1000 + 100 * rep + 1 + shared, prompt_tokens - shared);
      prompt.insert(prompt.end(), suffix.begin(), suffix.end());
      Sampler sampler = Sampler::Greedy();
      absl::StatusOr<GenerationResult> result = worker.Generate(prompt, 1, sampler);
      if (!result.ok()) {
        std::fprintf(stderr, "%s\n", result.status().ToString().c_str());
        return 1;
      }
      if (rep == 0) continue;
      cached_times[f].push_back(result->prefill_time);
      cached_tokens[f] = result->cached_tokens;
    }
  }
  const double cold_ms = MedianMs(cold);
  std::printf("prefill of a %u-token prompt, tiny %s on the CPU, median of %d\n", prompt_tokens,
              model.hybrid() ? "Qwen3-Next hybrid (KV + state)" : "Qwen3-MoE", reps);
  std::printf("%-22s %10s %10s %12s\n", "", "computed", "ms", "vs cold");
  std::printf("%-22s %10u %10.2f %11.2fx\n", "cold, in-process", prompt_tokens, cold_ms, 1.0);
  for (size_t f = 0; f < fractions.size(); ++f) {
    const double ms = MedianMs(cached_times[f]);
    std::printf("daemon, %3.0f%% cached   %10u %10.2f %11.2fx\n", fractions[f] * 100,
                prompt_tokens - cached_tokens[f], ms, cold_ms / ms);
  }
  return 0;
}

// The tier table's pool: tier 1 of kTierPoolBlocks blocks over a tier 2 of kTier2Slots slots over
// a disk tier. No mover thread: the bench moves blocks with OffloadForTesting, so that each row's
// prefix is exactly where the row says.
constexpr uint32_t kTierPoolBlocks = 512;
constexpr uint32_t kTier2Slots = 128;
constexpr uint32_t kDiskSlots = 4096;
constexpr uint32_t kFillerBlocks = 32;  // per filler sequence

enum class Placement { kTier1, kTier2, kTier3, kRecomputed };
struct Row {
  Placement placement;
  const char* name;
};
constexpr std::array<Row, 4> kRows = {
    Row{Placement::kTier1, "tier 1 (pool)"}, Row{Placement::kTier2, "tier 2 (host memory)"},
    Row{Placement::kTier3, "tier 3 (disk)"}, Row{Placement::kRecomputed, "recomputed"}};

PoolOptions TierPoolOptions(const PoolLayout& layout, const std::string& disk_path) {
  const uint64_t slot_bytes =
      RecordHeaderSlotBytes(layout.block_size) + RoundUpToRecordAlignment(layout.BlockBytes());
  return PoolOptions{
      .name = "qwen_tiers",
      .model_id = "tiny",
      .layout = layout,
      .num_blocks = kTierPoolBlocks,
      .host_tier_bytes = uint64_t{kTier2Slots} * layout.BlockBytes(),
      .offload_window = kTierPoolBlocks,  // everything evictable goes down at each offload
      .disk_tier_path = disk_path,
      .disk_tier_bytes = kDiskSlots * slot_bytes,
      // An offload pass queues everything it passes down; a full queue would end the pass and
      // let tier 2 evict records that never reached the disk.
      .testing_disk_tier_options =
          [](DiskTierOptions* disk) { disk->max_queued_stores = kDiskSlots; },
      .testing_manual_offload = true,
  };
}

// Moves blocks the way the tier rows need, through the daemon's client (fillers) and the pool
// itself (offload, flush).
class TierPlacer {
 public:
  TierPlacer(KvCacheClient& client, Pool& pool) : client_(client), pool_(pool) {}

  // Opens, commits and releases `blocks` blocks of prompts seen nowhere else (their KV is
  // whatever the pool holds: only their place in the LRUs matters). With `offload`, each filler
  // sequence is passed down to tier 2, and tier 2's oldest records on to a durable disk.
  absl::Status Fill(uint32_t blocks, bool offload) {
    for (uint32_t done = 0; done < blocks; done += kFillerBlocks) {
      const std::vector<uint32_t> tokens =
          Tokens(0x40000000u + fillers_++, kFillerBlocks * kBlockSize + 1);
      ASSIGN_OR_RETURN(KvCacheClient::Sequence sequence,
                       client_.OpenSequence(pool_.options().name, tokens));
      RETURN_IF_ERROR(client_.CommitSequence(sequence.sequence_id, tokens.size()).status());
      RETURN_IF_ERROR(client_.ReleaseSequence(sequence.sequence_id));
      if (offload) OffloadAndFlush();
    }
    return absl::OkStatus();
  }

  void OffloadAndFlush() {
    pool_.OffloadForTesting();
    pool_.disk_tier()->Flush();
  }

 private:
  KvCacheClient& client_;
  Pool& pool_;
  uint32_t fillers_ = 0;
};

// What a measured row must have loaded from where; false (and a loud message) otherwise.
bool CameFromItsTier(const Row& row, uint32_t shared, const GenerationResult& result,
                     const PoolStatsSnapshot& before, const PoolStatsSnapshot& after) {
  const uint64_t host_blocks = after.host_tier->hit_blocks - before.host_tier->hit_blocks;
  const uint64_t disk_blocks = after.disk_tier->hit_blocks - before.disk_tier->hit_blocks;
  const uint32_t cached = row.placement == Placement::kRecomputed ? 0 : shared;
  const uint32_t host = row.placement == Placement::kTier2 ? shared : 0;
  const uint32_t disk = row.placement == Placement::kTier3 ? shared : 0;
  if (result.cached_tokens == cached && result.host_tier_tokens == host &&
      result.disk_tier_tokens == disk && host_blocks * kBlockSize == host &&
      disk_blocks * kBlockSize == disk) {
    return true;
  }
  std::fprintf(stderr,
               "ERROR: row '%s' expected %u cached tokens (%u from tier 2, %u from tier 3); the "
               "response said %u (%u, %u), the pool's hit counters moved by %llu and %llu "
               "blocks\n",
               row.name, cached, host, disk, result.cached_tokens, result.host_tier_tokens,
               result.disk_tier_tokens, static_cast<unsigned long long>(host_blocks),
               static_cast<unsigned long long>(disk_blocks));
  return false;
}

// Time to the first token of a `prompt_tokens` prompt whose 90% prefix is in tier 1, only in
// tier 2, only on disk, or nowhere (recomputed). Each rep uses new prefixes, places them, then
// measures the rows in an order that rotates from rep to rep.
int TierTable(KvWorker& worker, TierPlacer& placer, Pool& pool, uint32_t prompt_tokens, int reps) {
  const uint32_t shared = prompt_tokens * 9 / 10 / kBlockSize * kBlockSize;
  std::array<std::vector<absl::Duration>, kRows.size()> first_token, prefill;
  for (int rep = 0; rep < reps; ++rep) {
    std::array<std::vector<uint32_t>, kRows.size()> prompts;
    for (size_t row = 0; row < kRows.size(); ++row) {
      const uint32_t seed = prompt_tokens * 100000 + rep * 10 + row;
      prompts[row] = Tokens(seed, shared);
      const std::vector<uint32_t> suffix = Tokens(seed + 7777777, prompt_tokens - shared);
      prompts[row].insert(prompts[row].end(), suffix.begin(), suffix.end());
    }
    // Computes a row's prefix (and one token past it, so that the measured prompt's suffix is
    // new): published in tier 1.
    const auto warm = [&](Placement placement) {
      const std::vector<uint32_t>& prompt = prompts[static_cast<size_t>(placement)];
      Sampler sampler = Sampler::Greedy();
      return worker.Generate(absl::MakeConstSpan(prompt).subspan(0, shared + 1), 1, sampler)
          .status();
    };
    // Tier 3: down to tier 2 and on to disk; then enough fillers through tiers 1 and 2 to evict
    // it from both (tier 2 passes its oldest records down before evicting them).
    // Tier 2: down to tier 2; then fillers through tier 1 only.
    // Tier 1: computed last.
    absl::Status placed = warm(Placement::kTier3);
    if (placed.ok()) placer.OffloadAndFlush();
    if (placed.ok()) placed = placer.Fill(kTierPoolBlocks + kTier2Slots + kFillerBlocks, true);
    if (placed.ok()) placed = warm(Placement::kTier2);
    if (placed.ok()) placer.OffloadAndFlush();
    if (placed.ok()) placed = placer.Fill(kTierPoolBlocks + kFillerBlocks, false);
    if (placed.ok()) placed = warm(Placement::kTier1);
    if (!placed.ok()) {
      std::fprintf(stderr, "ERROR placing the prefixes: %s\n", placed.ToString().c_str());
      return 1;
    }
    for (size_t i = 0; i < kRows.size(); ++i) {
      const size_t row = (i + rep) % kRows.size();
      const PoolStatsSnapshot before = pool.Stats();
      Sampler sampler = Sampler::Greedy();
      const absl::Time start = absl::Now();
      absl::StatusOr<GenerationResult> result = worker.Generate(prompts[row], 1, sampler);
      const absl::Duration elapsed = absl::Now() - start;
      if (!result.ok()) {
        std::fprintf(stderr, "%s\n", result.status().ToString().c_str());
        return 1;
      }
      if (!CameFromItsTier(kRows[row], shared, *result, before, pool.Stats())) return 1;
      first_token[row].push_back(elapsed);
      prefill[row].push_back(result->prefill_time);
    }
  }
  const double recomputed_ms = MedianMs(first_token.back());
  std::printf(
      "\nfirst token of a %u-token prompt whose %u-token prefix is in one tier, tiny Qwen3-MoE on "
      "the CPU, median of %d (first token: OpenSequence with its loads, prefill, commit)\n",
      prompt_tokens, shared, reps);
  std::printf("%-22s %10s %16s %12s %14s\n", "prefix from", "computed", "first token ms",
              "prefill ms", "vs recomputed");
  for (size_t row = 0; row < kRows.size(); ++row) {
    const double ms = MedianMs(first_token[row]);
    std::printf(
        "%-22s %10u %16.2f %12.2f %13.2fx\n", kRows[row].name,
        kRows[row].placement == Placement::kRecomputed ? prompt_tokens : prompt_tokens - shared, ms,
        MedianMs(prefill[row]), recomputed_ms / ms);
  }
  return 0;
}

struct RemovedOnExit {
  explicit RemovedOnExit(std::string path) : path(std::move(path)) {}
  ~RemovedOnExit() { std::filesystem::remove_all(path); }
  const std::string path;
};

// The hybrid's rows: its pool's page bytes, then prefill at 0/50/90% cached vs cold.
int HybridTable(const std::string& checkpoint, int reps) {
  absl::StatusOr<WorkerModel> model = WorkerModel::Load(checkpoint);
  if (!model.ok() || !model->hybrid()) {
    std::fprintf(stderr, "%s: %s\n", checkpoint.c_str(),
                 model.ok() ? "not a hybrid checkpoint" : model.status().ToString().c_str());
    return 1;
  }
  char dir[] = "/tmp/kvcache-worker-bench-hybrid-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  const RemovedOnExit removed(dir);
  const HybridPoolGeometry geometry =
      HybridPoolGeometryFor(model->hybrid_model().config(), kBlockSize, DType::kBFloat16);
  absl::StatusOr<PoolOptions> pool =
      ParsePoolSpec("next:model=tiny-next" + geometry.SpecFields() + ":blocks=2048");
  if (!pool.ok()) {
    std::fprintf(stderr, "hybrid pool: %s\n", pool.status().ToString().c_str());
    return 1;
  }
  DaemonOptions options;
  options.listen = std::string("unix://") + dir + "/kv.sock";
  options.pools.push_back(*pool);
  auto daemon = Daemon::Start(options);
  auto client = KvCacheClient::Connect(options.listen);
  if (!daemon.ok() || !client.ok() || !(*client)->OpenSession("", "worker_bench").ok()) {
    std::fprintf(stderr, "cannot start the hybrid daemon or connect\n");
    return 1;
  }
  auto worker = model->CreateWorker(client->get(), "next");
  if (!worker.ok()) {
    std::fprintf(stderr, "%s\n", worker.status().ToString().c_str());
    return 1;
  }
  std::printf(
      "hybrid page of %u tokens: KV %llu bytes (%u full-attention layers), state %llu bytes "
      "(%u linear-attention layers; part padded to %llu), state/KV %.2fx\n",
      kBlockSize, static_cast<unsigned long long>(geometry.kv_bytes), geometry.kv_layout.num_layers,
      static_cast<unsigned long long>(geometry.state_bytes),
      model->hybrid_model().config().base.num_hidden_layers - geometry.kv_layout.num_layers,
      static_cast<unsigned long long>(geometry.state_part_bytes),
      static_cast<double>(geometry.state_bytes) / geometry.kv_bytes);
  for (uint32_t prompt_tokens : bench::FullOrSmoke<std::vector<uint32_t>>({512}, {128})) {
    if (PrefillTable(*model, **worker, prompt_tokens, reps) != 0) return 1;
  }
  (*client)->CloseSession().IgnoreError();
  return 0;
}

int Main(const std::string& checkpoint, int reps, const std::string& hybrid_checkpoint) {
  absl::StatusOr<WorkerModel> loaded = WorkerModel::Load(checkpoint);
  if (!loaded.ok() || loaded->hybrid()) {
    std::fprintf(
        stderr, "%s: %s\n", checkpoint.c_str(),
        loaded.ok() ? "give the Qwen3-MoE checkpoint first" : loaded.status().ToString().c_str());
    return 1;
  }
  const Qwen3MoeModel* model = &loaded->moe_model();
  char dir[] = "/tmp/kvcache-worker-bench-XXXXXX";
  if (mkdtemp(dir) == nullptr) return 1;
  // Declared before the daemon, so destroyed after it: the socket and the tier file go on every
  // way out.
  const RemovedOnExit removed(dir);
  DaemonOptions options;
  options.listen = std::string("unix://") + dir + "/kv.sock";
  PoolOptions pool;
  pool.name = "qwen";
  pool.model_id = "tiny";
  pool.layout = model->KvLayout(kBlockSize, DType::kBFloat16);
  pool.num_blocks = 4096;
  options.pools.push_back(pool);
  const std::string tier_file = std::string(dir) + "/qwen_tiers.kvt";
  options.pools.push_back(TierPoolOptions(pool.layout, tier_file));
  auto daemon = Daemon::Start(options);
  auto client = KvCacheClient::Connect(options.listen);
  if (!daemon.ok() || !client.ok() || !(*client)->OpenSession("", "worker_bench").ok()) {
    std::fprintf(stderr, "cannot start the daemon or connect\n");
    return 1;
  }
  auto worker = KvWorker::Create(client->get(), "qwen", model);
  auto tier_worker = KvWorker::Create(client->get(), "qwen_tiers", model);
  auto tier_pool = (*daemon)->manager().FindPool("qwen_tiers");
  if (!worker.ok() || !tier_worker.ok() || !tier_pool.ok()) {
    std::fprintf(stderr, "cannot create the workers or find the tier pool\n");
    return 1;
  }

  // Attention grows with the context, so the longer the prompt, the less a cached prefix saves:
  // both lengths are shown.
  // A smoke run (bench/bench_run.h): one short prompt.
  const std::vector<uint32_t> prompt_lengths =
      bench::FullOrSmoke<std::vector<uint32_t>>({512, 1024}, {128});
  for (uint32_t prompt_tokens : prompt_lengths) {
    if (PrefillTable(*loaded, **worker, prompt_tokens, reps) != 0) return 1;
  }
  // The hybrid's rows beside Qwen3-MoE's, in their own daemon (its pool is laid out for it).
  if (!hybrid_checkpoint.empty() && HybridTable(hybrid_checkpoint, reps) != 0) return 1;
  TierPlacer placer(**client, **tier_pool);
  for (uint32_t prompt_tokens : prompt_lengths) {
    if (TierTable(**tier_worker, placer, **tier_pool, prompt_tokens, reps) != 0) return 1;
  }
  Sampler sampler = Sampler::Greedy();
  absl::StatusOr<GenerationResult> decode = (*worker)->Generate(Tokens(3, 256), 129, sampler);
  Sampler cold_sampler = Sampler::Greedy();
  absl::StatusOr<GenerationResult> cold_decode =
      GenerateCold(*model, Tokens(3, 256), 129, cold_sampler, kBlockSize, DType::kBFloat16);
  if (!decode.ok() || !cold_decode.ok()) {
    std::fprintf(stderr, "decode: %s\n",
                 (decode.ok() ? cold_decode.status() : decode.status()).ToString().c_str());
    return 1;
  }
  const double rate = 128 / absl::ToDoubleSeconds(decode->decode_time);
  const double cold_rate = 128 / absl::ToDoubleSeconds(cold_decode->decode_time);
  std::printf(
      "decode after a 256-token prompt: %.0f tokens/s through the daemon, %.0f cold "
      "in-process (%.2fx)\n",
      rate, cold_rate, rate / cold_rate);
  (*client)->CloseSession().IgnoreError();
  return 0;
}

}  // namespace
}  // namespace kvcache::worker

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: worker_bench CHECKPOINT_DIR [reps [HYBRID_CHECKPOINT_DIR]]\n");
    return 2;
  }
  return kvcache::worker::Main(argv[1], argc > 2 ? std::atoi(argv[2]) : 5, argc > 3 ? argv[3] : "");
}
