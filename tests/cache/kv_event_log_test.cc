// KvEventLog on its own (sequence, buffer, snapshot) and fed by a Pool: every hash that enters or
// leaves the prefix index is reported once, in order, so a replay of the events answers every
// prompt as the pool's own Lookup does.
#include "cache/kv_event_log.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <numeric>
#include <random>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "cache/pool.h"
#include "tests/testing/event_index.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/small_pool_options.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::IsEmpty;

Hash128 H(uint64_t n) { return Hash128{.hi = n * 7, .lo = n}; }
// An ordered key for a Hash128.
using Hash128Key = std::pair<uint64_t, uint64_t>;
Hash128Key Key(const Hash128& hash) { return {hash.hi, hash.lo}; }

StoredBlock Block(uint64_t n) {
  return StoredBlock{.hash = H(n), .token_ids = {uint32_t(n), uint32_t(n + 1)}, .extras_digest = 0};
}

TEST(KvEventLogTest, StartsWithAllBlocksClearedAtZero) {
  KvEventLog log;
  EXPECT_EQ(log.next_sequence(), 1u);
  EXPECT_EQ(log.first_sequence(), 0u);
  KvEventLog::ReadResult read = log.Read(0, 10);
  ASSERT_EQ(read.events.size(), 1u);
  EXPECT_EQ(read.events[0]->sequence, 0u);
  EXPECT_EQ(read.events[0]->kind, KvEventKind::kAllBlocksCleared);
  EXPECT_EQ(read.events[0]->pool, "");
  EXPECT_EQ(read.next_sequence, 1u);
}

TEST(KvEventLogTest, RemovalsAreGroupedByOwnerAndUnknownHashesDropped) {
  KvEventLog log;
  log.AddPool(0, "p", "CPU", 2);
  log.BlocksStored(0, "a", std::nullopt, {Block(1), Block(2)});
  log.BlocksStored(0, "b", std::nullopt, {Block(3)});
  log.BlocksRemoved(0, {H(2), H(99), H(3), H(1)});
  KvEventLog::ReadResult read = log.Read(1, 10);
  ASSERT_EQ(read.events.size(), 4u);
  EXPECT_EQ(read.events[0]->kind, KvEventKind::kBlocksStored);
  EXPECT_EQ(read.events[0]->parent_hash, std::nullopt);
  EXPECT_EQ(read.events[0]->blocks.size(), 2u);
  EXPECT_EQ(read.events[0]->medium, "CPU");
  EXPECT_EQ(read.events[0]->block_size, 2u);
  EXPECT_EQ(read.events[2]->tenant, "a");
  EXPECT_THAT(read.events[2]->removed, ElementsAre(H(2), H(1)));
  EXPECT_EQ(read.events[3]->tenant, "b");
  EXPECT_THAT(read.events[3]->removed, ElementsAre(H(3)));
  EXPECT_EQ(log.indexed_blocks(), 0u);
  // A hash removed again is not announced again.
  log.BlocksRemoved(0, {H(1)});
  EXPECT_EQ(log.next_sequence(), 5u);
}

TEST(KvEventLogTest, ABufferOverflowMakesOldStartsLost) {
  KvEventLog log(/*capacity=*/3);
  log.AddPool(0, "p", "CPU", 2);
  for (uint64_t n = 1; n <= 5; ++n) log.BlocksStored(0, "a", std::nullopt, {Block(n)});
  EXPECT_EQ(log.next_sequence(), 6u);
  EXPECT_EQ(log.first_sequence(), 3u);
  EXPECT_TRUE(log.Read(2, 10).lost);
  KvEventLog::ReadResult read = log.Read(3, 2);
  EXPECT_FALSE(read.lost);
  ASSERT_EQ(read.events.size(), 2u);
  EXPECT_EQ(read.events[1]->sequence, 4u);
  EXPECT_EQ(read.next_sequence, 5u);
  EXPECT_THAT(log.Read(6, 10).events, IsEmpty());
}

