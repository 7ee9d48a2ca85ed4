// One seed's run of the page simulation: pages named by an engine's keys (issue 31, DESIGN
// §13), on a pool with three parts: "kv" on every page, "swa" (a sliding window) on the last two
// pages of a hit, "state" (a recurrent state) on its last page. Seeded random operations: puts of
// random keys with random part masks (reserve and write, commit later or never, release), exists
// and acquire with random wanted parts, acquired pages held and released, pins and touches with
// TTLs on the FakeClock, sessions opened (bound to one of two manifests, or none), closed, kept
// alive and expired, some of them in the middle of a put, and offloads to tier 2 (and a disk tier
// below it in the disk run).
//
// PageModel is the reference: its own statement of the hit rule over the parts table below
// (never RestorablePages), and what every (tenant, manifest) namespace has been given.
//  - Every page the pool reports present must hold a part mask some put of that key in that
//    namespace committed, and its bytes (read back from every acquire) must be that put's.
//  - Exists of a key list must equal the model's hit rule applied to what each key alone
//    reports (present, tier, part mask); acquire must give that many pages with those masks
//    (fewer only when the pool had no room to load them), and pin the leading present ones.
//  - Until the pool's first eviction nothing can be lost, so the model knows exactly which
//    pages tier 1 holds with which parts: every reservation's duplicates, every commit's
//    published count, every per-key answer and every exists are predicted from it alone.
//  - Pages held (an acquire not yet released, a pin before its TTL, by a live session) stay in
//    tier 1 with their parts; with no pin alive, the referenced blocks are exactly the held ones.
//  - A session ending mid-put publishes nothing: its commit fails and its pages stay absent.
// After every operation: Pool::CheckInvariants and free + evictable + referenced = size; at the
// end, once every session has ended, nothing is referenced.
#ifndef KVCACHE_TESTS_CACHE_PAGE_SIMULATION_H_
#define KVCACHE_TESTS_CACHE_PAGE_SIMULATION_H_

#include "tests/cache/sim_common.h"

namespace kvcache {
namespace simulation {

struct PagePartSpec {
  const char* name;
  uint64_t bytes;
  uint32_t trailing_pages;  // 0: needed on every page up to the endpoint
};
inline constexpr PagePartSpec kSimPageParts[] = {{"kv", 64, 0}, {"swa", 32, 2}, {"state", 32, 1}};
inline constexpr absl::string_view kSimPageSpec = "kv/64+swa/32/trailing2+state/32/trailing1";
inline constexpr uint32_t kSimAllParts = 0b111;
inline constexpr uint32_t kSimPageTokens = 4;
inline constexpr uint64_t kSimPageBytes = 128;

// The hit rule as the issue states it, by brute force: the greatest e such that every wanted
// part is on every page [0, e) (an all-pages part) or on each of the last `trailing_pages` pages
// before e. `leading_masks`: the part masks of the leading present pages.
size_t ModelHitRule(const std::vector<uint32_t>& leading_masks, uint32_t wanted);

// What one key alone reports.
struct PageProbe {
  bool present = false;
  bool in_tier1 = false;
  uint32_t mask = 0;
  friend bool operator==(const PageProbe&, const PageProbe&) = default;
};

// Keys as a trace shows them: the long ones (16 bytes of 'p', then their own) by their end.
std::string DescribeKeys(absl::Span<const std::string> keys);

std::string DescribeProbe(const PageProbe& probe);

std::string DescribeProbes(const std::vector<PageProbe>& probes);

class PageSimulation {
 public:
  PageSimulation(uint64_t seed, bool disk, int num_ops)
      : rng_(seed), disk_(disk), num_ops_(num_ops) {}

  absl::Status Run(SimTotals* totals);

  const std::vector<std::string>& trace() const { return trace_; }

