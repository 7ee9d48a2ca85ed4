// Sessions as leases, epochs and request routing, on simulated time.
#include "cache/cache_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "cache/pool_spec.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

constexpr uint64_t kEpoch = 42;

class CacheManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"alpha", "beta"}) {
      PoolOptions options = DefaultPoolOptions();
      options.name = name;
      options.num_blocks = 16;
      auto memory = HostPoolMemory::Create(options.layout.BlockBytes(), options.num_blocks);
      ASSERT_OK(memory);
      ASSERT_OK(manager_.AddPool(options, *std::move(memory)));
    }
  }
  void TearDown() override {
    for (Pool* pool : manager_.pools()) EXPECT_OK(pool->CheckInvariants());
  }

  std::shared_ptr<Session> OpenSession(absl::Duration ttl = absl::Seconds(1)) {
    auto session = manager_.sessions().Open("tenant", "test", ttl);
    EXPECT_OK(session);
    return *session;
  }

  uint64_t OpenSequence(const Session& session, absl::string_view pool_name) {
    Pool* pool = *manager_.FindPool(pool_name);
    std::vector<uint32_t> tokens(40, 7);
    auto opened = pool->Open(session, SequenceSpec{tokens});
    EXPECT_OK(opened);
    return opened->sequence_id;
  }

  uint32_t Referenced(absl::string_view pool_name) {
    return (*manager_.FindPool(pool_name))->Stats().referenced;
  }

  ::kvcache::testing::FakeClock clock_;
  CacheManager manager_{SessionLimits{}, &clock_, kEpoch};
};

TEST_F(CacheManagerTest, SequenceIdsRouteToTheirPool) {
  auto session = OpenSession();
  const uint64_t in_alpha = OpenSequence(*session, "alpha");
  const uint64_t in_beta = OpenSequence(*session, "beta");
  EXPECT_EQ(*manager_.PoolOfSequence(in_alpha), *manager_.FindPool("alpha"));
  EXPECT_EQ(*manager_.PoolOfSequence(in_beta), *manager_.FindPool("beta"));
  EXPECT_THAT(manager_.PoolOfSequence(0), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(manager_.PoolOfSequence(in_alpha + 5), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CacheManagerTest, UnknownPoolNamesTheKnownOnes) {
  EXPECT_THAT(manager_.FindPool("gamma"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("alpha, beta")));
}

TEST_F(CacheManagerTest, DuplicatePoolNameIsRejected) {
  PoolOptions options = DefaultPoolOptions();
  options.name = "alpha";
  auto memory = HostPoolMemory::Create(options.layout.BlockBytes(), options.num_blocks);
  ASSERT_OK(memory);
  EXPECT_THAT(manager_.AddPool(options, *std::move(memory)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("already exists")));
}

TEST_F(CacheManagerTest, ExpiredLeaseReleasesEverySequenceOfTheSession) {
  auto session = OpenSession(absl::Seconds(1));
  auto kept = OpenSession(absl::Seconds(5));
  OpenSequence(*session, "alpha");
  OpenSequence(*session, "beta");
  OpenSequence(*kept, "alpha");
  clock_.Advance(absl::Milliseconds(900));
  EXPECT_EQ(manager_.ExpireSessions(), 0);
  ASSERT_OK(manager_.sessions().KeepAlive(session->id));
  clock_.Advance(absl::Milliseconds(900));
  EXPECT_EQ(manager_.ExpireSessions(), 0);  // the keep-alive pushed the deadline
  clock_.Advance(absl::Milliseconds(200));
  EXPECT_EQ(manager_.ExpireSessions(), 1);
  EXPECT_EQ(Referenced("alpha"), 3);  // only `kept`'s sequence remains
  EXPECT_EQ(Referenced("beta"), 0);
  EXPECT_TRUE(session->closed);
  // Late requests under the dead lease are fenced off.
  EXPECT_THAT(manager_.SessionFor(session->id, kEpoch), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(manager_.sessions().KeepAlive(session->id), StatusIs(absl::StatusCode::kAborted));
  Pool* alpha = *manager_.FindPool("alpha");
  std::vector<uint32_t> tokens{1, 2, 3};
  EXPECT_THAT(alpha->Open(*session, SequenceSpec{tokens}), StatusIs(absl::StatusCode::kAborted));
}

TEST_F(CacheManagerTest, CloseSessionReleasesAndReportsTheCount) {
  auto session = OpenSession();
  OpenSequence(*session, "alpha");
  OpenSequence(*session, "beta");
  auto released = manager_.CloseSession(session->id, kEpoch);
  ASSERT_OK(released);
  EXPECT_EQ(*released, 2);
  EXPECT_EQ(Referenced("alpha") + Referenced("beta"), 0);
  released = manager_.CloseSession(session->id, kEpoch);  // idempotent
  ASSERT_OK(released);
  EXPECT_EQ(*released, 0);
  EXPECT_THAT(manager_.CloseSession(999, kEpoch), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CacheManagerTest, StaleEpochIsFailedPrecondition) {
  auto session = OpenSession();
  EXPECT_OK(manager_.SessionFor(session->id, 0));
  EXPECT_OK(manager_.SessionFor(session->id, kEpoch));
  EXPECT_THAT(manager_.SessionFor(session->id, kEpoch + 1),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("restarted")));
}

TEST_F(CacheManagerTest, TtlIsClampedAndDefaulted) {
  auto defaulted = OpenSession(absl::ZeroDuration());
  EXPECT_EQ(defaulted->ttl, SessionLimits{}.default_ttl);
  auto tiny = OpenSession(absl::Milliseconds(1));
  EXPECT_EQ(tiny->ttl, SessionLimits{}.min_ttl);
  auto huge = OpenSession(absl::Hours(100));
  EXPECT_EQ(huge->ttl, SessionLimits{}.max_ttl);
  EXPECT_THAT(manager_.sessions().Open(std::string(300, 't'), "", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CacheManagerTest, SessionLimitIsResourceExhausted) {
  CacheManager small(SessionLimits{.max_sessions = 2}, &clock_, kEpoch);
  ASSERT_OK(small.sessions().Open("t", "", absl::Seconds(1)));
  ASSERT_OK(small.sessions().Open("t", "", absl::Seconds(1)));
  EXPECT_THAT(small.sessions().Open("t", "", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kResourceExhausted));
}

TEST_F(CacheManagerTest, ReaperExpiresSessionsInTheBackground) {
  auto session = OpenSession(absl::Seconds(1));
  OpenSequence(*session, "alpha");
  manager_.StartReaper(absl::Milliseconds(5));
  clock_.Advance(absl::Seconds(2));
  // Bounded wait for the background thread; the assertion is on state, not on timing.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (Referenced("alpha") != 0 && absl::Now() < give_up) absl::SleepFor(absl::Milliseconds(5));
  EXPECT_EQ(Referenced("alpha"), 0);
}

}  // namespace
}  // namespace kvcache
