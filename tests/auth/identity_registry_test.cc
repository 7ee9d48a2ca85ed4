#include "auth/identity_registry.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

IdentityFile File() {
  IdentityFile file;
  file.uids[1000] = {"acme", Role::kWorker};
  file.gids[2000] = {"ops", Role::kAdmin};
  file.tokens.push_back({"router", Sha256Of("router-secret"), "acme", Role::kReader});
  file.tokens.push_back({"batch", Sha256Of("batch-secret"), "batch", Role::kWorker});
  file.subjects["worker-a.example"] = {"acme", Role::kWorker};
  return file;
}

TEST(IdentityRegistryTest, WithoutAFileEveryPeerIsTheDefaultWorker) {
  IdentityRegistry registry;
  absl::StatusOr<Identity> peer = registry.ForUnixPeer(1234, 1234);
  ASSERT_OK(peer);
  EXPECT_EQ(peer->principal, "uid:1234");
  EXPECT_EQ(peer->tenant, "default");
  EXPECT_EQ(peer->role, Role::kWorker);
  EXPECT_OK(registry.ForAnonymousPeer("ipv4:127.0.0.1:5000"));
  EXPECT_THAT(registry.ForToken("anything"), StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST(IdentityRegistryTest, MapsUidsThenGids) {
  IdentityRegistry registry;
  registry.Install(File());
  EXPECT_EQ(registry.ForUnixPeer(1000, 2000)->tenant, "acme");  // the uid's line wins
  EXPECT_EQ(registry.ForUnixPeer(1001, 2000)->role, Role::kAdmin);
  EXPECT_THAT(registry.ForUnixPeer(1001, 1001),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("uid 1001")));
  EXPECT_THAT(registry.ForAnonymousPeer("ipv4:127.0.0.1:5000"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("no credential")));
}

TEST(IdentityRegistryTest, TokensMatchByDigestAndAreNeverEchoed) {
  IdentityRegistry registry;
  registry.Install(File());
  absl::StatusOr<Identity> router = registry.ForToken("router-secret");
  ASSERT_OK(router);
  EXPECT_EQ(router->principal, "token:router");
  EXPECT_EQ(router->role, Role::kReader);
  EXPECT_EQ(registry.ForToken("batch-secret")->tenant, "batch");
  for (const char* wrong : {"router-secreT", "router-secret ", "", "batch"}) {
    absl::StatusOr<Identity> refused = registry.ForToken(wrong);
    EXPECT_THAT(refused, StatusIs(absl::StatusCode::kUnauthenticated));
    if (*wrong != '\0') {
      EXPECT_THAT(std::string(refused.status().message()), Not(HasSubstr(wrong)));
    }
  }
}

TEST(IdentityRegistryTest, CertificatesMatchTheirFirstMappedName) {
  IdentityRegistry registry;
  registry.Install(File());
  absl::StatusOr<Identity> worker =
      registry.ForCertificate({"unknown-cn", "worker-a.example", "other-san"});
  ASSERT_OK(worker);
  EXPECT_EQ(worker->principal, "cert:worker-a.example");
  EXPECT_THAT(registry.ForCertificate({"stranger.example"}),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("stranger.example")));
}

TEST(IdentityRegistryTest, InstallReplacesTheWholeFile) {
  IdentityRegistry registry;
  registry.Install(File());
  ASSERT_OK(registry.ForToken("batch-secret"));
  IdentityFile without_batch = File();
  without_batch.tokens.pop_back();
  registry.Install(std::move(without_batch));
  EXPECT_THAT(registry.ForToken("batch-secret"), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_OK(registry.ForToken("router-secret"));
}

}  // namespace
}  // namespace kvcache
