// kvcache-test-client: one scripted client action per run, so integration tests can put clients
// in separate processes (and kill them). Usage:
//
//   kvcache-test-client TARGET ACTION POOL NUM_TOKENS FIRST_TOKEN [TTL_MS | ITERATIONS]
//
// The prompt is FIRST_TOKEN, FIRST_TOKEN+1, ... (NUM_TOKENS tokens). Actions:
//   compute-and-commit  opens a session and a sequence for the prompt, commits all of it (as a
//                       worker would once its KV is written), closes the session and exits.
//   open-and-report     opens the prompt, reports what was cached, closes the session and exits.
//   hold-and-hang       (TTL_MS required) opens a session with TTL_MS and the prompt, reports,
//                       then hangs (keeping the lease alive) until killed or stopped.
//   write-kv            opens the prompt, maps the pool and writes the KV pattern
//                       (tests/integration/kv_pattern.h) of every uncached token into its blocks
//                       through typed K/V spans (a device pool: a host image of each block,
//                       cudaMemcpy'd in), commits, releases and exits.
//   read-kv             opens the prompt, maps the pool and checks the cached blocks' bytes
//                       against the pattern (a device pool: cudaMemcpy'd out); releases and
//                       exits.
//   put-kv              puts the pattern of the prompt's full blocks with PutBlocks (no mapping).
//   get-kv              gets the prompt's cached prefix with GetBlocks and checks it.
//   time-get            (ITERATIONS required) GetBlocksInto of the prompt's cached prefix into
//                       one reused buffer, ITERATIONS times after a warm-up get; for benchmarks
//                       that compare another client with this one (bench/python_client_bench.py).
//
// Each reports one stdout line "result key=value ...": session, sequence, cached (tokens),
// blocks (the block table) where a sequence was opened; written (tokens) for write-kv;
// mismatched_blocks and digest (XXH3-64 hex of the cached blocks' bytes) for read-kv and get-kv;
// device (the CUDA device, or -1 for host memory) of the mapping for write-kv and read-kv;
// put_blocks, stored and digest (of the bytes put) for put-kv; got_blocks for get-kv;
// got_blocks, bytes (per get) and seconds (all ITERATIONS gets, steady clock) for time-get.
// Exit status: 0 done, 1 usage, 2 a call failed (the status is on stderr).
#include <unistd.h>

#include <chrono>
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

#if KVCACHE_WITH_CUDA
#include "common/cuda/cuda_status.h"
#endif

namespace kvcache {
namespace {

using ::kvcache::testing::Digest;
using ::kvcache::testing::ExpectedBlockBytes;
using ::kvcache::testing::ExpectedPrefixBytes;
using ::kvcache::testing::KvPatternValue;
using ::kvcache::testing::WriteTokenPattern;

constexpr char kTenant[] = "default";  // the default identity's tenant

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "kvcache-test-client: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 2;
}

int Usage() {
  std::fprintf(stderr,
               "usage: kvcache-test-client TARGET ACTION POOL NUM_TOKENS FIRST_TOKEN "
               "[TTL_MS | ITERATIONS]\n"
               "  ACTION: compute-and-commit | open-and-report | write-kv | read-kv | put-kv |\n"
               "          get-kv | hold-and-hang (needs TTL_MS) | time-get (needs ITERATIONS)\n");
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

#if KVCACHE_WITH_CUDA
absl::Status CudaCopy(void* to, const void* from, size_t bytes, cudaMemcpyKind kind, int device) {
  KVCACHE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device), "cudaSetDevice");
  return CudaStatus(cudaMemcpy(to, from, bytes, kind), "cudaMemcpy");
}
#endif

