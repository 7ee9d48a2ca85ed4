#include "server/proto_convert.h"

#include <map>
#include <utility>

namespace kvcache {

SequenceSpec ToSequenceSpec(const google::protobuf::RepeatedField<uint32_t>& tokens,
                            const std::string& cache_salt, const v1::ExtraKeys& extras) {
  return SequenceSpec{.tokens = absl::MakeConstSpan(tokens.data(), tokens.size()),
                      .cache_salt = cache_salt,
                      .extra_keys = ToExtraKeys(extras)};
}

// FillPoolInfo casts our enums to the proto's: each of our enumerators must carry the number of
// the proto's value of the same meaning.
static_assert(static_cast<int>(HashAlgorithm::kXxh3_128) == v1::HASH_ALGORITHM_XXH3_128);
static_assert(static_cast<int>(HashAlgorithm::kSha256) == v1::HASH_ALGORITHM_SHA256);
static_assert(static_cast<int>(DType::kFloat16) == v1::DTYPE_FLOAT16);
static_assert(static_cast<int>(DType::kBFloat16) == v1::DTYPE_BFLOAT16);
static_assert(static_cast<int>(DType::kFloat32) == v1::DTYPE_FLOAT32);
static_assert(static_cast<int>(DType::kFp8E4M3) == v1::DTYPE_FP8_E4M3);
static_assert(static_cast<int>(MappingInfo::Kind::kNone) == v1::PoolMapping::KIND_UNSPECIFIED);
static_assert(static_cast<int>(MappingInfo::Kind::kShm) == v1::PoolMapping::KIND_SHM);
static_assert(static_cast<int>(MappingInfo::Kind::kCudaIpc) == v1::PoolMapping::KIND_CUDA_IPC);

void FillPoolInfo(Pool& pool, const Identity& caller, v1::PoolInfo* info) {
  const PoolOptions& options = pool.options();
  info->set_name(options.name);
  info->set_model_id(options.model_id);
  info->set_num_blocks(options.num_blocks);
  info->set_hash_algorithm(static_cast<v1::HashAlgorithm>(options.hash_algorithm));
  info->set_memory_kind(pool.memory().kind());
  v1::PoolLayout* layout = info->mutable_layout();
  layout->set_num_layers(options.layout.num_layers);
  layout->set_num_kv_heads(options.layout.num_kv_heads);
  layout->set_head_dim(options.layout.head_dim);
  layout->set_block_size(options.layout.block_size);
  layout->set_dtype(static_cast<v1::DType>(options.layout.dtype));
  layout->set_block_bytes(options.layout.BlockBytes());
  layout->set_fingerprint(pool.layout_fingerprint());
  for (const PagePartLayout& part : pool.parts()) {
    v1::PagePartInfo* out = info->add_parts();
    out->set_name(part.name);
    out->set_offset(part.offset);
    out->set_bytes(part.bytes);
    out->set_hit_policy(part.policy == PartHitPolicy::kAllPages
                            ? v1::PagePartInfo::HIT_POLICY_ALL_PAGES
                            : v1::PagePartInfo::HIT_POLICY_TRAILING_PAGES);
    out->set_trailing_pages(part.trailing_pages);
  }
  if (caller.role < Role::kWorker) return;
  const MappingInfo mapping = pool.memory().mapping();
  v1::PoolMapping* out = info->mutable_mapping();
  out->set_kind(static_cast<v1::PoolMapping::Kind>(mapping.kind));
  out->set_shm_name(mapping.shm_name);
  out->set_size_bytes(mapping.size_bytes);
  out->set_cuda_ipc_handle(mapping.cuda_ipc_handle);
  out->set_cuda_device(mapping.cuda_device);
}

void FillCounts(const PoolStatsSnapshot& stats, v1::BlockCounts* counts) {
  counts->set_free(stats.free);
  counts->set_evictable(stats.evictable);
  counts->set_referenced(stats.referenced);
}

void FillStats(Pool& pool, absl::string_view tenant, v1::PoolStats* out) {
  pool.ExpirePins();  // the figures show expired pins released
  const PoolStatsSnapshot stats = tenant.empty() ? pool.Stats() : pool.Stats(tenant);
  out->set_pool(pool.options().name);
  out->set_tenant(std::string(tenant));
  FillCounts(stats, out->mutable_counts());
  out->set_prompt_tokens(stats.prompt_tokens);
  out->set_hit_tokens(stats.hit_tokens);
  out->set_hit_blocks(stats.hit_blocks);
  out->set_resurrected_blocks(stats.pool.resurrections);
  out->set_miss_blocks(stats.miss_blocks);
  out->set_evictions(stats.pool.evictions);
  out->set_published_blocks(stats.pool.published);
  out->set_duplicate_blocks(stats.pool.duplicates);
  out->set_open_sequences(stats.open_sequences);
  for (const TierStatsRow& row : stats.tiers) {
    v1::TierStats* tier = out->add_tiers();
    tier->set_tier(std::string(row.tier));
    tier->set_hit_blocks(row.hit_blocks);
    tier->set_stored_blocks(row.stored_blocks);
    tier->set_store_failures(row.store_failures);
    tier->set_evicted_blocks(row.evicted_blocks);
    tier->set_evicted_from_above(row.evicted_from_above);
    tier->set_lost_from_above(row.lost_from_above);
    tier->set_superseded(row.superseded);
    tier->set_poorer_kept_back(row.poorer_kept_back);
    tier->set_verify_failures(row.verify_failures);
    tier->set_open_failures(row.open_failures);
    tier->set_load_failures(row.load_failures);
    tier->set_deadline_blocks(row.deadline_blocks);
    tier->set_request_waits(row.request_waits);
    tier->set_records(row.records);
    tier->set_bytes_used(row.bytes_used);
    tier->set_capacity_bytes(row.capacity_bytes);
    tier->set_restored_records(row.restored_records);
    tier->set_restore_skipped(row.restore_skipped);
    tier->set_node_failures(row.node_failures);
    tier->set_skipped_commands(row.skipped_commands);
    tier->set_redirects(row.redirects);
  }
}

void FillManifestsInUse(const Pool& pool, const SessionRegistry& sessions, absl::string_view tenant,
                        v1::DescribePoolResponse* response) {
  const PoolOptions& options = pool.options();
  struct Use {
    const CompatibilityManifest* manifest;
    uint32_t sessions = 0;
  };
  std::map<std::pair<std::string, std::string>, Use> uses;  // (tenant, digest hex): ordered
  // Held until the end: the entries point into these sessions' manifests.
  const std::vector<SessionRegistry::Listed> open_sessions = sessions.List(tenant);
  for (const SessionRegistry::Listed& listed : open_sessions) {
    const Session& session = *listed.session;
    if (session.manifest == nullptr ||
        !session.manifest->CheckFits(options.layout, options.name, options.parts).ok()) {
      continue;
    }
    const std::string digest = session.manifest->Digest(options.hash_algorithm).ToHex();
    Use& use =
        uses.try_emplace({session.tenant, digest}, Use{session.manifest.get()}).first->second;
    ++use.sessions;
  }
  for (const auto& [key, use] : uses) {
    v1::ManifestInUse* out = response->add_manifests();
    out->set_tenant(key.first);
    out->set_digest(key.second);
    ToProto(use.manifest->fields(), out->mutable_manifest());
    out->set_sessions(use.sessions);
  }
}

void FillTiers(const PagesByTier& tiers, v1::TierPages* out) {
  out->set_pool(tiers.pool);
  out->set_host(tiers.host);
  out->set_disk(tiers.disk);
  out->set_cluster(tiers.cluster);
}

}  // namespace kvcache
