// Request keys and manifests from their protos, shared by the unary handlers and the block
// streams.
#ifndef KVCACHE_SERVER_PROTO_KEYS_H_
#define KVCACHE_SERVER_PROTO_KEYS_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
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

}  // namespace kvcache

#endif  // KVCACHE_SERVER_PROTO_KEYS_H_
