// RendezvousRegistry: small values peers exchange through the daemon before they can talk to
// each other (an NCCL unique id, say). Keys are scoped to a tenant; a value belongs to the session
// that published it and is dropped when that session ends. Waiters are callbacks, so nothing
// blocks a gRPC reactor: Await either answers at once or parks the callback until Publish.
//
// Thread safety: thread-safe. Callbacks run on the publishing thread, outside the lock.
#ifndef KVCACHE_CACHE_RENDEZVOUS_REGISTRY_H_
#define KVCACHE_CACHE_RENDEZVOUS_REGISTRY_H_

#include <cstdint>
#include <functional>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace kvcache {

inline constexpr size_t kMaxRendezvousKeyBytes = 256;
inline constexpr size_t kMaxRendezvousValueBytes = 4096;
inline constexpr size_t kMaxRendezvousEntries = 65536;

class RendezvousRegistry {
 public:
  using Callback = std::function<void(const std::string& value)>;

  // INVALID_ARGUMENT for an empty or oversize key or value; ALREADY_EXISTS when another session
  // holds the key; RESOURCE_EXHAUSTED past kMaxRendezvousEntries. Wakes every waiter.
  absl::Status Publish(const std::string& tenant, const std::string& key, std::string value,
                       uint64_t session_id);
  // Calls `on_value` with the key's value, now if it has one, else when it is published; returns
  // a ticket for Cancel (0 when it already answered). INVALID_ARGUMENT for a bad key.
  absl::StatusOr<uint64_t> Await(const std::string& tenant, const std::string& key,
                                 Callback on_value);
  // Forgets a parked waiter; true if it was still parked (its callback will never run).
  bool Cancel(uint64_t ticket);
  // Drops every value `session_id` published.
  void DropSession(uint64_t session_id);
  // Waiters parked until a publish, over all keys (tests wait for a wait to have parked).
  size_t parked_waiters() const;

 private:
  struct Entry {
    std::string value;
    uint64_t owner = 0;
    bool has_value = false;
    absl::flat_hash_map<uint64_t, Callback> waiters;  // by ticket
  };
  static std::string Scoped(const std::string& tenant, const std::string& key);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, std::string> ticket_keys_ ABSL_GUARDED_BY(mu_);
  uint64_t next_ticket_ ABSL_GUARDED_BY(mu_) = 1;
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_RENDEZVOUS_REGISTRY_H_
