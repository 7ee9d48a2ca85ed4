// BlockRecord: what a block carries when it leaves tier 1 (the pool workers map) for a lower tier —
// host memory, local disk, a cluster store — so that it can be verified on its way back without
// anything tier 1 knew about it (DESIGN §10: loads are verified, then published).
//
// A record is its identity followed by the block's bytes. The identity names the pool the bytes
// are valid for (model, layout fingerprint — which covers dtype and block shape —, hash
// algorithm) and the block itself (chain hash, parent hash, namespace digest — tenant root with
// cache salt —, extra keys digest, tokens, full-prefix digest), plus the XXH3-64 checksum of the
// bytes (common/block_checksum.h). A load matches the identity against the request's own chain
// and the checksum against the bytes read; any difference is a miss, never wrong KV.
//
// Why the prefix digest: tier 1 verifies a hit through its parent block, whose own hit was
// verified the same way, so a whole prefix is checked by induction. A record has no parent block:
// its chain fields check one link (this block's tokens under the parent's chain hash). If another
// prompt's block i-1 collides with ours, its block i record — same tokens, parent hash our
// h_{i-1} — would pass them. The prefix digest (BlockHasher::PrefixDigest: every token and extra
// key from the namespace on, 64 bits, independent of the chain hash) must collide too.
//
// Lower tiers index records by `hash` only; two records under one hash (a collision) are told
// apart by the rest of the identity.
//
// Thread safety: value types.
#ifndef KVCACHE_TIERS_BLOCK_RECORD_H_
#define KVCACHE_TIERS_BLOCK_RECORD_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/block_hash.h"

namespace kvcache {

// The pool a record's bytes belong to. A record of another pool identity is foreign.
struct PoolIdentity {
  std::string model_id;
  uint64_t layout_fingerprint = 0;  // PoolLayout::Fingerprint(): shape, dtype, block size
  HashAlgorithm hash_algorithm = HashAlgorithm::kXxh3_128;
  uint64_t block_bytes = 0;

  bool operator==(const PoolIdentity&) const = default;
};

// An expected record's extras_digest that matches any: a page named by a key (DESIGN §13) keeps
// its part mask there, which a lookup learns from the record it finds. Token blocks' digests are
// XXH3-64 values; one equal to this would still be checked by the prefix digest, which covers
// the extra keys too.
inline constexpr uint64_t kAnyPartMask = ~uint64_t{0};

// One block's identity below tier 1: BlockIdentity's fields (cache/block_pool.h) without the
// tier-1 parent block id, plus the tokens and the checksum of the bytes.
struct BlockRecordIdentity {
  Hash128 hash;
  Hash128 parent_hash;  // the chain root for a sequence's first block
  uint64_t namespace_digest = 0;
  uint64_t extras_digest = 0;
  uint64_t prefix_digest = 0;    // BlockHasher::PrefixDigest through this block
  std::vector<uint32_t> tokens;  // the block's block_size tokens
  uint64_t checksum = 0;         // BlockChecksum of the block's bytes
  // The tenant whose block it is (empty where unknown: a record an unsealed disk tier found at a
  // restart). Sealed tiers (tiers/record_seal.h) seal the record with the tenant's key and open it
  // with the key of the tenant that asks; RecordMismatch leaves it to them (namespace_digest
  // already covers the tenant).
  std::string tenant;

  bool operator==(const BlockRecordIdentity&) const = default;
};

// The first field in which a record read from a lower tier differs from what the request expects
// there ("hash", "parent_hash", "namespace", "extra_keys", "tokens", "prefix"; the checksum is
// the bytes' and is checked against them, not here); empty when it matches. An expected
// extras_digest of kAnyPartMask matches any.
absl::string_view RecordMismatch(const BlockRecordIdentity& found,
                                 const BlockRecordIdentity& expected);

// Superseding (DESIGN §13): a block stored again with more parts replaces the copy a tier holds
// with fewer, in every tier, by one rule. HasMoreParts: whether a copy whose extras digest is
// `incoming` names the same extra keys as one whose digest is `stored` and strictly more parts
// (its part mask, common/page_parts.h, a strict superset); equal or incomparable masks are not
// more. A pool without declared parts never has two such digests for one block (its token
// blocks' digests are their extra keys' alone, its pages all hold the one part), so for it this
// is always false and a stored record always stays.
bool HasMoreParts(uint64_t incoming_extras, uint64_t stored_extras);
// Whether `incoming` supersedes `stored`, a record under the same hash: the same block
// (RecordMismatch, whatever parts either holds) with more parts (HasMoreParts).
bool Supersedes(const BlockRecordIdentity& incoming, const BlockRecordIdentity& stored);

}  // namespace kvcache

#endif  // KVCACHE_TIERS_BLOCK_RECORD_H_
