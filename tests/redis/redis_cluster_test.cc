// RedisCluster against a real 3-master Redis Cluster (tests/testing/redis_cluster_process.h):
// slots as the cluster computes them, round trips over every node, MOVED and ASK while a slot
// migrates, a master killed and restarted, an unreachable cluster.
#include "redis/redis_cluster.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/redis_cluster_process.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::PollUntil;
using ::kvcache::testing::RedisClusterProcess;
using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// Deterministic bytes of `size` for `key`, so every read can be checked.
std::string ValueOf(const std::string& key, size_t size) {
  std::string value(size, '\0');
  uint64_t state = std::hash<std::string>()(key) | 1;
  for (size_t i = 0; i < size; ++i) {
    state = state * 6364136223846793005ULL + 1442695040888963407ULL;
    value[i] = static_cast<char>(state >> 56);
  }
  return value;
}

TEST(RedisKeySlotTest, MatchesRedisCrc16AndHashTags) {
  // The reference value of Redis' cluster specification: CRC16("123456789") = 0x31C3.
  EXPECT_EQ(RedisCluster::KeySlot("123456789"), 0x31C3 % kRedisClusterSlots);
  EXPECT_EQ(RedisCluster::KeySlot("{user1000}.following"),
            RedisCluster::KeySlot("{user1000}.followers"));
  EXPECT_EQ(RedisCluster::KeySlot("{user1000}.following"), RedisCluster::KeySlot("user1000"));
  // An empty tag hashes the whole key.
  EXPECT_EQ(RedisCluster::KeySlot("foo{}{bar}"), RedisCluster::KeySlot(std::string("foo{}{bar}")));
  EXPECT_NE(RedisCluster::KeySlot("foo{}{bar}"), RedisCluster::KeySlot("bar"));
  EXPECT_EQ(RedisCluster::KeySlot("foo{{bar}}zap"), RedisCluster::KeySlot("{bar"));
}

TEST(RedisClusterCreateTest, RefusesBadSeedsAndServesMissesWhenNothingAnswers) {
  EXPECT_THAT(RedisCluster::Create({}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(RedisCluster::Create({.seeds = {"no-port"}}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("HOST:PORT")));
  // Port 1 on loopback: nothing listens there. The client still comes up.
  absl::StatusOr<std::unique_ptr<RedisCluster>> cluster =
      RedisCluster::Create({.seeds = {"127.0.0.1:1"}});
  ASSERT_OK(cluster);
  const std::vector<absl::StatusOr<std::string>> got = (*cluster)->Get({"a", "b"});
  for (const auto& result : got) EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_EQ((*cluster)->MappedSlots(), 0);
  EXPECT_THAT((*cluster)->RefreshSlots(), StatusIs(absl::StatusCode::kUnavailable));
}

class RedisClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<RedisClusterProcess>> cluster =
        RedisClusterProcess::Start(dir_.path(), 3, ExtraConfig());
    ASSERT_OK(cluster);
    redis_ = *std::move(cluster);
    RedisClusterOptions options;
    options.seeds = {redis_->address(0)};
    options.password = Password();
    options.retry_down_after = absl::Milliseconds(200);
    absl::StatusOr<std::unique_ptr<RedisCluster>> client = RedisCluster::Create(options);
    ASSERT_OK(client);
    client_ = *std::move(client);
  }
  void TearDown() override {
    client_.reset();
    redis_.reset();
  }
  virtual std::vector<std::string> ExtraConfig() { return {}; }
  virtual std::string Password() { return ""; }

  // `count` keys spread over every node, with values of varied sizes up to 256 KiB.
  std::vector<std::pair<std::string, std::string>> Entries(int count, const std::string& prefix) {
    std::vector<std::pair<std::string, std::string>> entries;
    for (int i = 0; i < count; ++i) {
      const std::string key = absl::StrCat(prefix, i);
      entries.emplace_back(key, ValueOf(key, (i * 7919) % (256 << 10)));
    }
    return entries;
  }

  static std::vector<std::string> Keys(
      const std::vector<std::pair<std::string, std::string>>& entries) {
    std::vector<std::string> keys;
    for (const auto& [key, value] : entries) keys.push_back(key);
    return keys;
  }

  ScopedTempDir dir_{"kvcache-redis"};  // the nodes' files
  std::unique_ptr<RedisClusterProcess> redis_;
  std::unique_ptr<RedisCluster> client_;
};

