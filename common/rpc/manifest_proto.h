// CompatibilityManifest's fields to and from kvcache.v1.CompatibilityManifest, for the daemon
// and the client alike. Header-only: its users link kvcache::proto, which kvcache::rpc does not.
#ifndef KVCACHE_COMMON_RPC_MANIFEST_PROTO_H_
#define KVCACHE_COMMON_RPC_MANIFEST_PROTO_H_

#include "common/compatibility_manifest.h"
#include "kvcache/v1/kvcache.pb.h"

namespace kvcache {

// The fields as the message gives them; CompatibilityManifest::Create validates them.
inline ManifestFields ToManifestFields(const v1::CompatibilityManifest& proto) {
  ManifestFields fields{.model_id = proto.model_id(),
                        .model_config_digest = proto.model_config_digest(),
                        .kv_dtype = proto.kv_dtype(),
                        .kv_codec = proto.kv_codec(),
                        .page_tokens = proto.page_tokens(),
                        .key_hash_algorithm = proto.key_hash_algorithm()};
  fields.parts.reserve(proto.parts_size());
  for (const v1::PagePart& part : proto.parts())
    fields.parts.push_back({part.name(), part.bytes()});
  const v1::ParallelGeometry& parallel = proto.parallel();
  fields.parallel = ParallelGeometry{.tp_size = parallel.tp_size(),
                                     .tp_rank = parallel.tp_rank(),
                                     .pp_size = parallel.pp_size(),
                                     .pp_rank = parallel.pp_rank(),
                                     .cp_size = parallel.cp_size(),
                                     .cp_rank = parallel.cp_rank()};
  return fields;
}

inline void ToProto(const ManifestFields& fields, v1::CompatibilityManifest* proto) {
  proto->set_model_id(fields.model_id);
  proto->set_model_config_digest(fields.model_config_digest);
  proto->set_kv_dtype(fields.kv_dtype);
  proto->set_kv_codec(fields.kv_codec);
  proto->set_page_tokens(fields.page_tokens);
  for (const PagePart& part : fields.parts) {
    v1::PagePart* out = proto->add_parts();
    out->set_name(part.name);
    out->set_bytes(part.bytes);
  }
  v1::ParallelGeometry* parallel = proto->mutable_parallel();
  parallel->set_tp_size(fields.parallel.tp_size);
  parallel->set_tp_rank(fields.parallel.tp_rank);
  parallel->set_pp_size(fields.parallel.pp_size);
  parallel->set_pp_rank(fields.parallel.pp_rank);
  parallel->set_cp_size(fields.parallel.cp_size);
  parallel->set_cp_rank(fields.parallel.cp_rank);
  proto->set_key_hash_algorithm(fields.key_hash_algorithm);
}

}  // namespace kvcache

#endif  // KVCACHE_COMMON_RPC_MANIFEST_PROTO_H_
