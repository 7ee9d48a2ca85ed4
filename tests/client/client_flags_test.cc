// ClientOptionsFromFlags: the token comes from --token_file or $KVCACHE_TOKEN, trimmed, and never
// shows in an error; any --tls_* flag turns TLS on; unset flags keep the base options.
#include "client/client_flags.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "client/kv_cache_client.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_files.h"

namespace kvcache {
namespace {

using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::kvcache::worker::testing::WriteFile;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

// A secret to look for in errors.
constexpr char kSecret[] = "kvc-flag-secret-51c2";

// Each test starts from default flags and no $KVCACHE_TOKEN, and leaves them so.
class ClientFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override { unsetenv(kTokenEnvironmentVariable); }
  void TearDown() override { unsetenv(kTokenEnvironmentVariable); }

  absl::FlagSaver flag_saver_;
  ScopedTempDir dir_;
};

TEST_F(ClientFlagsTest, NoFlagsKeepTheBaseOptions) {
  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags(
      ClientOptions{.rpc_timeout = absl::Seconds(7), .bearer_token = "from-base"});
  ASSERT_OK(options);
  EXPECT_EQ(options->rpc_timeout, absl::Seconds(7));
  EXPECT_EQ(options->bearer_token, "from-base");
  EXPECT_FALSE(options->tls.enabled);

  options = ClientOptionsFromFlags();
  ASSERT_OK(options);
  EXPECT_THAT(options->bearer_token, IsEmpty());
  EXPECT_FALSE(options->tls.enabled);
  EXPECT_FALSE(options->allow_plaintext_token);
}

TEST_F(ClientFlagsTest, AllowPlaintextTokenSetsTheOption) {
  absl::SetFlag(&FLAGS_allow_plaintext_token, true);
  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags();
  ASSERT_OK(options);
  EXPECT_TRUE(options->allow_plaintext_token);
}

TEST_F(ClientFlagsTest, TokenFileIsReadWithItsTrailingWhitespaceTrimmed) {
  const std::string path = dir_.File("token");
  WriteFile(path, std::string(kSecret) + " \r\n\n");
  absl::SetFlag(&FLAGS_token_file, path);
  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags();
  ASSERT_OK(options);
  EXPECT_EQ(options->bearer_token, kSecret);
}

TEST_F(ClientFlagsTest, EnvironmentGivesTheTokenWhenThereIsNoTokenFile) {
  setenv(kTokenEnvironmentVariable, "kvc-env-token\n", 1);
  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags();
  ASSERT_OK(options);
  EXPECT_EQ(options->bearer_token, "kvc-env-token");

  // The file wins over the environment.
  const std::string path = dir_.File("token");
  WriteFile(path, kSecret);
  absl::SetFlag(&FLAGS_token_file, path);
  options = ClientOptionsFromFlags();
  ASSERT_OK(options);
  EXPECT_EQ(options->bearer_token, kSecret);

  // Set but empty is unset.
  absl::SetFlag(&FLAGS_token_file, "");
  setenv(kTokenEnvironmentVariable, "", 1);
  options = ClientOptionsFromFlags();
  ASSERT_OK(options);
  EXPECT_THAT(options->bearer_token, IsEmpty());
}

TEST_F(ClientFlagsTest, MissingTokenFileIsNamed) {
  const std::string path = dir_.File("no-such-token");
  absl::SetFlag(&FLAGS_token_file, path);
  EXPECT_THAT(ClientOptionsFromFlags(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--token_file"), HasSubstr(path))));
}

TEST_F(ClientFlagsTest, TokenFileThatIsADirectoryIsNamed) {
  absl::SetFlag(&FLAGS_token_file, dir_.path());
  EXPECT_THAT(ClientOptionsFromFlags(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(dir_.path())));
}

TEST_F(ClientFlagsTest, UnsendableTokenIsRefusedWithoutQuotingIt) {
  const std::string path = dir_.File("token");
  WriteFile(path, std::string(kSecret) + " and more words\n");
  absl::SetFlag(&FLAGS_token_file, path);
  EXPECT_THAT(ClientOptionsFromFlags(), StatusIs(absl::StatusCode::kInvalidArgument,
                                                 AllOf(HasSubstr(path), Not(HasSubstr(kSecret)))));

  absl::SetFlag(&FLAGS_token_file, "");
  setenv(kTokenEnvironmentVariable, (std::string(kSecret) + "\x01").c_str(), 1);
  EXPECT_THAT(ClientOptionsFromFlags(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(kTokenEnvironmentVariable), Not(HasSubstr(kSecret)))));
}

TEST_F(ClientFlagsTest, EmptyTokenFileIsRefused) {
  const std::string path = dir_.File("token");
  WriteFile(path, "\n");
  absl::SetFlag(&FLAGS_token_file, path);
  EXPECT_THAT(ClientOptionsFromFlags(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(path)));
}

TEST_F(ClientFlagsTest, TlsCaImpliesTls) {
  absl::SetFlag(&FLAGS_tls_ca, "/etc/kvcache/ca.pem");
  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags();
  ASSERT_OK(options);
  EXPECT_TRUE(options->tls.enabled);
  EXPECT_EQ(options->tls.ca_file, "/etc/kvcache/ca.pem");
  EXPECT_THAT(options->tls.cert_file, IsEmpty());
}

TEST_F(ClientFlagsTest, TlsCertAndKeyImplyTlsTogether) {
  absl::SetFlag(&FLAGS_tls_cert, "/etc/kvcache/worker.pem");
  EXPECT_THAT(ClientOptionsFromFlags(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tls_key")));
  absl::SetFlag(&FLAGS_tls_key, "/etc/kvcache/worker.key");
  absl::SetFlag(&FLAGS_tls_server_name, "kvcache.internal");
  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags();
  ASSERT_OK(options);
  EXPECT_TRUE(options->tls.enabled);
  EXPECT_EQ(options->tls.cert_file, "/etc/kvcache/worker.pem");
  EXPECT_EQ(options->tls.key_file, "/etc/kvcache/worker.key");
  EXPECT_EQ(options->tls.server_name, "kvcache.internal");
}

TEST_F(ClientFlagsTest, TlsAloneUsesTheDefaultRoots) {
  absl::SetFlag(&FLAGS_tls, true);
  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags();
  ASSERT_OK(options);
  EXPECT_TRUE(options->tls.enabled);
  EXPECT_THAT(options->tls.ca_file, IsEmpty());
}

TEST_F(ClientFlagsTest, TlsFlagsWithAUnixTargetAreRefusedByConnect) {
  absl::SetFlag(&FLAGS_tls_ca, dir_.File("ca.pem"));
  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags();
  ASSERT_OK(options);
  const std::string target = "unix://" + dir_.File("kv.sock");
  EXPECT_THAT(KvCacheClient::Connect(target, *options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(target)));
}

}  // namespace
}  // namespace kvcache
