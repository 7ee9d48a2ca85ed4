#include "auth/identity_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kDigest[] =
    "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

// kDigest is SHA-256("test"): a token line written with TokenDigestText names that token.
TEST(IdentityFileTest, TokenDigestTextIsHowAFileNamesAToken) {
  EXPECT_EQ(TokenDigestText("test"), kDigest);
  absl::StatusOr<IdentityFile> file = ParseIdentityFile(
      absl::StrCat("tenant acme\ntoken t ", TokenDigestText("a token"), " acme worker\n"));
  ASSERT_OK(file);
  ASSERT_EQ(file->tokens.size(), 1u);
  EXPECT_EQ(file->tokens[0].digest, Sha256Of("a token"));
}

TEST(IdentityFileTest, ParsesEveryKindOfLine) {
  absl::StatusOr<IdentityFile> file = ParseIdentityFile(
      absl::StrCat("# comment\n"
                   "tenant acme max_referenced_blocks=100 max_sessions=4 max_open_sequences=8 "
                   "max_put_bytes_in_flight=64MiB\n"
                   "\n"
                   "uid 1000 acme worker   # trailing comment\n"
                   "uid * guests reader\n"
                   "gid 2000 ops admin\n"
                   "token router ",
                   kDigest,
                   " acme reader\n"
                   "subject worker-a.example acme worker\n"));
  ASSERT_OK(file);
  EXPECT_EQ(file->limits.at("acme").max_referenced_blocks, 100u);
  EXPECT_EQ(file->limits.at("acme").max_sessions, 4u);
  EXPECT_EQ(file->limits.at("acme").max_open_sequences, 8u);
  EXPECT_EQ(file->limits.at("acme").max_put_bytes_in_flight, uint64_t{64} << 20);
  EXPECT_EQ(file->uids.at(1000).tenant, "acme");
  EXPECT_EQ(file->uids.at(1000).role, Role::kWorker);
  ASSERT_TRUE(file->any_uid.has_value());
  EXPECT_EQ(file->any_uid->role, Role::kReader);
  EXPECT_EQ(file->gids.at(2000).role, Role::kAdmin);
  ASSERT_EQ(file->tokens.size(), 1u);
  EXPECT_EQ(file->tokens[0].name, "router");
  EXPECT_EQ(file->tokens[0].digest, Sha256Of("test"));
  EXPECT_EQ(file->subjects.at("worker-a.example").tenant, "acme");
}

TEST(IdentityFileTest, ErrorsNameTheLineAndNeverEchoADigest) {
  const std::string bad_digest = "sha256:" + std::string(63, 'a') + "z";
  struct Case {
    std::string text;
    std::string message;
  };
  for (const Case& c : std::vector<Case>{
           {"uid 1000 acme boss\n", "line 1: unknown role 'boss'"},
           {"\nuid x acme worker\n", "line 2: 'x' is not a numeric uid"},
           {"uid 1 a worker\nuid 1 b worker\n", "line 2: duplicate uid 1"},
           {"token t " + bad_digest + " acme worker\n", "line 1: a token digest is sha256:"},
           {"token t plaintext-secret acme worker\n", "line 1: a token digest is sha256:"},
           {absl::StrCat("token t ", kDigest, " a worker\ntoken u ", kDigest, " b worker\n"),
            "line 2: the same token is listed twice"},
           {"tenant acme max_blocks=3\n", "line 1: unknown limit 'max_blocks'"},
           {"tenant acme max_sessions=many\n", "line 1: 'max_sessions=many' is not"},
           {"subject only-a-name\n", "line 1: want 'subject NAME TENANT ROLE'"},
           {"user 1000 acme worker\n", "line 1: unknown entry 'user'"},
           {"uid 1000 " + std::string(300, 't') + " worker\n", "line 1: a tenant must have"},
       }) {
    absl::StatusOr<IdentityFile> file = ParseIdentityFile(c.text);
    EXPECT_THAT(file, StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(c.message))) << c.text;
    EXPECT_THAT(std::string(file.status().message()), Not(HasSubstr("plaintext-secret")));
    EXPECT_THAT(std::string(file.status().message()), Not(HasSubstr(std::string(40, 'a'))));
  }
}

TEST(IdentityFileTest, MissingFileIsNotFound) {
  EXPECT_THAT(LoadIdentityFile("/nonexistent/identities"),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/identities")));
}

}  // namespace
}  // namespace kvcache
