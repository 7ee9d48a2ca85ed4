#include "cache/tenant_quotas.h"

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

const char* LimitName(QuotaResource resource) {
  switch (resource) {
    case QuotaResource::kSessions:
      return "max_sessions";
    case QuotaResource::kOpenSequences:
      return "max_open_sequences";
    case QuotaResource::kPutBytesInFlight:
      return "max_put_bytes_in_flight";
  }
  return "?";
}

uint64_t LimitOf(const TenantLimits& limits, QuotaResource resource) {
  switch (resource) {
    case QuotaResource::kSessions:
      return limits.max_sessions;
    case QuotaResource::kOpenSequences:
      return limits.max_open_sequences;
    case QuotaResource::kPutBytesInFlight:
      return limits.max_put_bytes_in_flight;
  }
  return 0;
}

}  // namespace

uint64_t& TenantQuotas::Usage::of(QuotaResource resource) {
  switch (resource) {
    case QuotaResource::kSessions:
      return sessions;
    case QuotaResource::kOpenSequences:
      return open_sequences;
    case QuotaResource::kPutBytesInFlight:
      break;
  }
  return put_bytes_in_flight;
}

void TenantQuotas::SetLimits(absl::flat_hash_map<std::string, TenantLimits> limits) {
  absl::MutexLock lock(&mu_);
  limits_ = std::move(limits);
}

TenantLimits TenantQuotas::LimitsOf(absl::string_view tenant) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = limits_.find(tenant);
  return it == limits_.end() ? TenantLimits{} : it->second;
}

absl::Status TenantQuotas::Exceeded(absl::string_view tenant, absl::string_view limit_name,
                                    uint64_t limit, uint64_t in_use, uint64_t asked) {
  return absl::ResourceExhaustedError(absl::StrCat("tenant '", tenant, "' quota ", limit_name, "=",
                                                   limit, ": ", in_use, " in use, ", asked,
                                                   " more asked for"));
}

absl::Status TenantQuotas::TryAcquire(absl::string_view tenant, QuotaResource resource,
                                      uint64_t amount) {
  absl::MutexLock lock(&mu_);
  auto limits_it = limits_.find(tenant);
  const TenantLimits limits = limits_it == limits_.end() ? TenantLimits{} : limits_it->second;
  uint64_t& in_use = usage_[tenant].of(resource);
  const uint64_t limit = LimitOf(limits, resource);
  if (amount > limit || in_use > limit - amount) {
    // Leaves no empty entry behind for a tenant that was refused its first acquisition.
    const uint64_t held = in_use;
    if (held == 0) ReleaseLocked(tenant, resource, 0);
    return Exceeded(tenant, LimitName(resource), limit, held, amount);
  }
  in_use += amount;
  return absl::OkStatus();
}
void TenantQuotas::Release(absl::string_view tenant, QuotaResource resource, uint64_t amount) {
  absl::MutexLock lock(&mu_);
  ReleaseLocked(tenant, resource, amount);
}

void TenantQuotas::ReleaseLocked(absl::string_view tenant, QuotaResource resource,
                                 uint64_t amount) {
  auto it = usage_.find(tenant);
  if (it == usage_.end()) return;
  Usage& usage = it->second;
  uint64_t& in_use = usage.of(resource);
  in_use -= std::min(in_use, amount);
  if (usage.sessions == 0 && usage.open_sequences == 0 && usage.put_bytes_in_flight == 0) {
    usage_.erase(it);
  }
}

uint64_t TenantQuotas::InUse(absl::string_view tenant, QuotaResource resource) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = usage_.find(tenant);
  return it == usage_.end() ? 0 : Usage(it->second).of(resource);
}

}  // namespace kvcache
