// A tenant's name rule and limits, shared by the cache core (sessions, quotas), the daemon's
// requests and the identity file (auth/), so that a tenant named in one is accepted by all and the
// limits the file sets are the ones the core enforces.
#ifndef KVCACHE_COMMON_TENANT_H_
#define KVCACHE_COMMON_TENANT_H_

#include <cstddef>
#include <cstdint>
#include <limits>

namespace kvcache {

// A tenant name's length, one rule wherever a request names a tenant (OpenSession, Lookup,
// GetStats, ListSessions, WatchEvents) and in the identity file.
inline constexpr size_t kMaxTenantBytes = 256;

inline constexpr uint64_t kUnlimited = std::numeric_limits<uint64_t>::max();

// What a tenant may hold (TenantQuotas enforces them; the identity file sets them).
struct TenantLimits {
  uint64_t max_referenced_blocks = kUnlimited;  // per pool
  uint64_t max_sessions = kUnlimited;
  uint64_t max_open_sequences = kUnlimited;  // across pools
  uint64_t max_put_bytes_in_flight = kUnlimited;

  bool operator==(const TenantLimits&) const = default;
};

}  // namespace kvcache

#endif  // KVCACHE_COMMON_TENANT_H_
