// Master keys and keyrings for the sealed tiers' tests (tiers/tier_keyring.h): key `id` filled
// from `fill`, so that two fills give two unrelated keys and a test can name "the same key file"
// or "another master key" in one letter.
#ifndef KVCACHE_TESTS_TESTING_TIER_KEYS_H_
#define KVCACHE_TESTS_TESTING_TIER_KEYS_H_

#include <gtest/gtest.h>

#include <memory>
#include <utility>
#include <vector>

#include "tests/testing/status_matchers.h"
#include "tiers/tier_keyring.h"

namespace kvcache::testing {

inline TierMasterKey TestTierKey(uint32_t id, char fill) {
  TierMasterKey key{.id = id};
  for (size_t i = 0; i < key.bytes.size(); ++i) key.bytes[i] = static_cast<uint8_t>(fill * 7 + i);
  return key;
}

// A keyring of `keys`, newest first, as a key file of those lines gives.
inline std::shared_ptr<const TierKeyring> TestTierKeyring(std::vector<TierMasterKey> keys) {
  absl::StatusOr<std::shared_ptr<TierKeyring>> keyring = TierKeyring::FromKeys(std::move(keys));
  EXPECT_OK(keyring);
  return keyring.ok() ? *std::move(keyring) : nullptr;
}

}  // namespace kvcache::testing

#endif  // KVCACHE_TESTS_TESTING_TIER_KEYS_H_
