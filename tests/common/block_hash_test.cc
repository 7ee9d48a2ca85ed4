// The hash chain against the published test vectors (docs/hash_test_vectors.tsv) and its rules.
#include "common/block_hash.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <numeric>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/pool_layout.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;

std::string SourceDir() {
  const char* dir = std::getenv("KVCACHE_SOURCE_DIR");
  return dir != nullptr ? dir : ".";
}

std::vector<std::vector<std::string>> ReadVectors() {
  std::ifstream file(SourceDir() + "/docs/hash_test_vectors.tsv");
  std::vector<std::vector<std::string>> rows;
  std::string line;
  std::getline(file, line);  // header
  while (std::getline(file, line)) {
    if (!line.empty()) rows.push_back(absl::StrSplit(line, '\t'));
  }
  return rows;
}

uint32_t ToU32(absl::string_view text) {
  uint32_t value = 0;
  EXPECT_TRUE(absl::SimpleAtoi(text, &value)) << text;
  return value;
}

ExtraKeys ParseExtras(const std::string& lora_id, const std::string& items) {
  ExtraKeys extras{.lora_id = lora_id};
  for (absl::string_view item : absl::StrSplit(items, ';', absl::SkipEmpty())) {
    std::pair<absl::string_view, absl::string_view> hash_rest = absl::StrSplit(item, '@');
    std::pair<absl::string_view, absl::string_view> range = absl::StrSplit(hash_rest.second, '+');
    extras.multimodal_items.push_back(
        {std::string(hash_rest.first), ToU32(range.first), ToU32(range.second)});
  }
  return extras;
}

TEST(BlockHashTest, ReproducesThePublishedTestVectors) {
  const auto rows = ReadVectors();
  ASSERT_EQ(rows.size(), 12) << "docs/hash_test_vectors.tsv missing or changed";
  for (const auto& row : rows) {
    SCOPED_TRACE(row[0]);
    ASSERT_EQ(row.size(), 16);
    auto algorithm = ParseHashAlgorithm(row[1]);
    auto dtype = ParseDType(row[7]);
    ASSERT_OK(algorithm);
    ASSERT_OK(dtype);
    const PoolLayout layout{.num_layers = ToU32(row[3]),
                            .num_kv_heads = ToU32(row[4]),
                            .head_dim = ToU32(row[5]),
                            .block_size = ToU32(row[6]),
                            .dtype = *dtype};
    EXPECT_EQ(absl::StrFormat("%016x", layout.Fingerprint()), row[13]);
    BlockHasher hasher(*algorithm);
    const Hash128 root = hasher.Root({row[2], layout.Fingerprint(), row[8], row[9]});
    EXPECT_EQ(root.ToHex(), row[14]);
    std::vector<uint32_t> tokens;
    for (absl::string_view token : absl::StrSplit(row[12], ',')) tokens.push_back(ToU32(token));
    std::vector<Hash128> chain;
    hasher.ExtendChain(root, tokens, layout.block_size, ParseExtras(row[10], row[11]), &chain);
    std::vector<std::string> hex;
    for (const Hash128& hash : chain) hex.push_back(hash.ToHex());
    EXPECT_EQ(hex, std::vector<std::string>(absl::StrSplit(row[15], ',')));
  }
}

TEST(BlockHashTest, OnlyFullBlocksAreHashedAndChainsExtendIncrementally) {
  BlockHasher hasher(HashAlgorithm::kXxh3_128);
  const Hash128 root = hasher.Root({"m", 1, "t", ""});
  std::vector<uint32_t> tokens(11);
  std::iota(tokens.begin(), tokens.end(), 0);
  std::vector<Hash128> whole;
  hasher.ExtendChain(root, tokens, 4, {}, &whole);
  EXPECT_EQ(whole.size(), 2);
  std::vector<Hash128> stepwise;
  for (size_t n = 1; n <= tokens.size(); ++n) {
    hasher.ExtendChain(root, absl::MakeConstSpan(tokens).first(n), 4, {}, &stepwise);
  }
  EXPECT_EQ(stepwise, whole);
}

TEST(BlockHashTest, EveryInputChangesTheHash) {
  BlockHasher hasher(HashAlgorithm::kXxh3_128);
  const Hash128 root = hasher.Root({"m", 1, "t", "s"});
  EXPECT_NE(root, hasher.Root({"m", 2, "t", "s"}));
  EXPECT_NE(root, hasher.Root({"m2", 1, "t", "s"}));
  EXPECT_NE(root, hasher.Root({"m", 1, "t2", "s"}));
  EXPECT_NE(root, hasher.Root({"m", 1, "t", ""}));
  // Length prefixes keep field boundaries: ("ab","c") and ("a","bc") differ.
  EXPECT_NE(hasher.Root({"ab", 1, "c", ""}), hasher.Root({"a", 1, "bc", ""}));
  const std::vector<uint32_t> block{1, 2, 3, 4};
  const Hash128 plain = hasher.Block(root, block, {}, 0);
  EXPECT_NE(plain, hasher.Block(root, std::vector<uint32_t>{1, 2, 3, 5}, {}, 0));
  EXPECT_NE(plain, hasher.Block(Hash128{1, 2}, block, {}, 0));
  EXPECT_NE(plain, hasher.Block(root, block, {.lora_id = "x"}, 0));
  const ExtraKeys image{.multimodal_items = {{"img", 6, 2}}};
  EXPECT_EQ(plain, hasher.Block(root, block, image, 0));  // the image is outside this block
  EXPECT_NE(plain, hasher.Block(root, block, image, 4));
  EXPECT_NE(BlockHasher(HashAlgorithm::kSha256).Block(root, block, {}, 0), plain);
}

