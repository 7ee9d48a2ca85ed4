// TenantQuotas: what each tenant may hold at once (DESIGN §6: per-tenant quotas bound what one
// client can hold), and what it holds now of the daemon-wide resources — sessions, open
// sequences, put bytes in flight. Referenced blocks are counted per pool by the Pool itself (it
// knows which block belongs to which tenant) against the limit read here.
//
// Limits come from the identity file and change on reload; usage is never reset by a reload, so a
// tenant whose limit drops below its use keeps what it holds and gets nothing more.
//
// Error codes: TryAcquire answers RESOURCE_EXHAUSTED naming the limit, the tenant's use and what
// was asked; nothing changes then.
//
// Thread safety: thread-safe. Callers may hold a pool's lock while calling in (the lock order is
// pool, then this), never the other way round.
#ifndef KVCACHE_CACHE_TENANT_QUOTAS_H_
#define KVCACHE_CACHE_TENANT_QUOTAS_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/tenant.h"

namespace kvcache {

// The resources TenantQuotas counts itself.
enum class QuotaResource { kSessions, kOpenSequences, kPutBytesInFlight };

class TenantQuotas {
 public:
  // Replaces every tenant's limits; tenants not named have none.
  void SetLimits(absl::flat_hash_map<std::string, TenantLimits> limits);
  TenantLimits LimitsOf(absl::string_view tenant) const;

  // Adds `amount` to the tenant's use of `resource` if that stays within its limit.
  absl::Status TryAcquire(absl::string_view tenant, QuotaResource resource, uint64_t amount);
  // REQUIRES: `amount` was acquired for this tenant and resource and not released yet.
  void Release(absl::string_view tenant, QuotaResource resource, uint64_t amount);
  uint64_t InUse(absl::string_view tenant, QuotaResource resource) const;

  // RESOURCE_EXHAUSTED in the shape every quota error takes, for the limits counted elsewhere.
  static absl::Status Exceeded(absl::string_view tenant, absl::string_view limit_name,
                               uint64_t limit, uint64_t in_use, uint64_t asked);

 private:
  struct Usage {
    uint64_t sessions = 0;
    uint64_t open_sequences = 0;
    uint64_t put_bytes_in_flight = 0;
    uint64_t& of(QuotaResource resource);
  };
  void ReleaseLocked(absl::string_view tenant, QuotaResource resource, uint64_t amount)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, TenantLimits> limits_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, Usage> usage_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_TENANT_QUOTAS_H_
