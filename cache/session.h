// Session: a client's lease. Sequences belong to a session and are released when it ends.
// A session belongs to the identity that opened it and acts within that identity's tenant.
// `closed` is set once, before the session's sequences are released, so a pool that sees it
// false under its own mutex knows the release sweep has not passed it yet.
#ifndef KVCACHE_CACHE_SESSION_H_
#define KVCACHE_CACHE_SESSION_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/compatibility_manifest.h"

namespace kvcache {

struct Session {
  Session(uint64_t id, std::string principal, std::string tenant, std::string client_name,
          absl::Duration ttl, std::shared_ptr<const CompatibilityManifest> manifest = nullptr)
      : id(id),
        principal(std::move(principal)),
        tenant(std::move(tenant)),
        client_name(std::move(client_name)),
        ttl(ttl),
        manifest(std::move(manifest)) {}

  const uint64_t id;
  // The identity that opened the session ("uid:1000", "token:router", ...): the only one that
  // may use it.
  const std::string principal;
  const std::string tenant;
  const std::string client_name;
  const absl::Duration ttl;
  // The engine's manifest the session is bound to (its digest joins every root the session
  // hashes); null: none, the roots as before manifests existed.
  const std::shared_ptr<const CompatibilityManifest> manifest;
  std::atomic<bool> closed{false};
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_SESSION_H_