TEST(KvEventLogTest, WaitForWakesOnAppend) {
  KvEventLog log;
  log.AddPool(0, "p", "CPU", 2);
  EXPECT_FALSE(log.WaitFor(1, absl::Milliseconds(10)));
  std::thread appender([&] {
    absl::SleepFor(absl::Milliseconds(20));
    log.BlocksStored(0, "a", std::nullopt, {Block(1)});
  });
  EXPECT_TRUE(log.WaitFor(1, absl::Seconds(30)));
  appender.join();
}

// The documented bound ("at most 25 ms after they happen") holds by construction: a burst is read
// at a deadline counted from its first event's own time, not from when a consumer woke up for it
// (a 25 ms sleep after the wake-up sent a lone event 25.2-25.9 ms late), with room left to send.
TEST(KvEventLogTest, ABurstIsReadWithinTheBoundOfItsFirstEvent) {
  EXPECT_LE(kKvEventFlushDelay + kKvEventSendAllowance, kKvEventMaxDelay);
  EXPECT_GT(kKvEventSendAllowance, absl::ZeroDuration());
  EXPECT_EQ(kKvEventMaxDelay, absl::Milliseconds(25));  // docs/operations.md
  testing::FakeClock clock;
  KvEventLog log(/*capacity=*/3, &clock);
  log.AddPool(0, "p", "CPU", 2);
  clock.Advance(absl::Seconds(5));
  const absl::Time recorded = clock.Now();
  log.BlocksStored(0, "a", std::nullopt, {Block(1)});
  clock.Advance(absl::Milliseconds(7));  // the consumer wakes up late
  EXPECT_EQ(log.FlushDeadline(1), recorded + kKvEventFlushDelay);
  log.BlocksStored(0, "a", std::nullopt, {Block(2)});
  EXPECT_EQ(log.FlushDeadline(1), recorded + kKvEventFlushDelay);  // later events change nothing
  // Nothing held at `start` (not yet, or no longer): read now.
  EXPECT_EQ(log.FlushDeadline(3), clock.Now());
  log.BlocksStored(0, "a", std::nullopt, {Block(3)});
  log.BlocksStored(0, "a", std::nullopt, {Block(4)});
  EXPECT_EQ(log.FlushDeadline(0), clock.Now());
  clock.Advance(absl::Seconds(1));
  log.WaitForFlush(1);  // long past: returns at once
}

TEST(KvEventLogTest, SnapshotPutsParentsFirstAndFilters) {
  KvEventLog log;
  log.AddPool(0, "p", "CPU", 2);
  log.AddPool(1, "q", "GPU", 2);
  // A long chain stored in pieces, so the log's map order cannot match the chain's.
  log.BlocksStored(0, "a", std::nullopt, {Block(1)});
  for (uint64_t n = 2; n <= 40; ++n) log.BlocksStored(0, "a", H(n - 1), {Block(n)});
  log.BlocksStored(0, "b", std::nullopt, {Block(100)});
  log.BlocksStored(1, "a", std::nullopt, {Block(200)});

  KvEventLog::Snapshot all = log.TakeSnapshot(KvEventFilter{});
  EXPECT_EQ(all.next_sequence, log.next_sequence());
  ASSERT_EQ(all.events.size(), 42u);
  testing::EventIndex index;
  for (const KvEvent& event : all.events) {
    EXPECT_EQ(event.sequence, all.next_sequence - 1);
    ASSERT_EQ(event.blocks.size(), 1u);
    index.Store(event.pool, event.tenant, event.parent_hash, event.blocks[0].hash,
                event.blocks[0].token_ids);
  }
  EXPECT_THAT(index.violations(), IsEmpty());

  KvEventLog::Snapshot tenant_b = log.TakeSnapshot(KvEventFilter{.tenant = "b"});
  ASSERT_EQ(tenant_b.events.size(), 1u);
  EXPECT_EQ(tenant_b.events[0].blocks[0].hash, H(100));
  KvEventLog::Snapshot pool_q = log.TakeSnapshot(KvEventFilter{.pool = "q"});
  ASSERT_EQ(pool_q.events.size(), 1u);
  EXPECT_EQ(pool_q.events[0].medium, "GPU");
}