TEST_F(RedisClusterTest, SlotsAgreeWithTheCluster) {
  for (const std::string key : {"a", "block:0123456789abcdef", "{tag}x", "x{tag}", "kv\x01\xff"}) {
    absl::StatusOr<std::string> slot = redis_->Cli(0, {"CLUSTER", "KEYSLOT", key});
    ASSERT_OK(slot);
    int expected = -1;
    ASSERT_TRUE(absl::SimpleAtoi(absl::StripAsciiWhitespace(*slot), &expected)) << *slot;
    EXPECT_EQ(RedisCluster::KeySlot(key), expected) << key;
  }
}

// A value in pieces arrives whole: the pieces in order, empty ones and an empty value included.
TEST_F(RedisClusterTest, SetFromPiecesStoresEachValueItsPiecesJoined) {
  const auto entries = Entries(40, "pieces:");
  std::vector<RedisCluster::SetEntry> pieces;
  std::vector<std::string> expected;
  for (size_t i = 0; i < entries.size(); ++i) {
    const absl::string_view value = entries[i].second;
    const size_t cut = value.size() / 3;
    pieces.push_back({.key = entries[i].first,
                      .value = {value.substr(0, cut), absl::string_view(), value.substr(cut)}});
    expected.push_back(entries[i].second);
  }
  pieces.push_back({.key = "pieces:empty", .value = {}});
  expected.push_back("");
  for (const absl::Status& status : client_->SetFromPieces(pieces)) EXPECT_OK(status);
  std::vector<std::string> keys = Keys(entries);
  keys.push_back("pieces:empty");
  const auto got = client_->Get(keys);
  for (size_t i = 0; i < keys.size(); ++i) {
    ASSERT_OK(got[i]) << keys[i];
    EXPECT_TRUE(*got[i] == expected[i]) << keys[i];
  }
}

// SetAsMade asks for each value just before writing it, in the keys' order across nodes, and
// sends what it wrote before it waits for a value not yet made: another client sees the first key
// stored while the last value is still being made. A value that could not be made is not sent.
TEST_F(RedisClusterTest, SetAsMadeSendsWhatItWroteBeforeWaitingAndWithholdsValuesNotMade) {
  const auto entries = Entries(12, "made:");
  const std::vector<std::string> keys = Keys(entries);
  std::vector<uint64_t> sizes;
  for (const auto& [key, value] : entries) sizes.push_back(value.size());
  absl::StatusOr<std::unique_ptr<RedisCluster>> observer =
      RedisCluster::Create({.seeds = {redis_->address(0)}});
  ASSERT_OK(observer);
  constexpr size_t kNotMade = 10;
  const size_t last = entries.size() - 1;
  std::vector<size_t> asked;
  bool first_seen_before_last_made = false;
  const auto made = [&](size_t i) { return i != last; };
  const auto value = [&](size_t i) -> absl::StatusOr<absl::string_view> {
    asked.push_back(i);
    if (i == kNotMade) return absl::InternalError("not made");
    if (i == last) {
      first_seen_before_last_made = PollUntil([&] { return (*observer)->Get({keys[0]})[0].ok(); });
    }
    return absl::string_view(entries[i].second);
  };
  const std::vector<absl::Status> set =
      client_->SetAsMade(keys, sizes, {.made = made, .value = value});
  EXPECT_TRUE(first_seen_before_last_made);
  std::vector<size_t> in_order(entries.size());
  std::iota(in_order.begin(), in_order.end(), 0);
  EXPECT_EQ(asked, in_order);
  const auto got = client_->Get(keys);
  for (size_t i = 0; i < entries.size(); ++i) {
    if (i == kNotMade) {
      EXPECT_THAT(set[i], StatusIs(absl::StatusCode::kInternal, HasSubstr("not made")));
      EXPECT_THAT(got[i], StatusIs(absl::StatusCode::kNotFound));
      continue;
    }
    EXPECT_OK(set[i]) << keys[i];
    ASSERT_OK(got[i]) << keys[i];
    EXPECT_TRUE(*got[i] == entries[i].second) << keys[i];
  }
}

