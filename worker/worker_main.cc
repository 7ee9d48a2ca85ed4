// kvcache-worker: generates with the MoE model, its KV in a kvcache-manager pool. Each turn prints
// a human line and a machine line ("result key=value ..."); with --turns N the conversation goes
// on, each turn's prompt being the previous prompt, its answer and a new user message, so later
// turns hit their own history in the cache. With --check_cold every turn is also run cold in
// this process and must match bit for bit.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/listen_address.h"
#include "common/status_macros.h"
#include "worker/kv_worker.h"

ABSL_FLAG(std::string, target, "", "daemon address (default: the daemon's default socket)");
ABSL_FLAG(std::string, pool, "default", "pool laid out for this model");
ABSL_FLAG(std::string, checkpoint, "", "directory with config.json and model.safetensors");
ABSL_FLAG(std::string, tenant, "demo", "tenant of this worker's session");
ABSL_FLAG(std::string, prompt, "", "prompt text; its bytes are the tokens (byte-level vocab)");
ABSL_FLAG(std::string, tokens, "", "prompt as comma-separated token ids (instead of --prompt)");
ABSL_FLAG(uint32_t, max_new_tokens, 16, "tokens to generate per turn");
ABSL_FLAG(uint32_t, turns, 1, "conversation turns");
ABSL_FLAG(double, temperature, 0, "0: greedy");
ABSL_FLAG(uint64_t, seed, 0, "sampling seed");
ABSL_FLAG(std::string, cache_salt, "", "narrows cache sharing within the tenant");
ABSL_FLAG(bool, check_cold, false, "also run each turn cold in-process and require equality");

namespace kvcache::worker {
namespace {

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

absl::Status Run() {
  ASSIGN_OR_RETURN(Qwen3MoeModel model, Qwen3MoeModel::Load(absl::GetFlag(FLAGS_checkpoint)));
  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) target = DefaultListenAddress();
  ASSIGN_OR_RETURN(std::unique_ptr<KvCacheClient> client, KvCacheClient::Connect(target));
  RETURN_IF_ERROR(client->OpenSession(absl::GetFlag(FLAGS_tenant), "kvcache-worker").status());
  ASSIGN_OR_RETURN(std::unique_ptr<KvWorker> worker,
                   KvWorker::Create(client.get(), absl::GetFlag(FLAGS_pool), &model));
  const SamplerOptions sampling{.temperature = static_cast<float>(absl::GetFlag(FLAGS_temperature)),
                                .seed = absl::GetFlag(FLAGS_seed)};
  ASSIGN_OR_RETURN(std::vector<uint32_t> prompt, PromptTokens());
  for (uint32_t turn = 1; turn <= absl::GetFlag(FLAGS_turns); ++turn) {
    ASSIGN_OR_RETURN(Sampler sampler, Sampler::Create(sampling));
    ASSIGN_OR_RETURN(GenerationResult result,
                     worker->Generate(prompt, absl::GetFlag(FLAGS_max_new_tokens), sampler,
                                      absl::GetFlag(FLAGS_cache_salt)));
    std::string cold_check = "unchecked";
    if (absl::GetFlag(FLAGS_check_cold)) {
      ASSIGN_OR_RETURN(Sampler cold_sampler, Sampler::Create(sampling));
      ASSIGN_OR_RETURN(GenerationResult cold,
                       GenerateCold(model, prompt, absl::GetFlag(FLAGS_max_new_tokens),
                                    cold_sampler, worker->layout().block_size,
                                    worker->layout().dtype));
      const bool same = cold.tokens == result.tokens && cold.logits_digest == result.logits_digest;
      cold_check = same ? "identical" : "DIFFERENT";
      if (!same) return absl::InternalError("cached run differs from the cold run");
    }
    std::printf("turn %u: %u prompt tokens, %u from the cache, %u computed in %.2f ms; "
                "%zu tokens decoded in %.2f ms; cold check: %s\n",
                turn, result.prompt_tokens, result.cached_tokens,
                result.prompt_tokens - result.cached_tokens,
                absl::ToDoubleMilliseconds(result.prefill_time), result.tokens.size(),
                absl::ToDoubleMilliseconds(result.decode_time), cold_check.c_str());
    std::printf("result turn=%u prompt_tokens=%u cached=%u tokens=%s digest=%016llx "
                "prefill_us=%lld decode_us=%lld\n",
                turn, result.prompt_tokens, result.cached_tokens,
                absl::StrJoin(result.tokens, ",").c_str(),
                static_cast<unsigned long long>(result.logits_digest),
                static_cast<long long>(absl::ToInt64Microseconds(result.prefill_time)),
                static_cast<long long>(absl::ToInt64Microseconds(result.decode_time)));
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
  absl::SetProgramUsageMessage("MoE worker generating over a kvcache-manager pool");
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = kvcache::worker::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "kvcache-worker: %s\n", status.ToString().c_str());
    // Also on stdout, where the machine lines go, so a driver sees why.
    std::printf("error code=%s\n", absl::StatusCodeToString(status.code()).c_str());
    return 1;
  }
  return 0;
}
