// SessionRegistry: the live client sessions (leases) and their deadlines.
//
// Session ids are unguessable and never reused within an epoch: the n-th session's id is n run
// through a keyed 64-bit permutation (a Feistel network over SHA-256, keyed from the OS's random
// source at construction). Knowing one's own ids tells nothing of another's, yet every id maps
// back to its n, so an id whose n was issued but is no longer registered is known to have ended:
// its late requests are fenced off with ABORTED; any other id is NOT_FOUND.
//
// Each session counts against its tenant's max_sessions quota (TenantQuotas) until it ends.
//
// Thread safety: thread-safe.
#ifndef KVCACHE_CACHE_SESSION_REGISTRY_H_
#define KVCACHE_CACHE_SESSION_REGISTRY_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cache/session.h"
#include "cache/tenant_quotas.h"
#include "common/clock.h"

namespace kvcache {

struct SessionLimits {
  absl::Duration default_ttl = absl::Seconds(10);
  absl::Duration min_ttl = absl::Milliseconds(100);
  absl::Duration max_ttl = absl::Minutes(10);
  size_t max_sessions = 65536;
};

// How many sessions a tenant has opened, closed and lost to lease expiry, for the metrics.
struct SessionCounters {
  uint64_t opened = 0;
  uint64_t closed = 0;
  uint64_t expired = 0;
  uint64_t open = 0;  // now
};

class SessionRegistry {
 public:
  // `quotas` must outlive the registry.
  SessionRegistry(const SessionLimits& limits, const Clock* clock, TenantQuotas* quotas);

  // A session of `tenant` owned by `principal`. `ttl` of zero means the default; others are
  // clamped to [min_ttl, max_ttl]; `manifest` (validated by its Create; null: none) binds the
  // session's roots. INVALID_ARGUMENT for an empty or oversize tenant or an oversize client name;
  // RESOURCE_EXHAUSTED past max_sessions or the tenant's quota; UNAVAILABLE once the daemon
  // drains (StopOpening).
  absl::StatusOr<std::shared_ptr<Session>> Open(
      std::string principal, std::string tenant, std::string client_name, absl::Duration ttl,
      std::shared_ptr<const CompatibilityManifest> manifest = nullptr);
  // NOT_FOUND for an id never issued; ABORTED for one that has ended.
  absl::StatusOr<std::shared_ptr<Session>> Get(uint64_t session_id) const;
  // Pushes the deadline to now + ttl. Errors as Get.
  absl::Status KeepAlive(uint64_t session_id);
  // When the lease ends unless kept alive (tests watch a client's keep-alives land). Errors as Get.
  absl::StatusOr<absl::Time> Deadline(uint64_t session_id) const;
  // Marks the session closed and unregisters it; the caller releases its sequences.
  absl::StatusOr<std::shared_ptr<Session>> Close(uint64_t session_id);
  // Closes and returns every session whose deadline has passed, in the order they were opened.
  // O(sessions); not on a request path.
  std::vector<std::shared_ptr<Session>> TakeExpired();

  // The daemon is draining: new sessions are refused (UNAVAILABLE, so a client tries another
  // daemon); the open ones go on until they end. Irreversible.
  void StopOpening() { stopped_opening_.store(true, std::memory_order_release); }

  size_t size() const;
  const SessionLimits& limits() const { return limits_; }

  struct Listed {
    std::shared_ptr<Session> session;
    absl::Time deadline;
  };
  // The open sessions of `tenant` (empty: every tenant). O(sessions).
  std::vector<Listed> List(absl::string_view tenant) const;
  // Per tenant, every tenant that ever opened one.
  absl::flat_hash_map<std::string, SessionCounters> Counters() const;

 private:
  struct Entry {
    std::shared_ptr<Session> session;
    absl::Time deadline;
    uint64_t opened = 0;  // opening order (ids are random)
  };
  std::atomic<bool> stopped_opening_{false};
  absl::Status UnknownLocked(uint64_t session_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // ABORTED for a session whose deadline has passed before the sweep took it.
  absl::Status ExpiredLocked(uint64_t session_id) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The keyed permutation of the session counter, and its inverse.
  uint64_t IdOf(uint64_t counter) const;
  uint64_t CounterOf(uint64_t session_id) const;
  void EndLocked(Session& session) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const SessionLimits limits_;
  const Clock* const clock_;
  std::array<uint8_t, 32> id_key_;
  TenantQuotas* const quotas_;  // own synchronization

  mutable absl::Mutex mu_;
  uint64_t next_counter_ ABSL_GUARDED_BY(mu_) = 1;
  uint64_t next_opened_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<uint64_t, Entry> sessions_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<std::string, SessionCounters> counters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_SESSION_REGISTRY_H_
