// KV events over gRPC (WatchEvents) from a real kvcache-manager process: a watcher that replays
// the stream into a router-style index (tests/testing/event_index.h) answers every prompt as the
// daemon's Lookup does; one cut off mid-stream and resumed from its last next_sequence misses and
// doubles nothing; one whose start the daemon no longer holds gets a snapshot and converges.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <random>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "client/kv_cache_client.h"
#include "tests/integration/daemon_process_fixture.h"
#include "tests/testing/event_index.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

using ::testing::IsEmpty;

constexpr uint32_t kSmallBlockSize = 4;

std::vector<uint32_t> Tokens(uint32_t first, size_t n) {
  std::vector<uint32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

Hash128 FromProto(const v1::BlockHash& hash) { return Hash128{.hi = hash.hi(), .lo = hash.lo()}; }

// A watcher on its own thread: applies every response to its index and checks that live events
// come in sequence, one after the other.
class Watcher {
 public:
  Watcher(const std::string& target, KvCacheClient::WatchOptions options) {
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(target);
    EXPECT_OK(client);
    client_ = *std::move(client);
    Start(options);
  }
  ~Watcher() { Stop(); }

  // Starts a stream; its events go on into the same index (a resume, when `options` carries the
  // last next_sequence and epoch).
  void Start(const KvCacheClient::WatchOptions& options) {
    {
      absl::MutexLock lock(&mu_);
      next_sequence_ = options.start_sequence;
      final_status_ = absl::OkStatus();
    }
    watch_ = client_->WatchEvents(options);
    thread_ = std::thread([this] { Run(); });
  }

  // Cancels the stream; the index keeps what it applied.
  void Stop() {
    if (!thread_.joinable()) return;
    watch_->Cancel();
    thread_.join();
  }

  uint32_t CachedBlocks(const std::string& pool, absl::Span<const uint32_t> tokens) const {
    absl::MutexLock lock(&mu_);
    return index_.CachedBlocks(pool, "default", tokens, kSmallBlockSize);
  }
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return index_.size();
  }
  std::vector<std::string> violations() const {
    absl::MutexLock lock(&mu_);
    std::vector<std::string> all = index_.violations();
    all.insert(all.end(), gaps_.begin(), gaps_.end());
    return all;
  }
  uint64_t next_sequence() const {
    absl::MutexLock lock(&mu_);
    return next_sequence_;
  }
  uint64_t head_sequence() const {
    absl::MutexLock lock(&mu_);
    return head_sequence_;
  }
  uint64_t epoch() const {
    absl::MutexLock lock(&mu_);
    return epoch_;
  }
  int snapshots() const {
    absl::MutexLock lock(&mu_);
    return snapshots_;
  }
  uint64_t live_events() const {
    absl::MutexLock lock(&mu_);
    return live_events_;
  }
  std::optional<uint64_t> first_live_sequence() const {
    absl::MutexLock lock(&mu_);
    return first_live_sequence_;
  }
  absl::Status final_status() const {
    absl::MutexLock lock(&mu_);
    return final_status_;
  }

 private:
  void Run() {
    while (true) {
      absl::StatusOr<v1::WatchEventsResponse> response = watch_->Next();
      absl::MutexLock lock(&mu_);
      if (!response.ok()) {
        final_status_ = response.status();
        return;
      }
      Apply(*response);
    }
  }

  void Apply(const v1::WatchEventsResponse& response) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    epoch_ = response.epoch();
    head_sequence_ = response.head_sequence();
    if (response.snapshot() && !in_snapshot_) ++snapshots_;
    in_snapshot_ = response.snapshot() && response.next_sequence() == next_sequence_;
    for (const v1::KvEvent& event : response.events()) {
      if (!response.snapshot()) {
        if (!first_live_sequence_.has_value()) first_live_sequence_ = event.sequence();
        if (last_live_.has_value() && event.sequence() != *last_live_ + 1) {
          gaps_.push_back(absl::StrCat("event ", event.sequence(), " after ", *last_live_));
        }
        last_live_ = event.sequence();
        ++live_events_;
      }
      if (event.has_all_blocks_cleared()) {
        index_.Clear(event.all_blocks_cleared().pool());
      } else if (event.has_blocks_stored()) {
        const v1::BlocksStored& stored = event.blocks_stored();
        std::optional<Hash128> parent;
        if (stored.has_parent_hash()) parent = FromProto(stored.parent_hash());
        for (const v1::StoredBlock& block : stored.blocks()) {
          index_.Store(stored.pool(), stored.tenant(), parent, FromProto(block.hash()),
                       std::vector<uint32_t>(block.token_ids().begin(), block.token_ids().end()));
          parent = FromProto(block.hash());
        }
      } else if (event.has_blocks_removed()) {
        for (const v1::BlockHash& hash : event.blocks_removed().hashes()) {
          index_.Remove(event.blocks_removed().pool(), FromProto(hash));
        }
      }
    }
    // A snapshot's last message moves next_sequence on; live events follow on from it.
    if (response.snapshot() && response.next_sequence() != next_sequence_) {
      last_live_ = response.next_sequence() - 1;
    }
    next_sequence_ = response.next_sequence();
  }

  std::unique_ptr<KvCacheClient> client_;
  std::unique_ptr<EventWatch> watch_;
  std::thread thread_;

  mutable absl::Mutex mu_;
  EventIndex index_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> gaps_ ABSL_GUARDED_BY(mu_);
  uint64_t next_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t epoch_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t head_sequence_ ABSL_GUARDED_BY(mu_) = 0;
  int snapshots_ ABSL_GUARDED_BY(mu_) = 0;
  bool in_snapshot_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<uint64_t> last_live_ ABSL_GUARDED_BY(mu_);
  std::optional<uint64_t> first_live_sequence_ ABSL_GUARDED_BY(mu_);
  uint64_t live_events_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Status final_status_ ABSL_GUARDED_BY(mu_);
};

