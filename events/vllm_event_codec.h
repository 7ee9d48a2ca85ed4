// vLLM's KV-event wire format (vllm/distributed/kv_events.py), which llm-d's and Dynamo's
// indexers decode unchanged: one KvEvent (cache/kv_event_log.h) as one msgpack batch
//   [ts float64 (unix seconds), [event], dp_rank 0]
// with each event a positional array tagged by its class name:
//   ["BlockStored", [hash...], parent|nil, [token ids...], block_size, nil, medium, nil]
//   ["BlockRemoved", [hash...], medium]
//   ["AllBlocksCleared"]
// A hash is the low 64 bits of our 128-bit block hash, always a msgpack uint64 (vLLM's
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 form), and a BlockStored carries the token ids of all its
// blocks, block_size per hash. The two nils are vLLM's lora_id and lora_name.
#ifndef KVCACHE_EVENTS_VLLM_EVENT_CODEC_H_
#define KVCACHE_EVENTS_VLLM_EVENT_CODEC_H_

#include <cstdint>
#include <string>

#include "cache/kv_event_log.h"

namespace kvcache {

std::string EncodeVllmBatch(const KvEvent& event);

// The 8-byte big-endian sequence frame of a ZeroMQ message.
std::string EncodeSequenceFrame(uint64_t sequence);

}  // namespace kvcache

#endif  // KVCACHE_EVENTS_VLLM_EVENT_CODEC_H_
