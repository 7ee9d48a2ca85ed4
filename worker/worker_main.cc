// kvcache-worker: generates with the MoE model, its KV in a kvcache-manager pool. Each turn prints
// a human line and a machine line ("result key=value ..."); with --turns N the conversation goes
// on, each turn's prompt being the previous prompt, its answer and a new user message, so later
// turns hit their own history in the cache. With --check_cold every turn is also run cold in
// this process and must match bit for bit, on the backend the worker computes with: the CPU model
// over a private host pool for a host pool, and for a device pool (a daemon with --device cuda:N,
// where the model runs on that GPU) the same GPU model over a fresh device buffer. A hybrid
// checkpoint (Qwen3-Next) runs over a pool of kv + state pages, on the CPU for a host pool and on
// the pool's GPU for a device pool (DESIGN §5).
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "client/client_flags.h"
#include "common/command_line.h"
#include "common/rpc/grpc_tuning.h"
#include "common/rpc/listen_address.h"
#include "common/rpc/malloc_tuning.h"
#include "common/status_macros.h"
#include "transfer/block_transport.h"
#include "transfer/nccl_transport.h"
#include "worker/kv_worker.h"
#include "worker/worker_model.h"

ABSL_FLAG(std::string, target, "", "daemon address (default: the daemon's default socket)");
ABSL_FLAG(std::string, pool, "default", "pool laid out for this model");
ABSL_FLAG(std::string, checkpoint, "",
          "directory with config.json and model.safetensors: Qwen3-MoE, or the hybrid "
          "Qwen3-Next (model_type qwen3_next) over a pool of kv + state pages");
ABSL_FLAG(uint32_t, state_every_pages, 1,
          "hybrid model: save the recurrent state into every Nth page (a hit ends only at such a "
          "page); the prefill role ships each page's part mask, so the decode side hits as far "
          "as the states go");
ABSL_FLAG(std::string, tenant, "",
          "tenant of this worker's sessions; empty: the tenant of this caller's identity");
ABSL_FLAG(std::string, prompt, "", "prompt text; its bytes are the tokens (byte-level vocab)");
ABSL_FLAG(std::string, tokens, "", "prompt as comma-separated token ids (instead of --prompt)");
ABSL_FLAG(uint32_t, max_new_tokens, 16, "tokens to generate per turn");
ABSL_FLAG(uint32_t, turns, 1, "conversation turns");
ABSL_FLAG(double, temperature, 0, "0: greedy");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(std::string, cache_salt, "", "narrows cache sharing within the tenant");
ABSL_FLAG(bool, check_cold, false,
          "also run each turn cold in-process (same backend: CPU, or the GPU for a device pool) "
          "and require bit-for-bit equality");
ABSL_FLAG(std::string, role, "single",
          "single: prefill and decode here; prefill: compute the prompt and its first token, then "
          "ship its KV to the decode side (--decode_target); decode: generate, finding the "
          "shipped KV as a prefix hit");
ABSL_FLAG(std::string, decode_target, "", "prefill role: the decode side's daemon");
ABSL_FLAG(std::string, decode_pool, "", "prefill role: the decode side's pool (default: --pool)");
ABSL_FLAG(std::string, transport, "stream",
          "prefill role: stream (the decode daemon's PutBlocks; any node), shm (same node, host "
          "pools) or nccl (same node and GPU, device pools: a single-rank NCCL channel)");
ABSL_FLAG(bool, pause_midway, false,
          "prefill role, for tests of aborted transfers: stop halfway through the shipment and "
          "wait to be killed");

