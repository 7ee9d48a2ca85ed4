// libFuzzer target: the cache core (CacheManager and its Pools) under arbitrary operation
// sequences decoded from the input — sessions opened, kept alive, closed and expired on a fake
// clock; sequences opened (every OpenMode), extended, committed, forked, released one by one and
// by session; lookups; block reads, writes and checksums; tenant quotas changed mid-run; device
// faults injected into the pools' memory; and pages named by keys (DESIGN §13) reserved with
// random part masks, written, committed, looked for, acquired, pinned, and offloaded to pool 0's
// tier 2 (pool 0's pages have two parts, pool 1's one). After every operation each pool's
// invariants hold (Pool::CheckInvariants, free + evictable + referenced = size, the tenants'
// shares add up to the pool's), and an acquire's pages are a hit under the hit rule by their own
// parts; at the end of an input, once every session is closed, nothing is referenced and no
// quota is held. A violation aborts (FUZZ_CHECK), which libFuzzer records as a crash.
//
// Each input gets a fresh CacheManager, so a crash reproduces from its input alone.
//
// Thread safety: libFuzzer calls LLVMFuzzerTestOneInput from one thread.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cache/cache_manager.h"
#include "cache/pool.h"
#include "cache/pool_memory.h"
#include "cache/tenant_quotas.h"
#include "common/page_parts.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/fuzz_inputs.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injection_pool_memory.h"

namespace kvcache {
namespace {

using ::kvcache::testing::FakeClock;
using ::kvcache::testing::FaultInjectionPoolMemory;

constexpr uint64_t kEpoch = 7;
constexpr int kMaxOps = 200;
const char* const kPrincipals[] = {"uid:1", "uid:2"};
const char* const kTenants[] = {"a", "b", "c"};
// Page keys: short ones and two of the most bytes a key may have (kMaxPageKeyBytes) that share
// their first 16.
const char* const kPageKeys[] = {"page-a",
                                 "page-b",
                                 "page-c",
                                 "page-d",
                                 "0123456789abcdef-long-key-a-0123456789abcdef0123456789abcdef01",
                                 "0123456789abcdef-long-key-b-0123456789abcdef0123456789abcdef01"};

enum class Op {
  kOpenSession,
  kCloseSession,
  kKeepAlive,
  kAdvanceClock,
  kOpen,
  kExtend,
  kCommit,
  kRelease,
  kFork,
  kLookup,
  kReleaseSession,
  kWriteBlock,
  kReadBlock,
  kChecksum,
  kSetLimits,
  kArmFault,
  kReservePages,
  kCommitPages,
  kExistsPages,
  kAcquirePages,
  kPinPages,
  kOffload,
  kMaxValue = kOffload,  // FuzzedDataProvider::ConsumeEnum's bound
};

// A sequence the harness opened and has not released: its pool, session and block table, so
// block operations only touch blocks a live sequence holds (their REQUIRES).
struct Tracked {
  uint64_t session_id = 0;
  size_t pool = 0;
  std::vector<BlockId> blocks;
};

class Harness {
 public:
  explicit Harness(FuzzedDataProvider& in) : in_(in) {
    // Two small pools, so eviction, resurrection and exhaustion are a few operations away: pool 0
    // with 1, 2 or 4 tokens per block (xxh3) and two page parts, kv and a state the hit needs on
    // its last page only; pool 1 with 2 (sha256) and the one part kv.
    const uint32_t block_sizes[] = {1, 2, 4};
    for (size_t i = 0; i < 2; ++i) {
      PoolOptions options;
      options.name = i == 0 ? "p0" : "p1";
      options.model_id = "fuzz";
      options.layout = PoolLayout{.num_layers = 1,
                                  .num_kv_heads = 1,
                                  .head_dim = 4,
                                  .block_size = i == 0 ? in_.PickValueInArray(block_sizes) : 2,
                                  .dtype = DType::kFloat16};
      options.num_blocks = i == 0 ? in_.ConsumeIntegralInRange<uint32_t>(1, 12) : 6;
      options.hash_algorithm = i == 0 ? HashAlgorithm::kXxh3_128 : HashAlgorithm::kSha256;
      if (i == 0) {
        const uint64_t half = options.layout.BlockBytes() / 2;
        auto parts = ParsePageParts(absl::StrCat("kv/", half, "+state/", half, "/trailing1"),
                                    options.layout.BlockBytes());
        FUZZ_CHECK_OK(parts.status());
        options.parts = *std::move(parts);
        // A tier 2 of a few blocks, filled only by kOffload (no mover thread: an input replays),
        // so pages come back from below, parts and all, and loads can run out of room.
        options.host_tier_bytes = 4 * options.layout.BlockBytes();
        options.testing_manual_offload = true;
      }
      auto host = HostPoolMemory::Create(options.layout.BlockBytes(), options.num_blocks);
      FUZZ_CHECK_OK(host.status());
      auto memory = std::make_unique<FaultInjectionPoolMemory>(*std::move(host));
      memories_.push_back(memory.get());
      FUZZ_CHECK_OK(manager_.AddPool(options, std::move(memory)));
    }
    pools_ = manager_.pools();
  }

