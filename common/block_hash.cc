#include "common/block_hash.h"

#include <openssl/evp.h>
#include <xxhash.h>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace kvcache {
namespace {

constexpr absl::string_view kRootTag = "kvcache.root.v1";
// The root of a session bound to a compatibility manifest: v1's fields, then the manifest's
// digest. Its own tag keeps the encoding of a root without one exactly v1's.
constexpr absl::string_view kManifestRootTag = "kvcache.root.v2";
constexpr absl::string_view kBlockTag = "kvcache.block.v1";
constexpr absl::string_view kPageTag = "kvcache.page.v1";
// The prefix digest hashes the chain's block encoding with the parent hash's 16 bytes replaced
// by the parent digest and 8 zero bytes, so it can reuse that encoding. Its own seed (the chain's
// is 0) keeps it from failing together with the chain hash.
constexpr uint64_t kPrefixDigestSeed = 0x9e37'79b9'7f4a'7c15ULL;
constexpr size_t kParentOffset = kBlockTag.size();

uint64_t LoadBigEndian64(const unsigned char* bytes) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) value = (value << 8) | bytes[i];
  return value;
}

void WriteHash(const Hash128& hash, ByteWriter* writer) {
  unsigned char bytes[16];
  for (int i = 0; i < 8; ++i) {
    bytes[i] = static_cast<unsigned char>(hash.hi >> (56 - 8 * i));
    bytes[8 + i] = static_cast<unsigned char>(hash.lo >> (56 - 8 * i));
  }
  writer->Raw(absl::string_view(reinterpret_cast<const char*>(bytes), 16));
}

bool Overlaps(const MultimodalItem& item, uint32_t start, uint32_t end) {
  const uint64_t item_end = uint64_t{item.offset} + item.length;
  return item.offset < end && item_end > start;
}

}  // namespace

std::string Hash128::ToHex() const { return absl::StrFormat("%016x%016x", hi, lo); }

absl::string_view HashAlgorithmName(HashAlgorithm algorithm) {
  return algorithm == HashAlgorithm::kSha256 ? "sha256" : "xxh3_128";
}

absl::StatusOr<HashAlgorithm> ParseHashAlgorithm(absl::string_view name) {
  const std::string lower = absl::AsciiStrToLower(name);
  if (lower == "xxh3" || lower == "xxh3_128" || lower == "xxh3-128")
    return HashAlgorithm::kXxh3_128;
  if (lower == "sha256" || lower == "sha-256") return HashAlgorithm::kSha256;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown hash algorithm '", name, "' (want xxh3_128 or sha256)"));
}

Hash128 BlockHasher::Weaken(Hash128 hash) const {
  if (keep_bits_ == 0 || keep_bits_ >= 128) return hash;
  if (keep_bits_ <= 64) {
    hash.hi = 0;
    if (keep_bits_ < 64) hash.lo &= (uint64_t{1} << keep_bits_) - 1;
  } else {
    hash.hi &= (uint64_t{1} << (keep_bits_ - 64)) - 1;
  }
  return hash;
}

Hash128 HashBytes(HashAlgorithm algorithm, absl::string_view bytes) {
  if (algorithm == HashAlgorithm::kSha256) {
    unsigned char digest[EVP_MAX_MD_SIZE];
    unsigned int digest_size = 0;
    EVP_Digest(bytes.data(), bytes.size(), digest, &digest_size, EVP_sha256(), nullptr);
    return Hash128{LoadBigEndian64(digest), LoadBigEndian64(digest + 8)};
  }
  const XXH128_hash_t hash = XXH3_128bits_withSeed(bytes.data(), bytes.size(), 0);
  return Hash128{hash.high64, hash.low64};
}

Hash128 BlockHasher::Finish() const {
  return Weaken(HashBytes(algorithm_, absl::string_view(scratch_.data(), scratch_.size())));
}

void BlockHasher::WriteRoot(const HashNamespace& ns) {
  scratch_.Clear();
  scratch_.Raw(ns.manifest_digest.has_value() ? kManifestRootTag : kRootTag);
  scratch_.String(ns.model_id);
  scratch_.U64(ns.layout_fingerprint);
  scratch_.String(ns.tenant);
  scratch_.String(ns.cache_salt);
  if (ns.manifest_digest.has_value()) WriteHash(*ns.manifest_digest, &scratch_);
}

Hash128 BlockHasher::Root(const HashNamespace& ns) {
  WriteRoot(ns);
  return Finish();
}