TEST_F(RedisClusterTest, RoundTripsOverEveryNode) {
  const auto entries = Entries(300, "rt:");
  for (const absl::Status& status : client_->Set(entries)) EXPECT_OK(status);
  EXPECT_EQ(client_->MappedSlots(), kRedisClusterSlots);
  std::vector<std::string> keys = Keys(entries);
  keys.push_back("rt:missing");
  const auto got = client_->Get(keys);
  for (size_t i = 0; i < entries.size(); ++i) {
    ASSERT_OK(got[i]) << keys[i];
    EXPECT_TRUE(*got[i] == entries[i].second) << keys[i];
  }
  EXPECT_THAT(got.back(), StatusIs(absl::StatusCode::kNotFound));
  // Every node got some of the keys.
  for (int node = 0; node < redis_->size(); ++node) {
    absl::StatusOr<std::string> size = redis_->Cli(node, {"DBSIZE"});
    ASSERT_OK(size);
    EXPECT_NE(absl::StripAsciiWhitespace(*size), "0") << "node " << node;
  }
  for (const absl::Status& status : client_->Delete(Keys(entries))) EXPECT_OK(status);
  for (const auto& result : client_->Get(Keys(entries))) {
    EXPECT_THAT(result, StatusIs(absl::StatusCode::kNotFound));
  }
  // Small pipelines: the same results, more round trips.
  RedisClusterOptions small;
  small.seeds = redis_->addresses();
  small.max_pipeline_bytes = 64 << 10;
  absl::StatusOr<std::unique_ptr<RedisCluster>> chunked = RedisCluster::Create(small);
  ASSERT_OK(chunked);
  for (const absl::Status& status : (*chunked)->Set(entries)) EXPECT_OK(status);
  const auto again = client_->Get(Keys(entries));
  for (size_t i = 0; i < entries.size(); ++i) {
    ASSERT_OK(again[i]);
    EXPECT_TRUE(*again[i] == entries[i].second);
  }
}

// A slot moves from one master to another while the client reads it: keys already migrated
// answer ASK, then once the slot is handed over MOVED; every read still returns its value.
TEST_F(RedisClusterTest, FollowsAskAndMovedWhileASlotMigrates) {
  std::vector<std::pair<std::string, std::string>> entries;
  for (int i = 0; i < 20; ++i) {
    const std::string key = absl::StrCat("{migrating}k", i);
    entries.emplace_back(key, ValueOf(key, 1000 + i));
  }
  for (const absl::Status& status : client_->Set(entries)) ASSERT_OK(status);
  const int slot = RedisCluster::KeySlot("migrating");
  absl::StatusOr<int> from = redis_->NodeOfSlot(slot);
  ASSERT_OK(from);
  const int to = (*from + 1) % redis_->size();
  absl::StatusOr<std::string> from_id = redis_->NodeId(*from);
  absl::StatusOr<std::string> to_id = redis_->NodeId(to);
  ASSERT_OK(from_id);
  ASSERT_OK(to_id);
  const std::string slot_text = absl::StrCat(slot);
  ASSERT_OK(redis_->Cli(to, {"CLUSTER", "SETSLOT", slot_text, "IMPORTING", *from_id}));
  ASSERT_OK(redis_->Cli(*from, {"CLUSTER", "SETSLOT", slot_text, "MIGRATING", *to_id}));
  // Half the keys move; the other half stays on the old owner for now.
  std::vector<std::string> migrate = {
      "MIGRATE", "127.0.0.1", absl::StrCat(redis_->port(to)), "", "0", "5000", "KEYS"};
  for (int i = 0; i < 10; ++i) migrate.push_back(entries[i].first);
  ASSERT_OK(redis_->Cli(*from, migrate));
  const auto check_all = [&] {
    const auto got = client_->Get(Keys(entries));
    for (size_t i = 0; i < entries.size(); ++i) {
      ASSERT_OK(got[i]) << entries[i].first;
      EXPECT_TRUE(*got[i] == entries[i].second) << entries[i].first;
    }
  };
  check_all();
  EXPECT_GE(client_->counters().ask, 10u);

  migrate.resize(7);
  for (int i = 10; i < 20; ++i) migrate.push_back(entries[i].first);
  ASSERT_OK(redis_->Cli(*from, migrate));
  for (int node = 0; node < redis_->size(); ++node) {
    ASSERT_OK(redis_->Cli(node, {"CLUSTER", "SETSLOT", slot_text, "NODE", *to_id}));
  }
  const uint64_t moved_before = client_->counters().moved;
  check_all();
  EXPECT_GT(client_->counters().moved, moved_before);
  // The map now names the new owner: no redirection any more.
  const uint64_t moved_after = client_->counters().moved;
  check_all();
  EXPECT_EQ(client_->counters().moved, moved_after);
}

