// The rule for a tenant's name, shared by the cache core (sessions), the daemon's requests and the
// identity file (auth/), so that a tenant named in one is accepted by all.
#ifndef KVCACHE_COMMON_TENANT_NAME_H_
#define KVCACHE_COMMON_TENANT_NAME_H_

#include <cstddef>

namespace kvcache {

// A tenant name's length, one rule wherever a request names a tenant (OpenSession, Lookup,
// GetStats, ListSessions, WatchEvents) and in the identity file.
inline constexpr size_t kMaxTenantBytes = 256;

}  // namespace kvcache

#endif  // KVCACHE_COMMON_TENANT_NAME_H_