 private:
  struct SessionInfo {
    std::shared_ptr<Session> session;
    std::string tenant;
    int manifest = -1;  // index into manifests_; -1: none
    absl::Time deadline;
    bool ended = false;
  };
  struct Put {
    uint64_t session_id = 0;
    std::vector<std::string> keys;
    std::vector<uint32_t> masks;
    std::vector<BlockId> blocks;  // kNoBlock: a duplicate
  };
  struct Held {
    uint64_t session_id = 0;
    std::vector<std::string> keys;
    std::vector<uint32_t> masks;
    std::vector<BlockId> blocks;
  };
  struct Pin {
    uint64_t session_id = 0;
    absl::Time until;
    std::vector<std::string> keys;
    std::vector<uint32_t> masks;
  };

  std::string NamespaceOf(const SessionInfo& info) const {
    return absl::StrCat(info.tenant, "/cfg-", info.manifest + 1);
  }
  std::string NamespaceOf(uint64_t session_id) const {
    return NamespaceOf(sessions_.at(session_id));
  }

  // A page's bytes: a function of its namespace, key and parts, so that a page served under
  // another namespace, key or mask is caught.
  static std::string PageBytes(const std::string& ns, const std::string& key, uint32_t mask);

  absl::Status CheckPoolParts();

  uint32_t Uniform(uint32_t lo, uint32_t hi) {
    return std::uniform_int_distribution<uint32_t>(lo, hi)(rng_);
  }
  bool Chance(int percent) { return Uniform(0, 99) < static_cast<uint32_t>(percent); }

  // Exact while nothing has been evicted: what tier 1 holds is then all that was published.
  bool Exact() const { return pool_->Stats().pool.evictions == 0; }

  // A live session, or 0 if none.
  uint64_t PickSession();

  std::vector<std::string> PickKeys();
  uint32_t PickMask();
  uint32_t PickWanted() { return Chance(10) ? 0 : Uniform(1, kSimAllParts); }

  absl::Status Step();

  size_t live_sessions() const;

  absl::Status OpenSession();

  // A session without a manifest has no page namespace: every page call is refused.
  absl::Status ExpectNoManifestRefused(const SessionInfo& info,
                                       const std::vector<std::string>& keys);

  // What `key` alone reports in `session_id`'s namespace: present or not, in tier 1 or below,
  // and (one exists per part) which parts it holds. Holds nothing, changes nothing.
  absl::StatusOr<PageProbe> ProbeKey(uint64_t session_id, const std::string& key);

  // The hit the pool should answer for `keys`, from each key's own answer: the leading present
  // keys (tier 1's run, then the pages below continuing it), under the model's hit rule.
  absl::StatusOr<std::vector<PageProbe>> ProbeKeys(uint64_t session_id,
                                                   const std::vector<std::string>& keys);
  // What a walk over `keys` answers, from each key's own answer: the leading keys present, each
  // looked up in tier 1 first and below it after (pages are independent, so tier 1 may hold a
  // page after one that went below), under the model's hit rule.
  // With a disk tier the walk is exact up to its first page below tier 1 only: the disk
  // tier's writes land in the background, so a record below may turn into another copy of its
  // key (another put's parts) between the keys' answers and the call.
  struct Expected {
    size_t hit = 0;           // the model's hit rule over the exact leading keys
    size_t present = 0;       // the leading keys present anywhere
    size_t ambiguous_at = 0;  // the first key whose answer may change; `present` when none
    bool exact() const { return ambiguous_at == present; }
  };
  Expected Expect(const std::vector<PageProbe>& probes, uint32_t wanted);
  // How many of the first `pages` keys tier 1 holds.
  static size_t InTier1(const std::vector<PageProbe>& probes, size_t pages);
  // An answer of `got` pages fits: exactly the hit where the walk is unambiguous, else at
  // least that (the rule never shrinks as pages are added) and at most the present keys.
  static bool Fits(const Expected& expected, size_t got) {
    if (expected.exact()) return got == expected.hit;
    return got >= expected.hit && got <= expected.present;
  }
  static std::string DescribeExpected(const Expected& expected) {
    if (expected.exact()) return absl::StrCat(expected.hit);
    return absl::StrCat(expected.hit, " to ", expected.present);
  }

