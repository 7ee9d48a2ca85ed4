// Test blocks (and a disk tier for them) for the tier tests and the crash child: block i's identity
// and bytes are derived from i alone, so a process that reopens a tier file can check every byte
// another process wrote, with no record of what that was. Thread safety: free functions;
// thread-safe.
#ifndef KVCACHE_TESTS_TIERS_TEST_BLOCKS_H_
#define KVCACHE_TESTS_TIERS_TEST_BLOCKS_H_

#include <cstdint>
#include <string>

#include "common/block_checksum.h"
#include "tiers/block_record.h"
#include "tiers/disk_tier.h"
#include "tiers/record_codec.h"

namespace kvcache::testing {

inline constexpr uint32_t kTestTokensPerBlock = 16;
// Not a multiple of 4 KiB, so slots carry padding.
inline constexpr uint64_t kTestBlockBytes = 10000;

inline PoolIdentity TestPool() {
  return PoolIdentity{.model_id = "tiny-qwen3-moe",
                      .layout_fingerprint = 0x5eed,
                      .hash_algorithm = HashAlgorithm::kXxh3_128,
                      .block_bytes = kTestBlockBytes};
}

// The test blocks' disk slot: a 4 KiB header and 10000 bytes padded to 12 KiB.
inline constexpr uint64_t kTestSlotBytes = 16384;

// A disk tier of `slots` test-block slots at `path`.
inline DiskTierOptions TestTierOptions(const std::string& path, uint64_t slots) {
  DiskTierOptions options;
  options.path = path;
  options.capacity_bytes = slots * kTestSlotBytes;
  options.pool = TestPool();
  options.tokens_per_block = kTestTokensPerBlock;
  return options;
}

inline uint64_t SplitMix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

inline Hash128 TestHash(uint64_t i) { return {SplitMix(i), SplitMix(~i)}; }

// Block bytes derived from the hash alone.
inline std::string TestBytes(const Hash128& hash, uint64_t size = kTestBlockBytes) {
  std::string bytes(size, '\0');
  uint64_t state = hash.hi ^ hash.lo;
  for (uint64_t i = 0; i < size; i += 8) {
    state = SplitMix(state);
    for (uint64_t b = 0; b < 8 && i + b < size; ++b)
      bytes[i + b] = static_cast<char>(state >> (8 * b));
  }
  return bytes;
}

inline BlockRecordIdentity TestIdentity(uint64_t i) {
  BlockRecordIdentity identity;
  identity.hash = TestHash(i);
  identity.parent_hash = i == 0 ? Hash128{7, 7} : TestHash(i - 1);
  identity.namespace_digest = 0xabcdef;
  identity.extras_digest = i % 3;
  identity.prefix_digest = SplitMix(i ^ 0x9e37);
  for (uint32_t t = 0; t < kTestTokensPerBlock; ++t) {
    identity.tokens.push_back(static_cast<uint32_t>(i * kTestTokensPerBlock + t));
  }
  const std::string bytes = TestBytes(identity.hash);
  identity.checksum = BlockChecksum(bytes.data(), bytes.size());
  return identity;
}

// The header `header` had as record format version 1 (no prefix digest, 8 bytes shorter: what a
// build before version 2 wrote), zero-padded to RecordHeaderSlotBytes.
inline std::string Version1RecordHeader(const RecordHeader& header) {
  const uint32_t tokens = static_cast<uint32_t>(header.block.tokens.size());
  std::string current(RecordHeaderSlotBytes(tokens), '\0');
  if (!EncodeRecordHeader(header, absl::MakeSpan(current)).ok()) return "";
  constexpr uint64_t kPrefixDigestOffset = 344;
  std::string old = current.substr(0, kPrefixDigestOffset) +
                    current.substr(kPrefixDigestOffset + 8,
                                   RecordHeaderBytes(tokens) - 8 - 8 - kPrefixDigestOffset);
  old[8] = 1;  // the version, little-endian
  const uint64_t checksum = BlockChecksum(old.data(), old.size());
  for (int b = 0; b < 8; ++b) old.push_back(static_cast<char>(checksum >> (8 * b)));
  old.resize(current.size(), '\0');
  return old;
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TIERS_TEST_BLOCKS_H_
