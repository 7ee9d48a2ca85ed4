// CompatibilityManifest: what an engine process declares about the KV it stores, so that KV
// written under one model configuration, dtype, page layout or parallel rank is never served to
// another (persisted KV reused after a config change gives wrong output: vllm#56311). A session
// opened with a manifest is bound to it; its digest joins the chain root of every block the
// session stores or looks up (docs/hash_spec.md "Root with a manifest"), so a different manifest
// is another namespace in tier 1 and in every tier below, across restarts.
//
// Created only through Create, which validates every field (INVALID_ARGUMENT naming the field)
// and computes the canonical encoding and its digests once; the object is immutable and shared
// by the session, its streams and the pools' roots.
//
// Thread safety: immutable after Create; thread-safe.
#ifndef KVCACHE_COMMON_COMPATIBILITY_MANIFEST_H_
#define KVCACHE_COMMON_COMPATIBILITY_MANIFEST_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/block_hash.h"
#include "common/page_parts.h"
#include "common/pool_layout.h"

namespace kvcache {

inline constexpr size_t kMaxManifestModelIdBytes = 256;
inline constexpr size_t kMaxModelConfigDigestBytes = 64;
inline constexpr size_t kMaxManifestNameBytes = 64;  // codec, part names, key hash algorithm
inline constexpr size_t kMaxManifestParts = 16;

// Whether every byte of `name` is one of [A-Za-z0-9._-] (the rule of manifest names and page
// part names; their lengths are checked where they are used).
bool IsManifestName(absl::string_view name);

// A named byte range of a page (for example "kv", "swa", "state"), in page order.
struct PagePart {
  std::string name;
  uint64_t bytes = 0;
};

// The engine process's place in its parallel groups. A size of 0 means 1 (not split).
struct ParallelGeometry {
  uint32_t tp_size = 1;
  uint32_t tp_rank = 0;
  uint32_t pp_size = 1;
  uint32_t pp_rank = 0;
  uint32_t cp_size = 1;
  uint32_t cp_rank = 0;
};

struct ManifestFields {
  std::string model_id;             // 1 to 256 bytes
  std::string model_config_digest;  // 1 to 64 bytes, opaque: the engine's digest of its config
  std::string kv_dtype;             // a dtype name ParseDType accepts
  std::string kv_codec;             // "" for raw KV; else 1 to 64 of [A-Za-z0-9._-]
  uint32_t page_tokens = 0;         // at least 1
  std::vector<PagePart> parts;      // 1 to 16, unique names, each at least one byte
  ParallelGeometry parallel;
  std::string key_hash_algorithm;  // "" or 1 to 64 of [A-Za-z0-9._-]
};

class CompatibilityManifest {
 public:
  // INVALID_ARGUMENT naming the first field out of range; nothing is created then.
  static absl::StatusOr<std::shared_ptr<const CompatibilityManifest>> Create(ManifestFields fields);

  // The fields as validated: sizes of 0 raised to 1, kv_dtype in its canonical name.
  const ManifestFields& fields() const { return fields_; }
  DType kv_dtype() const { return kv_dtype_; }
  uint64_t page_bytes() const { return page_bytes_; }
  // The canonical byte encoding (docs/hash_spec.md): equal for manifests that mean the same.
  const std::string& canonical_encoding() const { return canonical_encoding_; }
  // H(canonical encoding) at full width, H being the pool's hash algorithm.
  const Hash128& Digest(HashAlgorithm algorithm) const {
    return algorithm == HashAlgorithm::kSha256 ? sha256_digest_ : xxh3_digest_;
  }

  // FAILED_PRECONDITION naming both values when the manifest contradicts the pool's layout: its
  // page tokens against the block size, its dtype against the pool's, its codec against raw
  // blocks, its parts' bytes against the block bytes (one part, or the sum of them, must be a
  // block), or, for a pool that declares its parts (`pool_parts` not empty), its parts against
  // the pool's: the same names and sizes in the same order.
  absl::Status CheckFits(const PoolLayout& layout, absl::string_view pool_name,
                         absl::Span<const PagePartLayout> pool_parts = {}) const;

 private:
  explicit CompatibilityManifest(ManifestFields fields, DType kv_dtype);

  ManifestFields fields_;
  DType kv_dtype_;
  uint64_t page_bytes_ = 0;
  std::string canonical_encoding_;
  Hash128 xxh3_digest_;
  Hash128 sha256_digest_;
};

}  // namespace kvcache

#endif  // KVCACHE_COMMON_COMPATIBILITY_MANIFEST_H_
