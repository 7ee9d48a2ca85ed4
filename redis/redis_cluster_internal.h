// What redis_cluster.cc (nodes, connections, the slot map) and redis_cluster_batches.cc
// (pipelined batches and the commands made of them) share; not for use outside redis/.
#ifndef KVCACHE_REDIS_REDIS_CLUSTER_INTERNAL_H_
#define KVCACHE_REDIS_REDIS_CLUSTER_INTERNAL_H_

#include <cstddef>

#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "redis/redis_cluster.h"

namespace kvcache {
namespace redis_internal {

// The class of a Redis error, its first word ("WRONGPASS", "NOAUTH", "ERR"): what a message may
// repeat of a reply to AUTH, whose text could hold more than the class.
absl::string_view ErrorClass(absl::string_view error);

// Whether a wait that got no reply rests the node: always when it timed out on the client's own
// io_timeout, or lost its connection; when the caller's deadline cut it, only if the node had
// sent nothing for at least kSilenceThatTrips (redis_cluster.cc).
bool NoReplyTrips(bool cut_by_deadline, bool answered, absl::Duration waited);

}  // namespace redis_internal

struct RedisCluster::StringSink {
  ValueVisitor* visitor;
  size_t index = 0;      // of the command whose reply is read
  bool visited = false;  // whether that reply was a string, given to the visitor
};

}  // namespace kvcache

#endif  // KVCACHE_REDIS_REDIS_CLUSTER_INTERNAL_H_
