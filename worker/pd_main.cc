// kvcache-pd: pushes a batch of requests through prefill (daemon A) → decode (daemon B) and
// reports time to first token, time per output token, bytes shipped and their bandwidth, and
// the prefix-hit rates on both sides. Requests share a common prefix, as a system prompt would.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/time/clock.h"
#include "client/client_flags.h"
#include "common/command_line.h"
#include "common/rpc/grpc_tuning.h"
#include "common/rpc/malloc_tuning.h"
#include "common/status_macros.h"
#include "transfer/block_transport.h"
#include "transfer/nccl_transport.h"
#include "worker/kv_worker.h"
#include "worker/worker_model.h"

ABSL_FLAG(std::string, prefill_target, "", "the prefill node's daemon");
ABSL_FLAG(std::string, decode_target, "", "the decode node's daemon");
ABSL_FLAG(std::string, pool, "qwen", "pool name on both daemons, laid out for the model");
ABSL_FLAG(std::string, checkpoint, "",
          "directory with config.json and model.safetensors (Qwen3-MoE, or the hybrid "
          "Qwen3-Next over pools of kv + state pages, its state in every page)");
ABSL_FLAG(std::string, transport, "shm",
          "stream (any node), shm (same node, host pools) or nccl (same node and GPU, device "
          "pools: a single-rank NCCL channel, connected and warmed before the first request)");
ABSL_FLAG(std::string, tenant, "",
          "tenant of both sessions; empty: the tenant of this caller's identity");
ABSL_FLAG(uint32_t, requests, 8, "requests in the batch");
ABSL_FLAG(uint32_t, prompt_tokens, 512, "tokens per prompt");
ABSL_FLAG(uint32_t, shared_prefix, 256, "leading tokens every prompt shares");
ABSL_FLAG(uint32_t, max_new_tokens, 32, "tokens generated per request");
ABSL_FLAG(uint32_t, seed, 1, "varies the requests' own suffixes between runs");
ABSL_FLAG(uint32_t, state_every_pages, 1,
          "hybrid model: both sides save the recurrent state into every Nth page; the transport "
          "ships each page's part mask with it");