  void Run() {
    for (int i = 0; i < kMaxOps && in_.remaining_bytes() > 0; ++i) {
      Step(in_.ConsumeEnum<Op>());
      CheckPools();
    }
    Finish();
  }

 private:
  void Step(Op op) {
    switch (op) {
      case Op::kOpenSession: {
        // Half the sessions are bound to a manifest, which may not fit the pool they use.
        std::shared_ptr<const CompatibilityManifest> manifest;
        if (in_.ConsumeBool()) {
          const Pool& pool = *pools_[PickPool()];
          manifest = CompatibilityManifest::Create(
                         ConsumeManifest(in_, pool.options().layout, pool.parts()))
                         .value_or(nullptr);
        }
        auto session = manager_.sessions().Open(
            in_.PickValueInArray(kPrincipals), PickTenant(), "fuzz",
            absl::Milliseconds(in_.ConsumeIntegral<uint16_t>()), std::move(manifest));
        if (session.ok()) sessions_.push_back(*session);
        break;
      }
      case Op::kCloseSession: {
        const uint64_t id = PickSessionId();
        const absl::StatusOr<uint32_t> closed =
            manager_.CloseSession(id, PickEpoch(), in_.PickValueInArray(kPrincipals));
        (void)closed;
        break;
      }
      case Op::kKeepAlive:
        (void)manager_.sessions().KeepAlive(PickSessionId());
        break;
      case Op::kAdvanceClock:
        clock_.Advance(absl::Milliseconds(in_.ConsumeIntegral<uint16_t>()));
        if (in_.ConsumeBool()) manager_.ExpireSessions();
        break;
      case Op::kOpen: {
        const std::shared_ptr<Session> session = PickSession();
        if (session == nullptr) break;
        const size_t pool = PickPool();
        const PromptInput prompt = ConsumePrompt(in_, prompts_);
        const OpenMode modes[] = {OpenMode::kCompute, OpenMode::kPut, OpenMode::kPinCached};
        auto opened = pools_[pool]->Open(*session, prompt.Spec(), in_.PickValueInArray(modes));
        if (opened.ok()) {
          tracked_[opened->sequence_id] = Tracked{session->id, pool, opened->block_ids};
          sequence_ids_.push_back(opened->sequence_id);
        }
        break;
      }
      case Op::kExtend:
      case Op::kCommit:
      case Op::kRelease:
      case Op::kFork:
        SequenceOp(op);
        break;
      case Op::kLookup: {
        const PromptInput prompt = ConsumePrompt(in_, prompts_);
        (void)pools_[PickPool()]->Lookup(PickTenant(), prompt.Spec());
        break;
      }
      case Op::kReleaseSession: {
        const uint64_t id = PickSessionId();
        const size_t pool = PickPool();
        pools_[pool]->ReleaseSession(id);
        absl::erase_if(tracked_, [&](const auto& entry) {
          return entry.second.session_id == id && entry.second.pool == pool;
        });
        break;
      }
      case Op::kWriteBlock:
      case Op::kReadBlock:
      case Op::kChecksum:
        BlockOp(op);
        break;
      case Op::kSetLimits: {
        absl::flat_hash_map<std::string, TenantLimits> limits;
        TenantLimits& tenant = limits[PickTenant()];
        if (in_.ConsumeBool()) tenant.max_referenced_blocks = in_.ConsumeIntegralInRange(0, 8);
        if (in_.ConsumeBool()) tenant.max_sessions = in_.ConsumeIntegralInRange(0, 3);
        if (in_.ConsumeBool()) tenant.max_open_sequences = in_.ConsumeIntegralInRange(0, 4);
        manager_.quotas().SetLimits(std::move(limits));
        break;
      }
      case Op::kArmFault: {
        const FaultInjectionPoolMemory::Op ops[] = {
            FaultInjectionPoolMemory::Op::kCopyBlock, FaultInjectionPoolMemory::Op::kWrite,
            FaultInjectionPoolMemory::Op::kRead, FaultInjectionPoolMemory::Op::kChecksum};
        memories_[PickPool()]->FailNth(in_.PickValueInArray(ops), in_.ConsumeIntegralInRange(1, 4),
                                       FaultInjectionPoolMemory::StickyCudaError());
        break;
      }
      case Op::kReservePages:
      case Op::kCommitPages:
      case Op::kExistsPages:
      case Op::kAcquirePages:
      case Op::kPinPages:
        PageOp(op);
        break;
      case Op::kOffload:
        pools_[0]->OffloadForTesting();
        break;
    }
  }