namespace kvcache::worker {
namespace {

// Where the worker's model runs, for the result lines: "cpu", or "cuda:N" for a device pool.
std::string ComputeName(const KvWorker& worker) {
  return worker.on_device() ? absl::StrCat("cuda:", worker.mapped().device()) : "cpu";
}

absl::StatusOr<std::vector<uint32_t>> PromptTokens() {
  std::vector<uint32_t> tokens;
  const std::string ids = absl::GetFlag(FLAGS_tokens);
  if (!ids.empty()) {
    for (absl::string_view id : absl::StrSplit(ids, ',', absl::SkipEmpty())) {
      uint32_t token = 0;
      if (!absl::SimpleAtoi(id, &token)) {
        return absl::InvalidArgumentError(absl::StrCat("--tokens: '", id, "' is not a token id"));
      }
      tokens.push_back(token);
    }
  } else {
    for (unsigned char byte : absl::GetFlag(FLAGS_prompt)) tokens.push_back(byte);
  }
  if (tokens.empty()) return absl::InvalidArgumentError("give --prompt or --tokens");
  return tokens;
}

// The --transport the prefill role ships with. nccl connects and warms its channel here, once,
// outside the request path.
absl::StatusOr<std::unique_ptr<BlockTransport>> MakeTransport(KvCacheClient& client,
                                                              const KvWorker& worker,
                                                              KvCacheClient* receiver,
                                                              const std::string& pool) {
  const std::string transport = absl::GetFlag(FLAGS_transport);
  if (transport == "shm") return MakeShmTransport(receiver, pool);
  if (transport == "stream") {
    return MakeStreamTransport(receiver, absl::GetFlag(FLAGS_tenant), pool);
  }
  if (transport == "nccl") {
    return MakeSingleGpuNcclTransport(&client, worker.mapped(), receiver, pool);
  }
  return absl::InvalidArgumentError("--transport is stream, shm or nccl");
}

// Prefill role: prompt → first token here, KV shipped to the decode side before release.
absl::Status RunPrefill(KvCacheClient& client, KvWorker& worker,
                        const std::vector<uint32_t>& prompt, const SamplerOptions& sampling,
                        const ClientOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<KvCacheClient> receiver,
                   KvCacheClient::Connect(absl::GetFlag(FLAGS_decode_target), options));
  RETURN_IF_ERROR(
      receiver->OpenSession(absl::GetFlag(FLAGS_tenant), "kvcache-worker prefill").status());
  std::string pool = absl::GetFlag(FLAGS_decode_pool);
  if (pool.empty()) pool = absl::GetFlag(FLAGS_pool);
  ASSIGN_OR_RETURN(std::unique_ptr<BlockTransport> transport,
                   MakeTransport(client, worker, receiver.get(), pool));
  if (absl::GetFlag(FLAGS_pause_midway)) {
    transport->set_midway_hook([]() -> absl::Status {
      std::printf("paused midway\n");
      std::fflush(stdout);
      while (true) absl::SleepFor(absl::Seconds(1));
    });
  }
  ShipmentStats shipped;
  ASSIGN_OR_RETURN(Sampler sampler, Sampler::Create(sampling));
  ASSIGN_OR_RETURN(GenerationResult result,
                   worker.Generate(prompt, 1, sampler, absl::GetFlag(FLAGS_cache_salt),
                                   [&](absl::Span<const uint32_t> table,
                                       absl::Span<const uint32_t> part_masks) -> absl::Status {
                                     ASSIGN_OR_RETURN(
                                         shipped, transport->Ship(Shipment{
                                                      .tokens = prompt,
                                                      .cache_salt = absl::GetFlag(FLAGS_cache_salt),
                                                      .source = &worker.mapped(),
                                                      .source_blocks = table,
                                                      .part_masks = part_masks}));
                                     return absl::OkStatus();
                                   }));
  std::printf(
      "prefill: %u prompt tokens, %u from the cache, first token %u after %.2f ms; "
      "shipped %u blocks (%llu bytes) over %s in %.2f ms, %u already on the decode side\n",
      result.prompt_tokens, result.cached_tokens, result.tokens[0],
      absl::ToDoubleMilliseconds(result.prefill_time), shipped.blocks_sent,
      static_cast<unsigned long long>(shipped.bytes_sent), transport->name().c_str(),
      absl::ToDoubleMilliseconds(shipped.elapsed), shipped.blocks_already_there);
  std::printf(
      "result role=prefill prompt_tokens=%u cached=%u first_token=%u sent_blocks=%u "
      "skipped_blocks=%u bytes=%llu ttft_us=%lld ship_us=%lld compute=%s\n",
      result.prompt_tokens, result.cached_tokens, result.tokens[0], shipped.blocks_sent,
      shipped.blocks_already_there, static_cast<unsigned long long>(shipped.bytes_sent),
      static_cast<long long>(absl::ToInt64Microseconds(result.prefill_time)),
      static_cast<long long>(absl::ToInt64Microseconds(shipped.elapsed)),
      ComputeName(worker).c_str());
  RETURN_IF_ERROR(receiver->CloseSession().status());
  return absl::OkStatus();
}

absl::Status Run() {
  ASSIGN_OR_RETURN(WorkerModel model, WorkerModel::Load(absl::GetFlag(FLAGS_checkpoint)));
  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) target = DefaultListenAddress();
  ASSIGN_OR_RETURN(const ClientOptions options, ClientOptionsFromFlags());
  ASSIGN_OR_RETURN(std::unique_ptr<KvCacheClient> client, KvCacheClient::Connect(target, options));
  RETURN_IF_ERROR(client->OpenSession(absl::GetFlag(FLAGS_tenant), "kvcache-worker").status());
  const uint32_t state_every_pages = absl::GetFlag(FLAGS_state_every_pages);
  ASSIGN_OR_RETURN(std::unique_ptr<KvWorker> worker,
                   model.CreateWorker(client.get(), absl::GetFlag(FLAGS_pool), state_every_pages));
  const SamplerOptions sampling{.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature)),
                                .seed = absl::GetFlag(FLAGS_seed)};
  ASSIGN_OR_RETURN(std::vector<uint32_t> prompt, PromptTokens());
  if (absl::GetFlag(FLAGS_role) == "prefill") {
    RETURN_IF_ERROR(RunPrefill(*client, *worker, prompt, sampling, options));
    return client->CloseSession().status();
  }
  for (uint32_t turn = 1; turn <= absl::GetFlag(FLAGS_turns); ++turn) {
    ASSIGN_OR_RETURN(Sampler sampler, Sampler::Create(sampling));
    ASSIGN_OR_RETURN(GenerationResult result,
                     worker->Generate(prompt, absl::GetFlag(FLAGS_max_new_tokens), sampler,
                                      absl::GetFlag(FLAGS_cache_salt)));
    std::string cold_check = "unchecked";
    if (absl::GetFlag(FLAGS_check_cold)) {
      ASSIGN_OR_RETURN(Sampler cold_sampler, Sampler::Create(sampling));
      ASSIGN_OR_RETURN(
          GenerationResult cold,
          worker->GenerateColdReference(prompt, absl::GetFlag(FLAGS_max_new_tokens), cold_sampler));
      const bool same = cold.tokens == result.tokens && cold.logits_digest == result.logits_digest;
      cold_check = same ? "identical" : "DIFFERENT";
      if (!same) return absl::InternalError("cached run differs from the cold run");
    }
    std::printf(
        "turn %u: %u prompt tokens, %u from the cache, %u computed in %.2f ms; "
        "%zu tokens decoded in %.2f ms; cold check: %s\n",
        turn, result.prompt_tokens, result.cached_tokens,
        result.prompt_tokens - result.cached_tokens,
        absl::ToDoubleMilliseconds(result.prefill_time), result.tokens.size(),
        absl::ToDoubleMilliseconds(result.decode_time), cold_check.c_str());
    std::printf(
        "result turn=%u prompt_tokens=%u cached=%u cached_host=%u cached_disk=%u "
        "cached_cluster=%u tokens=%s digest=%016llx prefill_us=%lld decode_us=%lld compute=%s\n",
        turn, result.prompt_tokens, result.cached_tokens, result.host_tier_tokens,
        result.disk_tier_tokens, result.cluster_tier_tokens,
        absl::StrJoin(result.tokens, ",").c_str(),
        static_cast<unsigned long long>(result.logits_digest),
        static_cast<long long>(absl::ToInt64Microseconds(result.prefill_time)),
        static_cast<long long>(absl::ToInt64Microseconds(result.decode_time)),
        ComputeName(*worker).c_str());
    std::fflush(stdout);
    // Next turn: the conversation so far and a new user message.
    prompt.insert(prompt.end(), result.tokens.begin(), result.tokens.end());
    for (unsigned char byte : absl::StrFormat("\nuser: and then? (%u)\n", turn)) {
      prompt.push_back(byte);
    }
  }
  return client->CloseSession().status();
}

}  // namespace
}  // namespace kvcache::worker

int main(int argc, char** argv) {
  kvcache::TuneGrpcForBlockStreams();
  kvcache::ParseCommandLineFlags(argc, argv, "MoE worker generating over a kvcache-manager pool");
  kvcache::TuneMallocForBlockStreams();
  const absl::Status status = kvcache::worker::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "kvcache-worker: %s\n", status.ToString().c_str());
    // Also on stdout, where the machine lines go, so a driver sees why.
    std::printf("error code=%s\n", absl::StatusCodeToString(status.code()).c_str());
    return 1;
  }
  return 0;
}
