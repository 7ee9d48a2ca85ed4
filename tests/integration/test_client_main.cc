// kvcache-test-client: one scripted client action per run, so integration tests can put clients
// in separate processes (and kill them). Usage:
//
//   kvcache-test-client TARGET ACTION POOL NUM_TOKENS FIRST_TOKEN [TTL_MS]
//
// The prompt is FIRST_TOKEN, FIRST_TOKEN+1, ... (NUM_TOKENS tokens). Actions:
//   compute-and-commit  opens a session and a sequence for the prompt, commits all of it (as a
//                       worker would once its KV is written), closes the session and exits.
//   open-and-report     opens the prompt, reports what was cached, closes the session and exits.
//   hold-and-hang       (TTL_MS required) opens a session with TTL_MS and the prompt, reports,
//                       then hangs (keeping the lease alive) until killed or stopped.
//   write-kv            opens the prompt, maps the pool and writes the KV pattern
//                       (tests/integration/kv_pattern.h) of every uncached token into its blocks
//                       through typed K/V spans, commits, releases and exits.
//   read-kv             opens the prompt, maps the pool and checks the cached blocks' bytes
//                       against the pattern; releases and exits.
//   put-kv              puts the pattern of the prompt's full blocks with PutBlocks (no mapping).
//   get-kv              gets the prompt's cached prefix with GetBlocks and checks it.
//
// Each reports one stdout line "result key=value ...": session, sequence, cached (tokens),
// blocks (the block table) where a sequence was opened; written (tokens) for write-kv;
// mismatched_blocks and digest (XXH3-64 hex of the cached blocks' bytes) for read-kv and get-kv;
// put_blocks, stored and digest (of the bytes put) for put-kv; got_blocks for get-kv.
// Exit status: 0 done, 1 usage, 2 a call failed (the status is on stderr).
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/kv_cache_client.h"
#include "client/mapped_pool.h"
#include "tests/integration/kv_pattern.h"

