// Prefill time saved by prefix hits: prompts whose first 0%, 50% or 90% is already in the daemon's
// pool, next to a cold in-process run of the same length, plus decode tokens/s — all ratios
// measured in one run, on the CPU path. Usage: worker_bench CHECKPOINT_DIR [reps]
// The tests' tiny model (hidden 64) spends most of a long prefill in attention, which a cached
// prefix saves least; a wider one (scripts/make_tiny_checkpoint.py OUT --hidden 512
// --moe_intermediate 512 --layers 2) has the projection-dominated profile of real MoE models.
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <vector>

#include "absl/time/clock.h"
#include "server/daemon.h"
#include "worker/kv_worker.h"

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
int PrefillTable(const Qwen3MoeModel& model, KvWorker& worker, uint32_t prompt_tokens, int reps) {
  // Cold and cached runs alternate within each repetition so that they share the machine's noise.
  const std::vector<double> fractions = {0.0, 0.5, 0.9};
  std::vector<absl::Duration> cold;
  std::vector<std::vector<absl::Duration>> cached_times(fractions.size());
  std::vector<uint32_t> cached_tokens(fractions.size());
  for (int rep = 0; rep <= reps; ++rep) {  // rep 0 warms every shared prefix into the cache
    Sampler cold_sampler = Sampler::Greedy();
    absl::StatusOr<GenerationResult> reference =
        GenerateCold(model, Tokens(prompt_tokens * 100000 + rep, prompt_tokens), 1, cold_sampler,
                     kBlockSize, DType::kBFloat16);
    if (!reference.ok()) return 1;
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
  std::printf("prefill of a %u-token prompt, tiny Qwen3-MoE on the CPU, median of %d\n",
              prompt_tokens, reps);
  std::printf("%-22s %10s %10s %12s\n", "", "computed", "ms", "vs cold");
  std::printf("%-22s %10u %10.2f %11.2fx\n", "cold, in-process", prompt_tokens, cold_ms, 1.0);
  for (size_t f = 0; f < fractions.size(); ++f) {
    const double ms = MedianMs(cached_times[f]);
    std::printf("daemon, %3.0f%% cached   %10u %10.2f %11.2fx\n", fractions[f] * 100,
                prompt_tokens - cached_tokens[f], ms, cold_ms / ms);
  }
  return 0;
}

int Main(const std::string& checkpoint, int reps) {
  absl::StatusOr<Qwen3MoeModel> model = Qwen3MoeModel::Load(checkpoint);
  if (!model.ok()) {
    std::fprintf(stderr, "%s\n", model.status().ToString().c_str());
    return 1;
  }
  char dir[] = "/tmp/kvcache-worker-bench-XXXXXX";
  DaemonOptions options;
  options.listen = std::string("unix://") + mkdtemp(dir) + "/kv.sock";
  PoolOptions pool;
  pool.name = "qwen";
  pool.model_id = "tiny";
  pool.layout = model->KvLayout(kBlockSize, DType::kBFloat16);
  pool.num_blocks = 4096;
  options.pools.push_back(pool);
  auto daemon = Daemon::Start(options);
  auto client = KvCacheClient::Connect(options.listen);
  if (!daemon.ok() || !client.ok() || !(*client)->OpenSession("", "worker_bench").ok()) {
    std::fprintf(stderr, "cannot start the daemon or connect\n");
    return 1;
  }
  auto worker = KvWorker::Create(client->get(), "qwen", &*model);
  if (!worker.ok()) return 1;

  // Attention grows with the context, so the longer the prompt, the less a cached prefix saves:
  // both lengths are shown.
  for (uint32_t prompt_tokens : {512u, 1024u}) {
    if (PrefillTable(*model, **worker, prompt_tokens, reps) != 0) return 1;
  }
  Sampler sampler = Sampler::Greedy();
  absl::StatusOr<GenerationResult> decode = (*worker)->Generate(Tokens(3, 256), 129, sampler);
  Sampler cold_sampler = Sampler::Greedy();
  absl::StatusOr<GenerationResult> cold_decode =
      GenerateCold(*model, Tokens(3, 256), 129, cold_sampler, kBlockSize, DType::kBFloat16);
  if (decode.ok() && cold_decode.ok()) {
    const double rate = 128 / absl::ToDoubleSeconds(decode->decode_time);
    const double cold_rate = 128 / absl::ToDoubleSeconds(cold_decode->decode_time);
    std::printf(
        "decode after a 256-token prompt: %.0f tokens/s through the daemon, %.0f cold "
        "in-process (%.2fx)\n",
        rate, cold_rate, rate / cold_rate);
  }
  (*client)->CloseSession().IgnoreError();
  return 0;
}

}  // namespace
}  // namespace kvcache::worker

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: worker_bench CHECKPOINT_DIR [reps]\n");
    return 2;
  }
  return kvcache::worker::Main(argv[1], argc > 2 ? std::atoi(argv[2]) : 5);
}
