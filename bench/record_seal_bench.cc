// record_seal_bench: what sealing costs a record beyond the cipher itself. RecordSealer::Seal and
// RecordSealer::OpenHead + OpenBody of one record (head and body, tiers/record_seal.h) against
// one bare AES-256-GCM pass over the same body bytes with a context keyed once (what the bytes
// alone must cost), and the cluster tier's value name (RecordSealer::NameDigest) per record, on
// one thread. The ratio is the bare pass's rate over the record's: 1.0x means the head, the key
// lookups and the three messages' set-up cost nothing measurable.
//
//   record_seal_bench [ROUNDS]   (default 7; each round seals and opens 64 MiB of records at
//                                 each block size, best round printed)
//
// Exits 1 at the first seal or open that fails (bench/bench_run.h).
#include <openssl/evp.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "bench/bench_run.h"
#include "tiers/record_seal.h"
#include "tiers/tier_keyring.h"

namespace kvcache {
namespace {

constexpr uint32_t kTokens = 16;

std::shared_ptr<const TierKeyring> BenchKeyring() {
  TierMasterKey key{.id = 1};
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = static_cast<uint8_t>(i * 29 + 3);
  return bench::ValueOrFail(TierKeyring::FromKeys({key}), "TierKeyring::FromKeys");
}

RecordHeader HeaderFor(const PoolIdentity& pool, uint64_t i) {
  RecordHeader header;
  header.pool = pool;
  header.block.hash = Hash128{i, ~i};
  header.block.parent_hash = Hash128{i - 1, ~(i - 1)};
  header.block.namespace_digest = 7;
  header.block.prefix_digest = i * 31;
  header.block.tokens.assign(kTokens, static_cast<uint32_t>(i));
  header.block.tenant = "bench-tenant";
  header.sequence = i;
  return header;
}

// Seconds for one bare AES-256-GCM encryption of `records` bodies of `block_bytes`, in place,
// each under its own nonce with the key schedule set once.
double BareGcmSeconds(std::vector<char>& bodies, uint64_t block_bytes, size_t records) {
  EVP_CIPHER_CTX* ctx = EVP_CIPHER_CTX_new();
  EVP_CIPHER* cipher = EVP_CIPHER_fetch(nullptr, "AES-256-GCM", nullptr);
  uint8_t key[32] = {1, 2, 3};
  uint8_t nonce[12] = {};
  if (ctx == nullptr || cipher == nullptr ||
      EVP_EncryptInit_ex(ctx, cipher, nullptr, key, nullptr) != 1) {
    bench::Fail("EVP AES-256-GCM set-up");
  }
  const absl::Time start = absl::Now();
  for (size_t r = 0; r < records; ++r) {
    nonce[0] = static_cast<uint8_t>(r);
    nonce[1] = static_cast<uint8_t>(r >> 8);
    uint8_t* body = reinterpret_cast<uint8_t*>(bodies.data() + r * block_bytes);
    int length = 0;
    uint8_t tag[16];
    if (EVP_EncryptInit_ex(ctx, nullptr, nullptr, nullptr, nonce) != 1 ||
        EVP_EncryptUpdate(ctx, body, &length, body, static_cast<int>(block_bytes)) != 1 ||
        EVP_EncryptFinal_ex(ctx, tag, &length) != 1 ||
        EVP_CIPHER_CTX_ctrl(ctx, EVP_CTRL_GCM_GET_TAG, 16, tag) != 1) {
      bench::Fail("EVP AES-256-GCM");
    }
  }
  const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
  EVP_CIPHER_free(cipher);
  EVP_CIPHER_CTX_free(ctx);
  return seconds;
}

void Run(uint64_t block_bytes, int rounds) {
  const size_t records = bench::SmokeRun() ? 4 : std::max<uint64_t>(8, (64u << 20) / block_bytes);
  const PoolIdentity pool{.model_id = "bench",
                          .layout_fingerprint = 1,
                          .hash_algorithm = HashAlgorithm::kXxh3_128,
                          .block_bytes = block_bytes};
  const RecordSealer sealer(BenchKeyring(), pool, kTokens);
  std::vector<char> bodies(records * block_bytes, 'k');
  std::vector<char> heads(records * sealer.head_bytes());
  std::vector<RecordHeader> headers;
  for (size_t r = 0; r < records; ++r) headers.push_back(HeaderFor(pool, r));

  double best_bare = 1e30, best_seal = 1e30, best_open = 1e30, best_name = 1e30;
  for (int round = 0; round < rounds; ++round) {
    best_bare = std::min(best_bare, BareGcmSeconds(bodies, block_bytes, records));

    absl::Time start = absl::Now();
    for (size_t r = 0; r < records; ++r) {
      char* body = bodies.data() + r * block_bytes;
      const SealPiece piece{body, body, block_bytes};
      bench::CheckOk(
          sealer.Seal(headers[r], {&piece, 1},
                      absl::MakeSpan(heads.data() + r * sealer.head_bytes(), sealer.head_bytes())),
          "RecordSealer::Seal");
    }
    best_seal = std::min(best_seal, absl::ToDoubleSeconds(absl::Now() - start));

    start = absl::Now();
    for (size_t r = 0; r < records; ++r) {
      const absl::string_view head(heads.data() + r * sealer.head_bytes(), sealer.head_bytes());
      absl::StatusOr<OpenedHead> opened = sealer.OpenHead(head, headers[r].block.tenant);
      bench::CheckOk(opened.status(), "RecordSealer::OpenHead");
      char* body = bodies.data() + r * block_bytes;
      const SealPiece piece{body, body, block_bytes};
      bench::CheckOk(sealer.OpenBody(*opened, headers[r].block, {&piece, 1}),
                     "RecordSealer::OpenBody");
    }
    best_open = std::min(best_open, absl::ToDoubleSeconds(absl::Now() - start));

    start = absl::Now();
    for (size_t r = 0; r < records; ++r) {
      const std::string name = absl::StrCat("block:", r);
      bench::CheckOk(sealer.NameDigest(1, headers[r].block.tenant, name).status(),
                     "RecordSealer::NameDigest");
    }
    best_name = std::min(best_name, absl::ToDoubleSeconds(absl::Now() - start));
  }
  const double gb = double(records * block_bytes) / 1e9;
  const double per_record_us = 1e6 / records;
  std::printf(
      "%7llu B blocks: bare GCM %.2f GB/s; Seal %.2f GB/s (%.2fx), OpenHead+OpenBody %.2f GB/s "
      "(%.2fx); beyond the bare pass a record costs %.2f us to seal, %.2f us to open; "
      "NameDigest %.2f us\n",
      static_cast<unsigned long long>(block_bytes), gb / best_bare, gb / best_seal,
      best_bare / best_seal, gb / best_open, best_bare / best_open,
      (best_seal - best_bare) * per_record_us, (best_open - best_bare) * per_record_us,
      best_name * per_record_us);
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  const int rounds = kvcache::bench::SmokeRun() ? 1 : (argc > 1 ? std::atoi(argv[1]) : 7);
  if (rounds < 1) {
    std::fprintf(stderr, "usage: record_seal_bench [ROUNDS >= 1]\n");
    return 2;
  }
  for (uint64_t block_bytes : {uint64_t{32} << 10, uint64_t{256} << 10, uint64_t{1} << 20}) {
    kvcache::Run(block_bytes, rounds);
  }
  return 0;
}
