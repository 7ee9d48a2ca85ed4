#include "tiers/tier_keyring.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/hmac.h>
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kKey1[] = "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff";
constexpr char kKey2[] = "ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100";

TierKeyBytes Bytes(const std::string& hex) {
  const std::string raw = absl::HexStringToBytes(hex);
  TierKeyBytes bytes;
  std::copy(raw.begin(), raw.end(), bytes.begin());
  return bytes;
}

std::string WriteFile(const ScopedTempDir& dir, const std::string& text, mode_t mode) {
  const std::string path = dir.File("tier.key");
  std::ofstream(path) << text;
  EXPECT_EQ(chmod(path.c_str(), mode), 0);
  return path;
}

// RFC 5869 with HMAC-SHA-256, written out from the RFC: the derivation docs/security.md states.
std::string Hkdf(const TierKeyBytes& key, const std::string& info, size_t size) {
  const std::string salt = "kvcache tier keys v1";
  unsigned char prk[32];
  unsigned int length = 0;
  HMAC(EVP_sha256(), salt.data(), static_cast<int>(salt.size()), key.data(), key.size(), prk,
       &length);
  std::string okm, previous;
  for (unsigned char i = 1; okm.size() < size; ++i) {
    const std::string message = previous + info + std::string(1, static_cast<char>(i));
    unsigned char block[32];
    HMAC(EVP_sha256(), prk, sizeof(prk), reinterpret_cast<const unsigned char*>(message.data()),
         message.size(), block, &length);
    previous.assign(reinterpret_cast<const char*>(block), 32);
    okm += previous;
  }
  return okm.substr(0, size);
}

