// The cache core under concurrent load, as the daemon drives it: worker threads open sessions,
// open/commit/extend/fork/release sequences over shared prefixes, look up, write and read the
// blocks their own sequences pin, keep leases alive and let some expire, while the reaper sweeps
// on a real clock and a watcher reads the KV event log. Every stream-like binding goes through
// StreamLeases, which the manager tells of each ended session. Bounded by operation counts, not
// time. Built and run under ThreadSanitizer too (label tsan, scripts/test.sh): this is the test
// that gives TSan the core's lock interplay to look at (no gRPC on any path here). The pool has
// a tier 2, so its mover and loads run among the workers.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cache/cache_manager.h"
#include "cache/pool_spec.h"
#include "server/stream_leases.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::IsOk;
using ::kvcache::testing::StatusIs;
using ::testing::AnyOf;

constexpr uint64_t kEpoch = 7;
constexpr uint32_t kBlocks = 96;
constexpr uint32_t kBlockTokens = 16;
constexpr int kWorkers = 4;
constexpr int kRoundsPerWorker = 120;
constexpr size_t kPatternBytes = 256;

// A stream's view of its binding: how often it was told its lease ended, and whether it has
// unbound (after which it must never be told).
struct StreamState {
  std::atomic<int> notices{0};
  std::atomic<bool> unbound{false};
  std::atomic<int> told_after_unbind{0};
};

std::shared_ptr<StreamLeases::Binding> BindStream(StreamLeases& leases, const Session& session,
                                                  const std::shared_ptr<StreamState>& state) {
  auto binding = leases.Bind(session, [state] {
    if (state->unbound.load()) state->told_after_unbind.fetch_add(1);
    state->notices.fetch_add(1);
  });
  if (!binding.ok()) {
    // Only a session that has already ended (a short lease the reaper took) refuses a stream.
    EXPECT_THAT(binding.status(), StatusIs(absl::StatusCode::kAborted));
    return nullptr;
  }
  return *std::move(binding);
}

void UnbindStream(StreamLeases& leases, StreamLeases::Binding* binding, StreamState& state) {
  if (binding == nullptr) return;
  leases.Unbind(*binding);
  state.unbound.store(true);
}

// Tokens of one of three shared prompt prefixes (3 full blocks each), then a tail of its own.
std::vector<uint32_t> Prompt(int prefix, uint32_t tail_seed, size_t tail_tokens) {
  std::vector<uint32_t> tokens;
  for (uint32_t i = 0; i < 3 * kBlockTokens; ++i) tokens.push_back(1000 * (prefix + 1) + i);
  for (size_t i = 0; i < tail_tokens; ++i) tokens.push_back(tail_seed * 131 + i);
  return tokens;
}

std::string Pattern(int worker, int round, BlockId block) {
  std::string bytes(kPatternBytes, '\0');
  for (size_t i = 0; i < bytes.size(); ++i) {
    bytes[i] = static_cast<char>(worker * 31 + round * 7 + block + i);
  }
  return bytes;
}

class ConcurrencyTest : public ::testing::Test {
 protected:
  ConcurrencyTest() : manager_(Limits(), RealClock::Get(), kEpoch, /*event_log_capacity=*/128) {}

  static SessionLimits Limits() {
    SessionLimits limits;
    limits.min_ttl = absl::Milliseconds(1);
    return limits;
  }

  void SetUp() override {
    PoolOptions options = DefaultPoolOptions();
    options.name = "shared";
    options.num_blocks = kBlocks;
    // Tier 2, half the pool's size: its mover copies blocks while workers hit, evict and load
    // them back (issue 18), so TSan sees the offload pins and the loads outside the pool mutex.
    options.host_tier_bytes = uint64_t{kBlocks / 2} * options.layout.BlockBytes();
    auto memory = HostPoolMemory::Create(options.layout.BlockBytes(), options.num_blocks);
    ASSERT_OK(memory);
    ASSERT_OK(manager_.AddPool(options, *std::move(memory)));
    pool_ = *manager_.FindPool("shared");
    manager_.SetSessionEndedListener([this](uint64_t id) { leases_.SessionEnded(id); });
    manager_.StartReaper(absl::Milliseconds(2));
  }

