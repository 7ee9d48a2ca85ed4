// kvcache-demo: shows a prefix hit end to end against a running kvcache-manager. One "request"
// computes a prompt of several blocks and commits it; a second request whose prompt shares the
// first two blocks then finds them cached. Exits 1 if no hit is seen.
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_join.h"
#include "client/client_flags.h"
#include "client/kv_cache_client.h"
#include "common/command_line.h"
#include "common/rpc/listen_address.h"

ABSL_FLAG(
    std::string, target, "",
    "daemon address: unix:///path/kv.sock or HOST:PORT; default: the daemon's default socket");
ABSL_FLAG(std::string, pool, "default", "pool to use");
ABSL_FLAG(std::string, tenant, "",
          "tenant of the demo's session; empty: the tenant of this caller's identity");

namespace kvcache {
namespace {

int Fail(const char* what, const absl::Status& status) {
  std::fprintf(stderr, "kvcache-demo: %s: %s\n", what, status.ToString().c_str());
  return 2;
}

// Distinct, deterministic token ids; `first` makes prompts differ where they should.
std::vector<uint32_t> Tokens(uint32_t first, size_t count) {
  std::vector<uint32_t> tokens(count);
  for (size_t i = 0; i < count; ++i) tokens[i] = first + static_cast<uint32_t>(i);
  return tokens;
}

int Run() {
  std::string target = absl::GetFlag(FLAGS_target);
  if (target.empty()) target = DefaultListenAddress();
  const std::string pool = absl::GetFlag(FLAGS_pool);

  absl::StatusOr<ClientOptions> options = ClientOptionsFromFlags();
  if (!options.ok()) return Fail("client options", options.status());
  absl::StatusOr<std::unique_ptr<KvCacheClient>> connected =
      KvCacheClient::Connect(target, *std::move(options));
  if (!connected.ok()) return Fail("connect", connected.status());
  KvCacheClient& client = **connected;

  absl::StatusOr<KvCacheClient::PoolDescription> described = client.DescribePool(pool);
  if (!described.ok()) return Fail("describe pool", described.status());
  const uint32_t block_size = described->pool.layout.block_size;
  std::printf("pool '%s': %u blocks of %u tokens (%llu bytes each)\n", pool.c_str(),
              described->pool.num_blocks, block_size,
              static_cast<unsigned long long>(described->pool.block_bytes));

  absl::StatusOr<KvCacheClient::SessionInfo> session =
      client.OpenSession(absl::GetFlag(FLAGS_tenant), "kvcache-demo");
  if (!session.ok()) return Fail("open session", session.status());
  std::printf(
      "session %llu, epoch %llu, ttl %s\n", static_cast<unsigned long long>(session->session_id),
      static_cast<unsigned long long>(session->epoch), absl::FormatDuration(session->ttl).c_str());

  // Request 1: 3.5 blocks of prompt, "computed" and committed, then released.
  const std::vector<uint32_t> first = Tokens(1000, block_size * 3 + block_size / 2);
  absl::StatusOr<KvCacheClient::Sequence> a = client.OpenSequence(pool, first);
  if (!a.ok()) return Fail("open first prompt", a.status());
  std::printf("request 1: %zu tokens, blocks [%s], cached tokens %u\n", first.size(),
              absl::StrJoin(a->block_ids, ", ").c_str(), a->num_cached_tokens);
  absl::StatusOr<KvCacheClient::Commit> commit =
      client.CommitSequence(a->sequence_id, static_cast<uint32_t>(first.size()));
  if (!commit.ok()) return Fail("commit", commit.status());
  std::printf("request 1: committed %u blocks, %u newly published\n", commit->num_committed_blocks,
              commit->num_published_blocks);
  if (absl::Status released = client.ReleaseSequence(a->sequence_id); !released.ok()) {
    return Fail("release", released);
  }

  // Request 2: the same first two blocks, then a different continuation.
  std::vector<uint32_t> second(first.begin(), first.begin() + 2 * block_size);
  const std::vector<uint32_t> tail = Tokens(5000, block_size + 3);
  second.insert(second.end(), tail.begin(), tail.end());
  absl::StatusOr<KvCacheClient::Sequence> b = client.OpenSequence(pool, second);
  if (!b.ok()) return Fail("open second prompt", b.status());
  std::printf("request 2: %zu tokens, blocks [%s], cached tokens %u (prefix hit: %s)\n",
              second.size(), absl::StrJoin(b->block_ids, ", ").c_str(), b->num_cached_tokens,
              b->num_cached_tokens > 0 ? "yes" : "NO");

  absl::StatusOr<KvCacheClient::Stats> stats = client.GetStats(pool);
  if (!stats.ok()) return Fail("stats", stats.status());
  for (const KvCacheClient::PoolStats& pool_stats : stats->pools) {
    std::printf(
        "stats '%s': free=%u evictable=%u referenced=%u prompt_tokens=%llu hit_tokens=%llu "
        "hit_blocks=%llu miss_blocks=%llu published=%llu open_sequences=%u\n",
        pool_stats.pool.c_str(), pool_stats.counts.free, pool_stats.counts.evictable,
        pool_stats.counts.referenced, static_cast<unsigned long long>(pool_stats.prompt_tokens),
        static_cast<unsigned long long>(pool_stats.hit_tokens),
        static_cast<unsigned long long>(pool_stats.hit_blocks),
        static_cast<unsigned long long>(pool_stats.miss_blocks),
        static_cast<unsigned long long>(pool_stats.published_blocks), pool_stats.open_sequences);
  }

  absl::StatusOr<uint32_t> closed = client.CloseSession();
  if (!closed.ok()) return Fail("close session", closed.status());
  std::printf("session closed, %u sequence(s) released\n", *closed);
  return b->num_cached_tokens > 0 ? 0 : 1;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  kvcache::ParseCommandLineFlags(argc, argv,
                                 "Shows a prefix hit against a running kvcache-manager");
  return kvcache::Run();
}