// A master dies: its keys are UNAVAILABLE (misses for the tier), the others are served; it
// comes back (empty, as a cache node without persistence does) and is used again.
TEST_F(RedisClusterTest, AKilledMasterCostsOnlyItsKeysAndIsUsedAgainWhenBack) {
  const auto entries = Entries(120, "kill:");
  for (const absl::Status& status : client_->Set(entries)) ASSERT_OK(status);
  std::vector<int> owner;
  for (const auto& [key, value] : entries) {
    absl::StatusOr<int> node = redis_->NodeOfSlot(RedisCluster::KeySlot(key));
    ASSERT_OK(node);
    owner.push_back(*node);
  }
  ASSERT_OK(redis_->Kill(1));
  const absl::Time start = absl::Now();
  const auto got = client_->Get(Keys(entries));
  std::printf("redis: a batch of %zu GETs with one master dead took %s\n", entries.size(),
              absl::FormatDuration(absl::Now() - start).c_str());
  for (size_t i = 0; i < entries.size(); ++i) {
    if (owner[i] == 1) {
      EXPECT_THAT(got[i], StatusIs(absl::StatusCode::kUnavailable)) << entries[i].first;
    } else {
      ASSERT_OK(got[i]) << entries[i].first;
      EXPECT_TRUE(*got[i] == entries[i].second);
    }
  }
  EXPECT_GE(client_->counters().node_failures, 1u);

  ASSERT_OK(redis_->Restart(1));
  absl::SleepFor(absl::Milliseconds(250));  // past retry_down_after: the node may be tried again
  for (const absl::Status& status : client_->Set(entries)) EXPECT_OK(status);
  const auto back = client_->Get(Keys(entries));
  for (size_t i = 0; i < entries.size(); ++i) {
    ASSERT_OK(back[i]) << entries[i].first;
    EXPECT_TRUE(*back[i] == entries[i].second);
  }
}

// A master restarted while this client was idle: the connection it held is closed, which the
// next batch notices before using it, so the restarted node serves that very batch (it was
// never failed, so it is not rested).
TEST_F(RedisClusterTest, AMasterRestartedWhileIdleServesTheNextBatch) {
  const auto entries = Entries(60, "idle:");
  for (const absl::Status& status : client_->Set(entries)) ASSERT_OK(status);
  const int node = 2;
  ASSERT_OK(redis_->Kill(node));
  ASSERT_OK(redis_->Restart(node));  // empty, as a cache node without persistence comes back
  const uint64_t failures_before = client_->counters().node_failures;
  for (const absl::Status& status : client_->Set(entries)) EXPECT_OK(status);
  EXPECT_EQ(client_->counters().node_failures, failures_before);
  EXPECT_GE(client_->counters().stale_reconnects, 1u);
  const auto back = client_->Get(Keys(entries));
  for (size_t i = 0; i < entries.size(); ++i) {
    ASSERT_OK(back[i]) << entries[i].first;
    EXPECT_TRUE(*back[i] == entries[i].second);
  }
}

