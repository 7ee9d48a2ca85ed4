// KvCacheClient's rendezvous calls against a real in-process daemon
// (tests/client/daemon_fixture.h): publish/await between clients of one tenant, waits that park
// until a publish, deadlines, tenant scoping, ownership by the publishing session, and the size
// limits.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cache/rendezvous_registry.h"
#include "client/kv_cache_client.h"
#include "tests/client/daemon_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::PollUntil;
using ::kvcache::testing::StatusIs;

// An OK StatusOr<std::string> holding `expected`.
MATCHER_P(HoldsValue, expected, "") {
  if (!arg.ok()) {
    *result_listener << "status is " << arg.status();
    return false;
  }
  *result_listener << "value is \"" << *arg << "\"";
  return *arg == std::string(expected);
}

// Long enough that a wait which should answer never hits it; short enough for the tests that
// expect a wait to run out.
constexpr absl::Duration kLongWait = absl::Seconds(20);
constexpr absl::Duration kShortWait = absl::Milliseconds(300);

class RendezvousTest : public kvcache::testing::DaemonFixture {
 protected:
  RendezvousTest() { with_other_tenant_ = true; }

  // A connected client with an open session of `tenant`.
  std::unique_ptr<KvCacheClient> SessionClient(const std::string& tenant,
                                               const std::string& name = "peer") {
    std::unique_ptr<KvCacheClient> client = Connect();
    if (client == nullptr) return nullptr;
    EXPECT_OK(client->OpenSession(tenant, name));
    return client;
  }
};

TEST_F(RendezvousTest, PublishThenAwaitFromAnotherClientOfTheTenant) {
  ASSERT_OK(client_->OpenSession("", "prefill"));
  std::unique_ptr<KvCacheClient> decode = SessionClient("", "decode");
  ASSERT_NE(decode, nullptr);

  ASSERT_OK(client_->PublishRendezvous("nccl/job-1", "unique-id"));
  absl::StatusOr<std::string> value = decode->AwaitRendezvous("nccl/job-1", kLongWait);
  ASSERT_OK(value);
  EXPECT_EQ(*value, "unique-id");
  // The publisher sees its own value too, and a value can be read any number of times.
  EXPECT_THAT(client_->AwaitRendezvous("nccl/job-1", kLongWait), HoldsValue("unique-id"));
  EXPECT_THAT(decode->AwaitRendezvous("nccl/job-1", kLongWait), HoldsValue("unique-id"));
}

TEST_F(RendezvousTest, ValuesAreBytes) {
  ASSERT_OK(client_->OpenSession("", "prefill"));
  std::string id(128, '\0');  // an NCCL unique id is 128 raw bytes, zeros included
  for (size_t i = 0; i < id.size(); i += 3) id[i] = static_cast<char>(0xff - i);
  ASSERT_OK(client_->PublishRendezvous("id", id));
  std::unique_ptr<KvCacheClient> peer = SessionClient("");
  ASSERT_NE(peer, nullptr);
  absl::StatusOr<std::string> value = peer->AwaitRendezvous("id", kLongWait);
  ASSERT_OK(value);
  EXPECT_EQ(*value, id);
}

TEST_F(RendezvousTest, AwaitParkedBeforePublishIsAnswered) {
  ASSERT_OK(client_->OpenSession("", "prefill"));
  constexpr int kWaiters = 3;
  std::vector<std::unique_ptr<KvCacheClient>> waiters;
  for (int i = 0; i < kWaiters; ++i) {
    waiters.push_back(SessionClient("", "decode"));
    ASSERT_NE(waiters.back(), nullptr);
  }
  std::vector<absl::StatusOr<std::string>> results(kWaiters, absl::UnknownError("not run"));
  std::vector<absl::Duration> waited(kWaiters);
  std::vector<std::thread> threads;
  for (int i = 0; i < kWaiters; ++i) {
    threads.emplace_back([&, i] {
      const absl::Time start = absl::Now();
      results[i] = waiters[i]->AwaitRendezvous("late", kLongWait);
      waited[i] = absl::Now() - start;
    });
  }
  // Publish only once every wait has parked on the daemon, so the publish is what answers them.
  EXPECT_TRUE(PollUntil(
      [&] { return daemon_->manager().rendezvous().parked_waiters() == size_t{kWaiters}; }));
  ASSERT_OK(client_->PublishRendezvous("late", "value"));
  for (std::thread& thread : threads) thread.join();
  for (int i = 0; i < kWaiters; ++i) {
    ASSERT_OK(results[i]) << "waiter " << i;
    EXPECT_EQ(*results[i], "value");
    // Answered by the publish, not by the deadline.
    EXPECT_LT(waited[i], kLongWait / 2) << "waiter " << i;
  }
}

