#include "cache/page_counters.h"

#include <array>

namespace kvcache {

absl::string_view PageOpName(PageOp op) {
  static constexpr std::array<absl::string_view, kNumPageOps> kNames = {"exists", "hit", "miss",
                                                                        "published", "duplicate"};
  return kNames[static_cast<size_t>(op)];
}

void PageCounters::Count(absl::string_view tenant, absl::string_view manifest_digest, PageOp op,
                         uint64_t pages) {
  const absl::string_view label = manifest_digest.substr(0, kManifestLabelDigits);
  absl::MutexLock lock(&mu_);
  auto tenant_it = by_tenant_.find(tenant);
  if (tenant_it == by_tenant_.end()) tenant_it = by_tenant_.try_emplace(std::string(tenant)).first;
  auto& manifests = tenant_it->second;
  auto it = manifests.find(label);
  if (it == manifests.end()) {
    // The other-manifests row does not count against the cap; every one before it does.
    const size_t named = manifests.size() - (manifests.contains(kOtherManifests) ? 1 : 0);
    const absl::string_view row = named < kMaxManifestsPerTenant ? label : kOtherManifests;
    it = manifests.try_emplace(std::string(row)).first;
  }
  it->second[static_cast<size_t>(op)] += pages;
}

std::vector<PageCounters::Row> PageCounters::Rows() const {
  std::vector<Row> rows;
  absl::MutexLock lock(&mu_);
  for (const auto& [tenant, manifests] : by_tenant_) {
    for (const auto& [manifest, counts] : manifests) {
      rows.push_back(Row{.tenant = tenant, .manifest = manifest, .pages = counts});
    }
  }
  return rows;
}

}  // namespace kvcache
