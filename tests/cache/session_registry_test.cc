#include "cache/session_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/container/flat_hash_set.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

class SessionRegistryTest : public ::testing::Test {
 protected:
  std::shared_ptr<Session> Open(const std::string& tenant = "t") {
    auto session = registry_.Open("uid:1", tenant, "test", absl::Seconds(1));
    EXPECT_OK(session);
    return session.ok() ? *session : nullptr;
  }

  testing::FakeClock clock_;
  TenantQuotas quotas_;
  SessionRegistry registry_{SessionLimits{}, &clock_, &quotas_};
};

TEST_F(SessionRegistryTest, IdsAreUnguessableAndNeverRepeat) {
  absl::flat_hash_set<uint64_t> ids;
  uint64_t previous = 0;
  int ascending = 0, high_bits_used = 0;
  for (int i = 0; i < 2000; ++i) {
    std::shared_ptr<Session> session = Open();
    ASSERT_NE(session, nullptr);
    EXPECT_NE(session->id, 0u);
    EXPECT_TRUE(ids.insert(session->id).second) << "id repeated";
    ascending += session->id > previous ? 1 : 0;
    high_bits_used += session->id >> 48 != 0 ? 1 : 0;
    previous = session->id;
    ASSERT_OK(registry_.Close(session->id));
  }
  // A counter would ascend every time and leave the high bits empty; a permutation ascends about
  // half the time and fills them.
  EXPECT_GT(ascending, 800);
  EXPECT_LT(ascending, 1200);
  EXPECT_GT(high_bits_used, 1900);
  // Two registries (two daemon starts) key their ids apart.
  TenantQuotas other_quotas;
  SessionRegistry other(SessionLimits{}, &clock_, &other_quotas);
  auto first = other.Open("uid:1", "t", "test", absl::Seconds(1));
  ASSERT_OK(first);
  EXPECT_FALSE(ids.contains((*first)->id));
}

TEST_F(SessionRegistryTest, EndedIdsAreAbortedAndUnissuedOnesNotFound) {
  std::shared_ptr<Session> session = Open();
  const uint64_t id = session->id;
  ASSERT_OK(registry_.Close(id));
  EXPECT_THAT(registry_.Get(id), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(registry_.Get(id ^ 1), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(registry_.Get(0), StatusIs(absl::StatusCode::kNotFound));
  std::shared_ptr<Session> expiring = Open();
  clock_.Advance(absl::Seconds(2));
  EXPECT_EQ(registry_.TakeExpired().size(), 1u);
  EXPECT_THAT(registry_.Get(expiring->id), StatusIs(absl::StatusCode::kAborted));
}

// A lease past its deadline has ended even before the sweep takes it: a keep-alive that wins the
// race with the reaper (a daemon resumed after SIGSTOP, a slow sweep) cannot revive it, and calls
// under it are refused.
TEST_F(SessionRegistryTest, ALeasePastItsDeadlineIsEndedBeforeTheSweep) {
  std::shared_ptr<Session> session = Open();
  clock_.Advance(absl::Milliseconds(999));
  EXPECT_OK(registry_.KeepAlive(session->id));  // renewed just in time: a full second again
  clock_.Advance(absl::Milliseconds(999));
  EXPECT_OK(registry_.Get(session->id));
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_THAT(registry_.KeepAlive(session->id),
              StatusIs(absl::StatusCode::kAborted, HasSubstr("lease expired")));
  EXPECT_THAT(registry_.Get(session->id), StatusIs(absl::StatusCode::kAborted));
  ASSERT_EQ(registry_.TakeExpired().size(), 1u);  // still the sweep's to release
  EXPECT_TRUE(session->closed.load());
}

TEST_F(SessionRegistryTest, SessionsCountAgainstTheirTenantsQuotaUntilTheyEnd) {
  quotas_.SetLimits({{"small", TenantLimits{.max_sessions = 1}}});
  std::shared_ptr<Session> held = Open("small");
  EXPECT_THAT(registry_.Open("uid:1", "small", "test", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_NE(Open("other"), nullptr);
  ASSERT_OK(registry_.Close(held->id));
  std::shared_ptr<Session> next = Open("small");
  ASSERT_NE(next, nullptr);
  clock_.Advance(absl::Seconds(2));
  registry_.TakeExpired();  // expiry gives the quota back too
  EXPECT_EQ(quotas_.InUse("small", QuotaResource::kSessions), 0u);
}

TEST_F(SessionRegistryTest, EmptyOrOversizeTenantIsInvalid) {
  EXPECT_THAT(registry_.Open("uid:1", "", "test", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(registry_.Open("uid:1", std::string(257, 't'), "test", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvcache
