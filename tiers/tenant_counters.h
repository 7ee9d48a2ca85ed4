// TenantCounters: one running count per tenant — a sealed tier's records that did not open, by
// the tenant whose key was asked (tiers/record_seal.h) — for GetStats' and /metrics' per-tenant
// figures. Tenants come from the identity file (or are "default"), so the map stays small. Added
// to only when a record fails to open, never on a hit.
//
// Thread safety: thread-safe.
#ifndef KVCACHE_TIERS_TENANT_COUNTERS_H_
#define KVCACHE_TIERS_TENANT_COUNTERS_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kvcache {

class TenantCounters {
 public:
  void Add(absl::string_view tenant, uint64_t count = 1) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = counts_.find(tenant);
    if (it == counts_.end()) it = counts_.emplace(std::string(tenant), 0).first;
    it->second += count;
    total_ += count;
  }
  // The tenant's count; 0 for one never counted.
  uint64_t Of(absl::string_view tenant) const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    auto it = counts_.find(tenant);
    return it == counts_.end() ? 0 : it->second;
  }
  uint64_t Total() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return total_;
  }
  // Every tenant counted, by name.
  std::vector<std::pair<std::string, uint64_t>> Snapshot() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return {counts_.begin(), counts_.end()};
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, uint64_t, std::less<>> counts_ ABSL_GUARDED_BY(mu_);
  uint64_t total_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_TIERS_TENANT_COUNTERS_H_
