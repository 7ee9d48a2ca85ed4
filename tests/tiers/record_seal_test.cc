#include "tiers/record_seal.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/tenant.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/tier_keys.h"
#include "tests/tiers/test_blocks.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::kvcache::testing::TestBytes;
using ::kvcache::testing::TestIdentity;
using ::kvcache::testing::TestPool;
using ::testing::HasSubstr;

constexpr uint32_t kTokens = testing::kTestTokensPerBlock;

TierMasterKey Key(uint32_t id, char fill) { return testing::TestTierKey(id, fill); }
std::shared_ptr<const TierKeyring> Keyring(std::vector<TierMasterKey> keys) {
  return testing::TestTierKeyring(std::move(keys));
}

// A record and its sealing, for one tenant.
struct Sealed {
  RecordHeader header;
  std::string plain;  // the block's bytes
  std::string head;
  std::string body;  // ciphertext
};

Sealed SealOne(const RecordSealer& sealer, uint64_t i, const std::string& tenant) {
  Sealed sealed;
  sealed.header = RecordHeader{.pool = TestPool(), .block = TestIdentity(i), .sequence = 9};
  sealed.header.block.tenant = tenant;
  sealed.plain = TestBytes(sealed.header.block.hash);
  sealed.head.assign(sealer.head_bytes(), '\0');
  sealed.body.assign(sealed.plain.size(), '\0');
  // Two pieces, as a split cluster value takes them.
  const SealPiece pieces[] = {
      {sealed.plain.data(), sealed.body.data(), 1000},
      {sealed.plain.data() + 1000, sealed.body.data() + 1000, sealed.plain.size() - 1000}};
  EXPECT_OK(sealer.Seal(sealed.header, pieces, absl::MakeSpan(sealed.head)));
  return sealed;
}

// Whether the record opens for `tenant` expecting `expected`, its bytes then equal to `plain`.
absl::Status Open(const RecordSealer& sealer, const std::string& head, const std::string& body,
                  const std::string& tenant, const BlockRecordIdentity& expected,
                  const std::string& plain) {
  absl::StatusOr<OpenedHead> opened = sealer.OpenHead(head, tenant);
  if (!opened.ok()) return opened.status();
  std::string bytes = body;
  const SealPiece piece{bytes.data(), bytes.data(), bytes.size()};
  const absl::Status status = sealer.OpenBody(*opened, expected, {&piece, 1});
  if (status.ok() && bytes != plain) return absl::InternalError("opened to other bytes");
  return status;
}

TEST(RecordSealTest, RoundTripsAndHidesTokensAndBytes) {
  const RecordSealer sealer(Keyring({Key(1, 'a')}), TestPool(), kTokens);
  EXPECT_EQ(sealer.head_bytes(), SealedHeadBytes(kTokens));
  const Sealed sealed = SealOne(sealer, 3, "acme");
  EXPECT_EQ(RecordSealingOf(sealed.head), RecordSealing::kSealed);

  absl::StatusOr<OpenedHead> opened = sealer.OpenHead(sealed.head, "acme");
  ASSERT_OK(opened);
  EXPECT_EQ(opened->header, sealed.header);
  EXPECT_EQ(opened->key_id, 1u);
  EXPECT_OK(Open(sealer, sealed.head, sealed.body, "acme", sealed.header.block, sealed.plain));
  // A restart knows no tenant: the box says whose record it is.
  absl::StatusOr<OpenedHead> anyone = sealer.OpenHead(sealed.head);
  ASSERT_OK(anyone);
  EXPECT_EQ(anyone->header, sealed.header);

  // Neither the tokens, the model, the tenant nor any 16 bytes of the block are in the clear.
  const std::string tokens(reinterpret_cast<const char*>(sealed.header.block.tokens.data()),
                           4 * kTokens);
  for (const std::string& secret : {tokens, std::string("tiny-qwen3-moe"), std::string("acme")}) {
    EXPECT_EQ(sealed.head.find(secret), std::string::npos);
    EXPECT_EQ(sealed.body.find(secret), std::string::npos);
  }
  for (size_t at = 0; at + 16 <= sealed.plain.size(); at += 997) {
    EXPECT_EQ(sealed.body.find(sealed.plain.substr(at, 16)), std::string::npos) << at;
  }
  // A fresh nonce each time: the same record seals differently.
  const Sealed again = SealOne(sealer, 3, "acme");
  EXPECT_NE(again.head.substr(12, 12), sealed.head.substr(12, 12));
  EXPECT_NE(again.body, sealed.body);
}

