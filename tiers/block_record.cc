#include "tiers/block_record.h"

#include "common/page_parts.h"

namespace kvcache {

absl::string_view RecordMismatch(const BlockRecordIdentity& found,
                                 const BlockRecordIdentity& expected) {
  if (found.hash != expected.hash) return "hash";
  if (found.parent_hash != expected.parent_hash) return "parent_hash";
  if (found.namespace_digest != expected.namespace_digest) return "namespace";
  if (found.extras_digest != expected.extras_digest && expected.extras_digest != kAnyPartMask) {
    return "extra_keys";
  }
  if (found.tokens != expected.tokens) return "tokens";
  // Last: with every field above equal, only another prefix than ours differs here.
  if (found.prefix_digest != expected.prefix_digest) return "prefix";
  return "";
}

bool HasMoreParts(uint64_t incoming_extras, uint64_t stored_extras) {
  const uint32_t incoming = PartMaskIn(incoming_extras);
  const uint32_t stored = PartMaskIn(stored_extras);
  return SameExtraKeys(incoming_extras, stored_extras) && incoming != stored &&
         (incoming & stored) == stored;
}

bool Supersedes(const BlockRecordIdentity& incoming, const BlockRecordIdentity& stored) {
  if (!HasMoreParts(incoming.extras_digest, stored.extras_digest)) return false;
  BlockRecordIdentity any_parts = incoming;
  any_parts.extras_digest = kAnyPartMask;
  return RecordMismatch(stored, any_parts).empty();
}

}  // namespace kvcache
