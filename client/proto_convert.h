// Conversions between the v1 protos and KvCacheClient's plain structs. Internal to the client.
#ifndef KVCACHE_CLIENT_PROTO_CONVERT_H_
#define KVCACHE_CLIENT_PROTO_CONVERT_H_

#include <cstdint>
#include <vector>

#include "client/kv_cache_client.h"
#include "common/block_hash.h"
#include "kvcache/v1/kvcache.pb.h"

namespace kvcache {

void FillExtraKeys(const ExtraKeys& extras, v1::ExtraKeys* proto);

// The fields every session-scoped, prompt-keyed request carries (OpenSequence, PutBlocks'
// header, GetBlocks).
template <typename Request>
void FillPromptRequest(uint64_t session_id, uint64_t epoch, absl::string_view pool,
                       absl::Span<const uint32_t> tokens, absl::string_view cache_salt,
                       const ExtraKeys& extra_keys, Request* request) {
  request->set_session_id(session_id);
  request->set_epoch(epoch);
  request->set_pool(std::string(pool));
  request->mutable_tokens()->Add(tokens.begin(), tokens.end());
  request->set_cache_salt(std::string(cache_salt));
  FillExtraKeys(extra_keys, request->mutable_extra_keys());
}
KvCacheClient::PoolInfo ToPoolInfo(const v1::PoolInfo& proto);
KvCacheClient::BlockCounts ToBlockCounts(const v1::BlockCounts& proto);
KvCacheClient::PoolStats ToPoolStats(const v1::PoolStats& proto);
KvCacheClient::TierTokens ToTierTokens(const v1::TierTokens& proto);
KvCacheClient::TierPages ToTierPages(const v1::TierPages& proto);

template <typename Field>
std::vector<uint32_t> ToVector(const Field& field) {
  return std::vector<uint32_t>(field.begin(), field.end());
}

}  // namespace kvcache

#endif  // KVCACHE_CLIENT_PROTO_CONVERT_H_