// A device pool: each block that holds tokens [first, tokens.size()) is copied out, patched with
// their pattern and copied back; the device is synchronized at the end, so the commit that
// follows publishes complete bytes.
absl::Status WriteDeviceKv(const MappedPool& pool, const std::vector<uint32_t>& block_ids,
                           const std::vector<uint32_t>& tokens, uint32_t first) {
#if KVCACHE_WITH_CUDA
  const PoolLayout& layout = pool.layout();
  std::string image(pool.block_bytes(), '\0');
  for (uint32_t position = first; position < tokens.size(); ++position) {
    const uint32_t block = block_ids[position / layout.block_size];
    const bool block_start = position == first || position % layout.block_size == 0;
    if (block_start) {
      absl::Status status = CudaCopy(image.data(), pool.Block(block), image.size(),
                                     cudaMemcpyDeviceToHost, pool.device());
      if (!status.ok()) return status;
    }
    WriteTokenPattern(layout, tokens[position], position, image.data());
    const bool block_end = position + 1 == tokens.size() || (position + 1) % layout.block_size == 0;
    if (block_end) {
      absl::Status status = CudaCopy(pool.Block(block), image.data(), image.size(),
                                     cudaMemcpyHostToDevice, pool.device());
      if (!status.ok()) return status;
    }
  }
  // A copy from pageable memory may return before its DMA lands: wait for it before the commit.
  return CudaStatus(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
#else
  return absl::FailedPreconditionError("kvcache-test-client was built without CUDA");
#endif
}

// The bytes of `blocks`, concatenated: CheckedBlock for a host pool, cudaMemcpy for a device pool.
absl::StatusOr<std::string> ReadBlocks(const MappedPool& pool, absl::Span<const uint32_t> blocks) {
  std::string bytes;
  for (uint32_t block : blocks) {
    if (pool.is_device()) {
#if KVCACHE_WITH_CUDA
      std::string image(pool.block_bytes(), '\0');
      absl::Status status = CudaCopy(image.data(), pool.Block(block), image.size(),
                                     cudaMemcpyDeviceToHost, pool.device());
      if (!status.ok()) return status;
      bytes += image;
      continue;
#else
      return absl::FailedPreconditionError("kvcache-test-client was built without CUDA");
#endif
    }
    absl::StatusOr<absl::Span<uint8_t>> span = pool.CheckedBlock(block);
    if (!span.ok()) return span.status();
    bytes.append(reinterpret_cast<const char*>(span->data()), span->size());
  }
  return bytes;
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
  uint32_t iterations = 0;
  if (!absl::SimpleAtoi(args[3], &num_tokens) || !absl::SimpleAtoi(args[4], &first_token)) {
    return Usage();
  }
  const bool hang = command == "hold-and-hang";
  const bool time_get = command == "time-get";
  if ((hang || time_get) != (args.size() == 6) || (hang && !absl::SimpleAtoi(args[5], &ttl_ms)) ||
      (time_get && (!absl::SimpleAtoi(args[5], &iterations) || iterations == 0))) {
    return Usage();
  }
  const bool known = hang || time_get || command == "compute-and-commit" ||
                     command == "open-and-report" || command == "write-kv" ||
                     command == "read-kv" || command == "put-kv" || command == "get-kv";
  if (!known) return Usage();

  absl::StatusOr<std::unique_ptr<KvCacheClient>> connected = KvCacheClient::Connect(target);
  if (!connected.ok()) return Fail("connect", connected.status());
  KvCacheClient& client = **connected;
  absl::StatusOr<KvCacheClient::SessionInfo> session =
      client.OpenSession(kTenant, command, absl::Milliseconds(ttl_ms));
  if (!session.ok()) return Fail("open session", session.status());
  std::vector<uint32_t> tokens(num_tokens);
  for (uint32_t i = 0; i < num_tokens; ++i) tokens[i] = first_token + i;

  if (time_get) {
    absl::StatusOr<KvCacheClient::GetResult> warm = client.GetBlocks(pool, tokens);
    if (!warm.ok()) return Fail("get blocks", warm.status());
    std::string buffer(warm->bytes.size(), '\0');
    const auto start = std::chrono::steady_clock::now();
    for (uint32_t i = 0; i < iterations; ++i) {
      absl::StatusOr<KvCacheClient::GetInfo> got =
          client.GetBlocksInto(pool, tokens, absl::MakeSpan(buffer));
      if (!got.ok()) return Fail("get blocks into", got.status());
    }
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    Report(absl::StrCat("session=", session->session_id, " got_blocks=", warm->num_blocks,
                        " bytes=", buffer.size(), " seconds=", elapsed.count()));
  } else if (command == "put-kv" || command == "get-kv") {
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
      if (mapped->is_device()) {
        const absl::Status written =
            WriteDeviceKv(*mapped, sequence->block_ids, tokens, sequence->num_cached_tokens);
        if (!written.ok()) return Fail("write kv", written);
      } else {
        for (uint32_t position = sequence->num_cached_tokens; position < num_tokens; ++position) {
          const absl::Status written = WriteTokenKvOfAnyType(
              *mapped, sequence->block_ids[position / block_size], tokens[position], position);
          if (!written.ok()) return Fail("write kv", written);
        }
      }
      absl::StrAppend(&fields, " written=", num_tokens - sequence->num_cached_tokens,
                      " device=", mapped->device());
    }
    if (command == "write-kv" || command == "compute-and-commit") {
      // The KV is written (a real worker synchronizes its device work first): publish it.
      absl::StatusOr<KvCacheClient::Commit> commit =
          client.CommitSequence(sequence->sequence_id, num_tokens);
      if (!commit.ok()) return Fail("commit", commit.status());
    }
    if (command == "read-kv") {
      const uint32_t hit_blocks = sequence->num_cached_tokens / mapped->layout().block_size;
      absl::StatusOr<std::string> bytes =
          ReadBlocks(*mapped, absl::MakeConstSpan(sequence->block_ids).first(hit_blocks));
      if (!bytes.ok()) return Fail("read kv", bytes.status());
      absl::StrAppend(&fields,
                      " mismatched_blocks=", MismatchedBlocks(mapped->layout(), tokens, *bytes),
                      " digest=", Digest(*bytes), " device=", mapped->device());
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
