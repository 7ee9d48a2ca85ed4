// KvCacheClient against a real in-process daemon (tests/client/daemon_fixture.h): every call's
// results and exact status codes, the keep-alive lease, and epoch fencing across a restart.
#include "client/kv_cache_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cache/pool_spec.h"
#include "tests/client/daemon_fixture.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::PollUntil;
using ::kvcache::testing::RetryWhileUnavailable;
using ::kvcache::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

class KvCacheClientTest : public kvcache::testing::DaemonFixture {
 protected:
  KvCacheClient::Stats Stats(KvCacheClient& client) {
    absl::StatusOr<KvCacheClient::Stats> stats = client.GetStats();
    EXPECT_OK(stats);
    return stats.ok() ? *stats : KvCacheClient::Stats{};
  }
};

TEST_F(KvCacheClientTest, ConnectToNothingIsUnavailable) {
  ClientOptions options;
  options.connect_timeout = absl::Milliseconds(200);
  EXPECT_THAT(KvCacheClient::Connect("unix://" + dir_.File("nobody.sock"), options),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(KvCacheClientTest, PingReturnsTheDaemonEpoch) {
  absl::StatusOr<uint64_t> epoch = client_->Ping();
  ASSERT_OK(epoch);
  EXPECT_EQ(*epoch, daemon_->manager().epoch());
}

TEST_F(KvCacheClientTest, ListPoolsDescribesEveryPool) {
  absl::StatusOr<std::vector<KvCacheClient::PoolInfo>> pools = client_->ListPools();
  ASSERT_OK(pools);
  ASSERT_EQ(pools->size(), 3u);  // default, tiny, large
  const PoolOptions expected = DefaultPoolOptions();
  const KvCacheClient::PoolInfo& pool = (*pools)[0];
  EXPECT_EQ(pool.name, "default");
  EXPECT_EQ(pool.model_id, expected.model_id);
  EXPECT_EQ(pool.layout.num_layers, expected.layout.num_layers);
  EXPECT_EQ(pool.layout.num_kv_heads, expected.layout.num_kv_heads);
  EXPECT_EQ(pool.layout.head_dim, expected.layout.head_dim);
  EXPECT_EQ(pool.layout.block_size, kBlockSize);
  EXPECT_EQ(pool.layout.dtype, expected.layout.dtype);
  EXPECT_EQ(pool.block_bytes, expected.layout.BlockBytes());
  EXPECT_EQ(pool.layout_fingerprint,
            (*daemon_->manager().FindPool("default"))->layout_fingerprint());
  EXPECT_EQ(pool.num_blocks, kDefaultBlocks);
  EXPECT_EQ(pool.hash_algorithm, HashAlgorithm::kXxh3_128);
  EXPECT_EQ(pool.memory_kind, "host");
  EXPECT_EQ((*pools)[1].name, "tiny");
  EXPECT_EQ((*pools)[1].num_blocks, kTinyBlocks);
}

TEST_F(KvCacheClientTest, DescribePool) {
  absl::StatusOr<KvCacheClient::PoolDescription> described = client_->DescribePool("tiny");
  ASSERT_OK(described);
  EXPECT_EQ(described->pool.name, "tiny");
  EXPECT_EQ(described->counts.free, kTinyBlocks);
  EXPECT_EQ(described->counts.evictable, 0u);
  EXPECT_EQ(described->counts.referenced, 0u);
  EXPECT_THAT(client_->DescribePool("nope"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(KvCacheClientTest, OpenSessionGrantsTtlAndEpoch) {
  absl::StatusOr<KvCacheClient::SessionInfo> session =
      client_->OpenSession("", "test", absl::Seconds(2));
  ASSERT_OK(session);
  EXPECT_NE(session->session_id, 0u);
  EXPECT_EQ(session->epoch, daemon_->manager().epoch());
  EXPECT_EQ(session->ttl, absl::Seconds(2));
  EXPECT_EQ(client_->session_id(), session->session_id);
  EXPECT_EQ(client_->session_epoch(), session->epoch);
  EXPECT_EQ(Stats(*client_).open_sessions, 1u);
  // One session per client while it is healthy.
  EXPECT_THAT(client_->OpenSession("", "test"), StatusIs(absl::StatusCode::kAlreadyExists));
  // A TTL of zero takes the daemon's default.
  std::unique_ptr<KvCacheClient> other = Connect();
  absl::StatusOr<KvCacheClient::SessionInfo> defaulted = other->OpenSession("", "other");
  ASSERT_OK(defaulted);
  EXPECT_EQ(defaulted->ttl, SessionLimits().default_ttl);
  EXPECT_NE(defaulted->session_id, session->session_id);
}

TEST_F(KvCacheClientTest, CommittedPrefixIsHitOnTheSameBlocks) {
  ASSERT_OK(client_->OpenSession("", "test"));
  const std::vector<uint32_t> prompt = Tokens(3 * kBlockSize + 8);
  absl::StatusOr<KvCacheClient::Sequence> first = client_->OpenSequence("default", prompt);
  ASSERT_OK(first);
  EXPECT_EQ(first->block_ids.size(), 4u);
  EXPECT_EQ(first->num_cached_tokens, 0u);

  absl::StatusOr<KvCacheClient::Commit> commit =
      client_->CommitSequence(first->sequence_id, prompt.size());
  ASSERT_OK(commit);
  EXPECT_EQ(commit->num_committed_blocks, 3u);
  EXPECT_EQ(commit->num_published_blocks, 3u);
  // Idempotent: committing again (or less) publishes nothing new.
  commit = client_->CommitSequence(first->sequence_id, kBlockSize);
  ASSERT_OK(commit);
  EXPECT_EQ(commit->num_committed_blocks, 3u);
  EXPECT_EQ(commit->num_published_blocks, 0u);
  ASSERT_OK(client_->ReleaseSequence(first->sequence_id));

  absl::StatusOr<KvCacheClient::Sequence> second = client_->OpenSequence("default", prompt);
  ASSERT_OK(second);
  EXPECT_EQ(second->num_cached_tokens, 3 * kBlockSize);
  ASSERT_EQ(second->block_ids.size(), 4u);
  EXPECT_THAT(std::vector<uint32_t>(second->block_ids.begin(), second->block_ids.begin() + 3),
              ElementsAreArray(first->block_ids.begin(), first->block_ids.begin() + 3));

  const KvCacheClient::Stats stats = Stats(*client_);
  ASSERT_EQ(stats.pools.size(), 3u);
  const KvCacheClient::PoolStats& pool = stats.pools[0];
  EXPECT_EQ(pool.pool, "default");
  EXPECT_EQ(pool.prompt_tokens, 2 * prompt.size());
  EXPECT_EQ(pool.hit_tokens, 3 * kBlockSize);
  EXPECT_EQ(pool.hit_blocks, 3u);
  EXPECT_EQ(pool.resurrected_blocks, 3u);
  EXPECT_EQ(pool.miss_blocks, 5u);
  EXPECT_EQ(pool.published_blocks, 3u);
  EXPECT_EQ(pool.open_sequences, 1u);
  EXPECT_EQ(pool.counts.referenced, 4u);
  EXPECT_EQ(pool.counts.free + pool.counts.evictable + pool.counts.referenced, kDefaultBlocks);
  ASSERT_OK(client_->GetStats("tiny"));
  EXPECT_EQ(client_->GetStats("tiny")->pools.size(), 1u);
  EXPECT_THAT(client_->GetStats("nope"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(KvCacheClientTest, LookupSeesOnlyTheSameTenantSaltAndExtraKeys) {
  ASSERT_OK(client_->OpenSession("", "test"));
  const std::vector<uint32_t> prompt = Tokens(2 * kBlockSize);
  const ExtraKeys lora{.lora_id = "adapter-1", .multimodal_items = {}};
  absl::StatusOr<KvCacheClient::Sequence> sequence =
      client_->OpenSequence("default", prompt, "salt", lora);
  ASSERT_OK(sequence);
  ASSERT_OK(client_->CommitSequence(sequence->sequence_id, prompt.size()));

  absl::StatusOr<KvCacheClient::LookupResult> hit =
      client_->Lookup("default", "", prompt, "salt", lora);
  ASSERT_OK(hit);
  // Lookup is not capped: the whole prompt is reported.
  EXPECT_EQ(hit->num_cached_blocks, 2u);
  EXPECT_EQ(hit->num_cached_tokens, 2 * kBlockSize);
  // Another tenant is not this caller's to look into.
  EXPECT_THAT(client_->Lookup("default", "other", prompt, "salt", lora),
              StatusIs(absl::StatusCode::kPermissionDenied));
  EXPECT_EQ(client_->Lookup("default", "", prompt, "pepper", lora)->num_cached_blocks, 0u);
  EXPECT_EQ(client_->Lookup("default", "", prompt, "salt")->num_cached_blocks, 0u);
  EXPECT_THAT(client_->Lookup("nope", "", prompt), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(KvCacheClientTest, ExtendAllocatesBlocksAsTheSequenceGrows) {
  ASSERT_OK(client_->OpenSession("", "test"));
  absl::StatusOr<KvCacheClient::Sequence> sequence =
      client_->OpenSequence("default", Tokens(kBlockSize));
  ASSERT_OK(sequence);
  ASSERT_EQ(sequence->block_ids.size(), 1u);
  absl::StatusOr<KvCacheClient::Extension> extended =
      client_->ExtendSequence(sequence->sequence_id, Tokens(1, 7));
  ASSERT_OK(extended);
  EXPECT_EQ(extended->new_block_ids.size(), 1u);
  EXPECT_EQ(extended->num_tokens, kBlockSize + 1);
  extended = client_->ExtendSequence(sequence->sequence_id, Tokens(2, 8));
  ASSERT_OK(extended);
  EXPECT_THAT(extended->new_block_ids, ElementsAre());
  EXPECT_EQ(extended->num_tokens, kBlockSize + 3);
  EXPECT_THAT(client_->ExtendSequence(sequence->sequence_id, {}),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST_F(KvCacheClientTest, ForkSharesFullBlocksAndCopiesThePartialOne) {
  ASSERT_OK(client_->OpenSession("", "test"));
  absl::StatusOr<KvCacheClient::Sequence> parent =
      client_->OpenSequence("default", Tokens(kBlockSize + 4));
  ASSERT_OK(parent);
  absl::StatusOr<KvCacheClient::Fork> child = client_->ForkSequence(parent->sequence_id);
  ASSERT_OK(child);
  EXPECT_NE(child->sequence_id, parent->sequence_id);
  ASSERT_EQ(child->block_ids.size(), 2u);
  EXPECT_EQ(child->block_ids[0], parent->block_ids[0]);
  EXPECT_NE(child->block_ids[1], parent->block_ids[1]);
  EXPECT_EQ(child->copied_from_block, parent->block_ids[1]);

  absl::StatusOr<KvCacheClient::Sequence> aligned =
      client_->OpenSequence("default", Tokens(2 * kBlockSize, 500));
  ASSERT_OK(aligned);
  absl::StatusOr<KvCacheClient::Fork> aligned_child = client_->ForkSequence(aligned->sequence_id);
  ASSERT_OK(aligned_child);
  EXPECT_EQ(aligned_child->block_ids, aligned->block_ids);
  EXPECT_EQ(aligned_child->copied_from_block, std::nullopt);
}

TEST_F(KvCacheClientTest, BadRequestsGetExactCodes) {
  ASSERT_OK(client_->OpenSession("", "test"));
  const std::vector<uint32_t> prompt = Tokens(kBlockSize + 1);
  EXPECT_THAT(client_->OpenSequence("nope", prompt), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(client_->OpenSequence("default", {}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no tokens")));
  EXPECT_OK(client_->OpenSequence("default", prompt, std::string(256, 's')));
  EXPECT_THAT(client_->OpenSequence("default", prompt, std::string(257, 's')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("cache_salt")));

  absl::StatusOr<KvCacheClient::Sequence> sequence = client_->OpenSequence("default", prompt);
  ASSERT_OK(sequence);
  EXPECT_THAT(client_->CommitSequence(sequence->sequence_id, prompt.size() + 1),
              StatusIs(absl::StatusCode::kInvalidArgument));

  // Pool index 0 exists but the sequence does not; pool index 7 does not exist at all.
  for (const uint64_t unknown : {uint64_t{999} * kMaxPools, uint64_t{7}}) {
    EXPECT_THAT(client_->CommitSequence(unknown, 1), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(client_->ExtendSequence(unknown, prompt), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(client_->ForkSequence(unknown), StatusIs(absl::StatusCode::kNotFound));
    EXPECT_THAT(client_->ReleaseSequence(unknown), StatusIs(absl::StatusCode::kNotFound));
  }
  ASSERT_OK(client_->ReleaseSequence(sequence->sequence_id));
  EXPECT_THAT(client_->ReleaseSequence(sequence->sequence_id),
              StatusIs(absl::StatusCode::kNotFound));

  // Regression (issue 17): Lookup took a 300-byte tenant where OpenSession refused one over 256.
  // One rule, before any permission check.
  EXPECT_THAT(client_->Lookup("default", std::string(300, 't'), prompt),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 256")));
  std::unique_ptr<KvCacheClient> other = Connect();
  ASSERT_NE(other, nullptr);
  EXPECT_THAT(other->OpenSession(std::string(257, 't'), "test"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at most 256")));
  EXPECT_FALSE(client_->epoch_changed());
  EXPECT_FALSE(client_->session_lost());
}

TEST_F(KvCacheClientTest, TinyPoolIsResourceExhaustedAndUnchanged) {
  ASSERT_OK(client_->OpenSession("", "test"));
  EXPECT_THAT(client_->OpenSequence("tiny", Tokens((kTinyBlocks + 1) * kBlockSize)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  ASSERT_OK(client_->OpenSequence("tiny", Tokens(3 * kBlockSize)));
  EXPECT_THAT(client_->OpenSequence("tiny", Tokens(2 * kBlockSize, 900)),
              StatusIs(absl::StatusCode::kResourceExhausted));
  absl::StatusOr<KvCacheClient::PoolDescription> tiny = client_->DescribePool("tiny");
  ASSERT_OK(tiny);
  EXPECT_EQ(tiny->counts.referenced, 3u);
  EXPECT_EQ(tiny->counts.free, 1u);
}

TEST_F(KvCacheClientTest, CloseSessionReleasesAndLaterCallsAreAborted) {
  ASSERT_OK(client_->OpenSession("", "test"));
  absl::StatusOr<KvCacheClient::Sequence> sequence =
      client_->OpenSequence("default", Tokens(3 * kBlockSize));
  ASSERT_OK(sequence);
  ASSERT_OK(client_->OpenSequence("default", Tokens(kBlockSize, 300)));
  absl::StatusOr<uint32_t> released = client_->CloseSession();
  ASSERT_OK(released);
  EXPECT_EQ(*released, 2u);
  const KvCacheClient::Stats stats = Stats(*client_);
  EXPECT_EQ(stats.open_sessions, 0u);
  EXPECT_EQ(stats.pools[0].counts.referenced, 0u);
  EXPECT_EQ(stats.pools[0].open_sequences, 0u);

  EXPECT_THAT(client_->OpenSequence("default", Tokens(4)), StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(client_->CommitSequence(sequence->sequence_id, 4),
              StatusIs(absl::StatusCode::kAborted));
  EXPECT_THAT(client_->ReleaseSequence(sequence->sequence_id),
              StatusIs(absl::StatusCode::kAborted));
  // The user closed it: that is not a lost lease.
  EXPECT_FALSE(client_->session_lost());
  // A new session may be opened after closing.
  ASSERT_OK(client_->OpenSession("", "test"));
  EXPECT_OK(client_->OpenSequence("default", Tokens(4)));
}

TEST_F(KvCacheClientTest, DestructorClosesTheSession) {
  std::unique_ptr<KvCacheClient> other = Connect();
  ASSERT_OK(other->OpenSession("", "short-lived"));
  ASSERT_OK(other->OpenSequence("default", Tokens(2 * kBlockSize)));
  EXPECT_EQ(Stats(*client_).open_sessions, 1u);
  other.reset();
  const KvCacheClient::Stats stats = Stats(*client_);
  EXPECT_EQ(stats.open_sessions, 0u);
  EXPECT_EQ(stats.pools[0].counts.referenced, 0u);
}

TEST_F(KvCacheClientTest, KeepAliveHoldsAShortLeaseOpen) {
  // What is tested is the client's background thread really sending keep-alives, and that runs on
  // real time (every ttl/3), so the lease is short: 300 ms, a keep-alive every 100 ms. The
  // daemon's side runs on the fixture's FakeClock, so no sleep has to outlast a deadline: each
  // round moves the daemon's time 90% of the lease on and waits until a keep-alive sent after
  // that has pushed the deadline to a full lease from the new now (without keep-alives that wait
  // fails). Three rounds take the daemon 2.7 leases past the open, with the session still there.
  constexpr absl::Duration kLease = absl::Milliseconds(300);
  absl::StatusOr<KvCacheClient::SessionInfo> session = client_->OpenSession("", "test", kLease);
  ASSERT_OK(session);
  ASSERT_EQ(session->ttl, kLease);
  absl::StatusOr<KvCacheClient::Sequence> sequence =
      client_->OpenSequence("default", Tokens(2 * kBlockSize));
  ASSERT_OK(sequence);
  SessionRegistry& sessions = daemon_->manager().sessions();
  for (int round = 0; round < 3; ++round) {
    clock_.Advance(kLease * 9 / 10);
    ASSERT_TRUE(PollUntil([&] {
      const absl::StatusOr<absl::Time> deadline = sessions.Deadline(session->session_id);
      return deadline.ok() && *deadline == clock_.Now() + kLease;
    })) << "no keep-alive arrived in round "
        << round << ": " << sessions.Deadline(session->session_id).status();
  }
  EXPECT_OK(client_->CommitSequence(sequence->sequence_id, 2 * kBlockSize));
  EXPECT_EQ(Stats(*client_).open_sessions, 1u);
  EXPECT_FALSE(client_->session_lost());
}

TEST_F(KvCacheClientTest, LeaseEndedByTheDaemonMarksSessionLost) {
  absl::Mutex mu;
  std::vector<absl::Status> lost;
  ClientOptions options;
  options.on_session_lost = [&](const absl::Status& status) {
    absl::MutexLock lock(&mu);
    lost.push_back(status);
  };
  std::unique_ptr<KvCacheClient> client = Connect(options);
  absl::StatusOr<KvCacheClient::SessionInfo> session =
      client->OpenSession("", "test", absl::Milliseconds(300));
  ASSERT_OK(session);
  ASSERT_OK(client->OpenSequence("default", Tokens(2 * kBlockSize)));
  // The daemon ends the lease on its side, as if it had expired.
  ASSERT_OK(daemon_->manager().CloseSession(session->session_id, session->epoch,
                                            OwnerOf(session->session_id)));
  // The flag is latched before the callback runs: wait for both.
  ASSERT_TRUE(PollUntil([&] {
    absl::MutexLock lock(&mu);
    return client->session_lost() && !lost.empty();
  }));
  {
    absl::MutexLock lock(&mu);
    ASSERT_EQ(lost.size(), 1u);
    EXPECT_THAT(lost[0], StatusIs(absl::StatusCode::kAborted));
  }
  EXPECT_FALSE(client->epoch_changed());
  EXPECT_THAT(client->OpenSequence("default", Tokens(4)), StatusIs(absl::StatusCode::kAborted));
  // A lost session may be replaced without closing it first.
  ASSERT_OK(client->OpenSession("", "test"));
  EXPECT_FALSE(client->session_lost());
  EXPECT_OK(client->OpenSequence("default", Tokens(4)));
}

TEST_F(KvCacheClientTest, RestartedDaemonIsFencedWithFailedPrecondition) {
  std::atomic<int> changes{0};
  std::atomic<uint64_t> seen_old_epoch{0};
  std::atomic<uint64_t> seen_new_epoch{0};
  ClientOptions options;
  // Wait across the restart instead of failing UNAVAILABLE while nothing listens.
  options.wait_for_ready = true;
  options.on_epoch_change = [&](uint64_t old_epoch, uint64_t new_epoch) {
    seen_old_epoch = old_epoch;
    seen_new_epoch = new_epoch;
    ++changes;
  };
  std::unique_ptr<KvCacheClient> client = Connect(options);
  absl::StatusOr<KvCacheClient::SessionInfo> session = client->OpenSession("", "test");
  ASSERT_OK(session);
  absl::StatusOr<KvCacheClient::Sequence> sequence =
      client->OpenSequence("default", Tokens(2 * kBlockSize));
  ASSERT_OK(sequence);
  const uint64_t old_epoch = daemon_->manager().epoch();

  daemon_.reset();
  StartDaemon();
  const uint64_t new_epoch = daemon_->manager().epoch();
  ASSERT_NE(new_epoch, old_epoch);

  EXPECT_THAT(RetryWhileUnavailable(
                  [&] { return client->CommitSequence(sequence->sequence_id, 2 * kBlockSize); }),
              StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_TRUE(client->epoch_changed());
  // The keep-alive thread may have noticed first and still be about to run the callback.
  ASSERT_TRUE(PollUntil([&] { return changes.load() > 0; }));
  EXPECT_EQ(changes.load(), 1);
  EXPECT_EQ(seen_old_epoch.load(), old_epoch);
  // The error reply's trailing metadata names the new epoch.
  EXPECT_EQ(seen_new_epoch.load(), new_epoch);
  // Calls that carry no session are checked against the reply's epoch.
  EXPECT_THAT(client->Ping(),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("restarted")));
  EXPECT_THAT(client->GetStats(), StatusIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(changes.load(), 1);

  // Reopening clears the fence.
  absl::StatusOr<KvCacheClient::SessionInfo> reopened = client->OpenSession("", "test");
  ASSERT_OK(reopened);
  EXPECT_EQ(reopened->epoch, new_epoch);
  EXPECT_FALSE(client->epoch_changed());
  EXPECT_FALSE(client->session_lost());
  absl::StatusOr<uint64_t> epoch = client->Ping();
  ASSERT_OK(epoch);
  EXPECT_EQ(*epoch, new_epoch);
  EXPECT_OK(client->OpenSequence("default", Tokens(2 * kBlockSize)));
}

}  // namespace
}  // namespace kvcache
