// PoolOptions: how a pool is made — its layout and blocks (tier 1), and the lower tiers below it
// (LowerTiers, cache/lower_tiers.h). Kept apart from Pool so the tier stack reads them too.
#ifndef KVCACHE_CACHE_POOL_OPTIONS_H_
#define KVCACHE_CACHE_POOL_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/block_hash.h"
#include "common/page_parts.h"
#include "common/pool_layout.h"
#include "common/task_workers.h"
#include "redis/redis_cluster.h"
#include "tiers/disk_tier.h"
#include "tiers/tier_keyring.h"

namespace kvcache {

// A pool's name goes into its shared-memory object's name, metric labels and event topics: 1 to
// kMaxPoolNameBytes of [A-Za-z0-9._-]. INVALID_ARGUMENT naming the pool otherwise.
inline constexpr size_t kMaxPoolNameBytes = 64;
absl::Status ValidatePoolName(absl::string_view name);

// Which tier-2 records the mover passes down to the disk tier.
enum class DiskAdmission : uint8_t {
  kAll,     // every record near tier 2's eviction end
  kReused,  // only records of blocks hit at least once (in tier 1, or loaded from below)
};

struct PoolOptions {
  std::string name;
  std::string model_id;
  PoolLayout layout;
  uint32_t num_blocks = 0;
  HashAlgorithm hash_algorithm = HashAlgorithm::kXxh3_128;
  // The named parts of every page (DESIGN §13), in page order, summing to the block's bytes;
  // empty: not declared, one part "kv" of the whole block (Pool::parts()).
  std::vector<PagePartLayout> parts;
  // TEST ONLY: keep only this many low bits of every chain hash (BlockHasher's keep_bits), so
  // collisions are common. No flag, pool spec or config sets it: production always runs with 0
  // (all 128 bits), and a pool with it set hashes differently from every client.
  uint32_t testing_hash_bits = 0;
  // Tier 2: bytes of host memory for blocks evicted from this pool (0: none). At least one block.
  uint64_t host_tier_bytes = 0;
  // Tier 2's offload window in blocks (LowerTiers::offload_window); 0: the default share of the
  // pool.
  uint32_t offload_window = 0;
  // Tier 3: a file on local disk below tier 2 (which it needs), `disk_tier_bytes` large; kept
  // across restarts. Empty path: none.
  std::string disk_tier_path;
  uint64_t disk_tier_bytes = 0;
  DiskAdmission disk_admission = DiskAdmission::kAll;
  // TEST ONLY: the disk tier's options as the pool builds them, adjusted before it opens.
  std::function<void(DiskTierOptions*)> testing_disk_tier_options;
  // TEST ONLY: no mover thread; tests and the simulation move blocks with OffloadForTesting().
  bool testing_manual_offload = false;
  // The cluster tier (tiers/cluster_tier.h): a Redis Cluster shared by every node's daemon. The
  // mover also writes there what it offloads; an open continues its verified prefix there after
  // the tiers of the node.
  std::optional<RedisClusterOptions> cluster_tier;
  // Set (--tier_key_file): the disk tier's records and the cluster tier's values are sealed with
  // AES-256-GCM under keys of each block's tenant (tiers/record_seal.h); null: plaintext. Tiers 1
  // and 2 stay in memory and are never sealed. One keyring may serve every pool.
  std::shared_ptr<const TierKeyring> tier_keyring;
  // Threads that work beside a request's thread or the tiers' own (common/task_workers.h; null:
  // those threads do it all): they seal and open the sealed tiers' records (with a keyring), and
  // copy a host pool's large batches, a slice each beside the request: a tier-2 load or a
  // PutPages of kSlicedCopyMinBytes or more. One set of them may serve every pool.
  std::shared_ptr<TaskWorkers> workers;
};

}  // namespace kvcache

#endif  // KVCACHE_CACHE_POOL_OPTIONS_H_
