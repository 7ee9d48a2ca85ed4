// Parses a pool as given on the daemon's command line:
//   NAME[:model=ID][:layers=N][:kv_heads=N][:head_dim=N][:block_size=N][:dtype=fp16]
//       [:blocks=N | :bytes=SIZE][:hash=xxh3_128|sha256][:host_tier=SIZE[:disk_tier=PATH:SIZE]]
// SIZE takes a K/M/G/T (or KiB/MiB/GiB/TiB) suffix. host_tier: tier 2 in host memory (host pools),
// at least one block. disk_tier: tier 3, a file at the absolute PATH (no ':' in it) on local disk,
// below tier 2 and kept across restarts. disk_admission=all|reused: which tier-2 records go on
// to disk (reused: only blocks hit at least once). parts=NAME/SIZE[/trailingN]+...: the named
// parts of every page (common/page_parts.h), summing to the block's bytes; a trailing part is
// needed only on the last N pages of a hit (absent: all pages). Unset fields take the demo
// defaults below.
#ifndef KVCACHE_CACHE_POOL_SPEC_H_
#define KVCACHE_CACHE_POOL_SPEC_H_

#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cache/pool.h"

namespace kvcache {

// The embedded default: a small host pool for a demo model.
PoolOptions DefaultPoolOptions();

// INVALID_ARGUMENT naming the offending field.
absl::StatusOr<PoolOptions> ParsePoolSpec(absl::string_view spec);

// The same pools as JSON, for a file a ConfigMap can hold (--pools_file): {"pools": [POOL, ...]}
// where a POOL is an object of the fields above, "name" among them, each a string or an
// integer ("blocks": 1024, "host_tier": "16GiB"), "disk_tier" either "PATH:SIZE" or
// {"path": PATH, "size": SIZE}. Each pool is checked as ParsePoolSpec checks it, and an error
// names the pool by its place and name: INVALID_ARGUMENT for JSON that does not parse, a pool
// that is not an object, a field of another type, a value holding ':' (the spec's separator).
absl::StatusOr<std::vector<PoolOptions>> ParsePoolsJson(absl::string_view json);

// Every name valid and no two alike: what a daemon checks before it creates any pool's memory.
absl::Status ValidatePoolNames(absl::Span<const PoolOptions> pools);

}  // namespace kvcache

#endif  // KVCACHE_CACHE_POOL_SPEC_H_
