// kvcache-test-client: one scripted client action per run, so integration tests can put clients
// in separate processes (and kill them). Usage:
//
//   kvcache-test-client TARGET compute-and-commit POOL NUM_TOKENS FIRST_TOKEN
//       opens a session and a sequence for the prompt FIRST_TOKEN, FIRST_TOKEN+1, ..., commits
//       all of it (as a worker would once its KV is written), closes the session and exits.
//   kvcache-test-client TARGET open-and-report POOL NUM_TOKENS FIRST_TOKEN
//       opens the prompt, reports what was cached, closes the session and exits.
//   kvcache-test-client TARGET hold-and-hang POOL NUM_TOKENS FIRST_TOKEN TTL_MS
//       opens a session with TTL_MS and the prompt, reports, then hangs (keeping the lease alive)
//       until killed or stopped.
//
// Each reports one stdout line: "result session=S sequence=Q cached=N blocks=B0,B1,...".
// Exit status: 0 done, 1 usage, 2 a call failed (the status is on stderr).
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_join.h"
#include "client/kv_cache_client.h"

namespace kvcache {
namespace {

constexpr char kTenant[] = "integration";

int Fail(const std::string& what, const absl::Status& status) {
  std::fprintf(stderr, "kvcache-test-client: %s: %s\n", what.c_str(), status.ToString().c_str());
  return 2;
}

int Usage() {
  std::fprintf(stderr,
               "usage: kvcache-test-client TARGET (compute-and-commit|open-and-report) POOL "
               "NUM_TOKENS FIRST_TOKEN\n"
               "       kvcache-test-client TARGET hold-and-hang POOL NUM_TOKENS FIRST_TOKEN "
               "TTL_MS\n");
  return 1;
}

int Run(const std::vector<std::string>& args) {
  if (args.size() < 5) return Usage();
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
  if (hang && (args.size() != 6 || !absl::SimpleAtoi(args[5], &ttl_ms))) return Usage();
  if (!hang &&
      (args.size() != 5 || (command != "compute-and-commit" && command != "open-and-report"))) {
    return Usage();
  }

  absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(target);
  if (!client.ok()) return Fail("connect", client.status());
  absl::StatusOr<KvCacheClient::SessionInfo> session =
      (*client)->OpenSession(kTenant, command, absl::Milliseconds(ttl_ms));
  if (!session.ok()) return Fail("open session", session.status());

  std::vector<uint32_t> tokens(num_tokens);
  for (uint32_t i = 0; i < num_tokens; ++i) tokens[i] = first_token + i;
  absl::StatusOr<KvCacheClient::Sequence> sequence = (*client)->OpenSequence(pool, tokens);
  if (!sequence.ok()) return Fail("open sequence", sequence.status());
  if (command == "compute-and-commit") {
    // This is where a worker would write the KV of every token into the blocks.
    absl::StatusOr<KvCacheClient::Commit> commit =
        (*client)->CommitSequence(sequence->sequence_id, num_tokens);
    if (!commit.ok()) return Fail("commit", commit.status());
  }
  std::printf("result session=%llu sequence=%llu cached=%u blocks=%s\n",
              static_cast<unsigned long long>(session->session_id),
              static_cast<unsigned long long>(sequence->sequence_id), sequence->num_cached_tokens,
              absl::StrJoin(sequence->block_ids, ",").c_str());
  std::fflush(stdout);

  if (hang) {
    // The keep-alive thread holds the lease until the test kills or stops this process.
    while (true) pause();
  }
  absl::StatusOr<uint32_t> closed = (*client)->CloseSession();
  if (!closed.ok()) return Fail("close session", closed.status());
  return 0;
}

}  // namespace
}  // namespace kvcache

int main(int argc, char** argv) {
  return kvcache::Run(std::vector<std::string>(argv + 1, argv + argc));
}