// A master that stops answering (SIGSTOP) costs its keys one io_timeout, not a stall; once it
// answers again it is used again.
TEST_F(RedisClusterTest, ASilentMasterCostsItsKeysOneTimeout) {
  const auto entries = Entries(60, "slow:");
  for (const absl::Status& status : client_->Set(entries)) ASSERT_OK(status);
  absl::StatusOr<int> silent = redis_->NodeOfSlot(RedisCluster::KeySlot(entries[0].first));
  ASSERT_OK(silent);
  ASSERT_OK(redis_->Pause(*silent));
  absl::Time start = absl::Now();
  auto got = client_->Get(Keys(entries));
  std::printf("redis: a batch of %zu GETs with one master silent took %s (io_timeout %s)\n",
              entries.size(), absl::FormatDuration(absl::Now() - start).c_str(),
              absl::FormatDuration(RedisClusterOptions().io_timeout).c_str());
  EXPECT_THAT(got[0], StatusIs(absl::StatusCode::kUnavailable));
  size_t served = 0;
  for (const auto& result : got) served += result.ok() ? 1 : 0;
  EXPECT_GT(served, 0u);  // the other masters' keys
  // Resting: the next batch does not wait on it again.
  start = absl::Now();
  got = client_->Get(Keys(entries));
  EXPECT_THAT(got[0], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("failed recently")));
  std::printf("redis: the next batch took %s\n", absl::FormatDuration(absl::Now() - start).c_str());
  ASSERT_OK(redis_->Resume(*silent));
  absl::SleepFor(absl::Milliseconds(250));  // past retry_down_after
  got = client_->Get(Keys(entries));
  for (size_t i = 0; i < entries.size(); ++i) {
    ASSERT_OK(got[i]) << entries[i].first;
    EXPECT_TRUE(*got[i] == entries[i].second);
  }
}

// A master that hangs (SIGSTOP: connections open, nothing answered) under requests with a
// deadline far shorter than io_timeout (30 s here): the first batch that waits on it pays its
// deadline and rests the node; batches within the rest skip it at once (its keys UNAVAILABLE,
// counted as skipped) instead of each paying the deadline again, and so does a write; after
// SIGCONT and the rest, the next batch probes it and it serves again.
TEST_F(RedisClusterTest, AHungMasterIsRestedAfterOneDeadlineAndProbedBackAfterItsRest) {
  RedisClusterOptions options;
  options.seeds = {redis_->address(0)};
  options.io_timeout = absl::Seconds(30);
  options.retry_down_after = absl::Seconds(5);
  absl::StatusOr<std::unique_ptr<RedisCluster>> client = RedisCluster::Create(options);
  ASSERT_OK(client);
  const auto entries = Entries(60, "hung:");
  for (const absl::Status& status : (*client)->Set(entries)) ASSERT_OK(status);
  absl::StatusOr<int> hung = redis_->NodeOfSlot(RedisCluster::KeySlot(entries[0].first));
  ASSERT_OK(hung);
  size_t on_hung = 0;
  for (const auto& [key, value] : entries) {
    absl::StatusOr<int> node = redis_->NodeOfSlot(RedisCluster::KeySlot(key));
    ASSERT_OK(node);
    on_hung += *node == *hung ? 1 : 0;
  }
  const auto get = [&] {
    return (*client)->Get(
        Keys(entries), [](size_t, absl::string_view) {}, absl::Now() + absl::Seconds(1));
  };
  ASSERT_OK(redis_->Pause(*hung));
  const RedisClusterCounters before = (*client)->counters();
  std::vector<absl::Status> got = get();
  EXPECT_THAT(got[0], StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_EQ((*client)->counters().node_failures, before.node_failures + 1);
  EXPECT_EQ((*client)->counters().skipped, before.skipped);
  for (int open = 0; open < 5; ++open) {
    got = get();
    EXPECT_THAT(got[0], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("skipped")));
    size_t served = 0;
    for (const absl::Status& status : got) served += status.ok() ? 1 : 0;
    EXPECT_EQ(served, entries.size() - on_hung);  // the other masters' keys
  }
  EXPECT_EQ((*client)->counters().skipped, before.skipped + 5 * on_hung);
  // A write through (no deadline: io_timeout, 30 s, would bound it) skips the node too.
  const std::vector<absl::Status> set = (*client)->Set(entries);
  EXPECT_THAT(set[0], StatusIs(absl::StatusCode::kUnavailable, HasSubstr("skipped")));
  EXPECT_EQ((*client)->counters().skipped, before.skipped + 6 * on_hung);
  EXPECT_EQ((*client)->counters().node_failures, before.node_failures + 1);

  ASSERT_OK(redis_->Resume(*hung));
  EXPECT_TRUE(PollUntil([&] {
    for (const absl::Status& status : get()) {
      if (!status.ok()) return false;
    }
    return true;
  })) << "the node did not serve again after its rest";
}

class RedisClusterAuthTest : public RedisClusterTest {
 protected:
  std::vector<std::string> ExtraConfig() override {
    return {"--requirepass", "s3cret-pass", "--masterauth", "s3cret-pass"};
  }
  std::string Password() override { return "s3cret-pass"; }
};

