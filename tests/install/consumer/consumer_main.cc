// A service outside this tree that uses the installed C++ client: pings a daemon, describes a
// pool, and opens and commits a sequence in a session. Prints what it got, one fact a line, for
// tests/install/install_test.sh to compare with what the daemon was started with.
// Usage: kvcache_consumer TARGET POOL
#include <cstdio>
#include <memory>
#include <numeric>
#include <vector>

#include "client/kv_cache_client.h"
#include "common/status_macros.h"

namespace {

absl::Status Run(const std::string& target, const std::string& pool) {
  using kvcache::KvCacheClient;
  ASSIGN_OR_RETURN(std::unique_ptr<KvCacheClient> client, KvCacheClient::Connect(target));
  ASSIGN_OR_RETURN(const uint64_t epoch, client->Ping());
  std::printf("ping: epoch %s\n", epoch != 0 ? "nonzero" : "zero");
  ASSIGN_OR_RETURN(KvCacheClient::PoolDescription described, client->DescribePool(pool));
  const kvcache::PoolLayout& layout = described.pool.layout;
  std::printf("pool: %s model=%s layers=%u kv_heads=%u head_dim=%u block_size=%u blocks=%u\n",
              described.pool.name.c_str(), described.pool.model_id.c_str(), layout.num_layers,
              layout.num_kv_heads, layout.head_dim, layout.block_size, described.pool.num_blocks);
  RETURN_IF_ERROR(client->OpenSession("", "kvcache_consumer").status());
  std::vector<uint32_t> prompt(2 * layout.block_size + 1);
  std::iota(prompt.begin(), prompt.end(), 1);
  ASSIGN_OR_RETURN(KvCacheClient::Sequence sequence, client->OpenSequence(pool, prompt));
  std::printf("sequence: %zu blocks\n", sequence.block_ids.size());
  RETURN_IF_ERROR(client->CommitSequence(sequence.sequence_id, prompt.size()).status());
  RETURN_IF_ERROR(client->ReleaseSequence(sequence.sequence_id));
  ASSIGN_OR_RETURN(KvCacheClient::LookupResult found, client->Lookup(pool, "", prompt));
  std::printf("lookup: %u cached tokens\n", found.num_cached_tokens);
  return client->CloseSession().status();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s TARGET POOL\n", argv[0]);
    return 2;
  }
  const absl::Status status = Run(argv[1], argv[2]);
  if (!status.ok()) {
    std::fprintf(stderr, "kvcache_consumer: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