namespace kvcache {
namespace {

using ::kvcache::testing::Digest;
using ::kvcache::testing::ExpectedBlockBytes;
using ::kvcache::testing::ExpectedPrefixBytes;
using ::kvcache::testing::KvPatternValue;

constexpr char kTenant[] = "integration";

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "kvcache-test-client: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 2;
}

int Usage() {
  std::fprintf(stderr,
               "usage: kvcache-test-client TARGET ACTION POOL NUM_TOKENS FIRST_TOKEN [TTL_MS]\n"
               "  ACTION: compute-and-commit | open-and-report | write-kv | read-kv | put-kv |\n"
               "          get-kv | hold-and-hang (needs TTL_MS)\n");
  return 1;
}

void Report(const std::string& fields) {
  std::printf("result %s\n", fields.c_str());
  std::fflush(stdout);
}

std::string SequenceFields(const KvCacheClient::SessionInfo& session,
                           const KvCacheClient::Sequence& sequence) {
  return absl::StrCat("session=", session.session_id, " sequence=", sequence.sequence_id,
                      " cached=", sequence.num_cached_tokens,
                      " blocks=", absl::StrJoin(sequence.block_ids, ","));
}

// Writes the pattern of the token at `position` into its slot of block `block_id`, K and V of
// every layer, through typed spans of the pool's element size.
template <typename T>
absl::Status WriteTokenKv(const MappedPool& pool, uint32_t block_id, uint32_t token,
                          uint32_t position) {
  const PoolLayout& layout = pool.layout();
  const uint32_t slot = position % layout.block_size;
  for (uint32_t layer = 0; layer < layout.num_layers; ++layer) {
    for (uint32_t kv = 0; kv < 2; ++kv) {
      absl::StatusOr<absl::Span<T>> span =
          kv == 0 ? pool.Keys<T>(block_id, layer) : pool.Values<T>(block_id, layer);
      if (!span.ok()) return span.status();
      for (uint32_t head = 0; head < layout.num_kv_heads; ++head) {
        for (uint32_t dim = 0; dim < layout.head_dim; ++dim) {
          const size_t index = (size_t{slot} * layout.num_kv_heads + head) * layout.head_dim + dim;
          (*span)[index] = static_cast<T>(KvPatternValue(token, position, layer, kv, head, dim));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status WriteTokenKvOfAnyType(const MappedPool& pool, uint32_t block_id, uint32_t token,
                                   uint32_t position) {
  switch (DTypeBytes(pool.layout().dtype)) {
    case 1:
      return WriteTokenKv<uint8_t>(pool, block_id, token, position);
    case 2:
      return WriteTokenKv<uint16_t>(pool, block_id, token, position);
    case 4:
      return WriteTokenKv<uint32_t>(pool, block_id, token, position);
    default:
      return absl::UnimplementedError("unexpected element size");
  }
}

// Compares each block with the pattern; returns how many differ.
size_t MismatchedBlocks(const PoolLayout& layout, const std::vector<uint32_t>& tokens,
                        absl::string_view bytes) {
  const uint64_t block_bytes = layout.BlockBytes();
  size_t mismatched = 0;
  for (size_t block = 0; block < bytes.size() / block_bytes; ++block) {
    if (bytes.substr(block * block_bytes, block_bytes) !=
        ExpectedBlockBytes(layout, tokens, block)) {
      ++mismatched;
    }
  }
  return mismatched;
}

absl::StatusOr<std::unique_ptr<MappedPool>> MapPool(KvCacheClient& client,
                                                    const std::string& pool) {
  absl::StatusOr<KvCacheClient::PoolDescription> described = client.DescribePool(pool);
  if (!described.ok()) return described.status();
  return MappedPool::Map(*described);
}

int Run(const std::vector<std::string>& args) {
  if (args.size() < 5 || args.size() > 6) return Usage();
  const std::string& target = args[0];
  const std::string& command = args[1];
  const std::string& pool = args[2];
  uint32_t num_tokens = 0;
  uint32_t first_token = 0;
  uint32_t ttl_ms = 0;
  if (!absl::SimpleAtoi(args[3], &num_tokens) || !absl::SimpleAtoi(args[4], &first_token)) {
    return Usage();
  }
  const bool hang = command == "hold-and-hang";
  if (hang != (args.size() == 6) || (hang && !absl::SimpleAtoi(args[5], &ttl_ms))) return Usage();
  const bool known = hang || command == "compute-and-commit" || command == "open-and-report" ||
                     command == "write-kv" || command == "read-kv" || command == "put-kv" ||
                     command == "get-kv";
  if (!known) return Usage();

  absl::StatusOr<std::unique_ptr<KvCacheClient>> connected = KvCacheClient::Connect(target);
  if (!connected.ok()) return Fail("connect", connected.status());
  KvCacheClient& client = **connected;
  absl::StatusOr<KvCacheClient::SessionInfo> session =
      client.OpenSession(kTenant, command, absl::Milliseconds(ttl_ms));
  if (!session.ok()) return Fail("open session", session.status());
  std::vector<uint32_t> tokens(num_tokens);
  for (uint32_t i = 0; i < num_tokens; ++i) tokens[i] = first_token + i;

  if (command == "put-kv" || command == "get-kv") {
    absl::StatusOr<KvCacheClient::PoolDescription> described = client.DescribePool(pool);
    if (!described.ok()) return Fail("describe pool", described.status());
    const PoolLayout& layout = described->pool.layout;
    if (command == "put-kv") {
      const std::string bytes =
          ExpectedPrefixBytes(layout, tokens, tokens.size() / layout.block_size);
      absl::StatusOr<KvCacheClient::PutResult> put = client.PutBlocks(pool, tokens, bytes);
      if (!put.ok()) return Fail("put blocks", put.status());
      Report(absl::StrCat(
          "session=", session->session_id, " cached=", put->num_already_cached * layout.block_size,
          " put_blocks=", put->num_blocks, " stored=", put->num_stored, " digest=", Digest(bytes)));
    } else {
      absl::StatusOr<KvCacheClient::GetResult> got = client.GetBlocks(pool, tokens);
      if (!got.ok()) return Fail("get blocks", got.status());
      Report(absl::StrCat("session=", session->session_id, " cached=", got->num_cached_tokens,
                          " got_blocks=", got->num_blocks,
                          " mismatched_blocks=", MismatchedBlocks(layout, tokens, got->bytes),
                          " digest=", Digest(got->bytes)));
    }
  } else {
    std::unique_ptr<MappedPool> mapped;
    if (command == "write-kv" || command == "read-kv") {
      // Map once, before the sequence: a worker maps at start-up, not per request.
      absl::StatusOr<std::unique_ptr<MappedPool>> pool_mapping = MapPool(client, pool);
      if (!pool_mapping.ok()) return Fail("map pool", pool_mapping.status());
      mapped = *std::move(pool_mapping);
      if (mapped->epoch() != session->epoch) {
        return Fail("map pool", absl::FailedPreconditionError("mapped another daemon epoch"));
      }
    }
    absl::StatusOr<KvCacheClient::Sequence> sequence = client.OpenSequence(pool, tokens);
    if (!sequence.ok()) return Fail("open sequence", sequence.status());
    std::string fields = SequenceFields(*session, *sequence);
    if (command == "write-kv") {
      const uint32_t block_size = mapped->layout().block_size;
      for (uint32_t position = sequence->num_cached_tokens; position < num_tokens; ++position) {
        const absl::Status written = WriteTokenKvOfAnyType(
            *mapped, sequence->block_ids[position / block_size], tokens[position], position);
        if (!written.ok()) return Fail("write kv", written);
      }
      absl::StrAppend(&fields, " written=", num_tokens - sequence->num_cached_tokens);
    }
    if (command == "write-kv" || command == "compute-and-commit") {
      // The KV is written (a real worker synchronizes its device work first): publish it.
      absl::StatusOr<KvCacheClient::Commit> commit =
          client.CommitSequence(sequence->sequence_id, num_tokens);
      if (!commit.ok()) return Fail("commit", commit.status());
    }
    if (command == "read-kv") {
      const uint32_t hit_blocks = sequence->num_cached_tokens / mapped->layout().block_size;
      std::string bytes;
      for (uint32_t block = 0; block < hit_blocks; ++block) {
        absl::StatusOr<absl::Span<uint8_t>> span = mapped->CheckedBlock(sequence->block_ids[block]);
        if (!span.ok()) return Fail("read kv", span.status());
        bytes.append(reinterpret_cast<const char*>(span->data()), span->size());
      }
      absl::StrAppend(&fields,
                      " mismatched_blocks=", MismatchedBlocks(mapped->layout(), tokens, bytes),
                      " digest=", Digest(bytes));
    }
    Report(fields);
    if (hang) {
      // The keep-alive thread holds the lease until the test kills or stops this process.
      while (true) pause();
    }
    if (command == "write-kv" || command == "read-kv") {
      const absl::Status released = client.ReleaseSequence(sequence->sequence_id);
      if (!released.ok()) return Fail("release", released);
    }
  }
  absl::StatusOr<uint32_t> closed = client.CloseSession();
  if (!closed.ok()) return Fail("close session", closed.status());
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  return kvcache::Run(std::vector<std::string>(argv + 1, argv + argc));
}
