// CallLimits: the daemon's bounds on long calls and on put bytes, per connection and in total
// (DESIGN §6: overload is refused at once, never queued). A long call is one that may stay open
// for as long as its client likes: the block streams (PutBlocks, GetBlocks), WatchEvents and a
// parked AwaitRendezvous. Each holds a ticket from AdmitStream for its whole life; a put also
// holds the bytes it will write from AdmitPutBytes (besides its tenant's max_put_bytes_in_flight,
// cache/tenant_quotas.h).
//
// Beyond a connection's bound the call gets RESOURCE_EXHAUSTED: that client asked for too much
// over one connection, and others are unaffected. Beyond the daemon's bound it gets UNAVAILABLE:
// the daemon is busy, and a retry later (or on another replica) may succeed. Either way at once,
// and nothing changes.
//
// A connection is what gRPC names it (ServerContext::peer(): "fd:N" for a Unix-socket connection,
// "ipv4:ADDR:PORT" for TCP). A name's entry lives while it holds a ticket, so a reused
// descriptor starts from zero: gRPC closes a connection only after its last call is done.
//
// Thread safety: thread-safe. Tickets may be released on any thread.
#ifndef KVCACHE_SERVER_CALL_LIMITS_H_
#define KVCACHE_SERVER_CALL_LIMITS_H_

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

namespace kvcache {

struct CallLimitOptions {
  uint32_t max_streams_per_connection = 64;
  uint32_t max_streams = 1024;
  uint64_t max_put_bytes_per_connection = uint64_t{4} << 30;
  uint64_t max_put_bytes = uint64_t{16} << 30;
};

// What is held now, and how many calls were refused since the start.
struct CallLimitUsage {
  uint32_t streams = 0;
  uint64_t put_bytes = 0;
  uint64_t refused_streams = 0;
  uint64_t refused_puts = 0;
};

class CallLimits {
 public:
  enum class Resource { kStreams, kPutBytes };

  // Gives back what it holds when destroyed. Move-only.
  class Ticket {
   public:
    Ticket() = default;
    Ticket(Ticket&& other) noexcept { *this = std::move(other); }
    Ticket& operator=(Ticket&& other) noexcept;
    ~Ticket() { Release(); }
    void Release();

   private:
    friend class CallLimits;
    Ticket(CallLimits* limits, std::string connection, Resource resource, uint64_t amount)
        : limits_(limits),
          connection_(std::move(connection)),
          resource_(resource),
          amount_(amount) {}

    CallLimits* limits_ = nullptr;
    std::string connection_;
    Resource resource_ = Resource::kStreams;
    uint64_t amount_ = 0;
  };

  explicit CallLimits(const CallLimitOptions& options) : options_(options) {}

  const CallLimitOptions& options() const { return options_; }
  // One long call on `connection`; `method` names it in the error.
  absl::StatusOr<Ticket> AdmitStream(absl::string_view connection, absl::string_view method);
  // `bytes` of a put on `connection`. A put larger than either bound alone is RESOURCE_EXHAUSTED.
  absl::StatusOr<Ticket> AdmitPutBytes(absl::string_view connection, uint64_t bytes);

  CallLimitUsage Usage() const;
  // What `connection` holds now (tests).
  uint64_t HeldBy(absl::string_view connection, Resource resource) const;

 private:
  struct Held {
    uint64_t streams = 0;
    uint64_t put_bytes = 0;
    uint64_t& of(Resource resource) { return resource == Resource::kStreams ? streams : put_bytes; }
  };

  absl::StatusOr<Ticket> Admit(absl::string_view connection, Resource resource, uint64_t amount,
                               absl::string_view what);
  void Release(const std::string& connection, Resource resource, uint64_t amount);

  const CallLimitOptions options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Held> by_connection_ ABSL_GUARDED_BY(mu_);
  Held total_ ABSL_GUARDED_BY(mu_);
  uint64_t refused_streams_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t refused_puts_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_CALL_LIMITS_H_
