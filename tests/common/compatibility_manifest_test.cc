#include "common/compatibility_manifest.h"

#include <gtest/gtest.h>

#include <functional>
#include <string>

#include "common/block_hash.h"
#include "common/byte_writer.h"
#include "common/pool_layout.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

// 4 layers x 2 x 16 tokens x 2 heads x 64 x fp16: 32 KiB blocks (the daemon's default pool).
PoolLayout DefaultLayout() {
  return PoolLayout{.num_layers = 4,
                    .num_kv_heads = 2,
                    .head_dim = 64,
                    .block_size = 16,
                    .dtype = DType::kFloat16};
}

ManifestFields EngineFields() {
  return ManifestFields{.model_id = "meta-llama/Llama-3.1-8B-Instruct",
                        .model_config_digest = "rope=llama3:factor=8:max_len=131072",
                        .kv_dtype = "fp16",
                        .page_tokens = 16,
                        .parts = {{"kv", 32768}},
                        .parallel = {.tp_size = 2, .tp_rank = 0},
                        .key_hash_algorithm = "sha256_cbor"};
}

std::shared_ptr<const CompatibilityManifest> Make(const ManifestFields& fields) {
  absl::StatusOr<std::shared_ptr<const CompatibilityManifest>> manifest =
      CompatibilityManifest::Create(fields);
  EXPECT_OK(manifest);
  return manifest.ok() ? *manifest : nullptr;
}

absl::Status CreateStatus(const std::function<void(ManifestFields&)>& change) {
  ManifestFields fields = EngineFields();
  change(fields);
  return CompatibilityManifest::Create(fields).status();
}

TEST(CompatibilityManifestTest, BadFieldsAreInvalidArgumentNamingTheField) {
  const struct {
    const char* message;
    std::function<void(ManifestFields&)> change;
  } cases[] = {
      {"model_id is empty", [](ManifestFields& f) { f.model_id.clear(); }},
      {"model_id has 257 bytes", [](ManifestFields& f) { f.model_id = std::string(257, 'm'); }},
      {"model_config_digest has 0 bytes", [](ManifestFields& f) { f.model_config_digest.clear(); }},
      {"model_config_digest has 65 bytes",
       [](ManifestFields& f) { f.model_config_digest = std::string(65, 'd'); }},
      {"kv_dtype: unknown dtype 'int4'", [](ManifestFields& f) { f.kv_dtype = "int4"; }},
      {"kv_codec may hold only", [](ManifestFields& f) { f.kv_codec = "nv fp4"; }},
      {"page_tokens is 0", [](ManifestFields& f) { f.page_tokens = 0; }},
      {"has 0 parts", [](ManifestFields& f) { f.parts.clear(); }},
      {"names part 'kv' twice",
       [](ManifestFields& f) {
         f.parts.push_back({"kv", 1});
       }},
      {"part 'kv' has 0 bytes", [](ManifestFields& f) { f.parts[0].bytes = 0; }},
      {"part name is empty", [](ManifestFields& f) { f.parts[0].name.clear(); }},
      {"tp_rank 2 is not below tp_size 2", [](ManifestFields& f) { f.parallel.tp_rank = 2; }},
      {"pp_rank 1 is not below pp_size 1", [](ManifestFields& f) { f.parallel.pp_rank = 1; }},
      {"cp_rank 3 is not below cp_size 2",
       [](ManifestFields& f) { f.parallel.cp_size = 2, f.parallel.cp_rank = 3; }},
      {"key_hash_algorithm has 65 bytes",
       [](ManifestFields& f) { f.key_hash_algorithm = std::string(65, 'k'); }},
  };
  for (const auto& c : cases) {
    const absl::Status status = CreateStatus(c.change);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_NE(status.message().find(c.message), absl::string_view::npos)
        << "want '" << c.message << "' in: " << status.message();
  }
  EXPECT_OK(CreateStatus([](ManifestFields&) {}));
}

TEST(CompatibilityManifestTest, SpellingsOfOneManifestHaveOneDigest) {
  const auto canonical = Make(EngineFields());
  ManifestFields spelled = EngineFields();
  spelled.kv_dtype = "FLOAT16";
  const auto other = Make(spelled);
  EXPECT_EQ(other->fields().kv_dtype, "fp16");
  EXPECT_EQ(other->canonical_encoding(), canonical->canonical_encoding());

  // A size of 0 is 1: an absent geometry is one process.
  ManifestFields unsplit = EngineFields();
  unsplit.parallel = ParallelGeometry{.tp_size = 0, .pp_size = 0, .cp_size = 0};
  ManifestFields explicit_one = EngineFields();
  explicit_one.parallel = ParallelGeometry{.tp_size = 1, .pp_size = 1, .cp_size = 1};
  EXPECT_EQ(Make(unsplit)->Digest(HashAlgorithm::kXxh3_128),
            Make(explicit_one)->Digest(HashAlgorithm::kXxh3_128));
  EXPECT_EQ(Make(unsplit)->fields().parallel.tp_size, 1u);
}

