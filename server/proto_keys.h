// Request keys from their protos, shared by the unary handlers and the block streams.
#ifndef KVCACHE_SERVER_PROTO_KEYS_H_
#define KVCACHE_SERVER_PROTO_KEYS_H_

#include "common/block_hash.h"
#include "kvcache/v1/kvcache.pb.h"

namespace kvcache {

inline ExtraKeys ToExtraKeys(const v1::ExtraKeys& proto) {
  ExtraKeys extras{.lora_id = proto.lora_id()};
  extras.multimodal_items.reserve(proto.multimodal_items_size());
  for (const v1::MultimodalItem& item : proto.multimodal_items()) {
    extras.multimodal_items.push_back({item.content_hash(), item.offset(), item.length()});
  }
  return extras;
}

}  // namespace kvcache

#endif  // KVCACHE_SERVER_PROTO_KEYS_H_