class WatchEventsProcessTest : public DaemonProcessTest {
 protected:
  void SetUp() override {
    DaemonProcessTest::SetUp();
    pool_flag_ = "small:blocks=32:block_size=4";
    pool_name_ = "small";
    std::mt19937 random(15);
    // Prompts over a few shared prefixes: hits, resurrections and evictions all happen.
    for (uint32_t p = 0; p < 40; ++p) {
      std::vector<uint32_t> prompt = Tokens((p % 4) * 10000, (1 + p % 3) * kSmallBlockSize);
      const std::vector<uint32_t> tail = Tokens(p * 100 + 1, 1 + random() % (3 * kSmallBlockSize));
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      prompts_.push_back(std::move(prompt));
    }
  }

  std::unique_ptr<KvCacheClient> ConnectWorker() {
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(target_);
    EXPECT_OK(client);
    if (!client.ok()) return nullptr;
    EXPECT_OK((*client)->OpenSession("", "workload"));
    return *std::move(client);
  }

  // `steps` random requests, each opening a prompt, committing it and releasing it later.
  void RunWorkload(KvCacheClient& client, int steps, uint32_t seed) {
    std::mt19937 random(seed);
    std::vector<uint64_t> held;
    for (int step = 0; step < steps; ++step) {
      const std::vector<uint32_t>& prompt = prompts_[random() % prompts_.size()];
      absl::StatusOr<KvCacheClient::Sequence> opened = client.OpenSequence(pool_name_, prompt);
      if (opened.ok()) {
        ASSERT_OK(client.CommitSequence(opened->sequence_id, prompt.size()));
        held.push_back(opened->sequence_id);
      } else {
        ASSERT_EQ(opened.status().code(), absl::StatusCode::kResourceExhausted);
      }
      while (held.size() > random() % 3) {
        ASSERT_OK(client.ReleaseSequence(held.front()));
        held.erase(held.begin());
      }
    }
    for (uint64_t id : held) ASSERT_OK(client.ReleaseSequence(id));
  }

  // Polls until the watcher's index answers every prompt as the daemon's Lookup does.
  void ExpectConverges(const Watcher& watcher) {
    std::string mismatch;
    const bool converged = PollUntil([&] {
      for (const std::vector<uint32_t>& prompt : prompts_) {
        absl::StatusOr<KvCacheClient::LookupResult> lookup =
            observer_->Lookup(pool_name_, "", prompt);
        if (!lookup.ok()) return false;
        const uint32_t replayed = watcher.CachedBlocks(pool_name_, prompt);
        if (replayed != lookup->num_cached_blocks) {
          mismatch = absl::StrCat("prompt of ", prompt.size(), " tokens: events say ", replayed,
                                  " blocks, Lookup ", lookup->num_cached_blocks);
          return false;
        }
      }
      return true;
    });
    EXPECT_TRUE(converged) << mismatch;
    EXPECT_THAT(watcher.violations(), IsEmpty());
  }