  // One worker's rounds. Even rounds hold a long lease and must succeed (the pool may run short:
  // RESOURCE_EXHAUSTED); odd rounds hold a 1 ms lease that the reaper may end at any point, so
  // each of their calls may also answer ABORTED, and they end by expiry, not by closing.
  void Work(int worker) {
    std::vector<std::pair<std::shared_ptr<StreamLeases::Binding>, std::shared_ptr<StreamState>>>
        expiring;
    for (int round = 0; round < kRoundsPerWorker; ++round) {
      const bool short_lease = round % 2 == 1;
      auto session = manager_.sessions().Open(
          "uid:1000", absl::StrCat("tenant", worker % 2), absl::StrCat("worker", worker),
          short_lease ? absl::Milliseconds(1) : absl::Seconds(60));
      ASSERT_OK(session);
      auto state = std::make_shared<StreamState>();
      std::shared_ptr<StreamLeases::Binding> binding = BindStream(leases_, **session, state);
      if (short_lease) {
        RunSequences(worker, round, **session, /*may_abort=*/true);
        if (binding != nullptr) expiring.emplace_back(std::move(binding), std::move(state));
        continue;
      }
      ASSERT_NE(binding, nullptr);
      RunSequences(worker, round, **session, /*may_abort=*/false);
      EXPECT_OK(manager_.sessions().KeepAlive((*session)->id));
      if (round % 4 == 0) {
        // The stream ends first (its OnDone), then the client closes its session.
        UnbindStream(leases_, binding.get(), *state);
        EXPECT_OK(manager_.CloseSession((*session)->id, kEpoch, "uid:1000"));
      } else {
        // The session closes under a bound stream, which is told (on the notifier thread).
        EXPECT_OK(manager_.CloseSession((*session)->id, kEpoch, "uid:1000"));
        EXPECT_TRUE((*session)->closed.load());
        WaitForNotice(*state);
        UnbindStream(leases_, binding.get(), *state);
        EXPECT_EQ(state->notices.load(), 1);
      }
      EXPECT_EQ(state->told_after_unbind.load(), 0);
    }
    // Every short lease ends by expiry: the reaper releases it and its stream is told, once.
    for (auto& [binding, state] : expiring) {
      WaitForNotice(*state);
      EXPECT_TRUE(binding->lease_ended());
      UnbindStream(leases_, binding.get(), *state);
      EXPECT_EQ(state->notices.load(), 1);
      EXPECT_EQ(state->told_after_unbind.load(), 0);
    }
  }

  // Waits for the notice with no deadline of its own (CTest's timeout bounds a hang): the test
  // asserts that it comes, not how soon.
  static void WaitForNotice(const StreamState& state) {
    while (state.notices.load() == 0) absl::SleepFor(absl::Microseconds(200));
  }

  void RunSequences(int worker, int round, const Session& session, bool may_abort) {
    auto allowed = [&](const absl::Status& status, bool may_exhaust) {
      if (status.ok()) return true;
      if (may_abort && status.code() == absl::StatusCode::kAborted) return true;
      if (may_exhaust && status.code() == absl::StatusCode::kResourceExhausted) return true;
      ADD_FAILURE() << "worker " << worker << " round " << round << ": " << status;
      return false;
    };
    const std::vector<uint32_t> tokens =
        Prompt((worker + round) % 3, worker * 1000 + round, 5 + round % 20);
    const SequenceSpec spec{tokens};
    auto lookup = pool_->Lookup(session.tenant, spec);
    EXPECT_OK(lookup);

    auto opened = pool_->Open(session, spec);
    if (!allowed(opened.status(), true) || !opened.ok()) return;
    // Blocks past the hit are this sequence's alone until it releases them: write a pattern of
    // this round's into each and read it back (a block shared by mistake shows as a mismatch).
    // Not under a short lease: the reaper may end it and hand its blocks to another worker at any
    // moment (the daemon's streams hold transfer sequences of their own for that reason).
    const size_t first_fresh = opened->num_cached_tokens / kBlockTokens;
    for (size_t i = first_fresh; !may_abort && i < opened->block_ids.size(); ++i) {
      const BlockId block = opened->block_ids[i];
      const std::string pattern = Pattern(worker, round, block);
      EXPECT_OK(pool_->WriteBlock(block, 0, pattern));
      std::string read(kPatternBytes, '\0');
      EXPECT_OK(pool_->ReadBlock(block, 0, read.size(), read.data()));
      EXPECT_EQ(read, pattern) << "block " << block;
    }
    auto committed = pool_->Commit(session, opened->sequence_id, tokens.size());
    allowed(committed.status(), false);

    const std::vector<uint32_t> more(kBlockTokens, worker * 7 + round);
    auto extended = pool_->Extend(session, opened->sequence_id, more);
    allowed(extended.status(), true);

    auto forked = pool_->Fork(session, opened->sequence_id);
    if (allowed(forked.status(), true) && forked.ok()) {
      EXPECT_EQ(Pool::PoolIndexOf(forked->sequence_id), pool_->pool_index());
      for (BlockId block : may_abort ? std::vector<BlockId>{} : forked->block_ids) {
        std::string read(kPatternBytes, '\0');
        EXPECT_OK(pool_->ReadBlock(block, 0, read.size(), read.data()));
      }
      // Every other fork is released by the client, the rest with the session.
      if (round % 3 != 0) allowed(pool_->Release(session, forked->sequence_id), false);
    }
    if (round % 5 == 0) allowed(pool_->Release(session, opened->sequence_id), false);
    EXPECT_EQ(pool_->SequencesOfSession(session.id) <= 2, true);
  }

