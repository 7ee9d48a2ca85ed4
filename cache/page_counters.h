// PageCounters: one pool's pages served per namespace, a tenant and a compatibility manifest
// (DESIGN §13), for kvcache_pages_total: the pages ExistsPages found, the pages AcquirePages and
// GetPages served or missed, the pages CommitPages and PutPages published or found present
// already. A manifest is named by the first kManifestLabelDigits hex digits of its digest (as
// DescribePool's ManifestInUse.digest begins).
//
// Label cardinality is bounded: a tenant's first kMaxManifestsPerTenant manifests in a pool are
// counted under their own label, any later one under kOtherManifests. An engine fleet runs a
// few manifests at once (a model, its tensor-parallel ranks, a rollout's next version); a
// tenant cycling through more would otherwise grow the exposition without end.
//
// Thread safety: thread-safe.
#ifndef KVCACHE_CACHE_PAGE_COUNTERS_H_
#define KVCACHE_CACHE_PAGE_COUNTERS_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kvcache {

enum class PageOp : uint8_t { kExists = 0, kHit, kMiss, kPublished, kDuplicate };
inline constexpr size_t kNumPageOps = 5;

// The op's label value: "exists", "hit", "miss", "published", "duplicate".
absl::string_view PageOpName(PageOp op);

class PageCounters {
 public:
  static constexpr size_t kMaxManifestsPerTenant = 8;
  static constexpr size_t kManifestLabelDigits = 16;
  static constexpr absl::string_view kOtherManifests = "other";

  // Adds `pages` to the tenant's count of `op` under the manifest whose digest is
  // `manifest_digest` (hex, as Hash128::ToHex writes it).
  void Count(absl::string_view tenant, absl::string_view manifest_digest, PageOp op,
             uint64_t pages);

  struct Row {
    std::string tenant;
    std::string manifest;  // the label: a digest's first digits, or kOtherManifests
    std::array<uint64_t, kNumPageOps> pages{};  // by PageOp
  };
  // Every namespace counted, by tenant then manifest label.
  std::vector<Row> Rows() const;

 private:
  using Counts = std::array<uint64_t, kNumPageOps>;
  mutable absl::Mutex mu_;
  std::map<std::string, std::map<std::string, Counts, std::less<>>, std::less<>> by_tenant_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_PAGE_COUNTERS_H_
