// Prints docs/hash_test_vectors.tsv. Run it only when the spec version changes: the vectors are
// the contract that every client language is tested against.
#include <cstdio>
#include <numeric>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/block_hash.h"
#include "common/pool_layout.h"

namespace kvcache {
namespace {

struct Vector {
  std::string name;
  HashAlgorithm algorithm;
  std::string model_id;
  PoolLayout layout;
  std::string tenant, salt;
  ExtraKeys extras;
  std::vector<uint32_t> tokens;
};

std::vector<uint32_t> Range(uint32_t first, size_t n) {
  std::vector<uint32_t> tokens(n);
  std::iota(tokens.begin(), tokens.end(), first);
  return tokens;
}

void Print(const Vector& v) {
  BlockHasher hasher(v.algorithm);
  const uint64_t fingerprint = v.layout.Fingerprint();
  const Hash128 root = hasher.Root({v.model_id, fingerprint, v.tenant, v.salt});
  std::vector<Hash128> chain;
  hasher.ExtendChain(root, v.tokens, v.layout.block_size, v.extras, &chain);
  std::vector<std::string> items, hashes;
  for (const MultimodalItem& item : v.extras.multimodal_items) {
    items.push_back(absl::StrCat(item.content_hash, "@", item.offset, "+", item.length));
  }
  for (const Hash128& hash : chain) hashes.push_back(hash.ToHex());
  std::printf("%s\n",
              absl::StrJoin(
                  {v.name, std::string(HashAlgorithmName(v.algorithm)), v.model_id,
                   absl::StrCat(v.layout.num_layers), absl::StrCat(v.layout.num_kv_heads),
                   absl::StrCat(v.layout.head_dim), absl::StrCat(v.layout.block_size),
                   std::string(DTypeName(v.layout.dtype)), v.tenant, v.salt, v.extras.lora_id,
                   absl::StrJoin(items, ";"), absl::StrJoin(v.tokens, ","),
                   absl::StrFormat("%016x", fingerprint), root.ToHex(), absl::StrJoin(hashes, ",")},
                  "\t")
                  .c_str());
}

void Main() {
  const PoolLayout demo{.num_layers = 4,
                        .num_kv_heads = 2,
                        .head_dim = 64,
                        .block_size = 16,
                        .dtype = DType::kFloat16};
  const PoolLayout tiny{
      .num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_size = 4, .dtype = DType::kFloat32};
  const ExtraKeys image{.multimodal_items = {{"img:3f2a", 10, 12}}};
  const ExtraKeys everything{.lora_id = "adapter-7",
                             .multimodal_items = {{"img:a", 2, 3}, {"audio:b", 5, 6}}};
  std::printf(
      "name\talgorithm\tmodel_id\tlayers\tkv_heads\thead_dim\tblock_size\tdtype\ttenant\t"
      "cache_salt\tlora_id\tmultimodal_items\ttokens\tfingerprint\troot\tblock_hashes\n");
  for (HashAlgorithm algorithm : {HashAlgorithm::kXxh3_128, HashAlgorithm::kSha256}) {
    const std::string tag(HashAlgorithmName(algorithm));
    Print({tag + "-plain", algorithm, "demo", demo, "acme", "", {}, Range(1, 35)});
    Print({tag + "-salted", algorithm, "demo", demo, "acme", "user-42", {}, Range(1, 35)});
    Print({tag + "-other-tenant", algorithm, "demo", demo, "globex", "", {}, Range(1, 35)});
    Print({tag + "-lora",
           algorithm,
           "demo",
           demo,
           "acme",
           "",
           {.lora_id = "adapter-7"},
           Range(1, 35)});
    Print({tag + "-image", algorithm, "demo", demo, "acme", "", image, Range(1, 35)});
    Print({tag + "-tiny-everything",
           algorithm,
           "",
           tiny,
           "",
           "s",
           everything,
           {0, 4294967295u, 7, 7, 65536, 1, 2, 3, 9, 9, 9, 9, 5}});
  }
}

}  // namespace
}  // namespace kvcache

int main() { kvcache::Main(); }
