// vLLM's KV-event wire format (vllm/distributed/kv_events.py), which llm-d's and Dynamo's
// indexers decode unchanged: one KvEvent (cache/kv_event_log.h) as one msgpack batch
//   [ts float64 (unix seconds), [event], dp_rank 0]
// with each event in one of vLLM's two encodings (msgspec structs tagged by class name):
// - kArray, positional arrays (array_like=True: vLLM until its events became tagged maps, and
//   what llm-d's decoder reads, pkg/kvevents/engineadapter/vllm_adapter.go):
//     ["BlockStored", [hash...], parent|nil, [token ids...], block_size, nil, medium, nil]
//     ["BlockRemoved", [hash...], medium]
//     ["AllBlocksCleared"]
// - kMap, tagged maps (current vLLM's KVCacheEvent, tag=True without array_like; fields that
//   equal their default are omitted, as msgspec's omit_defaults does):
//     {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": parent|nil,
//      "token_ids": [...], "block_size": n, "lora_id": nil, "medium": m, "lora_name": nil}
//     {"type": "BlockRemoved", "block_hashes": [...], "medium": m}
//     {"type": "AllBlocksCleared"}
// A token block's hash is the low 64 bits of our 128-bit block hash, a msgpack uint64 (vLLM's
// VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1 form), and a BlockStored carries the token ids of all its
// blocks, block_size per hash. The two nils are vLLM's lora_id and lora_name.
// A page (DESIGN §13) is named by the engine's own key instead: its hash is the key's bytes, a
// msgpack bin (vLLM's ExternalBlockHash bytes form, which its consumers reduce to the last 8
// bytes big-endian, as vLLM's int form does), in BlockStored and BlockRemoved alike, with no
// parent and no token ids (docs/design.md, "Page events": a router that indexed the engine's own
// event for that key adds this node's medium to it, as for vLLM's offloading events).
#ifndef KVCACHE_EVENTS_VLLM_EVENT_CODEC_H_
#define KVCACHE_EVENTS_VLLM_EVENT_CODEC_H_

#include <cstdint>
#include <string>

#include "cache/kv_event_log.h"

namespace kvcache {

enum class VllmEventEncoding : uint8_t { kArray, kMap };

std::string EncodeVllmBatch(const KvEvent& event,
                            VllmEventEncoding encoding = VllmEventEncoding::kArray);

// The 8-byte big-endian sequence frame of a ZeroMQ message.
std::string EncodeSequenceFrame(uint64_t sequence);

}  // namespace kvcache

#endif  // KVCACHE_EVENTS_VLLM_EVENT_CODEC_H_
