#include "common/compatibility_manifest.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/byte_writer.h"
#include "common/status_macros.h"

namespace kvcache {

bool IsManifestName(absl::string_view name) {
  return std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '_' || c == '-';
  });
}

namespace {

constexpr absl::string_view kManifestTag = "kvcache.manifest.v1";

// "" is allowed only where `may_be_empty`; else 1 to kMaxManifestNameBytes of [A-Za-z0-9._-].
absl::Status ValidateName(absl::string_view field, absl::string_view value, bool may_be_empty) {
  if (value.empty()) {
    if (may_be_empty) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat("manifest ", field, " is empty"));
  }
  if (value.size() > kMaxManifestNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("manifest ", field, " has ", value.size(),
                                                   " bytes; at most ", kMaxManifestNameBytes));
  }
  if (!IsManifestName(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest ", field, " may hold only [A-Za-z0-9._-]"));
  }
  return absl::OkStatus();
}

// A rank must lie inside its group; a size of 0 is raised to 1 first.
absl::Status ValidateRank(absl::string_view group, uint32_t* size, uint32_t rank) {
  if (*size == 0) *size = 1;
  if (rank >= *size) {
    return absl::InvalidArgumentError(absl::StrCat("manifest parallel ", group, "_rank ", rank,
                                                   " is not below ", group, "_size ", *size));
  }
  return absl::OkStatus();
}

absl::Status Validate(ManifestFields* fields) {
  if (fields->model_id.empty()) return absl::InvalidArgumentError("manifest model_id is empty");
  if (fields->model_id.size() > kMaxManifestModelIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("manifest model_id has ",
                                                   fields->model_id.size(), " bytes; at most ",
                                                   kMaxManifestModelIdBytes));
  }
  const size_t digest_bytes = fields->model_config_digest.size();
  if (digest_bytes == 0 || digest_bytes > kMaxModelConfigDigestBytes) {
    return absl::InvalidArgumentError(absl::StrCat("manifest model_config_digest has ",
                                                   digest_bytes, " bytes; want 1 to ",
                                                   kMaxModelConfigDigestBytes));
  }
  RETURN_IF_ERROR(ValidateName("kv_codec", fields->kv_codec, /*may_be_empty=*/true));
  if (fields->page_tokens == 0) return absl::InvalidArgumentError("manifest page_tokens is 0");
  if (fields->parts.empty() || fields->parts.size() > kMaxManifestParts) {
    return absl::InvalidArgumentError(absl::StrCat("manifest has ", fields->parts.size(),
                                                   " parts; want 1 to ", kMaxManifestParts));
  }
  for (size_t i = 0; i < fields->parts.size(); ++i) {
    const PagePart& part = fields->parts[i];
    RETURN_IF_ERROR(ValidateName("part name", part.name, /*may_be_empty=*/false));
    // At most kMaxManifestParts: comparing with each earlier one costs less than a set.
    const auto earlier = fields->parts.begin() + static_cast<std::ptrdiff_t>(i);
    if (std::any_of(fields->parts.begin(), earlier,
                    [&](const PagePart& other) { return other.name == part.name; })) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest names part '", part.name, "' twice"));
    }
    if (part.bytes == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("manifest part '", part.name, "' has 0 bytes"));
    }
  }
  ParallelGeometry& parallel = fields->parallel;
  RETURN_IF_ERROR(ValidateRank("tp", &parallel.tp_size, parallel.tp_rank));
  RETURN_IF_ERROR(ValidateRank("pp", &parallel.pp_size, parallel.pp_rank));
  RETURN_IF_ERROR(ValidateRank("cp", &parallel.cp_size, parallel.cp_rank));
  return ValidateName("key_hash_algorithm", fields->key_hash_algorithm, /*may_be_empty=*/true);
}