TEST(RecordSealTest, AByteFlippedAnywhereDoesNotOpen) {
  const RecordSealer sealer(Keyring({Key(1, 'a')}), TestPool(), kTokens);
  const Sealed sealed = SealOne(sealer, 4, "acme");
  // Every byte of the head, and bytes all over the body (its first and last among them).
  for (size_t at = 0; at < sealed.head.size(); ++at) {
    std::string head = sealed.head;
    head[at] ^= 0x01;
    EXPECT_FALSE(Open(sealer, head, sealed.body, "acme", sealed.header.block, sealed.plain).ok())
        << "head byte " << at;
  }
  for (size_t at = 0; at < sealed.body.size(); at += at < 64 ? 1 : 331) {
    std::string body = sealed.body;
    body[at] ^= 0x80;
    EXPECT_THAT(Open(sealer, sealed.head, body, "acme", sealed.header.block, sealed.plain),
                StatusIs(absl::StatusCode::kUnauthenticated))
        << "body byte " << at;
  }
  std::string body = sealed.body;
  body.back() ^= 0x01;
  EXPECT_THAT(Open(sealer, sealed.head, body, "acme", sealed.header.block, sealed.plain),
              StatusIs(absl::StatusCode::kUnauthenticated));
  // Cut short.
  EXPECT_FALSE(sealer.OpenHead(sealed.head.substr(0, sealed.head.size() - 1), "acme").ok());
}