std::string Str(const TierKeyBytes& bytes) {
  return std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

TEST(ParseTierKeyFileTest, ReadsKeysNewestFirstWithCommentsAndBlankLines) {
  auto keys = ParseTierKeyFile(
      absl::StrCat("# rotated 2025-01\n\n  7:", kKey2, "  # new\n3:", kKey1, "\n"));
  ASSERT_OK(keys);
  ASSERT_EQ(keys->size(), 2u);
  EXPECT_EQ((*keys)[0].id, 7u);
  EXPECT_EQ((*keys)[0].bytes, Bytes(kKey2));
  EXPECT_EQ((*keys)[1].id, 3u);
  EXPECT_EQ((*keys)[1].bytes, Bytes(kKey1));
}

TEST(ParseTierKeyFileTest, RefusesMalformedLinesNamingTheLineNeverTheKey) {
  const std::string short_key(62, 'a');
  for (const std::string& text :
       {std::string(kKey1), absl::StrCat("0:", kKey1), absl::StrCat("4294967296:", kKey1),
        absl::StrCat("x:", kKey1), "1:" + short_key, absl::StrCat("1:", kKey1, "00"),
        absl::StrCat("1:", std::string(63, 'a'), "g"), absl::StrCat("1:", kKey1, "\n1:", kKey2),
        std::string(), std::string("# comment\n")}) {
    const absl::StatusOr<std::vector<TierMasterKey>> keys = ParseTierKeyFile(text);
    EXPECT_THAT(keys, StatusIs(absl::StatusCode::kInvalidArgument)) << text;
    EXPECT_THAT(keys.status().message(),
                AllOf(Not(HasSubstr(kKey1)), Not(HasSubstr(kKey2)), Not(HasSubstr(short_key))))
        << text;
  }
  EXPECT_THAT(ParseTierKeyFile(absl::StrCat("1:", kKey1, "\n1:", kKey2)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2")));
}

TEST(TierKeyringTest, LoadsAnOwnerOnlyFileAndRefusesOneOthersMayRead) {
  ScopedTempDir dir("tier-keyring");
  const std::string path = WriteFile(dir, absl::StrCat("2:", kKey2, "\n1:", kKey1, "\n"), 0600);
  auto keyring = TierKeyring::Load(path);
  ASSERT_OK(keyring);
  EXPECT_EQ((*keyring)->sealing_key_id(), 2u);
  EXPECT_THAT((*keyring)->key_ids(), ElementsAre(2u, 1u));
  EXPECT_EQ((*keyring)->path(), path);

  ASSERT_EQ(chmod(path.c_str(), 0644), 0);
  EXPECT_THAT(TierKeyring::Load(path),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr("--tier_key_file"), HasSubstr("open to others"),
                             Not(HasSubstr(kKey1)))));
}

TEST(TierKeyringTest, AMissingOrUnreadableFileIsRefusedWithTheReason) {
  ScopedTempDir dir("tier-keyring");
  EXPECT_THAT(TierKeyring::Load(dir.File("absent.key")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("absent.key")));
  // A directory cannot be read as one (root reads any file, whatever its mode).
  EXPECT_THAT(TierKeyring::Load(dir.path()),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("not a regular file")));
  if (geteuid() != 0) {
    const std::string path = WriteFile(dir, absl::StrCat("1:", kKey1, "\n"), 0000);
    EXPECT_THAT(TierKeyring::Load(path), StatusIs(absl::StatusCode::kPermissionDenied));
  }
  const std::string bad = WriteFile(dir, "1:zz\n", 0600);
  EXPECT_THAT(TierKeyring::Load(bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1")));
}

TEST(TierKeyringTest, ReloadSwapsTheKeysAndKeepsThemOnAnError) {
  ScopedTempDir dir("tier-keyring");
  const std::string path = WriteFile(dir, absl::StrCat("1:", kKey1, "\n"), 0600);
  auto keyring = TierKeyring::Load(path);
  ASSERT_OK(keyring);
  auto before = (*keyring)->TenantKeysFor(1, "acme");
  ASSERT_OK(before);

  WriteFile(dir, absl::StrCat("2:", kKey2, "\n1:", kKey1, "\n"), 0600);
  ASSERT_OK((*keyring)->Reload());
  EXPECT_THAT((*keyring)->key_ids(), ElementsAre(2u, 1u));
  auto after = (*keyring)->TenantKeysFor(1, "acme");
  ASSERT_OK(after);
  EXPECT_EQ(after->seal, before->seal);  // key 1 is the same key

  WriteFile(dir, "2:nothex\n", 0600);
  EXPECT_THAT((*keyring)->Reload(), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((*keyring)->key_ids(), ElementsAre(2u, 1u));

  WriteFile(dir, absl::StrCat("2:", kKey2, "\n"), 0600);
  ASSERT_OK((*keyring)->Reload());
  EXPECT_THAT((*keyring)->TenantKeysFor(1, "acme"), StatusIs(absl::StatusCode::kNotFound));
  EXPECT_THAT((*keyring)->NamesKey(1), StatusIs(absl::StatusCode::kNotFound));
}

TEST(TierKeyringTest, DerivesEachTenantsKeysWithHkdfSha256AsDocumented) {
  auto keyring = TierKeyring::FromKeys({{.id = 1, .bytes = Bytes(kKey1)}});
  ASSERT_OK(keyring);
  for (const std::string& tenant : {std::string("acme"), std::string(), std::string(256, 't')}) {
    auto keys = (*keyring)->TenantKeysFor(1, tenant);
    ASSERT_OK(keys);
    const std::string expected = Hkdf(Bytes(kKey1), std::string("tenant\0", 7) + tenant, 64);
    EXPECT_EQ(Str(keys->seal), expected.substr(0, 32));
    EXPECT_EQ(Str(keys->name), expected.substr(32, 32));
    auto again = (*keyring)->TenantKeysFor(1, tenant);  // from the cache
    ASSERT_OK(again);
    EXPECT_EQ(again->seal, keys->seal);
  }
  auto names = (*keyring)->NamesKey(1);
  ASSERT_OK(names);
  EXPECT_EQ(Str(*names), Hkdf(Bytes(kKey1), "tenant names", 32));
  // Tenants, and master keys, never share a key.
  EXPECT_NE((*keyring)->TenantKeysFor(1, "a")->seal, (*keyring)->TenantKeysFor(1, "b")->seal);
  auto other = TierKeyring::FromKeys({{.id = 1, .bytes = Bytes(kKey2)}});
  ASSERT_OK(other);
  EXPECT_NE((*other)->TenantKeysFor(1, "a")->seal, (*keyring)->TenantKeysFor(1, "a")->seal);
}

TEST(TierKeyringTest, RefusesNoKeysOrAnIdTwice) {
  EXPECT_THAT(TierKeyring::FromKeys({}), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(
      TierKeyring::FromKeys({{.id = 1, .bytes = Bytes(kKey1)}, {.id = 1, .bytes = Bytes(kKey2)}}),
      StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT((*TierKeyring::FromKeys({{.id = 4, .bytes = Bytes(kKey1)}}))->TenantKeysFor(5, "a"),
              StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace kvcache
