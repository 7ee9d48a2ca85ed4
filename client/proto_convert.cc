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

// ToPoolInfo casts the proto's enums to ours: each of our enumerators must carry the number of
// the proto's value of the same meaning, and the proto must have no value past ours (a newer
// enumerator there needs one here first).
static_assert(static_cast<int>(DType::kFloat16) == v1::DTYPE_FLOAT16 &&
              static_cast<int>(DType::kBFloat16) == v1::DTYPE_BFLOAT16 &&
              static_cast<int>(DType::kFloat32) == v1::DTYPE_FLOAT32 &&
              static_cast<int>(DType::kFp8E4M3) == v1::DTYPE_FP8_E4M3 &&
              v1::DType_MAX == v1::DTYPE_FP8_E4M3);
static_assert(static_cast<int>(HashAlgorithm::kXxh3_128) == v1::HASH_ALGORITHM_XXH3_128 &&
              static_cast<int>(HashAlgorithm::kSha256) == v1::HASH_ALGORITHM_SHA256 &&
              v1::HashAlgorithm_MAX == v1::HASH_ALGORITHM_SHA256);
static_assert(static_cast<int>(KvCacheClient::PoolMapping::Kind::kNone) ==
                  v1::PoolMapping::KIND_UNSPECIFIED &&
              static_cast<int>(KvCacheClient::PoolMapping::Kind::kShm) ==
                  v1::PoolMapping::KIND_SHM &&
              static_cast<int>(KvCacheClient::PoolMapping::Kind::kCudaIpc) ==
                  v1::PoolMapping::KIND_CUDA_IPC &&
              v1::PoolMapping::Kind_MAX == v1::PoolMapping::KIND_CUDA_IPC);

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
  for (const v1::PagePartInfo& part : proto.parts()) {
    info.parts.push_back(
        PagePartLayout{.name = part.name(),
                       .offset = part.offset(),
                       .bytes = part.bytes(),
                       .policy = part.hit_policy() == v1::PagePartInfo::HIT_POLICY_TRAILING_PAGES
                                     ? PartHitPolicy::kTrailingPages
                                     : PartHitPolicy::kAllPages,
                       .trailing_pages = part.trailing_pages()});
  }
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
  for (const v1::TierStats& tier : proto.tiers()) {
    stats.tiers.push_back(KvCacheClient::TierStats{.tier = tier.tier(),
                                                   .hit_blocks = tier.hit_blocks(),
                                                   .stored_blocks = tier.stored_blocks(),
                                                   .evicted_blocks = tier.evicted_blocks(),
                                                   .bytes_used = tier.bytes_used(),
                                                   .capacity_bytes = tier.capacity_bytes(),
                                                   .verify_failures = tier.verify_failures(),
                                                   .load_failures = tier.load_failures(),
                                                   .deadline_blocks = tier.deadline_blocks(),
                                                   .evicted_from_above = tier.evicted_from_above(),
                                                   .records = tier.records(),
                                                   .request_waits = tier.request_waits(),
                                                   .store_failures = tier.store_failures(),
                                                   .restored_records = tier.restored_records(),
                                                   .restore_skipped = tier.restore_skipped(),
                                                   .node_failures = tier.node_failures(),
                                                   .skipped_commands = tier.skipped_commands(),
                                                   .redirects = tier.redirects(),
                                                   .lost_from_above = tier.lost_from_above(),
                                                   .open_failures = tier.open_failures(),
                                                   .superseded = tier.superseded(),
                                                   .poorer_kept_back = tier.poorer_kept_back()});
  }
  return stats;
}

KvCacheClient::TierTokens ToTierTokens(const v1::TierTokens& proto) {
  return KvCacheClient::TierTokens{
      .pool = proto.pool(), .host = proto.host(), .cluster = proto.cluster(), .disk = proto.disk()};
}

KvCacheClient::TierPages ToTierPages(const v1::TierPages& proto) {
  return KvCacheClient::TierPages{
      .pool = proto.pool(), .host = proto.host(), .disk = proto.disk(), .cluster = proto.cluster()};
}

}  // namespace kvcache