TEST(RecordSealTest, AnotherTenantPoolBlockOrHeadDoesNotOpen) {
  const auto keyring = Keyring({Key(1, 'a')});
  const RecordSealer sealer(keyring, TestPool(), kTokens);
  const Sealed sealed = SealOne(sealer, 5, "acme");

  // Another tenant, every other field equal: the key differs.
  EXPECT_THAT(sealer.OpenHead(sealed.head, "globex"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("does not open")));
  // Another pool.
  PoolIdentity other_pool = TestPool();
  other_pool.layout_fingerprint ^= 1;
  EXPECT_THAT(RecordSealer(keyring, other_pool, kTokens).OpenHead(sealed.head, "acme"),
              StatusIs(absl::StatusCode::kUnauthenticated));
  // The body under another key (a reader expecting another block).
  for (auto change : {+[](BlockRecordIdentity& b) { b.hash.lo ^= 1; },
                      +[](BlockRecordIdentity& b) { b.namespace_digest ^= 1; },
                      +[](BlockRecordIdentity& b) { b.prefix_digest ^= 1; }}) {
    BlockRecordIdentity elsewhere = sealed.header.block;
    change(elsewhere);
    EXPECT_THAT(Open(sealer, sealed.head, sealed.body, "acme", elsewhere, sealed.plain),
                StatusIs(absl::StatusCode::kUnauthenticated));
  }
  // Another record's body under this head, both acme's.
  const Sealed other = SealOne(sealer, 5, "acme");
  EXPECT_THAT(Open(sealer, sealed.head, other.body, "acme", sealed.header.block, sealed.plain),
              StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST(RecordSealTest, OldKeysOpenTheirRecordsUntilRemoved) {
  const RecordSealer old_sealer(Keyring({Key(1, 'a')}), TestPool(), kTokens);
  const Sealed old_record = SealOne(old_sealer, 6, "acme");

  const RecordSealer rotated(Keyring({Key(2, 'b'), Key(1, 'a')}), TestPool(), kTokens);
  EXPECT_OK(Open(rotated, old_record.head, old_record.body, "acme", old_record.header.block,
                 old_record.plain));
  const Sealed new_record = SealOne(rotated, 7, "acme");
  ASSERT_OK(rotated.OpenHead(new_record.head, "acme"));
  EXPECT_EQ(rotated.OpenHead(new_record.head, "acme")->key_id, 2u);

  const RecordSealer removed(Keyring({Key(2, 'b')}), TestPool(), kTokens);
  EXPECT_THAT(removed.OpenHead(old_record.head, "acme"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("no key with id 1")));
  EXPECT_THAT(removed.OpenHead(old_record.head), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_OK(Open(removed, new_record.head, new_record.body, "acme", new_record.header.block,
                 new_record.plain));
  // Another master key under the same id opens nothing.
  const RecordSealer wrong(Keyring({Key(2, 'z')}), TestPool(), kTokens);
  EXPECT_THAT(wrong.OpenHead(new_record.head), StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(wrong.OpenHead(new_record.head, "acme"),
              StatusIs(absl::StatusCode::kUnauthenticated));
}

TEST(RecordSealTest, TellsEmptyUnsealedAndForeignBytesApart) {
  const RecordSealer sealer(Keyring({Key(1, 'a')}), TestPool(), kTokens);
  std::string empty(sealer.head_bytes(), '\0');
  EXPECT_EQ(RecordSealingOf(empty), RecordSealing::kEmpty);
  EXPECT_THAT(sealer.OpenHead(empty, "acme"), StatusIs(absl::StatusCode::kNotFound));

  std::string plain(sealer.head_bytes(), '\0');
  ASSERT_OK(EncodeRecordHeader({TestPool(), TestIdentity(1), 1}, absl::MakeSpan(plain)));
  EXPECT_EQ(RecordSealingOf(plain), RecordSealing::kUnsealed);
  EXPECT_THAT(sealer.OpenHead(plain, "acme"), StatusIs(absl::StatusCode::kFailedPrecondition));

  std::string garbage(sealer.head_bytes(), 'g');
  EXPECT_EQ(RecordSealingOf(garbage), RecordSealing::kOther);
  EXPECT_THAT(sealer.OpenHead(garbage), StatusIs(absl::StatusCode::kDataLoss));
}

TEST(RecordSealTest, SealRefusesWhatItCannotSeal) {
  const RecordSealer sealer(Keyring({Key(1, 'a')}), TestPool(), kTokens);
  RecordHeader header{.pool = TestPool(), .block = TestIdentity(1), .sequence = 1};
  std::string head(sealer.head_bytes(), '\0');
  header.block.tenant = std::string(kMaxTenantBytes + 1, 't');
  EXPECT_THAT(sealer.Seal(header, {}, absl::MakeSpan(head)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  header.block.tenant = "acme";
  header.block.tokens.pop_back();
  EXPECT_THAT(sealer.Seal(header, {}, absl::MakeSpan(head)),
              StatusIs(absl::StatusCode::kInvalidArgument));
  header.block = TestIdentity(1);
  head.pop_back();
  EXPECT_THAT(sealer.Seal(header, {}, absl::MakeSpan(head)),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(RecordSealTest, NameDigestsAreKeyedPerTenantAndKey) {
  const RecordSealer sealer(Keyring({Key(2, 'b'), Key(1, 'a')}), TestPool(), kTokens);
  auto a1 = sealer.NameDigest(1, "acme", "identity");
  ASSERT_OK(a1);
  EXPECT_EQ(*sealer.NameDigest(1, "acme", "identity"), *a1);
  EXPECT_NE(*sealer.NameDigest(1, "globex", "identity"), *a1);
  EXPECT_NE(*sealer.NameDigest(2, "acme", "identity"), *a1);
  EXPECT_NE(*sealer.NameDigest(1, "acme", "identity2"), *a1);
  EXPECT_THAT(sealer.NameDigest(3, "acme", "identity"), StatusIs(absl::StatusCode::kNotFound));
}

}  // namespace
}  // namespace kvcache