std::string Encode(const ManifestFields& fields, DType kv_dtype) {
  ByteWriter writer;
  writer.Raw(kManifestTag);
  writer.String(fields.model_id);
  writer.String(fields.model_config_digest);
  writer.U32(static_cast<uint32_t>(kv_dtype));
  writer.String(fields.kv_codec);
  writer.U32(fields.page_tokens);
  writer.U32(static_cast<uint32_t>(fields.parts.size()));
  for (const PagePart& part : fields.parts) {
    writer.String(part.name);
    writer.U64(part.bytes);
  }
  const ParallelGeometry& parallel = fields.parallel;
  for (uint32_t value : {parallel.tp_size, parallel.tp_rank, parallel.pp_size, parallel.pp_rank,
                         parallel.cp_size, parallel.cp_rank}) {
    writer.U32(value);
  }
  writer.String(fields.key_hash_algorithm);
  return std::string(writer.data(), writer.size());
}

}  // namespace

absl::StatusOr<std::shared_ptr<const CompatibilityManifest>> CompatibilityManifest::Create(
    ManifestFields fields) {
  RETURN_IF_ERROR(Validate(&fields));
  absl::StatusOr<DType> kv_dtype = ParseDType(fields.kv_dtype);
  if (!kv_dtype.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("manifest kv_dtype: ", kv_dtype.status().message()));
  }
  // Two spellings of one dtype ("bf16", "bfloat16") are one manifest.
  fields.kv_dtype = std::string(DTypeName(*kv_dtype));
  return std::shared_ptr<const CompatibilityManifest>(
      new CompatibilityManifest(std::move(fields), *kv_dtype));
}

CompatibilityManifest::CompatibilityManifest(ManifestFields fields, DType kv_dtype)
    : fields_(std::move(fields)), kv_dtype_(kv_dtype) {
  // Validate bounds the parts (16 of at most 2^64 - 1 bytes each); saturate rather than wrap, so
  // a sum that overflows can never equal a block's bytes.
  for (const PagePart& part : fields_.parts) {
    page_bytes_ = part.bytes > UINT64_MAX - page_bytes_ ? UINT64_MAX : page_bytes_ + part.bytes;
  }
  canonical_encoding_ = Encode(fields_, kv_dtype_);
  xxh3_digest_ = HashBytes(HashAlgorithm::kXxh3_128, canonical_encoding_);
  sha256_digest_ = HashBytes(HashAlgorithm::kSha256, canonical_encoding_);
}

absl::Status CompatibilityManifest::CheckFits(const PoolLayout& layout, absl::string_view pool_name,
                                              absl::Span<const PagePartLayout> pool_parts) const {
  const auto mismatch = [&](absl::string_view what, const auto& ours, const auto& pools) {
    return absl::FailedPreconditionError(absl::StrCat("the manifest has ", what, " ", ours,
                                                      " but pool '", pool_name, "' has ", pools));
  };
  if (fields_.page_tokens != layout.block_size) {
    return mismatch("page_tokens", fields_.page_tokens,
                    absl::StrCat("block_size ", layout.block_size));
  }
  if (kv_dtype_ != layout.dtype) {
    return mismatch("kv_dtype", fields_.kv_dtype, absl::StrCat("dtype ", DTypeName(layout.dtype)));
  }
  if (!fields_.kv_codec.empty()) {
    return mismatch("kv_codec", absl::StrCat("'", fields_.kv_codec, "'"), "raw blocks (codec '')");
  }
  if (page_bytes_ != layout.BlockBytes()) {
    return mismatch(fields_.parts.size() == 1 ? "part bytes" : "parts summing to", page_bytes_,
                    absl::StrCat("block_bytes ", layout.BlockBytes()));
  }
  if (pool_parts.empty()) return absl::OkStatus();
  const auto spell = [](const auto& parts) {
    std::string spelled;
    for (const auto& part : parts) {
      absl::StrAppend(&spelled, spelled.empty() ? "" : ",", part.name, "/", part.bytes);
    }
    return spelled;
  };
  const bool same = fields_.parts.size() == pool_parts.size() &&
                    std::equal(pool_parts.begin(), pool_parts.end(), fields_.parts.begin(),
                               [](const PagePartLayout& ours, const PagePart& theirs) {
                                 return ours.name == theirs.name && ours.bytes == theirs.bytes;
                               });
  if (!same)
    return mismatch("parts", spell(fields_.parts), absl::StrCat("parts ", spell(pool_parts)));
  return absl::OkStatus();
}

}  // namespace kvcache