namespace kvcache::worker {
namespace {

struct Side {
  std::unique_ptr<KvCacheClient> client;
  std::unique_ptr<KvWorker> worker;
};

absl::StatusOr<Side> Connect(const std::string& target, const ClientOptions& options,
                             const WorkerModel& model) {
  Side side;
  ASSIGN_OR_RETURN(side.client, KvCacheClient::Connect(target, options));
  RETURN_IF_ERROR(side.client->OpenSession(absl::GetFlag(FLAGS_tenant), "kvcache-pd").status());
  ASSIGN_OR_RETURN(side.worker, model.CreateWorker(side.client.get(), absl::GetFlag(FLAGS_pool),
                                                   absl::GetFlag(FLAGS_state_every_pages)));
  return side;
}

std::vector<uint32_t> RequestPrompt(uint32_t request) {
  const uint32_t shared = absl::GetFlag(FLAGS_shared_prefix);
  std::vector<uint32_t> prompt(absl::GetFlag(FLAGS_prompt_tokens));
  for (uint32_t i = 0; i < prompt.size(); ++i) {
    const uint32_t seed = i < shared ? 0 : absl::GetFlag(FLAGS_seed) * 100003 + request + 1;
    prompt[i] = (seed * 7919 + i * 31 + (i * i) % 17) % 256;
  }
  return prompt;
}

absl::Status Run() {
  ASSIGN_OR_RETURN(WorkerModel model, WorkerModel::Load(absl::GetFlag(FLAGS_checkpoint)));
  ASSIGN_OR_RETURN(const ClientOptions options, ClientOptionsFromFlags());
  ASSIGN_OR_RETURN(Side prefill, Connect(absl::GetFlag(FLAGS_prefill_target), options, model));
  ASSIGN_OR_RETURN(Side decode, Connect(absl::GetFlag(FLAGS_decode_target), options, model));
  std::unique_ptr<BlockTransport> transport;
  const std::string transport_flag = absl::GetFlag(FLAGS_transport);
  if (transport_flag == "shm") {
    ASSIGN_OR_RETURN(transport, MakeShmTransport(decode.client.get(), absl::GetFlag(FLAGS_pool)));
  } else if (transport_flag == "stream") {
    transport = MakeStreamTransport(decode.client.get(), absl::GetFlag(FLAGS_tenant),
                                    absl::GetFlag(FLAGS_pool));
  } else if (transport_flag == "nccl") {
    ASSIGN_OR_RETURN(transport,
                     MakeSingleGpuNcclTransport(prefill.client.get(), prefill.worker->mapped(),
                                                decode.client.get(), absl::GetFlag(FLAGS_pool)));
  } else {
    return absl::InvalidArgumentError("--transport is stream, shm or nccl");
  }
  const uint32_t max_new = absl::GetFlag(FLAGS_max_new_tokens);
  absl::Duration ttft_total, tpot_total, ship_total;
  uint64_t bytes = 0, prompt_tokens = 0, prefill_cached = 0, decode_cached = 0;
  uint32_t blocks_sent = 0, blocks_skipped = 0;
  std::printf("%-8s %10s %10s %10s %12s %14s\n", "request", "ttft ms", "tpot ms", "shipped",
              "prefill hit", "decode hit");
  for (uint32_t request = 0; request < absl::GetFlag(FLAGS_requests); ++request) {
    const std::vector<uint32_t> prompt = RequestPrompt(request);
    ShipmentStats shipped;
    Sampler prefill_sampler = Sampler::Greedy();
    ASSIGN_OR_RETURN(
        GenerationResult first,
        prefill.worker->Generate(prompt, 1, prefill_sampler, "",
                                 [&](absl::Span<const uint32_t> table,
                                     absl::Span<const uint32_t> part_masks) -> absl::Status {
                                   ASSIGN_OR_RETURN(
                                       shipped,
                                       transport->Ship(Shipment{.tokens = prompt,
                                                                .source = &prefill.worker->mapped(),
                                                                .source_blocks = table,
                                                                .part_masks = part_masks}));
                                   return absl::OkStatus();
                                 }));
    const absl::Duration ttft = first.prefill_time;
    Sampler decode_sampler = Sampler::Greedy();
    ASSIGN_OR_RETURN(GenerationResult rest,
                     decode.worker->Generate(prompt, max_new, decode_sampler));
    if (rest.tokens[0] != first.tokens[0]) {
      return absl::InternalError("decode side's first token differs from the prefill side's");
    }
    const absl::Duration tpot = rest.decode_time / std::max<uint32_t>(1, max_new - 1);
    std::printf("%-8u %10.2f %10.3f %7.1f KiB %11.0f%% %13.0f%%\n", request,
                absl::ToDoubleMilliseconds(ttft), absl::ToDoubleMilliseconds(tpot),
                shipped.bytes_sent / 1024.0, 100.0 * first.cached_tokens / prompt.size(),
                100.0 * rest.cached_tokens / prompt.size());
    ttft_total += ttft;
    tpot_total += tpot;
    ship_total += shipped.elapsed;
    bytes += shipped.bytes_sent;
    blocks_sent += shipped.blocks_sent;
    blocks_skipped += shipped.blocks_already_there;
    prompt_tokens += prompt.size();
    prefill_cached += first.cached_tokens;
    decode_cached += rest.cached_tokens;
  }
  const uint32_t n = absl::GetFlag(FLAGS_requests);
  std::printf("\n%u requests over %s: mean TTFT %.2f ms, mean TPOT %.3f ms\n", n,
              transport->name().c_str(), absl::ToDoubleMilliseconds(ttft_total / n),
              absl::ToDoubleMilliseconds(tpot_total / n));
  std::printf("shipped %u blocks (%llu bytes) in %.2f ms: %.2f GB/s; %u blocks not sent (held)\n",
              blocks_sent, static_cast<unsigned long long>(bytes),
              absl::ToDoubleMilliseconds(ship_total),
              bytes / std::max(1e-9, absl::ToDoubleSeconds(ship_total)) / 1e9, blocks_skipped);
  std::printf("prefix hits: prefill side %.1f%%, decode side %.1f%% of prompt tokens\n",
              100.0 * prefill_cached / prompt_tokens, 100.0 * decode_cached / prompt_tokens);
  return absl::OkStatus();
}

}  // namespace
}  // namespace kvcache::worker

int main(int argc, char** argv) {
  kvcache::TuneGrpcForBlockStreams();
  kvcache::ParseCommandLineFlags(argc, argv,
                                 "prefill → decode driver over two kvcache-manager daemons");
  kvcache::TuneMallocForBlockStreams();
  const absl::Status status = kvcache::worker::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "kvcache-pd: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