// A block held by tier 1 and a lower tier at once is indexed once per medium: removal from one
// leaves the other, and a snapshot carries each medium's copy, parents first across media.
TEST(KvEventLogTest, TheMediumIsPartOfTheIndexAndTheSnapshot) {
  KvEventLog log;
  log.AddPool(0, "p", "CPU", 2);
  log.BlocksStored(0, "a", std::nullopt, {Block(1), Block(2)});
  log.BlocksStoredIn(0, kKvMediumCpuPinned, "a", H(1), {Block(2)});
  log.BlocksStoredIn(0, kKvMediumDisk, "a", H(1), {Block(2)});
  EXPECT_EQ(log.indexed_blocks(), 4u);

  log.BlocksRemoved(0, {H(2)});  // tier 1 evicts block 2: tier 2 and the disk still hold it
  log.BlocksRemovedFrom(0, kKvMediumDisk, {H(2), H(1)});  // H(1) was never on disk: dropped
  KvEventLog::ReadResult read = log.Read(1, 10);
  ASSERT_EQ(read.events.size(), 5u);
  EXPECT_EQ(read.events[1]->medium, "CPU_PINNED");
  EXPECT_EQ(read.events[1]->parent_hash, H(1));
  EXPECT_EQ(read.events[2]->medium, "DISK");
  EXPECT_EQ(read.events[3]->kind, KvEventKind::kBlocksRemoved);
  EXPECT_EQ(read.events[3]->medium, "CPU");
  EXPECT_EQ(read.events[4]->medium, "DISK");
  EXPECT_THAT(read.events[4]->removed, ElementsAre(H(2)));

  KvEventLog::Snapshot snapshot = log.TakeSnapshot(KvEventFilter{});
  ASSERT_EQ(snapshot.events.size(), 2u);
  // H(2) in tier 2 comes after its parent, which only tier 1 holds.
  EXPECT_EQ(snapshot.events[0].medium, "CPU");
  EXPECT_EQ(snapshot.events[0].blocks[0].hash, H(1));
  EXPECT_EQ(snapshot.events[1].medium, "CPU_PINNED");
  EXPECT_EQ(snapshot.events[1].blocks[0].hash, H(2));
  EXPECT_EQ(snapshot.events[1].parent_hash, H(1));
  EXPECT_EQ(snapshot.events[1].tenant, "a");

  // A lower tier takes its tenant and parent from any medium's announcement.
  std::optional<KvEventLog::Announcement> announced = log.FindAnnounced(0, H(2));
  ASSERT_TRUE(announced.has_value());
  EXPECT_EQ(announced->tenant, "a");
  EXPECT_EQ(announced->parent_hash, H(1));
  EXPECT_EQ(log.FindAnnounced(0, H(3)), std::nullopt);
}

// The cluster tier's stores reach watchers but are never indexed: their removals are never seen.
TEST(KvEventLogTest, LiveOnlyStoresAreSentButNotSnapshotted) {
  KvEventLog log;
  log.AddPool(0, "p", "CPU", 2);
  log.BlocksStoredIn(0, kKvMediumExternal, "a", std::nullopt, {Block(1)},
                     KvEventRetention::kLiveOnly);
  KvEventLog::ReadResult read = log.Read(1, 10);
  ASSERT_EQ(read.events.size(), 1u);
  EXPECT_EQ(read.events[0]->medium, "EXTERNAL");
  EXPECT_EQ(log.indexed_blocks(), 0u);
  EXPECT_THAT(log.TakeSnapshot(KvEventFilter{}).events, IsEmpty());
}