TEST(CompatibilityManifestTest, EveryFieldChangesTheDigest) {
  const auto base = Make(EngineFields());
  const std::function<void(ManifestFields&)> changes[] = {
      [](ManifestFields& f) { f.model_id += "x"; },
      [](ManifestFields& f) { f.model_config_digest = "rope=llama3:factor=16:max_len=131072"; },
      [](ManifestFields& f) { f.kv_dtype = "bf16"; },
      [](ManifestFields& f) { f.kv_codec = "nvfp4"; },
      [](ManifestFields& f) { f.page_tokens = 32; },
      [](ManifestFields& f) { f.parts[0].name = "kv0"; },
      [](ManifestFields& f) { f.parts[0].bytes = 65536; },
      [](ManifestFields& f) {
        f.parts = {{"k", 16384}, {"v", 16384}};
      },
      [](ManifestFields& f) { f.parallel.tp_rank = 1; },
      [](ManifestFields& f) { f.parallel.tp_size = 4; },
      [](ManifestFields& f) { f.parallel.pp_size = 2; },
      [](ManifestFields& f) { f.parallel.cp_size = 2; },
      [](ManifestFields& f) { f.key_hash_algorithm = "xxh3_128"; },
  };
  for (size_t i = 0; i < std::size(changes); ++i) {
    ManifestFields fields = EngineFields();
    changes[i](fields);
    const auto changed = Make(fields);
    for (HashAlgorithm algorithm : {HashAlgorithm::kXxh3_128, HashAlgorithm::kSha256}) {
      EXPECT_NE(changed->Digest(algorithm), base->Digest(algorithm)) << "change " << i;
    }
  }
  EXPECT_NE(base->Digest(HashAlgorithm::kXxh3_128), base->Digest(HashAlgorithm::kSha256));
}

// docs/hash_spec.md's encoding, written out byte by byte for one manifest.
TEST(CompatibilityManifestTest, CanonicalEncodingIsTheSpecs) {
  ManifestFields fields{.model_id = "m",
                        .model_config_digest = "\x01\x02",
                        .kv_dtype = "bf16",
                        .page_tokens = 16,
                        .parts = {{"kv", 32768}},
                        .parallel = {.tp_size = 2, .tp_rank = 1}};
  const auto manifest = Make(fields);
  ByteWriter want;
  want.Raw("kvcache.manifest.v1");
  want.String("m");
  want.String("\x01\x02");
  want.U32(2);  // bf16
  want.String("");
  want.U32(16);
  want.U32(1);
  want.String("kv");
  want.U64(32768);
  for (uint32_t value : {2u, 1u, 1u, 0u, 1u, 0u}) want.U32(value);
  want.String("");
  EXPECT_EQ(manifest->canonical_encoding(), std::string(want.data(), want.size()));
  EXPECT_EQ(manifest->Digest(HashAlgorithm::kSha256),
            HashBytes(HashAlgorithm::kSha256, manifest->canonical_encoding()));
}

TEST(CompatibilityManifestTest, LayoutContradictionsAreFailedPreconditionNamingBothValues) {
  const PoolLayout layout = DefaultLayout();
  EXPECT_OK(Make(EngineFields())->CheckFits(layout, "p"));
  ManifestFields split = EngineFields();
  split.parts = {{"k", 16384}, {"v", 16384}};
  EXPECT_OK(Make(split)->CheckFits(layout, "p"));  // the parts sum to a block

  const struct {
    const char* message;
    std::function<void(ManifestFields&)> change;
  } cases[] = {
      {"page_tokens 32 but pool 'p' has block_size 16",
       [](ManifestFields& f) { f.page_tokens = 32; }},
      {"kv_dtype bf16 but pool 'p' has dtype fp16", [](ManifestFields& f) { f.kv_dtype = "bf16"; }},
      {"kv_codec 'nvfp4' but pool 'p' has raw blocks",
       [](ManifestFields& f) { f.kv_codec = "nvfp4"; }},
      {"part bytes 32769 but pool 'p' has block_bytes 32768",
       [](ManifestFields& f) { f.parts[0].bytes = 32769; }},
      {"parts summing to 32768000 but pool 'p' has block_bytes 32768",
       [](ManifestFields& f) {
         f.parts = {{"k", 16384000}, {"v", 16384000}};
       }},
  };
  for (const auto& c : cases) {
    ManifestFields fields = EngineFields();
    c.change(fields);
    const absl::Status status = Make(fields)->CheckFits(layout, "p");
    EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << c.message;
    EXPECT_NE(status.message().find(c.message), absl::string_view::npos)
        << "want '" << c.message << "' in: " << status.message();
  }
}

TEST(CompatibilityManifestTest, ManifestJoinsTheRootOnlyWhenPresent) {
  const auto manifest = Make(EngineFields());
  for (HashAlgorithm algorithm : {HashAlgorithm::kXxh3_128, HashAlgorithm::kSha256}) {
    BlockHasher hasher(algorithm);
    HashNamespace plain{.model_id = "m", .layout_fingerprint = 7, .tenant = "t", .cache_salt = ""};
    HashNamespace bound = plain;
    bound.manifest_digest = manifest->Digest(algorithm);
    // The v1 root, as docs/hash_spec.md writes it: no trace of manifests.
    ByteWriter v1;
    v1.Raw("kvcache.root.v1");
    v1.String("m");
    v1.U64(7);
    v1.String("t");
    v1.String("");
    EXPECT_EQ(hasher.Root(plain), HashBytes(algorithm, absl::string_view(v1.data(), v1.size())));
    EXPECT_NE(hasher.Root(bound), hasher.Root(plain));
    EXPECT_NE(hasher.NamespaceDigest(bound), hasher.NamespaceDigest(plain));
    ManifestFields other_rank = EngineFields();
    other_rank.parallel.tp_rank = 1;
    HashNamespace other = plain;
    other.manifest_digest = Make(other_rank)->Digest(algorithm);
    EXPECT_NE(hasher.Root(other), hasher.Root(bound));
    EXPECT_NE(hasher.NamespaceDigest(other), hasher.NamespaceDigest(bound));
  }
}

}  // namespace
}  // namespace kvcache
