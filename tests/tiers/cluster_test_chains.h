// What the cluster tier's tests share: chains of 32 KiB blocks (the default pool's, so a record is
// split to fit jemalloc's size classes) whose identities and bytes derive from their namespace,
// and a check that a load brought each block's own bytes.
#ifndef KVCACHE_TESTS_TIERS_CLUSTER_TEST_CHAINS_H_
#define KVCACHE_TESTS_TIERS_CLUSTER_TEST_CHAINS_H_

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "common/block_checksum.h"
#include "tiers/cluster_tier.h"

namespace kvcache::testing {

inline constexpr uint32_t kChainTokensPerBlock = 16;
inline constexpr uint64_t kChainBlockBytes = 32 << 10;

struct Chain {
  std::vector<BlockRecordIdentity> identities;
  std::vector<std::string> bytes;
};

// A chain of `blocks` blocks of `tenant` in namespace `ns`. The tokens are distinctive, so a test
// can look for them in what a tier wrote.
inline Chain MakeChain(int blocks, uint64_t ns, const std::string& tenant = "") {
  Chain chain;
  Hash128 parent{0, ns};
  for (int i = 0; i < blocks; ++i) {
    BlockRecordIdentity identity;
    identity.hash = Hash128{1000 + static_cast<uint64_t>(i), ns};
    identity.parent_hash = parent;
    identity.namespace_digest = ns;
    identity.prefix_digest = (ns << 8) ^ i;
    identity.tenant = tenant;
    for (uint32_t t = 0; t < kChainTokensPerBlock; ++t) {
      identity.tokens.push_back(0x51ed0000 + i * 100 + t);
    }
    std::string bytes(kChainBlockBytes, '\0');
    for (uint64_t b = 0; b < kChainBlockBytes; ++b) {
      bytes[b] = static_cast<char>((b * 31 + i + ns) & 0xff);
    }
    identity.checksum = BlockChecksum(bytes.data(), bytes.size());
    parent = identity.hash;
    chain.identities.push_back(identity);
    chain.bytes.push_back(std::move(bytes));
  }
  return chain;
}

// Loads `expected` from `tier` and checks every loaded block's bytes against `chain`'s (block i
// of `expected` against chain.bytes[i]). Returns how many loaded.
inline size_t LoadChecked(ClusterTier& tier, const std::vector<BlockRecordIdentity>& expected,
                          const Chain& chain) {
  std::vector<std::string> out(expected.size(), std::string(kChainBlockBytes, '\0'));
  std::vector<uint8_t*> pointers;
  for (std::string& block : out) pointers.push_back(reinterpret_cast<uint8_t*>(block.data()));
  const size_t loaded = tier.LoadPrefix(expected, pointers);
  for (size_t i = 0; i < loaded; ++i) EXPECT_TRUE(out[i] == chain.bytes[i]) << "block " << i;
  return loaded;
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TIERS_CLUSTER_TEST_CHAINS_H_