// Pages are announced by their engine keys, which their removal and a snapshot carry too: a
// router removes by the key it stored, and a watcher resuming from a snapshot sees the same
// names. A call's pages are one event, and no page has a parent, in the event or the snapshot.
TEST(KvEventLogTest, PagesCarryTheirKeysInTheirStoreTheirRemovalAndTheSnapshot) {
  KvEventLog log;
  log.AddPool(0, "p", "CPU", 2);
  const std::string key("engine\0key", 10);
  log.BlocksStored(0, "a", std::nullopt, {Block(1)});
  log.PagesStored(0, "a",
                  {StoredBlock{.hash = H(2), .extras_digest = 3},
                   StoredBlock{.hash = H(3), .extras_digest = 1}},
                  {key, "key-3"}, "00ff");
  KvEventLog::Snapshot snapshot = log.TakeSnapshot({});
  ASSERT_EQ(snapshot.events.size(), 3u);
  for (const KvEvent& event : snapshot.events) {
    if (event.blocks[0].hash == H(1)) {
      EXPECT_THAT(event.page_keys, IsEmpty());
      EXPECT_EQ(event.manifest_digest, "");
    } else {
      EXPECT_THAT(event.page_keys, ElementsAre(event.blocks[0].hash == H(2) ? key : "key-3"));
      EXPECT_EQ(event.manifest_digest, "00ff");
      EXPECT_EQ(event.parent_hash, std::nullopt);
    }
  }
  const std::optional<KvEventLog::Announcement> announced = log.FindAnnounced(0, H(2));
  ASSERT_TRUE(announced.has_value());
  ASSERT_TRUE(announced->page.has_value());
  EXPECT_EQ(announced->page->key, key);
  EXPECT_EQ(announced->page->manifest_digest, "00ff");
  EXPECT_EQ(log.FindAnnounced(0, H(3))->parent_hash, std::nullopt);
  EXPECT_EQ(log.FindAnnounced(0, H(3))->page->key, "key-3");
  EXPECT_FALSE(log.FindAnnounced(0, H(1))->page.has_value());

  // A token block's removal pays nothing; one with a page names every hash, "" for tokens.
  log.BlocksRemoved(0, {H(2), H(1)});
  KvEventLog::ReadResult read = log.Read(1, 10);
  ASSERT_EQ(read.events.size(), 3u);
  EXPECT_THAT(read.events[0]->page_keys, IsEmpty());
  EXPECT_THAT(read.events[1]->page_keys, ElementsAre(key, "key-3"));
  EXPECT_EQ(read.events[1]->parent_hash, std::nullopt);
  EXPECT_THAT(read.events[1]->blocks[0].token_ids, IsEmpty());
  EXPECT_THAT(read.events[2]->removed, ElementsAre(H(2), H(1)));
  EXPECT_THAT(read.events[2]->page_keys, ElementsAre(key, ""));
  log.BlocksStored(0, "a", std::nullopt, {Block(4)});
  log.BlocksRemoved(0, {H(4)});
  EXPECT_THAT(log.Read(5, 1).events[0]->page_keys, IsEmpty());
}

// The log keeps its own compact copy of each indexed block, not the event that announced it: a
// snapshot must still give back every field exactly — tokens of any width (the largest uint32
// included) and count, extras digests, parents — after the events have left the buffer and
// entries have been freed and reused.
TEST(KvEventLogTest, TheSnapshotGivesBackExactlyWhatWasStored) {
  KvEventLog log(/*capacity=*/1);
  log.AddPool(0, "p", "CPU", 2);
  std::map<Hash128Key, StoredBlock> expected;
  std::map<Hash128Key, std::optional<Hash128>> parents;
  auto store = [&](uint64_t n, std::vector<uint32_t> tokens, std::optional<Hash128> parent) {
    StoredBlock block{.hash = H(n),
                      .token_ids = BlockTokenIds(tokens.begin(), tokens.end()),
                      .extras_digest = n * 3};
    expected[Key(H(n))] = block;
    parents[Key(H(n))] = parent;
    log.BlocksStored(0, "a", parent, {block});
  };
  // Enough blocks for two token chunks, the second widened to 32 bits by its last block.
  const uint64_t num_blocks = 5000;
  for (uint64_t n = 1; n <= num_blocks; ++n) {
    store(n, {uint32_t(n), uint32_t(n % 7)}, n == 1 ? std::nullopt : std::optional(H(n - 1)));
  }
  store(num_blocks + 1, {0xffffffffu, 1}, H(num_blocks));
  store(num_blocks + 2, {1, 2, 3}, std::nullopt);  // a count other than the block size
  // Freed entries are reused for new blocks.
  std::vector<Hash128> gone;
  for (uint64_t n = 100; n < 200; ++n) gone.push_back(H(n));
  log.BlocksRemoved(0, gone);
  for (const Hash128& hash : gone) expected.erase(Key(hash));
  for (uint64_t n = 1; n <= 50; ++n) store(num_blocks + 10 + n, {uint32_t(1u << 30), 5}, H(n));

  KvEventLog::Snapshot snapshot = log.TakeSnapshot({});
  EXPECT_EQ(log.indexed_blocks(), expected.size());
  ASSERT_EQ(snapshot.events.size(), expected.size());
  for (const KvEvent& event : snapshot.events) {
    const auto it = expected.find(Key(event.blocks[0].hash));
    ASSERT_NE(it, expected.end());
    EXPECT_EQ(event.blocks[0].token_ids, it->second.token_ids);
    EXPECT_EQ(event.blocks[0].extras_digest, it->second.extras_digest);
    EXPECT_EQ(event.parent_hash, parents[it->first]);
    EXPECT_EQ(event.tenant, "a");
  }
}

