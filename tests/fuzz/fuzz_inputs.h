// Prompts decoded from a fuzz input, shared by the fuzz targets. Tokens come from a small
// alphabet and later prompts often reuse an earlier prompt's prefix, so that prefix hits,
// resurrections and forks of shared blocks are a few input bytes away rather than a 2^-32 guess;
// now and then the salt, the LoRA id or a multimodal item is malformed or out of range. Sessions'
// compatibility manifests likewise mostly fit a pool, sometimes not.
//
// Thread safety: functions of their arguments only.
#ifndef KVCACHE_TESTS_FUZZ_FUZZ_INPUTS_H_
#define KVCACHE_TESTS_FUZZ_FUZZ_INPUTS_H_

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/types/span.h"
#include "cache/pool.h"
#include "common/block_hash.h"
#include "common/compatibility_manifest.h"
#include "common/page_parts.h"
#include "common/pool_layout.h"

namespace kvcache {

// True one time in `one_in` on random input, and false once the input is used up: every choice
// a target makes is written so that the zeros FuzzedDataProvider returns then take the ordinary
// path (a well-formed request, no fault), not the odd one.
inline bool Rarely(FuzzedDataProvider& in, int one_in) {
  return in.ConsumeIntegralInRange(1, one_in) == one_in;
}

// Up to `max_tokens` tokens, mostly from {0, 1, 2, 3}, sometimes any value; now and then none.
inline std::vector<uint32_t> ConsumeTokens(FuzzedDataProvider& in, size_t max_tokens) {
  std::vector<uint32_t> tokens(Rarely(in, 16) ? 0
                                              : in.ConsumeIntegralInRange<size_t>(1, max_tokens));
  for (uint32_t& token : tokens) {
    token =
        Rarely(in, 16) ? in.ConsumeIntegral<uint32_t>() : in.ConsumeIntegralInRange<uint32_t>(0, 3);
  }
  return tokens;
}

struct PromptInput {
  std::vector<uint32_t> tokens;
  std::string cache_salt;
  ExtraKeys extra_keys;

  SequenceSpec Spec() const { return SequenceSpec{tokens, cache_salt, extra_keys}; }
};

// A prompt: half the time an earlier prompt (or a prefix of it) (from `history`, which it joins)
// and more tokens; mostly no salt and no extra keys.
inline PromptInput ConsumePrompt(FuzzedDataProvider& in,
                                 std::vector<std::vector<uint32_t>>& history) {
  PromptInput prompt;
  if (!history.empty() && !Rarely(in, 2)) {
    const std::vector<uint32_t>& earlier =
        history[in.ConsumeIntegralInRange<size_t>(0, history.size() - 1)];
    prompt.tokens.assign(earlier.begin(),
                         earlier.end() - in.ConsumeIntegralInRange<size_t>(0, earlier.size()));
  }
  const std::vector<uint32_t> more = ConsumeTokens(in, 40);
  prompt.tokens.insert(prompt.tokens.end(), more.begin(), more.end());
  if (history.size() < 16) history.push_back(prompt.tokens);
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 5:
      prompt.cache_salt = in.ConsumeRandomLengthString(kMaxCacheSaltBytes + 4);
      break;
    case 6:
      prompt.extra_keys.lora_id = in.ConsumeRandomLengthString(kMaxLoraIdBytes + 4);
      break;
    case 7: {
      const size_t items = in.ConsumeIntegralInRange<size_t>(0, 3);
      for (size_t i = 0; i < items; ++i) {
        MultimodalItem item;
        item.content_hash = in.ConsumeRandomLengthString(kMaxContentHashBytes + 4);
        item.offset = in.ConsumeIntegralInRange<uint32_t>(0, prompt.tokens.size() + 1);
        item.length = in.ConsumeIntegralInRange<uint32_t>(0, 8);
        prompt.extra_keys.multimodal_items.push_back(std::move(item));
      }
      break;
    }
    default:
      break;
  }
  return prompt;
}

// A compatibility manifest for a pool of `layout` (and its `pool_parts`, where it declares
// parts): mostly one that fits it, of one of two config digests and two TP ranks (so sessions
// share blocks or keep apart), now and then with one field that contradicts the layout or does
// not validate at all.
inline ManifestFields ConsumeManifest(FuzzedDataProvider& in, const PoolLayout& layout,
                                      absl::Span<const PagePartLayout> pool_parts = {}) {
  ManifestFields fields{.model_id = "fuzz-model",
                        .model_config_digest = in.ConsumeBool() ? "rope-b" : "rope-a",
                        .kv_dtype = std::string(DTypeName(layout.dtype)),
                        .page_tokens = layout.block_size,
                        .parts = {{"kv", layout.BlockBytes()}},
                        .parallel = {.tp_size = 2, .tp_rank = in.ConsumeIntegralInRange(0u, 1u)}};
  // A pool that declares parts is fitted by a manifest naming the same ones.
  if (!pool_parts.empty()) {
    fields.parts.clear();
    for (const PagePartLayout& part : pool_parts) fields.parts.push_back({part.name, part.bytes});
  }
  if (!Rarely(in, 4)) return fields;
  switch (in.ConsumeIntegralInRange(0, 7)) {
    case 0:
      fields.page_tokens = in.ConsumeIntegral<uint32_t>();
      break;
    case 1:
      fields.kv_dtype = in.ConsumeBool() ? "fp32" : in.ConsumeRandomLengthString(8);
      break;
    case 2:
      fields.kv_codec = in.ConsumeRandomLengthString(70);
      break;
    case 3:
      fields.parts = {{"k", layout.BlockBytes() / 2}, {"v", layout.BlockBytes() / 2}};
      break;
    case 4:
      fields.parts.push_back({in.ConsumeBool() ? "kv" : "state", in.ConsumeIntegral<uint64_t>()});
      break;
    case 5:
      fields.parallel.tp_rank = in.ConsumeIntegral<uint32_t>();
      break;
    case 6:
      fields.model_config_digest = in.ConsumeRandomLengthString(80);
      break;
    default:
      fields.model_id = in.ConsumeRandomLengthString(300);
      break;
  }
  return fields;
}

}  // namespace kvcache

#endif  // KVCACHE_TESTS_FUZZ_FUZZ_INPUTS_H_
