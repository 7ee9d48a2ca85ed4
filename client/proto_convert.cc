#include "client/proto_convert.h"

namespace kvcache {

void FillExtraKeys(const ExtraKeys& extras, v1::ExtraKeys* proto) {
  proto->set_lora_id(extras.lora_id);
  for (const MultimodalItem& item : extras.multimodal_items) {
    v1::MultimodalItem* out = proto->add_multimodal_items();
    out->set_content_hash(item.content_hash);
    out->set_offset(item.offset);
    out->set_length(item.length);
  }
}

KvCacheClient::PoolInfo ToPoolInfo(const v1::PoolInfo& proto) {
  KvCacheClient::PoolInfo info;
  info.name = proto.name();
  info.model_id = proto.model_id();
  const v1::PoolLayout& layout = proto.layout();
  info.layout = PoolLayout{.num_layers = layout.num_layers(),
                           .num_kv_heads = layout.num_kv_heads(),
                           .head_dim = layout.head_dim(),
                           .block_size = layout.block_size(),
                           .dtype = static_cast<DType>(layout.dtype())};
  info.block_bytes = layout.block_bytes();
  info.layout_fingerprint = layout.fingerprint();
  info.num_blocks = proto.num_blocks();
  info.hash_algorithm = static_cast<HashAlgorithm>(proto.hash_algorithm());
  info.memory_kind = proto.memory_kind();
  const v1::PoolMapping& mapping = proto.mapping();
  info.mapping.kind = static_cast<KvCacheClient::PoolMapping::Kind>(mapping.kind());
  info.mapping.shm_name = mapping.shm_name();
  info.mapping.size_bytes = mapping.size_bytes();
  info.mapping.cuda_ipc_handle = mapping.cuda_ipc_handle();
  info.mapping.cuda_device = mapping.cuda_device();
  return info;
}

KvCacheClient::BlockCounts ToBlockCounts(const v1::BlockCounts& proto) {
  return KvCacheClient::BlockCounts{
      .free = proto.free(), .evictable = proto.evictable(), .referenced = proto.referenced()};
}

KvCacheClient::PoolStats ToPoolStats(const v1::PoolStats& proto) {
  KvCacheClient::PoolStats stats;
  stats.pool = proto.pool();
  stats.counts = ToBlockCounts(proto.counts());
  stats.prompt_tokens = proto.prompt_tokens();
  stats.hit_tokens = proto.hit_tokens();
  stats.hit_blocks = proto.hit_blocks();
  stats.resurrected_blocks = proto.resurrected_blocks();
  stats.miss_blocks = proto.miss_blocks();
  stats.evictions = proto.evictions();
  stats.published_blocks = proto.published_blocks();
  stats.duplicate_blocks = proto.duplicate_blocks();
  stats.open_sequences = proto.open_sequences();
  return stats;
}

}  // namespace kvcache
