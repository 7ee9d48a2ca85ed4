// WatchEvents and ListSessions are scoped by identity: a tenant sees its own blocks and sessions,
// an admin every tenant's (or the one it names); ids of sessions are shown only to their owner.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "client/kv_cache_client.h"
#include "tests/client/daemon_fixture.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/status_matchers.h"

namespace kvcache::testing {
namespace {

using ::testing::ElementsAre;
using ::testing::UnorderedElementsAre;

class EventWatchTest : public DaemonFixture {
 protected:
  EventWatchTest() { with_other_tenant_ = true; }

  // Tenants of the stored blocks a watcher sees, until it has seen `count` of them.
  static std::vector<std::string> StoredTenants(EventWatch& watch, size_t count) {
    std::vector<std::string> tenants;
    while (tenants.size() < count) {
      absl::StatusOr<v1::WatchEventsResponse> response = watch.Next();
      EXPECT_OK(response);
      if (!response.ok()) break;
      for (const v1::KvEvent& event : response->events()) {
        if (event.has_blocks_stored()) tenants.push_back(event.blocks_stored().tenant());
      }
    }
    return tenants;
  }

  void ComputeAndRelease(KvCacheClient& client, const std::vector<uint32_t>& prompt) {
    absl::StatusOr<KvCacheClient::Sequence> opened = client.OpenSequence("default", prompt);
    ASSERT_OK(opened);
    ASSERT_OK(client.CommitSequence(opened->sequence_id, prompt.size()));
    ASSERT_OK(client.ReleaseSequence(opened->sequence_id));
  }
};

TEST_F(EventWatchTest, ATenantSeesItsOwnBlocksAndAnAdminSeesAll) {
  std::unique_ptr<KvCacheClient> globex = ConnectAsOtherTenant();
  std::unique_ptr<KvCacheClient> admin = ConnectAsAdmin();
  ASSERT_OK(client_->OpenSession("", "acme-worker"));
  ASSERT_OK(globex->OpenSession("", "globex-worker"));
  ComputeAndRelease(*client_, Tokens(2 * kBlockSize + 1, 1));
  ComputeAndRelease(*globex, Tokens(2 * kBlockSize + 1, 5000));
  ComputeAndRelease(*client_, Tokens(2 * kBlockSize + 1, 9000));

  std::unique_ptr<EventWatch> own = client_->WatchEvents({});
  EXPECT_THAT(StoredTenants(*own, 2), ElementsAre("default", "default"));
  std::unique_ptr<EventWatch> theirs = globex->WatchEvents({});
  EXPECT_THAT(StoredTenants(*theirs, 1), ElementsAre("globex"));
  std::unique_ptr<EventWatch> all = admin->WatchEvents({});
  EXPECT_THAT(StoredTenants(*all, 3), ElementsAre("default", "globex", "default"));
  std::unique_ptr<EventWatch> named = admin->WatchEvents({.tenant = "globex"});
  EXPECT_THAT(StoredTenants(*named, 1), ElementsAre("globex"));

  // Live: globex's next blocks reach globex's watcher, not the other tenant's.
  ComputeAndRelease(*globex, Tokens(kBlockSize, 7000));
  ComputeAndRelease(*client_, Tokens(kBlockSize, 8000));
  EXPECT_THAT(StoredTenants(*theirs, 1), ElementsAre("globex"));
  EXPECT_THAT(StoredTenants(*own, 1), ElementsAre("default"));

  std::unique_ptr<EventWatch> trespass = client_->WatchEvents({.tenant = "globex"});
  EXPECT_THAT(trespass->Next(), StatusIs(absl::StatusCode::kPermissionDenied));
}

TEST_F(EventWatchTest, ListSessionsShowsATenantItsOwnAndIdsOnlyToTheirOwner) {
  std::unique_ptr<KvCacheClient> globex = ConnectAsOtherTenant();
  std::unique_ptr<KvCacheClient> admin = ConnectAsAdmin();
  absl::StatusOr<KvCacheClient::SessionInfo> acme_session =
      client_->OpenSession("", "acme-worker", absl::Seconds(5));
  ASSERT_OK(acme_session);
  absl::StatusOr<KvCacheClient::SessionInfo> globex_session =
      globex->OpenSession("", "globex-worker");
  ASSERT_OK(globex_session);
  absl::StatusOr<KvCacheClient::Sequence> held = client_->OpenSequence("default", Tokens(20));
  ASSERT_OK(held);

  absl::StatusOr<std::vector<KvCacheClient::ListedSession>> own = client_->ListSessions();
  ASSERT_OK(own);
  ASSERT_EQ(own->size(), 1u);
  EXPECT_EQ((*own)[0].session_id, acme_session->session_id);
  EXPECT_EQ((*own)[0].tenant, "default");
  EXPECT_EQ((*own)[0].client_name, "acme-worker");
  EXPECT_EQ((*own)[0].principal, absl::StrCat("uid:", getuid()));
  EXPECT_EQ((*own)[0].ttl, absl::Seconds(5));
  EXPECT_EQ((*own)[0].expires_in, absl::Seconds(5));  // the fixture's clock stands still
  EXPECT_EQ((*own)[0].open_sequences, 1u);

  // A session of the same tenant opened by another identity is listed without its id.
  std::unique_ptr<KvCacheClient> admin_as_default = ConnectAsAdmin();
  ASSERT_OK(admin_as_default->OpenSession("default", "ops-in-default"));
  own = client_->ListSessions();
  ASSERT_OK(own);
  std::vector<uint64_t> ids;
  for (const auto& session : *own) ids.push_back(session.session_id);
  EXPECT_THAT(ids, UnorderedElementsAre(acme_session->session_id, 0u));

  absl::StatusOr<std::vector<KvCacheClient::ListedSession>> everything = admin->ListSessions();
  ASSERT_OK(everything);
  EXPECT_EQ(everything->size(), 3u);
  for (const auto& session : *everything) EXPECT_NE(session.session_id, 0u);
  absl::StatusOr<std::vector<KvCacheClient::ListedSession>> of_globex =
      admin->ListSessions("globex");
  ASSERT_OK(of_globex);
  ASSERT_EQ(of_globex->size(), 1u);
  EXPECT_EQ((*of_globex)[0].session_id, globex_session->session_id);

  EXPECT_THAT(client_->ListSessions("globex"), StatusIs(absl::StatusCode::kPermissionDenied));
  ASSERT_OK(client_->ReleaseSequence(held->sequence_id));
}

}  // namespace
}  // namespace kvcache::testing
