#include "tiers/block_record.h"

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

}  // namespace kvcache
