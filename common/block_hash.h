// Block hash chains: h_i = H(h_{i-1}, tokens of full block i, extra keys of block i), with h_{-1}
// a root derived from the pool's namespace (model id, layout fingerprint, tenant, cache salt, and
// the session's compatibility manifest when it has one).
// The canonical byte encoding and test vectors are in docs/hash_spec.md; any client language must
// reproduce them. H is XXH3-128 with seed 0 by default or SHA-256 truncated to 128 bits; never a
// process-random seed, so hashes agree across processes and restarts.
//
// Thread safety: free functions are thread-safe; BlockHasher holds a scratch buffer and is
// thread-compatible (one per thread or per call).
#ifndef KVCACHE_COMMON_BLOCK_HASH_H_
#define KVCACHE_COMMON_BLOCK_HASH_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/byte_writer.h"

namespace kvcache {

// 128-bit hash; hi holds the first 8 canonical bytes (big-endian), lo the last 8.
struct Hash128 {
  uint64_t hi = 0;
  uint64_t lo = 0;

  friend bool operator==(const Hash128& a, const Hash128& b) {
    return a.hi == b.hi && a.lo == b.lo;
  }
  friend bool operator!=(const Hash128& a, const Hash128& b) { return !(a == b); }
  template <typename H>
  friend H AbslHashValue(H state, const Hash128& hash) {
    // Already uniformly distributed; one word is enough for a hash table.
    return H::combine(std::move(state), hash.lo);
  }
  std::string ToHex() const;  // 32 lowercase hex digits, canonical byte order
};

// Values match kvcache.v1.HashAlgorithm.
enum class HashAlgorithm : uint32_t { kXxh3_128 = 1, kSha256 = 2 };
absl::string_view HashAlgorithmName(HashAlgorithm algorithm);
// Accepts "xxh3" / "xxh3_128" and "sha256".
absl::StatusOr<HashAlgorithm> ParseHashAlgorithm(absl::string_view name);

// A multimodal input at prompt positions [offset, offset + length); every block overlapping that
// range carries `content_hash` in its extra keys.
struct MultimodalItem {
  std::string content_hash;
  uint32_t offset = 0;
  uint32_t length = 0;
};

// Request-level extra keys; a block's share of them is what ExtraKeysForBlock encodes.
struct ExtraKeys {
  std::string lora_id;
  std::vector<MultimodalItem> multimodal_items;
};

// H of `bytes` at full width (no testing_hash_bits), in canonical form.
Hash128 HashBytes(HashAlgorithm algorithm, absl::string_view bytes);

struct HashNamespace {
  absl::string_view model_id;
  uint64_t layout_fingerprint = 0;
  absl::string_view tenant;
  absl::string_view cache_salt;
  // The session's CompatibilityManifest::Digest under the pool's algorithm; absent for a session
  // opened without a manifest, whose roots are exactly what they were before manifests existed.
  std::optional<Hash128> manifest_digest;
};

class BlockHasher {
 public:
  explicit BlockHasher(HashAlgorithm algorithm) : algorithm_(algorithm) {}
  // Test only (PoolOptions::testing_hash_bits): every root and block hash keeps only its low
  // `keep_bits` bits (1 to 127; 0 keeps all 128), so chains collide often and tests can show
  // that verification turns each collision into a miss. A collision propagates down the chain as
  // with a real one, because each block hashes its parent's weakened hash.
  BlockHasher(HashAlgorithm algorithm, uint32_t keep_bits)
      : algorithm_(algorithm), keep_bits_(keep_bits) {}

  HashAlgorithm algorithm() const { return algorithm_; }

  Hash128 Root(const HashNamespace& ns);
  // XXH3-64 of the namespace's root encoding, at full width whatever keep_bits says. Cached blocks
  // keep it, so a hit on a root that collides with another namespace's (another tenant's or cache
  // salt's) is refused: the root hash alone does not tell namespaces apart.
  uint64_t NamespaceDigest(const HashNamespace& ns);

  // Hash of the block holding `tokens`, which start at prompt position `block_start`.
  Hash128 Block(const Hash128& parent, absl::Span<const uint32_t> tokens, const ExtraKeys& extras,
                uint32_t block_start);

  // XXH3-64 of the block's extra-key encoding; cached blocks keep it so a hit can be verified.
  uint64_t ExtrasDigest(const ExtraKeys& extras, uint32_t block_start, uint32_t block_end);

  // The block's full-prefix digest: XXH3-64 with its own seed over the parent's digest, the
  // block's tokens and its extra keys, the first block's parent being NamespaceDigest; so it
  // covers the namespace and every token and extra key up to the block's end. Full width
  // whatever keep_bits says, and independent of the chain hash. Records below tier 1 keep it: a
  // lower tier verifies a record alone, without tier 1's parent block links, so another prefix
  // whose chain hash one block up collides with ours would pass the chain-hash checks there.
  uint64_t PrefixDigest(uint64_t parent_digest, absl::Span<const uint32_t> tokens,
                        const ExtraKeys& extras, uint32_t block_start);

  // A page named by an engine's key (DESIGN §13): H over its own tag, the namespace's root and
  // the key. Pages are not chained: an engine key already names its prefix.
  Hash128 Page(const Hash128& root, absl::string_view key);
  // XXH3-64 with the prefix digest's seed over the namespace digest and the key: a page's
  // stand-in for PrefixDigest, independent of Page, so a record below tier 1 is checked by 192
  // bits of the whole key besides the key bytes its tokens hold.
  uint64_t PageKeyDigest(uint64_t namespace_digest, absl::string_view key);

  // Appends to `chain` the hashes of every full block of `tokens` not yet in it. `chain[i]` is the
  // hash of block i; the root is h_{-1}.
  void ExtendChain(const Hash128& root, absl::Span<const uint32_t> tokens, uint32_t block_size,
                   const ExtraKeys& extras, std::vector<Hash128>* chain);
  // The same, also appending each block's PrefixDigest to `prefix_digests` (parallel to `chain`;
  // `root_digest` is the namespace's). Each block is encoded once for both (the digest costs one
  // XXH3-64 over it).
  void ExtendChain(const Hash128& root, uint64_t root_digest, absl::Span<const uint32_t> tokens,
                   uint32_t block_size, const ExtraKeys& extras, std::vector<Hash128>* chain,
                   std::vector<uint64_t>* prefix_digests);

 private:
  void WriteExtras(const ExtraKeys& extras, uint32_t block_start, uint32_t block_end);
  // The token count, the tokens and the block's extra keys.
  void WriteBlock(absl::Span<const uint32_t> tokens, const ExtraKeys& extras, uint32_t block_start);
  // PrefixDigest of the block whose chain encoding (Block's) is in scratch_; rewrites its parent.
  uint64_t PrefixDigestOfEncodedBlock(uint64_t parent_digest);
  void WriteRoot(const HashNamespace& ns);
  Hash128 Finish() const;

  Hash128 Weaken(Hash128 hash) const;

  const HashAlgorithm algorithm_;
  const uint32_t keep_bits_ = 0;
  ByteWriter scratch_;
};

}  // namespace kvcache

#endif  // KVCACHE_COMMON_BLOCK_HASH_H_
