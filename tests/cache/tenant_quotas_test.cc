#include "cache/tenant_quotas.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

TEST(TenantQuotasTest, WithoutLimitsAnythingGoes) {
  TenantQuotas quotas;
  EXPECT_OK(quotas.TryAcquire("a", QuotaResource::kPutBytesInFlight, uint64_t{1} << 40));
  EXPECT_EQ(quotas.InUse("a", QuotaResource::kPutBytesInFlight), uint64_t{1} << 40);
}

TEST(TenantQuotasTest, LimitIsPerTenantAndPerResource) {
  TenantQuotas quotas;
  quotas.SetLimits({{"a", TenantLimits{.max_sessions = 2}}});
  ASSERT_OK(quotas.TryAcquire("a", QuotaResource::kSessions, 2));
  EXPECT_THAT(quotas.TryAcquire("a", QuotaResource::kSessions, 1),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("tenant 'a' quota max_sessions=2: 2 in use, 1 more asked for")));
  EXPECT_EQ(quotas.InUse("a", QuotaResource::kSessions), 2u);  // nothing changed
  EXPECT_OK(quotas.TryAcquire("a", QuotaResource::kOpenSequences, 100));
  EXPECT_OK(quotas.TryAcquire("b", QuotaResource::kSessions, 100));
  quotas.Release("a", QuotaResource::kSessions, 1);
  EXPECT_OK(quotas.TryAcquire("a", QuotaResource::kSessions, 1));
}

TEST(TenantQuotasTest, AskingMoreThanTheLimitAtOnceDoesNotOverflow) {
  TenantQuotas quotas;
  quotas.SetLimits({{"a", TenantLimits{.max_put_bytes_in_flight = 100}}});
  ASSERT_OK(quotas.TryAcquire("a", QuotaResource::kPutBytesInFlight, 60));
  EXPECT_THAT(quotas.TryAcquire("a", QuotaResource::kPutBytesInFlight, kUnlimited),
              StatusIs(absl::StatusCode::kResourceExhausted));
  EXPECT_EQ(quotas.InUse("a", QuotaResource::kPutBytesInFlight), 60u);
}

TEST(TenantQuotasTest, ALoweredLimitKeepsWhatIsHeldAndGrantsNothingMore) {
  TenantQuotas quotas;
  ASSERT_OK(quotas.TryAcquire("a", QuotaResource::kOpenSequences, 5));
  quotas.SetLimits({{"a", TenantLimits{.max_open_sequences = 3}}});
  EXPECT_EQ(quotas.InUse("a", QuotaResource::kOpenSequences), 5u);
  EXPECT_THAT(quotas.TryAcquire("a", QuotaResource::kOpenSequences, 1),
              StatusIs(absl::StatusCode::kResourceExhausted));
  quotas.Release("a", QuotaResource::kOpenSequences, 3);
  EXPECT_OK(quotas.TryAcquire("a", QuotaResource::kOpenSequences, 1));
}

}  // namespace
}  // namespace kvcache
