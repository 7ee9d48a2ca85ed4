// The daemon's conversions between the v1 protos and the core's structs, as
// client/proto_convert.h is the client's: requests' keys, manifests and parts in, and the answers
// that describe pools (PoolInfo, counts, stats, manifests in use, tiers of a page read) out.
#ifndef KVCACHE_SERVER_PROTO_CONVERT_H_
#define KVCACHE_SERVER_PROTO_CONVERT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "auth/identity.h"
#include "cache/pool.h"
#include "cache/session_registry.h"
#include "common/block_hash.h"
#include "common/compatibility_manifest.h"
#include "common/page_parts.h"
#include "common/rpc/manifest_proto.h"
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

// The request's manifest, validated (INVALID_ARGUMENT naming the field); null when it has none.
template <typename Request>
absl::StatusOr<std::shared_ptr<const CompatibilityManifest>> ManifestOf(const Request& request) {
  if (!request.has_manifest()) return nullptr;
  return CompatibilityManifest::Create(ToManifestFields(request.manifest()));
}

// The mask of the named parts of a pool (PartMaskOf: empty names, every part; INVALID_ARGUMENT
// naming an unknown one): page calls' `parts`, token calls' `restore_parts`.
inline absl::StatusOr<uint32_t> WantedParts(
    absl::Span<const PagePartLayout> parts,
    const google::protobuf::RepeatedPtrField<std::string>& names) {
  if (names.empty()) return AllPartsMask(parts.size());
  return PartMaskOf(parts, std::vector<std::string>(names.begin(), names.end()));
}

SequenceSpec ToSequenceSpec(const google::protobuf::RepeatedField<uint32_t>& tokens,
                            const std::string& cache_salt, const v1::ExtraKeys& extras);

// The pool's name, model, layout and parts; its mapping (shm name, CUDA IPC handle) only for
// roles that may hold blocks, since it opens the whole pool's memory.
void FillPoolInfo(Pool& pool, const Identity& caller, v1::PoolInfo* info);
void FillCounts(const PoolStatsSnapshot& stats, v1::BlockCounts* counts);
// `tenant` empty: the whole pool's figures (an admin's view).
void FillStats(Pool& pool, absl::string_view tenant, v1::PoolStats* out);
// The manifests of `tenant`'s open sessions (empty: every tenant's) that fit the pool's layout,
// one entry per tenant and digest with its session count. O(sessions): DescribePool is an
// operator's call, not a request path.
void FillManifestsInUse(const Pool& pool, const SessionRegistry& sessions, absl::string_view tenant,
                        v1::DescribePoolResponse* response);
void FillTiers(const PagesByTier& tiers, v1::TierPages* out);

}  // namespace kvcache

#endif  // KVCACHE_SERVER_PROTO_CONVERT_H_