  // 1 to 4 page keys, now and then none or one too long.
  std::vector<std::string> PickPageKeys() {
    std::vector<std::string> keys(Rarely(in_, 16) ? 0 : in_.ConsumeIntegralInRange(1, 4));
    for (std::string& key : keys) {
      key = Rarely(in_, 16) ? in_.ConsumeRandomLengthString(kMaxPageKeyBytes + 4)
                            : std::string(in_.PickValueInArray(kPageKeys));
    }
    return keys;
  }
  // A mask over the pool's parts (now and then 0 or past them, which is refused).
  uint32_t PickPartMask() {
    return in_.ConsumeIntegralInRange<uint32_t>(Rarely(in_, 16) ? 0 : 1, 4);
  }

  // A page call by a session of the input (ended ones included) on either pool (pool 1 has one
  // part; a session's manifest may fit neither).
  void PageOp(Op op) {
    const std::shared_ptr<Session> session = PickSession();
    if (session == nullptr) return;
    const size_t pool_index = PickPool();
    Pool& pool = *pools_[pool_index];
    const uint32_t wanted = in_.ConsumeIntegralInRange<uint32_t>(0, 3);
    switch (op) {
      case Op::kReservePages: {
        const std::vector<std::string> keys = PickPageKeys();
        std::vector<uint32_t> masks;
        if (in_.ConsumeBool()) {
          masks.resize(Rarely(in_, 16) ? in_.ConsumeIntegralInRange<size_t>(0, 5) : keys.size());
          for (uint32_t& mask : masks) mask = PickPartMask();
        }
        auto reserved = pool.ReservePages(*session, keys, masks);
        if (!reserved.ok()) break;
        FUZZ_CHECK(reserved->block_ids.size() == keys.size(), "%zu blocks for %zu keys",
                   reserved->block_ids.size(), keys.size());
        std::vector<BlockId> fresh;
        for (BlockId block : reserved->block_ids) {
          if (block != kNoBlock) fresh.push_back(block);
        }
        tracked_[reserved->sequence_id] = Tracked{session->id, pool_index, fresh};
        sequence_ids_.push_back(reserved->sequence_id);
        break;
      }
      case Op::kCommitPages: {
        const uint64_t id = PickSequenceId();
        auto found = manager_.PoolOfSequence(id);
        if (!found.ok()) break;
        // A commit ends the reservation; a refused one (not a reservation, not this session's)
        // leaves it as it was.
        if ((*found)->CommitPages(*session, id).ok()) tracked_.erase(id);
        break;
      }
      case Op::kExistsPages: {
        const std::vector<std::string> keys = PickPageKeys();
        auto found = pool.ExistsPages(*session, keys, wanted);
        if (!found.ok()) break;
        const PagesByTier& tiers = found->by_tier;
        FUZZ_CHECK(found->num_pages <= keys.size() &&
                       tiers.pool + tiers.host + tiers.disk + tiers.cluster == found->num_pages,
                   "exists: %u pages of %zu keys", found->num_pages, keys.size());
        break;
      }
      case Op::kAcquirePages: {
        const std::vector<std::string> keys = PickPageKeys();
        auto acquired = pool.AcquirePages(*session, keys, wanted, 0);
        if (!acquired.ok()) break;
        const size_t got = acquired->block_ids.size();
        FUZZ_CHECK(got <= keys.size() && acquired->part_masks.size() == got,
                   "acquire: %zu pages, %zu masks, %zu keys", got, acquired->part_masks.size(),
                   keys.size());
        // What an acquire gives is a hit by the parts it says the pages hold.
        FUZZ_CHECK(RestorablePages(pool.parts(), wanted, acquired->part_masks) == got,
                   "acquire: %zu pages are no hit for parts 0x%x", got, wanted);
        tracked_[acquired->sequence_id] = Tracked{session->id, pool_index, acquired->block_ids};
        sequence_ids_.push_back(acquired->sequence_id);
        break;
      }
      case Op::kPinPages: {
        const std::vector<std::string> keys = PickPageKeys();
        const absl::Duration ttl =
            absl::Milliseconds(in_.ConsumeIntegralInRange<uint32_t>(0, 4000));
        auto pinned = pool.PinPages(*session, keys, Rarely(in_, 16) ? Pool::kMaxPinTtl * 2 : ttl);
        FUZZ_CHECK(!pinned.ok() || *pinned <= keys.size(), "pinned %u of %zu keys", *pinned,
                   keys.size());
        break;
      }
      default:
        break;
    }
  }