// A snapshot holds the log's mutex only to copy the index: the pools' events, which wait for
// that mutex under each pool's own, go on while its events are built (with the mutex held
// throughout, the hook's calls would never return), and what they change after the copy is not
// in it.
TEST(KvEventLogTest, ASnapshotBuildsItsEventsWithoutHoldingTheLog) {
  KvEventLog log;
  log.AddPool(0, "p", "CPU", 2);
  log.BlocksStored(0, "a", std::nullopt, {Block(1)});
  log.BlocksStored(0, "a", H(1), {Block(2), Block(3)});
  const uint64_t copied_at = log.next_sequence();
  bool hook_ran = false;
  log.SetSnapshotHookForTesting([&](KvEventLog::SnapshotStage stage) {
    if (stage != KvEventLog::SnapshotStage::kCopied) return;
    hook_ran = true;
    log.BlocksStored(0, "a", H(3), {Block(4)});
    log.BlocksRemoved(0, {H(1), H(2), H(3)});
  });
  KvEventLog::Snapshot snapshot = log.TakeSnapshot({});
  EXPECT_TRUE(hook_ran);
  EXPECT_EQ(snapshot.next_sequence, copied_at);
  std::vector<Hash128> hashes;
  for (const KvEvent& event : snapshot.events) hashes.push_back(event.blocks[0].hash);
  EXPECT_THAT(hashes, ElementsAre(H(1), H(2), H(3)));  // parents first
  EXPECT_EQ(snapshot.events[2].parent_hash, H(2));
  EXPECT_THAT(snapshot.events[2].blocks[0].token_ids, ElementsAre(3u, 4u));
  EXPECT_EQ(log.next_sequence(), copied_at + 2);
  EXPECT_EQ(log.indexed_blocks(), 1u);  // block 4 alone, stored meanwhile
}

