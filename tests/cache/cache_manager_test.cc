// Sessions as leases, epochs, request routing, and the device fault latch the pools share, on
// simulated time and on pool memory that can fail like a device (FaultInjectionPoolMemory).
#include "cache/cache_manager.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "cache/pool_spec.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injection_pool_memory.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::FaultInjectionPoolMemory;
using ::kvcache::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr uint64_t kEpoch = 42;
constexpr char kPrincipal[] = "uid:1000";

class CacheManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"alpha", "beta"}) {
      PoolOptions options = DefaultPoolOptions();
      options.name = name;
      options.num_blocks = 16;
      auto memory = HostPoolMemory::Create(options.layout.BlockBytes(), options.num_blocks);
      ASSERT_OK(memory);
      // Works as the memory it wraps until a test arms a fault.
      auto faulty = std::make_unique<FaultInjectionPoolMemory>(*std::move(memory));
      memories_.push_back(faulty.get());
      ASSERT_OK(manager_.AddPool(options, std::move(faulty)));
    }
  }
  void TearDown() override {
    for (Pool* pool : manager_.pools()) EXPECT_OK(pool->CheckInvariants());
  }

  std::shared_ptr<Session> OpenSession(absl::Duration ttl = absl::Seconds(1)) {
    auto session = manager_.sessions().Open(kPrincipal, "tenant", "test", ttl);
    EXPECT_OK(session);
    return *session;
  }

  // 40 tokens: two full blocks of 16 and a partial one.
  OpenedSequence Open(const Session& session, absl::string_view pool_name) {
    Pool* pool = *manager_.FindPool(pool_name);
    auto opened = pool->Open(session, SequenceSpec{kTokens});
    EXPECT_OK(opened);
    return opened.ok() ? *opened : OpenedSequence{};
  }
  uint64_t OpenSequence(const Session& session, absl::string_view pool_name) {
    return Open(session, pool_name).sequence_id;
  }

  uint32_t Referenced(absl::string_view pool_name) {
    return (*manager_.FindPool(pool_name))->Stats().referenced;
  }

  // Arms alpha's memory to fail its next block copy like a sticky CUDA error, then forks
  // `sequence` (which ends in a partial block) into it; returns the fork's status.
  absl::Status ForkIntoADeviceFault(const Session& session, uint64_t sequence) {
    memories_[0]->FailNth(FaultInjectionPoolMemory::Op::kCopyBlock, 1,
                          FaultInjectionPoolMemory::StickyCudaError());
    const absl::Status forked = (*manager_.FindPool("alpha"))->Fork(session, sequence).status();
    EXPECT_TRUE(memories_[0]->tripped());
    return forked;
  }

  inline static const std::vector<uint32_t> kTokens = std::vector<uint32_t>(40, 7);
  ::kvcache::testing::FakeClock clock_;
  CacheManager manager_{SessionLimits{}, &clock_, kEpoch};
  std::vector<FaultInjectionPoolMemory*> memories_;  // alpha's, beta's; owned by the pools
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
  EXPECT_THAT(manager_.SessionFor(session->id, kEpoch, kPrincipal),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(manager_.sessions().KeepAlive(session->id), StatusIs(absl::StatusCode::kAborted));
  Pool* alpha = *manager_.FindPool("alpha");
  std::vector<uint32_t> tokens{1, 2, 3};
  EXPECT_THAT(alpha->Open(*session, SequenceSpec{tokens}), StatusIs(absl::StatusCode::kAborted));
}

