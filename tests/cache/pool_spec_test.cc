#include "cache/pool_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

TEST(PoolSpecTest, ParsesEveryField) {
  auto options = ParsePoolSpec(
      "qwen:model=qwen3-moe:layers=48:kv_heads=4:head_dim=128:block_size=32:dtype=bf16:"
      "blocks=100:hash=sha256");
  ASSERT_OK(options);
  EXPECT_EQ(options->name, "qwen");
  EXPECT_EQ(options->model_id, "qwen3-moe");
  EXPECT_EQ(options->layout.num_layers, 48);
  EXPECT_EQ(options->layout.num_kv_heads, 4);
  EXPECT_EQ(options->layout.head_dim, 128);
  EXPECT_EQ(options->layout.block_size, 32);
  EXPECT_EQ(options->layout.dtype, DType::kBFloat16);
  EXPECT_EQ(options->num_blocks, 100);
  EXPECT_EQ(options->hash_algorithm, HashAlgorithm::kSha256);
}

TEST(PoolSpecTest, BytesBecomeWholeBlocks) {
  // Default layout: 4 layers * 2 * 16 tokens * 2 heads * 64 dims * 2 bytes = 32 KiB per block.
  auto options = ParsePoolSpec("p:bytes=1MiB");
  ASSERT_OK(options);
  EXPECT_EQ(options->num_blocks, 32);
  EXPECT_THAT(ParsePoolSpec("p:bytes=1K"), StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(PoolSpecTest, HostTierTakesAByteSizeOfAtLeastOneBlock) {
  auto options = ParsePoolSpec("p:bytes=1MiB:host_tier=64MiB");
  ASSERT_OK(options);
  EXPECT_EQ(options->host_tier_bytes, 64ull << 20);
  EXPECT_EQ(ParsePoolSpec("p")->host_tier_bytes, 0u);  // no tier 2 unless asked
  // The default block is 32 KiB.
  EXPECT_THAT(ParsePoolSpec("p:host_tier=16KiB"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("host_tier=16384 bytes holds no block of 32768 bytes")));
  EXPECT_THAT(ParsePoolSpec("p:host_tier=0"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("host_tier=0")));
  EXPECT_THAT(ParsePoolSpec("p:host_tier=lots"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'lots' is not a byte size")));
}

TEST(PoolSpecTest, DiskTierTakesAPathAndASizeBelowAHostTier) {
  auto options = ParsePoolSpec("p:host_tier=64MiB:disk_tier=/var/lib/kvcache/p.tier:2G:blocks=8");
  ASSERT_OK(options);
  EXPECT_EQ(options->disk_tier_path, "/var/lib/kvcache/p.tier");
  EXPECT_EQ(options->disk_tier_bytes, 2ull << 30);
  EXPECT_EQ(options->num_blocks, 8u);  // the field after the size is parsed as usual
  EXPECT_TRUE(ParsePoolSpec("p")->disk_tier_path.empty());
  EXPECT_THAT(ParsePoolSpec("p:disk_tier=/d/p.tier:1G"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("give host_tier=SIZE too")));
  EXPECT_THAT(ParsePoolSpec("p:host_tier=1G:disk_tier=/d/p.tier"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("disk_tier wants PATH:SIZE")));
  EXPECT_THAT(ParsePoolSpec("p:host_tier=1G:disk_tier=d/p.tier:1G"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("must be absolute")));
  EXPECT_THAT(ParsePoolSpec("p:host_tier=1G:disk_tier=/d/p.tier:0"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("disk_tier size 0")));
  EXPECT_THAT(ParsePoolSpec("p:host_tier=1G:disk_tier=/d/p.tier:big"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'big' is not a byte size")));
  EXPECT_EQ(options->disk_admission, DiskAdmission::kAll);
  EXPECT_EQ(
      ParsePoolSpec("p:host_tier=1G:disk_tier=/d/p.tier:1G:disk_admission=reused")->disk_admission,
      DiskAdmission::kReused);
  EXPECT_THAT(ParsePoolSpec("p:disk_admission=some"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("disk_admission='some' (want all or reused)")));
}

TEST(PoolSpecTest, BadFieldsAreNamed) {
  EXPECT_THAT(ParsePoolSpec("p:layers=many"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("layers='many'")));
  EXPECT_THAT(ParsePoolSpec("p:colour=red"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unknown pool field")));
  EXPECT_THAT(ParsePoolSpec("p:dtype=int4"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("int4")));
  EXPECT_THAT(ParsePoolSpec("p:head_dim=0"), StatusIs(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(ParsePoolSpec(":layers=1"), StatusIs(absl::StatusCode::kInvalidArgument));
}

// Regression (issue 17): a name with '/' failed at start as a shared-memory "Invalid argument",
// and two pools of one name as "File exists".
TEST(PoolSpecTest, PoolNamesAreCheckedAndUnique) {
  EXPECT_THAT(ParsePoolSpec("a/b:layers=1"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pool name 'a/b'")));
  EXPECT_THAT(ParsePoolSpec(std::string(65, 'p')),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 to 64")));
  EXPECT_OK(ParsePoolSpec(std::string(64, 'p')));
  EXPECT_OK(ParsePoolSpec("Qwen3-32B_v1.fp8"));
  std::vector<PoolOptions> pools = {*ParsePoolSpec("a"), *ParsePoolSpec("b")};
  EXPECT_OK(ValidatePoolNames(pools));
  pools.push_back(*ParsePoolSpec("a:layers=2"));
  EXPECT_THAT(ValidatePoolNames(pools),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("two pools are named 'a'")));
  pools.back().name = "bad\nname";
  EXPECT_THAT(ValidatePoolNames(pools),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad\\n")));
}

// --pools_file: the same pools as JSON, field for field.
TEST(PoolsJsonTest, GivesThePoolsTheSpecsGive) {
  auto pools = ParsePoolsJson(R"({"pools": [
      {"name": "qwen", "model": "qwen3-moe", "layers": 48, "kv_heads": 4, "head_dim": 128,
       "block_size": 32, "dtype": "bf16", "blocks": 100, "hash": "sha256"},
      {"name": "tiered", "bytes": "1MiB", "host_tier": "4MiB",
       "disk_tier": {"path": "/var/lib/kvcache/t.kvt", "size": "64MiB"}, "disk_admission": "reused",
       "parts": "kv/30720+state/2048/trailing1"},
      {"name": "short", "disk_tier": "/var/lib/kvcache/s.kvt:1G", "host_tier": 65536}]})");
  ASSERT_OK(pools);
  ASSERT_EQ(pools->size(), 3u);
  const std::vector<std::string> specs = {
      "qwen:model=qwen3-moe:layers=48:kv_heads=4:head_dim=128:block_size=32:dtype=bf16:"
      "blocks=100:hash=sha256",
      "tiered:bytes=1MiB:host_tier=4MiB:disk_tier=/var/lib/kvcache/t.kvt:64MiB:"
      "disk_admission=reused:parts=kv/30720+state/2048/trailing1",
      "short:host_tier=65536:disk_tier=/var/lib/kvcache/s.kvt:1G"};
  for (size_t i = 0; i < specs.size(); ++i) {
    auto from_spec = ParsePoolSpec(specs[i]);
    ASSERT_OK(from_spec);
    const PoolOptions& from_json = (*pools)[i];
    EXPECT_EQ(from_json.name, from_spec->name);
    EXPECT_EQ(from_json.model_id, from_spec->model_id);
    EXPECT_EQ(from_json.layout.DebugString(), from_spec->layout.DebugString());
    EXPECT_EQ(from_json.num_blocks, from_spec->num_blocks);
    EXPECT_EQ(from_json.hash_algorithm, from_spec->hash_algorithm);
    EXPECT_EQ(from_json.host_tier_bytes, from_spec->host_tier_bytes);
    EXPECT_EQ(from_json.disk_tier_path, from_spec->disk_tier_path);
    EXPECT_EQ(from_json.disk_tier_bytes, from_spec->disk_tier_bytes);
    EXPECT_EQ(from_json.disk_admission, from_spec->disk_admission);
    EXPECT_EQ(from_json.parts.size(), from_spec->parts.size());
  }
  EXPECT_EQ((*pools)[1].parts.size(), 2u);
  EXPECT_EQ((*pools)[2].disk_tier_bytes, uint64_t{1} << 30);
}

// The example in docs/operations.md ("Pools and their tiers").
TEST(PoolsJsonTest, TheOperationsGuidesExampleParses) {
  auto pools = ParsePoolsJson(R"({"pools": [
    {"name": "llama", "model": "llama-3-8b", "layers": 32, "kv_heads": 8, "head_dim": 128,
     "block_size": 16, "dtype": "bf16", "bytes": "8GiB", "host_tier": "64GiB",
     "disk_tier": {"path": "/var/lib/kvcache/llama.tier", "size": "1TiB"}},
    {"name": "hybrid", "bytes": "1GiB", "parts": "kv/28K+state/4K/trailing1"}]})");
  ASSERT_OK(pools);
  EXPECT_EQ((*pools)[0].disk_tier_bytes, uint64_t{1} << 40);
  EXPECT_EQ((*pools)[1].parts.size(), 2u);
}

TEST(PoolsJsonTest, EveryMistakeIsNamedWithItsPool) {
  const auto error = [](const char* json) {
    const auto pools = ParsePoolsJson(json);
    EXPECT_THAT(pools, StatusIs(absl::StatusCode::kInvalidArgument)) << json;
    return pools.ok() ? std::string() : std::string(pools.status().message());
  };
  EXPECT_EQ(error("{\"pools\": [}"), "not valid JSON");
  EXPECT_EQ(error("[]"), "want an object with a \"pools\" array");
  EXPECT_EQ(error(R"({"pools": []})"), "\"pools\" is empty");
  EXPECT_EQ(error(R"({"pools": [{"name": "a"}], "pool": []})"), "unknown field 'pool'");
  EXPECT_EQ(error(R"({"pools": [3]})"), "pools[0]: is a JSON number, not an object");
  EXPECT_EQ(error(R"({"pools": [{"blocks": 3}]})"), "pools[0]: has no \"name\" string");
  EXPECT_THAT(error(R"({"pools": [{"name": "a"}, {"name": "b", "hots_tier": "1G"}]})"),
              HasSubstr("pools[1] ('b'): unknown pool field 'hots_tier'"));
  EXPECT_THAT(error(R"({"pools": [{"name": "a", "layers": 4.5}]})"),
              HasSubstr("pools[0] ('a'): field 'layers' is a JSON number; want a string or an "
                        "integer"));
  EXPECT_THAT(error(R"({"pools": [{"name": "a", "layers": -4}]})"),
              HasSubstr("pools[0] ('a'): pool field layers='-4' is not a non-negative integer"));
  EXPECT_THAT(error(R"({"pools": [{"name": "a", "model": "x:blocks=1"}]})"),
              HasSubstr("field 'model' holds ':'"));
  EXPECT_THAT(error(R"({"pools": [{"name": "a", "host_tier": "1M",
                                    "disk_tier": {"path": "/x:y", "size": "1G"}}]})"),
              HasSubstr("pools[0] ('a'): field 'disk_tier.path' holds ':'"));
  EXPECT_THAT(error(R"({"pools": [{"name": "a", "disk_tier": ["/x", "1G"]}]})"),
              HasSubstr("want \"PATH:SIZE\" or {\"path\": PATH, \"size\": SIZE}"));
  EXPECT_THAT(error(R"({"pools": [{"name": "bad name"}]})"), HasSubstr("pools[0] ('bad name')"));
}

}  // namespace
}  // namespace kvcache