TEST(BlockHashTest, PrefixDigestCoversTheWholePrefixAtFullWidth) {
  BlockHasher hasher(HashAlgorithm::kXxh3_128);
  const uint64_t ns = hasher.NamespaceDigest({"m", 1, "t", "s"});
  const std::vector<uint32_t> block{1, 2, 3, 4};
  const uint64_t first = hasher.PrefixDigest(ns, block, {}, 0);
  const uint64_t second = hasher.PrefixDigest(first, block, {}, 4);
  // Another namespace, an earlier block, the block's own tokens or extra keys: another digest.
  EXPECT_NE(first, hasher.PrefixDigest(hasher.NamespaceDigest({"m", 1, "t2", "s"}), block, {}, 0));
  EXPECT_NE(second,
            hasher.PrefixDigest(hasher.PrefixDigest(ns, std::vector<uint32_t>{1, 2, 3, 5}, {}, 0),
                                block, {}, 4));
  EXPECT_NE(second, hasher.PrefixDigest(first, std::vector<uint32_t>{1, 2, 3, 5}, {}, 4));
  EXPECT_NE(second, hasher.PrefixDigest(first, block, {.lora_id = "x"}, 4));
  // Neither the chain's truncation (testing_hash_bits) nor its algorithm touches it.
  EXPECT_EQ(BlockHasher(HashAlgorithm::kXxh3_128, 4).PrefixDigest(first, block, {}, 4), second);
  EXPECT_EQ(BlockHasher(HashAlgorithm::kSha256).PrefixDigest(first, block, {}, 4), second);
  // 4-bit chain hashes of 64 one-block prompts collide; their digests do not.
  BlockHasher weak(HashAlgorithm::kXxh3_128, 4);
  const Hash128 root = weak.Root({"m", 1, "t", "s"});
  absl::flat_hash_set<Hash128> hashes;
  absl::flat_hash_set<uint64_t> digests;
  for (uint32_t token = 0; token < 64; ++token) {
    const std::vector<uint32_t> tokens{token, 0, 0, 0};
    hashes.insert(weak.Block(root, tokens, {}, 0));
    digests.insert(weak.PrefixDigest(ns, tokens, {}, 0));
  }
  EXPECT_LE(hashes.size(), 16u);
  EXPECT_EQ(digests.size(), 64u);
}

TEST(BlockHashTest, ExtendChainComputesThePrefixDigestsFromTheSameEncoding) {
  BlockHasher hasher(HashAlgorithm::kXxh3_128);
  const HashNamespace ns{"m", 1, "t", "s"};
  const Hash128 root = hasher.Root(ns);
  const uint64_t root_digest = hasher.NamespaceDigest(ns);
  const ExtraKeys extras{.lora_id = "l", .multimodal_items = {{"img", 5, 2}}};
  std::vector<uint32_t> tokens(11);
  std::iota(tokens.begin(), tokens.end(), 0);
  std::vector<Hash128> chain;
  std::vector<uint64_t> digests;
  for (size_t n = 1; n <= tokens.size(); ++n) {
    hasher.ExtendChain(root, root_digest, absl::MakeConstSpan(tokens).first(n), 4, extras, &chain,
                       &digests);
  }
  std::vector<Hash128> plain;
  hasher.ExtendChain(root, tokens, 4, extras, &plain);
  EXPECT_EQ(chain, plain);
  ASSERT_EQ(digests.size(), 2u);
  const absl::Span<const uint32_t> all(tokens);
  EXPECT_EQ(digests[0], hasher.PrefixDigest(root_digest, all.subspan(0, 4), extras, 0));
  EXPECT_EQ(digests[1], hasher.PrefixDigest(digests[0], all.subspan(4, 4), extras, 4));
}

TEST(BlockHashTest, ParsesAlgorithmNames) {
  EXPECT_EQ(*ParseHashAlgorithm("xxh3"), HashAlgorithm::kXxh3_128);
  EXPECT_EQ(*ParseHashAlgorithm("SHA256"), HashAlgorithm::kSha256);
  EXPECT_THAT(ParseHashAlgorithm("md5"), StatusIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace kvcache
