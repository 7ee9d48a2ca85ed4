// Rendezvous values: scoped to a tenant, owned by the publishing session, waking parked waiters.
#include "cache/rendezvous_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;

TEST(RendezvousRegistryTest, AwaitAnswersAtOnceOrWhenPublished) {
  RendezvousRegistry registry;
  std::vector<std::string> seen;
  auto record = [&](const std::string& value) { seen.push_back(value); };
  absl::StatusOr<uint64_t> parked = registry.Await("t", "nccl-id", record);
  ASSERT_OK(parked);
  EXPECT_NE(*parked, 0u);
  EXPECT_TRUE(seen.empty());
  ASSERT_OK(registry.Publish("t", "nccl-id", "abc", /*session_id=*/1));
  EXPECT_THAT(seen, ::testing::ElementsAre("abc"));
  absl::StatusOr<uint64_t> immediate = registry.Await("t", "nccl-id", record);
  ASSERT_OK(immediate);
  EXPECT_EQ(*immediate, 0u);
  EXPECT_THAT(seen, ::testing::ElementsAre("abc", "abc"));
  EXPECT_FALSE(registry.Cancel(*parked));  // already answered
}

TEST(RendezvousRegistryTest, TenantsDoNotSeeEachOther) {
  RendezvousRegistry registry;
  ASSERT_OK(registry.Publish("a", "key", "secret", 1));
  bool answered = false;
  absl::StatusOr<uint64_t> ticket =
      registry.Await("b", "key", [&](const std::string&) { answered = true; });
  ASSERT_OK(ticket);
  EXPECT_FALSE(answered);
  // "a" + "bkey" must not collide with "ab" + "key".
  ASSERT_OK(registry.Publish("ab", "key", "other", 2));
  absl::StatusOr<uint64_t> probe =
      registry.Await("a", "bkey", [&](const std::string&) { answered = true; });
  ASSERT_OK(probe);
  EXPECT_FALSE(answered);
  EXPECT_TRUE(registry.Cancel(*ticket));
  EXPECT_TRUE(registry.Cancel(*probe));
}

TEST(RendezvousRegistryTest, OwnershipAndSessionEnd) {
  RendezvousRegistry registry;
  ASSERT_OK(registry.Publish("t", "k", "v1", 1));
  ASSERT_OK(registry.Publish("t", "k", "v2", 1));  // the owner may overwrite
  EXPECT_THAT(registry.Publish("t", "k", "v3", 2), StatusIs(absl::StatusCode::kAlreadyExists));
  registry.DropSession(1);
  bool answered = false;
  absl::StatusOr<uint64_t> ticket =
      registry.Await("t", "k", [&](const std::string&) { answered = true; });
  ASSERT_OK(ticket);
  EXPECT_FALSE(answered);  // the value went with its session
  ASSERT_OK(registry.Publish("t", "k", "v3", 2));
  EXPECT_TRUE(answered);
}

TEST(RendezvousRegistryTest, BadKeysAndValues) {
  RendezvousRegistry registry;
  EXPECT_THAT(registry.Publish("t", "", "v", 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(registry.Publish("t", std::string(257, 'k'), "v", 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(registry.Publish("t", "k", "", 1), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(registry.Publish("t", "k", std::string(4097, 'v'), 1),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(registry.Await("t", "", [](const std::string&) {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvcache
