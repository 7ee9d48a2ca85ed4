// StatusIs / IsOk matchers for absl::Status and absl::StatusOr, which Debian's Abseil lacks.
#ifndef KVCACHE_TESTS_TESTING_STATUS_MATCHERS_H_
#define KVCACHE_TESTS_TESTING_STATUS_MATCHERS_H_

#include <gmock/gmock.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace kvcache::testing {

inline const absl::Status& GetStatus(const absl::Status& status) { return status; }
template <typename T>
const absl::Status& GetStatus(const absl::StatusOr<T>& status_or) {
  return status_or.status();
}

MATCHER_P(StatusIs, code, "has status code " + ::testing::PrintToString(code)) {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code;
}

MATCHER_P2(StatusIs, code, message_matcher, "") {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "status is " << status;
  return status.code() == code &&
         ::testing::Matches(message_matcher)(std::string(status.message()));
}

MATCHER(IsOk, "is OK") {
  const absl::Status& status = GetStatus(arg);
  *result_listener << "status is " << status;
  return status.ok();
}

}  // namespace kvcache::testing

#define ASSERT_OK(expr) ASSERT_THAT((expr), ::kvcache::testing::IsOk())
#define EXPECT_OK(expr) EXPECT_THAT((expr), ::kvcache::testing::IsOk())

#endif  // KVCACHE_TESTS_TESTING_STATUS_MATCHERS_H_