TEST_F(RendezvousTest, AwaitOfAnUnpublishedKeyRunsIntoItsDeadline) {
  ASSERT_OK(client_->OpenSession("", "decode"));
  const absl::Time start = absl::Now();
  EXPECT_THAT(client_->AwaitRendezvous("never", kShortWait),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  const absl::Duration waited = absl::Now() - start;
  EXPECT_GE(waited, kShortWait - absl::Milliseconds(10));
  EXPECT_LT(waited, kLongWait);
  // The abandoned wait leaves nothing behind: a later publish and await work as usual.
  ASSERT_OK(client_->PublishRendezvous("never", "now"));
  EXPECT_THAT(client_->AwaitRendezvous("never", kLongWait), HoldsValue("now"));
}

TEST_F(RendezvousTest, TheAwaitDeadlineIsTheTimeoutNotTheRpcTimeout) {
  ClientOptions options;
  options.rpc_timeout = absl::Milliseconds(200);
  std::unique_ptr<KvCacheClient> decode = Connect(options);
  ASSERT_NE(decode, nullptr);
  ASSERT_OK(decode->OpenSession("", "decode"));
  ASSERT_OK(client_->OpenSession("", "prefill"));
  absl::StatusOr<std::string> result = absl::UnknownError("not run");
  std::thread waiter([&] { result = decode->AwaitRendezvous("slow", kLongWait); });
  // Publish well after the client's rpc_timeout has passed. Real time: the deadline that must not
  // fire is gRPC's own timer on the client, which no injected clock reaches.
  EXPECT_TRUE(PollUntil([&] { return daemon_->manager().rendezvous().parked_waiters() == 1; }));
  absl::SleepFor(absl::Milliseconds(600));
  ASSERT_OK(client_->PublishRendezvous("slow", "finally"));
  waiter.join();
  ASSERT_OK(result);
  EXPECT_EQ(*result, "finally");
}

TEST_F(RendezvousTest, AnotherTenantCannotSeeTheKey) {
  ASSERT_OK(client_->OpenSession("", "prefill"));
  ASSERT_OK(client_->PublishRendezvous("shared-name", "acme's"));
  std::unique_ptr<KvCacheClient> other = ConnectAsOtherTenant();
  ASSERT_NE(other, nullptr);
  ASSERT_OK(other->OpenSession("", "peer"));
  ASSERT_NE(other, nullptr);
  EXPECT_THAT(other->AwaitRendezvous("shared-name", kShortWait),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // The same key in another tenant is another key: no conflict, and each sees its own value.
  ASSERT_OK(other->PublishRendezvous("shared-name", "globex's"));
  EXPECT_THAT(other->AwaitRendezvous("shared-name", kLongWait), HoldsValue("globex's"));
  EXPECT_THAT(client_->AwaitRendezvous("shared-name", kLongWait), HoldsValue("acme's"));
}

TEST_F(RendezvousTest, OnlyThePublishingSessionMayOverwrite) {
  ASSERT_OK(client_->OpenSession("", "prefill"));
  ASSERT_OK(client_->PublishRendezvous("key", "first"));
  std::unique_ptr<KvCacheClient> other = SessionClient("");
  ASSERT_NE(other, nullptr);
  EXPECT_THAT(other->PublishRendezvous("key", "intruder"),
              StatusIs(absl::StatusCode::kAlreadyExists));
  EXPECT_THAT(other->AwaitRendezvous("key", kLongWait), HoldsValue("first"));
  // The owner may publish again: the same value (idempotent) or a new one.
  ASSERT_OK(client_->PublishRendezvous("key", "first"));
  ASSERT_OK(client_->PublishRendezvous("key", "second"));
  EXPECT_THAT(other->AwaitRendezvous("key", kLongWait), HoldsValue("second"));
}

TEST_F(RendezvousTest, ClosingThePublishersSessionDropsTheValue) {
  ASSERT_OK(client_->OpenSession("", "prefill"));
  ASSERT_OK(client_->PublishRendezvous("key", "value"));
  std::unique_ptr<KvCacheClient> other = SessionClient("");
  ASSERT_NE(other, nullptr);
  ASSERT_OK(other->AwaitRendezvous("key", kLongWait));

  ASSERT_OK(client_->CloseSession());
  EXPECT_THAT(other->AwaitRendezvous("key", kShortWait),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // The key is free again: another session may take it.
  ASSERT_OK(other->PublishRendezvous("key", "new owner"));
  EXPECT_THAT(other->AwaitRendezvous("key", kLongWait), HoldsValue("new owner"));
}

TEST_F(RendezvousTest, OversizeOrEmptyKeysAndValuesAreInvalid) {
  ASSERT_OK(client_->OpenSession("", "prefill"));
  const std::string max_key(kMaxRendezvousKeyBytes, 'k');
  const std::string max_value(kMaxRendezvousValueBytes, 'v');
  EXPECT_THAT(client_->PublishRendezvous(max_key + "k", "value"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->PublishRendezvous("key", max_value + "v"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->PublishRendezvous("", "value"),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->AwaitRendezvous(max_key + "k", kLongWait),
              StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(client_->AwaitRendezvous("", kLongWait),
              StatusIs(absl::StatusCode::kInvalidArgument));
  // The limits themselves are fine.
  ASSERT_OK(client_->PublishRendezvous(max_key, max_value));
  EXPECT_THAT(client_->AwaitRendezvous(max_key, kLongWait), HoldsValue(max_value));
  // A rejected publish stored nothing.
  EXPECT_THAT(client_->AwaitRendezvous("key", kShortWait),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
}

TEST_F(RendezvousTest, BothCallsNeedAnOpenSession) {
  EXPECT_THAT(client_->PublishRendezvous("key", "value"),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(client_->AwaitRendezvous("key", kShortWait),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  ASSERT_OK(client_->OpenSession("", "prefill"));
  ASSERT_OK(client_->CloseSession());
  EXPECT_THAT(client_->PublishRendezvous("key", "value"),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(client_->AwaitRendezvous("key", kShortWait),
              StatusIs(absl::StatusCode::kFailedPrecondition));
}

}  // namespace
}  // namespace kvcache