TEST_F(RedisClusterAuthTest, AuthenticatesAndNeverShowsThePassword) {
  const auto entries = Entries(10, "auth:");
  for (const absl::Status& status : client_->Set(entries)) EXPECT_OK(status);
  RedisClusterOptions wrong;
  wrong.seeds = redis_->addresses();
  wrong.password = "wrong-password-value";
  absl::StatusOr<std::unique_ptr<RedisCluster>> intruder = RedisCluster::Create(wrong);
  ASSERT_OK(intruder);
  for (const auto& result : (*intruder)->Get(Keys(entries))) {
    EXPECT_THAT(result,
                StatusIs(absl::StatusCode::kUnavailable, Not(HasSubstr("wrong-password-value"))));
  }
  EXPECT_THAT(
      (*intruder)->RefreshSlots(),
      StatusIs(absl::StatusCode::kUnavailable, HasSubstr("refused the configured credentials")));
}

// The start-up report: every master reached, every slot covered.
TEST_F(RedisClusterAuthTest, ReachCountsMastersAndSlotsCovered) {
  const RedisCluster::Reach reach = client_->CheckReach();
  EXPECT_EQ(reach.masters, 3);
  EXPECT_EQ(reach.masters_reached, 3);
  EXPECT_EQ(reach.slots_covered, kRedisClusterSlots);
  EXPECT_EQ(reach.credentials_refused, 0);
  EXPECT_THAT(reach.problems, IsEmpty());
}

// A wrong password is told once per node, naming the node and WRONGPASS, never the password,
// however often the node is tried again (here at every batch: no rest); the report counts it.
TEST_F(RedisClusterAuthTest, AWrongPasswordIsToldOncePerNodeWithoutThePassword) {
  std::vector<std::string> told;
  RedisClusterOptions wrong;
  wrong.seeds = redis_->addresses();
  wrong.password = "wrong-password-value";
  wrong.retry_down_after = absl::ZeroDuration();
  wrong.on_credentials_refused = [&](const std::string& line) { told.push_back(line); };
  absl::StatusOr<std::unique_ptr<RedisCluster>> intruder = RedisCluster::Create(wrong);
  ASSERT_OK(intruder);
  for (int batch = 0; batch < 4; ++batch) {
    for (const auto& result : (*intruder)->Get({"a", "b", "c"})) {
      EXPECT_THAT(result, StatusIs(absl::StatusCode::kUnavailable));
    }
  }
  const RedisCluster::Reach reach = (*intruder)->CheckReach();
  EXPECT_EQ(reach.masters_reached, 0);
  EXPECT_EQ(reach.credentials_refused, 3);
  ASSERT_EQ(told.size(), 3u) << absl::StrJoin(told, "\n");
  for (int node = 0; node < redis_->size(); ++node) {
    EXPECT_EQ(told[node], absl::StrCat("Redis node ", redis_->address(node),
                                       " refused the configured credentials (WRONGPASS)"));
  }
  for (const std::string& problem : reach.problems) {
    EXPECT_THAT(problem, HasSubstr("WRONGPASS"));
    EXPECT_THAT(problem, Not(HasSubstr("wrong-password-value")));
  }
}

// No password where the cluster wants one: NOAUTH, told once per node, counted as refused.
TEST_F(RedisClusterAuthTest, NoPasswordWhereOneIsWantedIsToldOnce) {
  std::vector<std::string> told;
  RedisClusterOptions none;
  none.seeds = {redis_->address(0)};
  none.on_credentials_refused = [&](const std::string& line) { told.push_back(line); };
  absl::StatusOr<std::unique_ptr<RedisCluster>> client = RedisCluster::Create(none);
  ASSERT_OK(client);
  EXPECT_THAT((*client)->RefreshSlots(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("NOAUTH")));
  const RedisCluster::Reach reach = (*client)->CheckReach();
  EXPECT_EQ(reach.masters_reached, 0);
  EXPECT_EQ(reach.credentials_refused, 1);
  EXPECT_THAT(told, ElementsAre(absl::StrCat("Redis node ", redis_->address(0),
                                             " wants a password and none is configured (NOAUTH)")));
}

}  // namespace
}  // namespace kvcache