  absl::Status Reserve();

  absl::Status CommitPending();
  absl::Status ReleasePending();

  absl::Status Commit(uint64_t sequence_id);

  absl::Status Release(uint64_t sequence_id);

  // A read of pages (Exists, Acquire): the session, keys and wanted parts it sends, and what the
  // model expects of them from each key probed alone first.
  struct PageRead {
    uint64_t session_id = 0;
    const SessionInfo* info = nullptr;
    std::vector<std::string> keys;
    uint32_t wanted = 0;
    std::vector<PageProbe> probes;
    Expected expected;
  };
  // The next read to make; nullopt when there is none (no session to act in) or the operation
  // is over (a session bound to no manifest, whose refusal this checked).
  absl::StatusOr<std::optional<PageRead>> StartRead();

  absl::Status Exists();

  absl::Status Acquire();

  // The pages an acquire got: as many as the model's hit rule gives unless the pool lacked room
  // to load them (then fewer), a hit under the rule by their own parts, each with the parts and
  // the bytes some put of its key committed (the key's own answer's, where unambiguous).
  absl::Status CheckAcquired(uint64_t session_id, const std::vector<std::string>& keys,
                             uint32_t wanted, const std::vector<PageProbe>& probes,
                             const Expected& expected, const PoolStatsSnapshot& before,
                             const AcquiredPages& acquired);

  absl::Status ReleaseHeld();

  absl::Status PinPages();

  // Whether an acquire held or a pin not swept yet holds tier 1's copy of `page` (namespace,
  // key).
  bool HeldInTier1(const std::pair<std::string, std::string>& page) const;

  // A pin whose TTL has passed but that no reserve or acquire has swept yet: still held.
  bool UnsweptExpiredPins() const;
  bool LivePins() const;

  // Forgets what a session held once it ended.
  void Ended(uint64_t session_id);

  absl::Status CloseSession();

  absl::Status AdvanceAndExpire();

  absl::Status ExpireSessions();

  absl::Status KeepAlive();

  absl::Status Offload();

  absl::Status CheckAfterStep();

  std::mt19937_64 rng_;
  const bool disk_;
  const int num_ops_;
  uint32_t num_blocks_ = 0;
  PoolOptions options_;
  FakeClock clock_;
  std::optional<testing::ScopedTempDir> disk_dir_;
  std::unique_ptr<CacheManager> manager_;
  Pool* pool_ = nullptr;
  std::vector<std::shared_ptr<const CompatibilityManifest>> manifests_;
  std::vector<std::string> keys_;
  std::map<uint64_t, SessionInfo> sessions_;
  std::vector<uint64_t> session_order_;
  // By (namespace, key): every part mask a commit of it carried.
  std::map<std::pair<std::string, std::string>, std::set<uint32_t>> committed_;
  // Exact while nothing was evicted: tier 1's pages and their masks, by (namespace, key).
  std::map<std::pair<std::string, std::string>, uint32_t> tier1_;
  std::map<uint64_t, Put> pending_;  // by sequence id: reserved, written, not yet committed
  std::map<uint64_t, Held> held_;    // by sequence id: acquired, not yet released
  std::vector<Pin> pins_;
  absl::Time pins_swept_at_ = absl::InfinitePast();
  std::vector<std::string> trace_;
  uint64_t hit_pages_ = 0;
  uint64_t below_hit_pages_ = 0;
  uint64_t disk_hit_pages_ = 0;
  uint64_t offloaded_ = 0;
  uint64_t exact_steps_ = 0;
  uint64_t partial_hits_ = 0;
  uint64_t ended_mid_put_ = 0;
  uint64_t ambiguous_walks_ = 0;
};

}  // namespace simulation
}  // namespace kvcache

#endif  // KVCACHE_TESTS_CACHE_PAGE_SIMULATION_H_