// The copy's memory is made ready from sizes read before the copy: blocks indexed in between,
// more than the room it keeps for growth, in a new token chunk, and a token that widens a chunk,
// are all in the snapshot, as of the copy.
TEST(KvEventLogTest, ASnapshotHoldsWhatWasIndexedBetweenItsSizesAndItsCopy) {
  constexpr uint32_t kBlockSize = 2;
  KvEventLog log;
  log.AddPool(0, "p", "CPU", kBlockSize);
  auto block = [](uint64_t id, uint32_t token) {
    return StoredBlock{.hash = H(id), .token_ids = {token, token + 1}};
  };
  uint64_t next_id = 1;
  for (; next_id <= 3000; ++next_id) {
    log.BlocksStored(0, "a", std::nullopt, {block(next_id, static_cast<uint32_t>(next_id))});
  }
  const uint64_t wide_id = next_id;
  uint64_t added = 0;
  log.SetSnapshotHookForTesting([&](KvEventLog::SnapshotStage stage) {
    if (stage != KvEventLog::SnapshotStage::kShaped || added > 0) return;
    // The next entry is in the first chunk of tokens (4,096 entries a chunk), which a token of
    // 32 bits widens; 3,000 entries got room for 3,000 + 187 + 1,024, and 6,000 more overflow
    // it, into chunks that did not exist when the sizes were read.
    log.BlocksStored(0, "a", std::nullopt, {block(next_id++, 0xFFFFFFF0u)});
    for (added = 1; added <= 6000; ++added, ++next_id) {
      log.BlocksStored(0, "a", std::nullopt, {block(next_id, static_cast<uint32_t>(next_id))});
    }
  });
  const KvEventLog::Snapshot snapshot = log.TakeSnapshot({});
  ASSERT_EQ(added, 6001u);
  ASSERT_EQ(snapshot.events.size(), 9001u);
  ASSERT_EQ(next_id, 9002u);
  EXPECT_EQ(snapshot.next_sequence, log.next_sequence());
  absl::flat_hash_map<Hash128, std::vector<uint32_t>> tokens;
  for (const KvEvent& event : snapshot.events) {
    tokens[event.blocks[0].hash] = {event.blocks[0].token_ids.begin(),
                                    event.blocks[0].token_ids.end()};
  }
  for (uint64_t id = 1; id < next_id; ++id) {
    if (id == wide_id) continue;
    ASSERT_THAT(tokens[H(id)], ElementsAre(id, id + 1)) << id;
  }
  EXPECT_THAT(tokens[H(wide_id)], ElementsAre(0xFFFFFFF0u, 0xFFFFFFF1u));
}

TEST(KvEventLogTest, FilterLetsEveryoneSeeAClearOfAllPools) {
  KvEvent cleared_all{.kind = KvEventKind::kAllBlocksCleared};
  KvEvent stored{.kind = KvEventKind::kBlocksStored, .pool = "p", .tenant = "a"};
  EXPECT_TRUE((KvEventFilter{.tenant = "b", .pool = "q"}).Matches(cleared_all));
  EXPECT_TRUE((KvEventFilter{.tenant = "a"}).Matches(stored));
  EXPECT_FALSE((KvEventFilter{.tenant = "b"}).Matches(stored));
  EXPECT_FALSE((KvEventFilter{.pool = "q"}).Matches(stored));
}

// A Pool reporting into a log.
class PoolEventsTest : public ::testing::Test {
 protected:
  static constexpr uint32_t kBlockSize = 4;
  static constexpr uint32_t kNumBlocks = 24;

  void SetUp() override {
    PoolOptions options = testing::SmallPoolOptions("small", kNumBlocks, kBlockSize);
    auto memory = HostPoolMemory::Create(options.layout.BlockBytes(), options.num_blocks);
    ASSERT_OK(memory);
    log_.AddPool(0, options.name, "CPU", kBlockSize);
    auto pool = Pool::Create(options, 0, *std::move(memory), nullptr, nullptr, &log_, &clock_);
    ASSERT_OK(pool);
    pool_ = *std::move(pool);
  }
  void TearDown() override { EXPECT_OK(pool_->CheckInvariants()); }

  // Opens, commits every full block and releases.
  void Compute(const std::vector<uint32_t>& tokens) {
    auto opened = pool_->Open(session_, SequenceSpec{.tokens = tokens});
    ASSERT_OK(opened);
    ASSERT_OK(pool_->Commit(session_, opened->sequence_id, tokens.size()));
    ASSERT_OK(pool_->Release(session_, opened->sequence_id));
  }

  // Applies every event not applied yet.
  void Replay() {
    KvEventLog::ReadResult read = log_.Read(replayed_, 1 << 20);
    ASSERT_FALSE(read.lost);
    for (const auto& event : read.events) {
      switch (event->kind) {
        case KvEventKind::kBlocksStored: {
          std::optional<Hash128> parent = event->parent_hash;
          for (const StoredBlock& block : event->blocks) {
            index_.Store(event->pool, event->tenant, parent, block.hash, block.token_ids);
            parent = block.hash;
          }
          break;
        }
        case KvEventKind::kBlocksRemoved:
          for (const Hash128& hash : event->removed) index_.Remove(event->pool, hash);
          break;
        case KvEventKind::kAllBlocksCleared:
          index_.Clear(event->pool);
          break;
      }
    }
    replayed_ = read.next_sequence;
  }