  StreamLeases leases_;  // declared first: outlives the manager's reaper, which notifies it
  CacheManager manager_;
  Pool* pool_ = nullptr;
};

TEST_F(ConcurrencyTest, WorkersReaperAndWatcherKeepThePoolConsistent) {
  std::atomic<int> workers_left{kWorkers};
  std::atomic<uint64_t> events_seen{0};
  std::thread watcher([&] {
    KvEventLog& log = manager_.events();
    uint64_t next = log.next_sequence();
    for (int step = 0; workers_left.load() > 0; ++step) {
      log.WaitFor(next, absl::Milliseconds(1));
      KvEventLog::ReadResult read = log.Read(next, 32);
      if (read.lost) {
        // Fell behind the ring (128 events): resume from a snapshot, as a watcher does.
        KvEventLog::Snapshot snapshot = log.TakeSnapshot(KvEventFilter{});
        EXPECT_LE(snapshot.next_sequence, log.next_sequence());
        EXPECT_GE(snapshot.next_sequence, next);
        next = snapshot.next_sequence;
        continue;
      }
      for (const auto& event : read.events) {
        EXPECT_EQ(event->sequence, next) << "events out of order";
        EXPECT_EQ(event->pool, "shared");
        next = event->sequence + 1;
        events_seen.fetch_add(1);
      }
      EXPECT_EQ(read.next_sequence, next);
      if (step % 16 == 0) {
        KvEventLog::Snapshot snapshot = log.TakeSnapshot(KvEventFilter{.tenant = "tenant0"});
        for (const KvEvent& event : snapshot.events) EXPECT_EQ(event.tenant, "tenant0");
      }
    }
  });
  std::vector<std::thread> workers;
  for (int worker = 0; worker < kWorkers; ++worker) {
    workers.emplace_back([&, worker] {
      Work(worker);
      workers_left.fetch_sub(1);
    });
  }
  for (std::thread& worker : workers) worker.join();
  watcher.join();

  // Everything has ended: the long leases were closed, the short ones expired and were swept.
  EXPECT_EQ(manager_.sessions().size(), 0u);
  EXPECT_EQ(leases_.bound(), 0u);
  EXPECT_OK(pool_->CheckInvariants());
  const PoolStatsSnapshot stats = pool_->Stats();
  EXPECT_EQ(stats.referenced, 0u);
  EXPECT_EQ(stats.open_sequences, 0u);
  EXPECT_EQ(stats.free + stats.evictable + stats.referenced, kBlocks);
  ASSERT_TRUE(stats.host_tier.has_value());
  std::printf(
      "tier 2: %llu stored (%llu by requests passing their victims down), %llu hits, %llu "
      "evicted, %llu requests waited\n",
      static_cast<unsigned long long>(stats.host_tier->store.stored),
      static_cast<unsigned long long>(stats.host_tier->passed_down_on_eviction),
      static_cast<unsigned long long>(stats.host_tier->hit_blocks),
      static_cast<unsigned long long>(stats.host_tier->store.evicted),
      static_cast<unsigned long long>(stats.host_tier->request_waits));
  // However the workers' requests outran the mover, no victim was lost on the way down.
  EXPECT_EQ(stats.host_tier->evicted_unsaved, 0u);
  EXPECT_GT(stats.evictable, 0u) << "nothing was ever committed";
  EXPECT_GT(events_seen.load(), 0u);
}

}  // namespace
}  // namespace kvcache