uint64_t BlockHasher::NamespaceDigest(const HashNamespace& ns) {
  WriteRoot(ns);
  return XXH3_64bits_withSeed(scratch_.data(), scratch_.size(), 0);
}

void BlockHasher::WriteExtras(const ExtraKeys& extras, uint32_t block_start, uint32_t block_end) {
  scratch_.String(extras.lora_id);
  uint32_t count = 0;
  for (const MultimodalItem& item : extras.multimodal_items) {
    count += Overlaps(item, block_start, block_end) ? 1 : 0;
  }
  scratch_.U32(count);
  for (const MultimodalItem& item : extras.multimodal_items) {
    if (Overlaps(item, block_start, block_end)) scratch_.String(item.content_hash);
  }
}

void BlockHasher::WriteBlock(absl::Span<const uint32_t> tokens, const ExtraKeys& extras,
                             uint32_t block_start) {
  scratch_.U32(static_cast<uint32_t>(tokens.size()));
  scratch_.U32s(tokens);
  WriteExtras(extras, block_start, block_start + static_cast<uint32_t>(tokens.size()));
}

Hash128 BlockHasher::Block(const Hash128& parent, absl::Span<const uint32_t> tokens,
                           const ExtraKeys& extras, uint32_t block_start) {
  scratch_.Clear();
  scratch_.Raw(kBlockTag);
  WriteHash(parent, &scratch_);
  WriteBlock(tokens, extras, block_start);
  return Finish();
}

uint64_t BlockHasher::ExtrasDigest(const ExtraKeys& extras, uint32_t block_start,
                                   uint32_t block_end) {
  scratch_.Clear();
  WriteExtras(extras, block_start, block_end);
  return XXH3_64bits_withSeed(scratch_.data(), scratch_.size(), 0);
}

uint64_t BlockHasher::PrefixDigest(uint64_t parent_digest, absl::Span<const uint32_t> tokens,
                                   const ExtraKeys& extras, uint32_t block_start) {
  scratch_.Clear();
  scratch_.Raw(kBlockTag);
  scratch_.U64(parent_digest);
  scratch_.U64(0);
  WriteBlock(tokens, extras, block_start);
  return XXH3_64bits_withSeed(scratch_.data(), scratch_.size(), kPrefixDigestSeed);
}

Hash128 BlockHasher::Page(const Hash128& root, absl::string_view key) {
  scratch_.Clear();
  scratch_.Raw(kPageTag);
  WriteHash(root, &scratch_);
  scratch_.String(key);
  return Finish();
}

uint64_t BlockHasher::PageKeyDigest(uint64_t namespace_digest, absl::string_view key) {
  scratch_.Clear();
  scratch_.Raw(kPageTag);
  scratch_.U64(namespace_digest);
  scratch_.String(key);
  return XXH3_64bits_withSeed(scratch_.data(), scratch_.size(), kPrefixDigestSeed);
}

uint64_t BlockHasher::PrefixDigestOfEncodedBlock(uint64_t parent_digest) {
  scratch_.U64At(kParentOffset, parent_digest);
  scratch_.U64At(kParentOffset + 8, 0);
  return XXH3_64bits_withSeed(scratch_.data(), scratch_.size(), kPrefixDigestSeed);
}

void BlockHasher::ExtendChain(const Hash128& root, absl::Span<const uint32_t> tokens,
                              uint32_t block_size, const ExtraKeys& extras,
                              std::vector<Hash128>* chain) {
  ExtendChain(root, 0, tokens, block_size, extras, chain, nullptr);
}

void BlockHasher::ExtendChain(const Hash128& root, uint64_t root_digest,
                              absl::Span<const uint32_t> tokens, uint32_t block_size,
                              const ExtraKeys& extras, std::vector<Hash128>* chain,
                              std::vector<uint64_t>* prefix_digests) {
  const size_t full_blocks = tokens.size() / block_size;
  chain->reserve(full_blocks);
  if (prefix_digests != nullptr) prefix_digests->reserve(full_blocks);
  for (size_t i = chain->size(); i < full_blocks; ++i) {
    const Hash128& parent = i == 0 ? root : (*chain)[i - 1];
    const uint32_t start = static_cast<uint32_t>(i * block_size);
    chain->push_back(Block(parent, tokens.subspan(start, block_size), extras, start));
    if (prefix_digests != nullptr) {
      prefix_digests->push_back(
          PrefixDigestOfEncodedBlock(i == 0 ? root_digest : (*prefix_digests)[i - 1]));
    }
  }
}

}  // namespace kvcache