  std::vector<std::vector<uint32_t>> prompts_;
};

TEST_F(WatchEventsProcessTest, AReplayOfTheStreamAnswersLikeLookup) {
  StartDaemon();
  Watcher watcher(target_, {});
  std::unique_ptr<KvCacheClient> worker = ConnectWorker();
  ASSERT_NE(worker, nullptr);
  RunWorkload(*worker, 400, 1);
  ExpectConverges(watcher);
  // Once the workload stops, the watcher catches up with the head the daemon reports.
  EXPECT_TRUE(PollUntil([&] { return watcher.next_sequence() == watcher.head_sequence(); }));
  EXPECT_GT(watcher.head_sequence(), 100u);
  // A fresh daemon still holds event 0: the watcher replayed from it, without a snapshot.
  EXPECT_EQ(watcher.snapshots(), 0);
  EXPECT_EQ(watcher.first_live_sequence(), 0u);
  const KvCacheClient::PoolStats stats = PoolStats();
  EXPECT_GT(stats.evictions, 20u);
  EXPECT_GT(stats.resurrected_blocks, 5u);
  EXPECT_GT(watcher.size(), 0u);
}

TEST_F(WatchEventsProcessTest, AWatcherCutOffAndResumedMissesAndDoublesNothing) {
  StartDaemon();
  Watcher reference(target_, {});
  std::unique_ptr<KvCacheClient> worker = ConnectWorker();
  ASSERT_NE(worker, nullptr);
  Watcher cut(target_, {});
  RunWorkload(*worker, 150, 2);
  ASSERT_TRUE(PollUntil([&] { return cut.live_events() > 20; }));
  cut.Stop();  // mid-stream: the workload may still be producing
  const uint64_t resume_from = cut.next_sequence();
  const uint64_t epoch = cut.epoch();
  EXPECT_EQ(cut.final_status().code(), absl::StatusCode::kCancelled);

  RunWorkload(*worker, 150, 3);
  cut.Start({.start_sequence = resume_from, .epoch = epoch});
  RunWorkload(*worker, 100, 4);
  ExpectConverges(reference);
  ExpectConverges(cut);
  ASSERT_TRUE(PollUntil([&] { return cut.next_sequence() == reference.next_sequence(); }));
  // Resumed exactly after the last event it had, with no snapshot: nothing missed (live events
  // came one after the other, checked as they arrived) and nothing doubled (the index would
  // have flagged a hash stored twice or removed while absent).
  EXPECT_EQ(cut.snapshots(), 0);
  EXPECT_EQ(cut.live_events(), reference.live_events());
  EXPECT_EQ(cut.size(), reference.size());
}

TEST_F(WatchEventsProcessTest, AStartTheDaemonNoLongerHoldsGetsASnapshotAndConverges) {
  extra_daemon_flags_ = {"--kv_events_buffer=8"};
  StartDaemon();
  std::unique_ptr<KvCacheClient> worker = ConnectWorker();
  ASSERT_NE(worker, nullptr);
  RunWorkload(*worker, 200, 5);
  {
    Watcher fresh(target_, {});  // event 0 is long gone
    ExpectConverges(fresh);
    EXPECT_EQ(fresh.snapshots(), 1);
    RunWorkload(*worker, 100, 6);
    ExpectConverges(fresh);
  }
  {
    // Numbers from another daemon's epoch mean nothing here.
    Watcher other_epoch(target_, {.start_sequence = 3, .epoch = 12345});
    ExpectConverges(other_epoch);
    EXPECT_EQ(other_epoch.snapshots(), 1);
  }
}

TEST_F(WatchEventsProcessTest, BadRequestsGetPreciseCodes) {
  StartDaemon();
  Watcher unknown_pool(target_, {.pool = "no-such-pool"});
  ASSERT_TRUE(PollUntil([&] { return !unknown_pool.final_status().ok(); }));
  EXPECT_EQ(unknown_pool.final_status().code(), absl::StatusCode::kNotFound);
  Watcher other_tenant(target_, {.tenant = "someone-else"});
  ASSERT_TRUE(PollUntil([&] { return !other_tenant.final_status().ok(); }));
  EXPECT_EQ(other_tenant.final_status().code(), absl::StatusCode::kPermissionDenied);
  // The daemon serves on.
  EXPECT_OK(observer_->Ping());
}

}  // namespace
}  // namespace kvcache::testing