TEST_F(CacheManagerTest, CloseSessionReleasesAndReportsTheCount) {
  auto session = OpenSession();
  OpenSequence(*session, "alpha");
  OpenSequence(*session, "beta");
  auto released = manager_.CloseSession(session->id, kEpoch, kPrincipal);
  ASSERT_OK(released);
  EXPECT_EQ(*released, 2);
  EXPECT_EQ(Referenced("alpha") + Referenced("beta"), 0);
  released = manager_.CloseSession(session->id, kEpoch, kPrincipal);  // idempotent
  ASSERT_OK(released);
  EXPECT_EQ(*released, 0);
  EXPECT_THAT(manager_.CloseSession(999, kEpoch, kPrincipal),
              StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(CacheManagerTest, StaleEpochIsFailedPrecondition) {
  auto session = OpenSession();
  EXPECT_OK(manager_.SessionFor(session->id, 0, kPrincipal));
  EXPECT_OK(manager_.SessionFor(session->id, kEpoch, kPrincipal));
  EXPECT_THAT(manager_.SessionFor(session->id, kEpoch + 1, kPrincipal),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("restarted")));
}

TEST_F(CacheManagerTest, TtlIsClampedAndDefaulted) {
  auto defaulted = OpenSession(absl::ZeroDuration());
  EXPECT_EQ(defaulted->ttl, SessionLimits{}.default_ttl);
  auto tiny = OpenSession(absl::Milliseconds(1));
  EXPECT_EQ(tiny->ttl, SessionLimits{}.min_ttl);
  auto huge = OpenSession(absl::Hours(100));
  EXPECT_EQ(huge->ttl, SessionLimits{}.max_ttl);
  EXPECT_THAT(manager_.sessions().Open(kPrincipal, std::string(300, 't'), "", absl::Seconds(1)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(CacheManagerTest, SessionLimitIsResourceExhausted) {
  CacheManager small(SessionLimits{.max_sessions = 2}, &clock_, kEpoch);
  ASSERT_OK(small.sessions().Open(kPrincipal, "t", "", absl::Seconds(1)));
  ASSERT_OK(small.sessions().Open(kPrincipal, "t", "", absl::Seconds(1)));
  EXPECT_THAT(small.sessions().Open(kPrincipal, "t", "", absl::Seconds(1)),
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

TEST_F(CacheManagerTest, DeviceFaultInAForkIsUnavailableNamingItAndLeavesNoChild) {
  auto session = OpenSession();
  const uint64_t parent = OpenSequence(*session, "alpha");
  const PoolStatsSnapshot before = (*manager_.FindPool("alpha"))->Stats();

  const absl::Status forked = ForkIntoADeviceFault(*session, parent);
  EXPECT_THAT(forked, StatusIs(absl::StatusCode::kUnavailable,
                               AllOf(HasSubstr("pool 'alpha'"),
                                     HasSubstr("INTERNAL: copying a block: an illegal memory"))));
  EXPECT_EQ(manager_.device_faults().status(), forked);
  // The half-made child and the copy's pin are gone; the parent is untouched.
  const PoolStatsSnapshot after = (*manager_.FindPool("alpha"))->Stats();
  EXPECT_EQ(after.open_sequences, before.open_sequences);
  EXPECT_EQ(after.referenced, before.referenced);
}

TEST_F(CacheManagerTest, AfterADeviceFaultEveryPoolsBlockCallsAnswerTheLatchedStatus) {
  auto session = OpenSession();
  const OpenedSequence in_alpha = Open(*session, "alpha");
  const OpenedSequence in_beta = Open(*session, "beta");
  const absl::Status latched = ForkIntoADeviceFault(*session, in_alpha.sequence_id);
  ASSERT_THAT(latched, StatusIs(absl::StatusCode::kUnavailable));
  const int alpha_calls = memories_[0]->calls();
  const int beta_calls = memories_[1]->calls();

  // beta's memory never failed, but it shares the device, and so the latch, with alpha.
  for (const OpenedSequence& sequence : {in_alpha, in_beta}) {
    Pool* pool = *manager_.PoolOfSequence(sequence.sequence_id);
    SCOPED_TRACE(pool->options().name);
    const BlockId block = sequence.block_ids[0];
    EXPECT_EQ(pool->Open(*session, SequenceSpec{kTokens}).status(), latched);
    EXPECT_EQ(pool->Extend(*session, sequence.sequence_id, kTokens).status(), latched);
    EXPECT_EQ(pool->Commit(*session, sequence.sequence_id, 16).status(), latched);
    EXPECT_EQ(pool->Fork(*session, sequence.sequence_id).status(), latched);
    EXPECT_EQ(pool->Lookup("tenant", SequenceSpec{kTokens}).status(), latched);
    EXPECT_EQ(pool->BlockChecksum(block).status(), latched);
    char byte = 0;
    EXPECT_EQ(pool->ReadBlock(block, 0, 1, &byte), latched);
    EXPECT_EQ(pool->WriteBlock(block, 0, "x"), latched);
  }
  // Refused before touching memory.
  EXPECT_EQ(memories_[0]->calls(), alpha_calls);
  EXPECT_EQ(memories_[1]->calls(), beta_calls);

  // Dropping references still works, so leases end cleanly and the invariants hold (TearDown).
  EXPECT_OK((*manager_.FindPool("alpha"))->Release(*session, in_alpha.sequence_id));
  EXPECT_OK(manager_.CloseSession(session->id, kEpoch, kPrincipal));
  EXPECT_EQ(Referenced("alpha") + Referenced("beta"), 0);
  EXPECT_EQ(manager_.device_faults().status(), latched);
}

TEST_F(CacheManagerTest, AFaultingChecksumLatchesForEveryPool) {
  auto session = OpenSession();
  const BlockId in_alpha = Open(*session, "alpha").block_ids[0];
  const BlockId in_beta = Open(*session, "beta").block_ids[0];
  memories_[1]->FailNth(FaultInjectionPoolMemory::Op::kChecksum, 1,
                        absl::DataLossError("uncorrectable ECC error"));
  const absl::Status latched = (*manager_.FindPool("beta"))->BlockChecksum(in_beta).status();
  EXPECT_THAT(latched, StatusIs(absl::StatusCode::kUnavailable,
                                AllOf(HasSubstr("pool 'beta'"),
                                      HasSubstr("DATA_LOSS: uncorrectable ECC error"))));
  char byte = 0;
  EXPECT_EQ((*manager_.FindPool("alpha"))->ReadBlock(in_alpha, 0, 1, &byte), latched);
}

TEST_F(CacheManagerTest, ACallersRangeErrorIsNotADeviceFault) {
  auto session = OpenSession();
  Pool* alpha = *manager_.FindPool("alpha");
  const BlockId block = Open(*session, "alpha").block_ids[0];
  EXPECT_THAT(alpha->WriteBlock(block, alpha->options().layout.BlockBytes(), "x"),
              StatusIs(absl::StatusCode::kOutOfRange));
  EXPECT_OK(manager_.device_faults().status());
  EXPECT_OK(alpha->WriteBlock(block, 0, "x"));
}

}  // namespace
}  // namespace kvcache