  // An extend, commit, release or fork by a session of the input (ended ones included) of a
  // sequence id of the input (released ones included) or any id, in the pool the id names.
  void SequenceOp(Op op) {
    const std::shared_ptr<Session> session = PickSession();
    if (session == nullptr) return;
    const uint64_t id = PickSequenceId();
    auto found = manager_.PoolOfSequence(id);
    if (!found.ok()) return;
    Pool& pool = **found;
    switch (op) {
      case Op::kExtend: {
        auto extended = pool.Extend(*session, id, ConsumeTokens(in_, 24));
        if (!extended.ok()) break;
        auto it = tracked_.find(id);
        FUZZ_CHECK(it != tracked_.end(), "extended sequence %llu was never opened",
                   static_cast<unsigned long long>(id));
        it->second.blocks.insert(it->second.blocks.end(), extended->new_block_ids.begin(),
                                 extended->new_block_ids.end());
        break;
      }
      case Op::kCommit:
        (void)pool.Commit(*session, id, in_.ConsumeIntegralInRange<uint32_t>(0, 80));
        break;
      case Op::kRelease:
        if (pool.Release(*session, id).ok()) tracked_.erase(id);
        break;
      case Op::kFork: {
        auto forked = pool.Fork(*session, id);
        if (!forked.ok()) break;
        tracked_[forked->sequence_id] = Tracked{session->id, pool.pool_index(), forked->block_ids};
        sequence_ids_.push_back(forked->sequence_id);
        break;
      }
      default:
        break;
    }
  }

  // A block read, write or checksum on a block that a live sequence of a live session holds.
  void BlockOp(Op op) {
    if (tracked_.empty()) return;
    auto it = tracked_.begin();
    std::advance(it, in_.ConsumeIntegralInRange<size_t>(0, tracked_.size() - 1));
    const Tracked& sequence = it->second;
    // A session that ended (closed, expired, swept) took its sequences' references with it.
    if (!manager_.sessions().Get(sequence.session_id).ok() || sequence.blocks.empty()) return;
    Pool& pool = *pools_[sequence.pool];
    const BlockId block =
        sequence.blocks[in_.ConsumeIntegralInRange<size_t>(0, sequence.blocks.size() - 1)];
    const uint64_t block_bytes = pool.options().layout.BlockBytes();
    const uint64_t offset = in_.ConsumeIntegralInRange<uint64_t>(0, block_bytes + 2);
    const uint64_t size = in_.ConsumeIntegralInRange<uint64_t>(0, block_bytes + 2);
    if (op == Op::kWriteBlock) {
      const std::string bytes = in_.ConsumeBytesAsString(size);
      (void)pool.WriteBlock(block, offset, bytes);
    } else if (op == Op::kReadBlock) {
      std::string out(size, '\0');
      (void)pool.ReadBlock(block, offset, size, out.data());
    } else {
      (void)pool.BlockChecksum(block);
    }
  }