  testing::FakeClock clock_;
  KvEventLog log_;
  std::unique_ptr<Pool> pool_;
  Session session_{1, "uid:1", "tenant-a", "test", absl::Seconds(10)};
  testing::EventIndex index_;
  uint64_t replayed_ = 0;
};

std::vector<uint32_t> Tokens(uint32_t first, size_t n) {
  std::vector<uint32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

TEST_F(PoolEventsTest, ACommitIsOneChainAndASharedPrefixIsNotAnnouncedAgain) {
  const uint64_t start = log_.next_sequence();
  Compute(Tokens(0, 3 * kBlockSize + 1));
  KvEventLog::ReadResult first = log_.Read(start, 10);
  ASSERT_EQ(first.events.size(), 1u);
  const KvEvent& stored = *first.events[0];
  EXPECT_EQ(stored.kind, KvEventKind::kBlocksStored);
  EXPECT_EQ(stored.pool, "small");
  EXPECT_EQ(stored.tenant, "tenant-a");
  EXPECT_EQ(stored.parent_hash, std::nullopt);
  ASSERT_EQ(stored.blocks.size(), 3u);
  EXPECT_THAT(stored.blocks[1].token_ids, ElementsAreArray(Tokens(kBlockSize, kBlockSize)));

  // The same two leading blocks, then two new ones: one event whose parent is block 1.
  std::vector<uint32_t> longer = Tokens(0, 2 * kBlockSize);
  const std::vector<uint32_t> tail = Tokens(1000, 2 * kBlockSize + 1);
  longer.insert(longer.end(), tail.begin(), tail.end());
  Compute(longer);
  KvEventLog::ReadResult second = log_.Read(first.next_sequence, 10);
  ASSERT_EQ(second.events.size(), 1u);
  EXPECT_EQ(second.events[0]->parent_hash, stored.blocks[1].hash);
  EXPECT_EQ(second.events[0]->blocks.size(), 2u);
}

TEST_F(PoolEventsTest, EvictionsAreRemovalsAndResidencyIsTimed) {
  // Fill the pool with released chains, then one prompt that needs every block.
  for (uint32_t i = 0; i < kNumBlocks / 4; ++i) {
    Compute(Tokens(i * 100, 4 * kBlockSize));
    clock_.Advance(absl::Seconds(1));
  }
  Replay();
  EXPECT_EQ(index_.size(), kNumBlocks);
  clock_.Advance(absl::Seconds(10));
  Compute(Tokens(50000, kNumBlocks * kBlockSize - 1));
  Replay();
  EXPECT_THAT(index_.violations(), IsEmpty());
  // Every block but the last (partial, never published) holds the new prompt.
  EXPECT_EQ(index_.size(), kNumBlocks - 1);
  const PoolStatsSnapshot stats = pool_->Stats();
  EXPECT_EQ(stats.pool.evictions, kNumBlocks);
  const HistogramSnapshot lifetime = pool_->Residency().lifetime;
  EXPECT_EQ(lifetime.count, kNumBlocks);
  // Allocated 10 to 15 simulated seconds before their eviction.
  EXPECT_GE(lifetime.sum, kNumBlocks * 10.0);
  EXPECT_LE(lifetime.sum, kNumBlocks * 16.0);
  EXPECT_EQ(pool_->Residency().idle_before_evict.count, kNumBlocks);
}

TEST_F(PoolEventsTest, AChildPublishedUnderAnotherSequencesParentLeavesWithIt) {
  // Two sequences compute one prompt at once; the first commits only its first block, so the
  // second's block 1 is published under the first's block 0 (its own block 0 is a duplicate).
  const std::vector<uint32_t> prompt = Tokens(0, 2 * kBlockSize + 1);
  auto first = pool_->Open(session_, SequenceSpec{.tokens = prompt});
  auto second = pool_->Open(session_, SequenceSpec{.tokens = prompt});
  ASSERT_OK(first);
  ASSERT_OK(second);
  ASSERT_OK(pool_->Commit(session_, first->sequence_id, kBlockSize));
  ASSERT_OK(pool_->Commit(session_, second->sequence_id, 2 * kBlockSize));
  ASSERT_OK(pool_->Release(session_, first->sequence_id));
  ASSERT_OK(pool_->Release(session_, second->sequence_id));
  // A prompt that needs every free block and one more evicts the first sequence's block 0, the
  // parent the second's block 1 hangs off: both hashes leave the index together.
  const PoolStatsSnapshot before = pool_->Stats();
  ASSERT_EQ(before.evictable, 2u);
  Compute(Tokens(50000, before.free * kBlockSize + 1));
  EXPECT_EQ(pool_->Stats().pool.evictions, 2u);
  Replay();
  EXPECT_THAT(index_.violations(), IsEmpty());
  EXPECT_EQ(index_.CachedBlocks("small", session_.tenant, prompt, kBlockSize), 0u);
  // Computed again, the prompt is cached again in full, and the events say the same.
  Compute(prompt);
  Replay();
  auto lookup = pool_->Lookup(session_.tenant, SequenceSpec{.tokens = prompt});
  ASSERT_OK(lookup);
  EXPECT_EQ(lookup->num_cached_blocks, 2u);
  EXPECT_EQ(index_.CachedBlocks("small", session_.tenant, prompt, kBlockSize), 2u);
  EXPECT_THAT(index_.violations(), IsEmpty());
}

TEST_F(PoolEventsTest, ReplayAnswersLikeLookupAfterARandomWorkload) {
  std::mt19937 random(15);
  // Prompts built from a few shared prefixes, so hits, resurrections and evictions all happen.
  std::vector<std::vector<uint32_t>> prompts;
  for (uint32_t p = 0; p < 40; ++p) {
    std::vector<uint32_t> prompt = Tokens((p % 4) * 10000, (1 + p % 3) * kBlockSize);
    const std::vector<uint32_t> tail = Tokens(p * 100 + 1, 1 + random() % (3 * kBlockSize));
    prompt.insert(prompt.end(), tail.begin(), tail.end());
    prompts.push_back(std::move(prompt));
  }
  std::vector<uint64_t> held;  // sequences kept open a while: referenced blocks
  for (int step = 0; step < 600; ++step) {
    const std::vector<uint32_t>& prompt = prompts[random() % prompts.size()];
    auto opened = pool_->Open(session_, SequenceSpec{.tokens = prompt});
    if (!opened.ok()) {
      ASSERT_EQ(opened.status().code(), absl::StatusCode::kResourceExhausted);
    } else {
      ASSERT_OK(pool_->Commit(session_, opened->sequence_id, prompt.size()));
      held.push_back(opened->sequence_id);
    }
    while (held.size() > random() % 3) {
      ASSERT_OK(pool_->Release(session_, held.front()));
      held.erase(held.begin());
    }
    if (step % 50 == 0) {
      Replay();
      for (const auto& probe : prompts) {
        auto lookup = pool_->Lookup(session_.tenant, SequenceSpec{.tokens = probe});
        ASSERT_OK(lookup);
        ASSERT_EQ(index_.CachedBlocks("small", session_.tenant, probe, kBlockSize),
                  lookup->num_cached_blocks)
            << "step " << step;
      }
    }
  }
  Replay();
  EXPECT_THAT(index_.violations(), IsEmpty());
  EXPECT_GT(pool_->Stats().pool.evictions, 50u);
  EXPECT_GT(pool_->Stats().pool.resurrections, 10u);
  // The log's own copy of the index is the pool's.
  EXPECT_EQ(log_.indexed_blocks(), index_.size());
  for (uint64_t id : held) ASSERT_OK(pool_->Release(session_, id));
}

}  // namespace
}  // namespace kvcache