  // After every operation (fuzz_check.h).
  void CheckPools() {
    for (const Pool* pool : pools_) CheckPool(*pool);
  }

  // Every session closed: nothing may stay referenced, open or counted against a quota.
  void Finish() {
    for (const std::shared_ptr<Session>& session : sessions_) {
      (void)manager_.CloseSession(session->id, kEpoch, session->principal);
    }
    CheckPools();
    for (Pool* pool : pools_) {
      const PoolStatsSnapshot stats = pool->Stats();
      FUZZ_CHECK(stats.referenced == 0 && stats.open_sequences == 0,
                 "%s: %u blocks and %u sequences left after every session closed",
                 pool->options().name.c_str(), stats.referenced, stats.open_sequences);
    }
    FUZZ_CHECK(manager_.sessions().size() == 0, "%zu sessions left", manager_.sessions().size());
    for (const char* tenant : kTenants) {
      for (QuotaResource resource : {QuotaResource::kSessions, QuotaResource::kOpenSequences}) {
        FUZZ_CHECK(manager_.quotas().InUse(tenant, resource) == 0, "tenant %s still holds quota %d",
                   tenant, static_cast<int>(resource));
      }
    }
  }

  std::string PickTenant() {
    return Rarely(in_, 16) ? in_.ConsumeRandomLengthString(300)
                           : std::string(in_.PickValueInArray(kTenants));
  }
  size_t PickPool() { return in_.ConsumeIntegralInRange<size_t>(0, pools_.size() - 1); }
  uint64_t PickEpoch() {
    const uint64_t epochs[] = {0, kEpoch, kEpoch + 1};
    return in_.PickValueInArray(epochs);
  }
  // One of the sessions opened so far (ended ones included), or null when there is none.
  std::shared_ptr<Session> PickSession() {
    if (sessions_.empty()) return nullptr;
    return sessions_[in_.ConsumeIntegralInRange<size_t>(0, sessions_.size() - 1)];
  }
  // A session id opened so far, or now and then one never issued.
  uint64_t PickSessionId() {
    if (sessions_.empty() || Rarely(in_, 16)) {
      return in_.ConsumeIntegral<uint64_t>();
    }
    return PickSession()->id;
  }
  // A sequence id returned so far (released ones included), or now and then an arbitrary one.
  uint64_t PickSequenceId() {
    if (sequence_ids_.empty() || Rarely(in_, 16)) {
      return in_.ConsumeIntegral<uint64_t>();
    }
    return sequence_ids_[in_.ConsumeIntegralInRange<size_t>(0, sequence_ids_.size() - 1)];
  }

  FuzzedDataProvider& in_;
  FakeClock clock_;
  CacheManager manager_{SessionLimits{.default_ttl = absl::Seconds(1),
                                      .min_ttl = absl::Milliseconds(1),
                                      .max_ttl = absl::Seconds(60),
                                      .max_sessions = 4},
                        &clock_, kEpoch, /*event_log_capacity=*/64};
  std::vector<FaultInjectionPoolMemory*> memories_;  // owned by the pools
  std::vector<Pool*> pools_;
  std::vector<std::shared_ptr<Session>> sessions_;
  std::vector<uint64_t> sequence_ids_;
  absl::flat_hash_map<uint64_t, Tracked> tracked_;
  std::vector<std::vector<uint32_t>> prompts_;  // earlier prompts, whose prefixes later ones reuse
};

}  // namespace
}  // namespace kvcache

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  kvcache::Harness harness(in);
  harness.Run();
  return 0;
}
