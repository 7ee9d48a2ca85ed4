// kvcache-tenant-probe: tenant B's attacks on tenant A's state, run as a separate process so that
// a test can run it as another uid (setpriv) or with another credential. Usage:
//
//   kvcache-tenant-probe TARGET TENANT_A SESSION_A SEQUENCE_A POOL FIRST_TOKEN NUM_TOKENS
//
// Credentials come from the environment: KVCACHE_TOKEN (bearer token), KVCACHE_TLS_CA,
// KVCACHE_TLS_CERT, KVCACHE_TLS_KEY. The prompt is FIRST_TOKEN, FIRST_TOKEN+1, ... which tenant
// A has cached. Prints one line per attempt, "probe NAME CODE [key=value]", where CODE is the
// gRPC status code's name, then "probe done". Exit status: 0 when every attempt got an answer.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/block_checksum.h"
#include "common/rpc/grpc_status.h"
#include "tests/integration/raw_channel.h"

namespace kvcache::testing {
namespace {

std::string CodeName(const grpc::Status& status) {
  return absl::StatusCodeToString(FromGrpcStatus(status).code());
}

void Report(const std::string& name, const grpc::Status& status, const std::string& extra = "") {
  std::printf("probe %s %s%s%s\n", name.c_str(), CodeName(status).c_str(), extra.empty() ? "" : " ",
              extra.c_str());
  std::fflush(stdout);
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

int Run(int argc, char** argv) {
  uint64_t session_a = 0, sequence_a = 0;
  uint32_t first_token = 0, num_tokens = 0;
  if (argc != 8 || !absl::SimpleAtoi(argv[3], &session_a) ||
      !absl::SimpleAtoi(argv[4], &sequence_a) || !absl::SimpleAtoi(argv[6], &first_token) ||
      !absl::SimpleAtoi(argv[7], &num_tokens)) {
    std::fprintf(stderr,
                 "usage: kvcache-tenant-probe TARGET TENANT_A SESSION_A SEQUENCE_A POOL "
                 "FIRST_TOKEN NUM_TOKENS\n");
    return 1;
  }
  const std::string target = argv[1], tenant_a = argv[2], pool = argv[5];
  const RawCredentials credentials{Env("KVCACHE_TOKEN"), Env("KVCACHE_TLS_CA"),
                                   Env("KVCACHE_TLS_CERT"), Env("KVCACHE_TLS_KEY")};
  std::unique_ptr<v1::KvCache::Stub> stub = RawStub(target, credentials);
  std::vector<uint32_t> prompt(num_tokens);
  for (uint32_t i = 0; i < num_tokens; ++i) prompt[i] = first_token + i;
  auto set_prompt = [&](auto* request) {
    request->set_pool(pool);
    request->mutable_tokens()->Add(prompt.begin(), prompt.end());
  };

  {  // B's own view: no hit on A's prompt.
    v1::LookupRequest request;
    set_prompt(&request);
    v1::LookupResponse response;
    const grpc::Status status = stub->Lookup(RawContext(credentials).get(), request, &response);
    Report("lookup_own_tenant", status, absl::StrCat("blocks=", response.num_cached_blocks()));
    request.set_tenant(tenant_a);
    Report("lookup_tenant_a", stub->Lookup(RawContext(credentials).get(), request, &response));
  }
  {
    v1::OpenSessionRequest request;
    request.set_tenant(tenant_a);
    v1::OpenSessionResponse response;
    Report("open_session_tenant_a",
           stub->OpenSession(RawContext(credentials).get(), request, &response));
  }
  {
    v1::GetStatsRequest request;
    v1::GetStatsResponse response;
    grpc::Status status = stub->GetStats(RawContext(credentials).get(), request, &response);
    uint64_t hit_tokens = 0, prompt_tokens = 0, referenced = 0;
    std::string tenant;
    for (const v1::PoolStats& stats : response.pools()) {
      hit_tokens += stats.hit_tokens();
      prompt_tokens += stats.prompt_tokens();
      referenced += stats.counts().referenced();
      tenant = stats.tenant();
    }
    Report("stats_own_tenant", status,
           absl::StrCat("tenant=", tenant, " prompt_tokens=", prompt_tokens,
                        " hit_tokens=", hit_tokens, " referenced=", referenced));
    request.set_tenant(tenant_a);
    Report("stats_tenant_a", stub->GetStats(RawContext(credentials).get(), request, &response));
  }
  {
    v1::KeepAliveRequest request;
    request.set_session_id(session_a);
    v1::KeepAliveResponse response;
    Report("keep_alive_a", stub->KeepAlive(RawContext(credentials).get(), request, &response));
  }
  {
    v1::OpenSequenceRequest request;
    request.set_session_id(session_a);
    set_prompt(&request);
    v1::OpenSequenceResponse response;
    Report("open_sequence_in_a",
           stub->OpenSequence(RawContext(credentials).get(), request, &response));
  }
  {
    v1::ExtendSequenceRequest request;
    request.set_session_id(session_a);
    request.set_sequence_id(sequence_a);
    request.add_tokens(1);
    v1::ExtendSequenceResponse response;
    Report("extend_a", stub->ExtendSequence(RawContext(credentials).get(), request, &response));
  }
  {
    v1::CommitSequenceRequest request;
    request.set_session_id(session_a);
    request.set_sequence_id(sequence_a);
    request.set_num_written_tokens(1);
    v1::CommitSequenceResponse response;
    Report("commit_a", stub->CommitSequence(RawContext(credentials).get(), request, &response));
  }
  {
    v1::ForkSequenceRequest request;
    request.set_session_id(session_a);
    request.set_sequence_id(sequence_a);
    v1::ForkSequenceResponse response;
    Report("fork_a", stub->ForkSequence(RawContext(credentials).get(), request, &response));
  }
  {
    v1::ReleaseSequenceRequest request;
    request.set_session_id(session_a);
    request.set_sequence_id(sequence_a);
    v1::ReleaseSequenceResponse response;
    Report("release_a", stub->ReleaseSequence(RawContext(credentials).get(), request, &response));
  }
  {
    v1::PublishRendezvousRequest request;
    request.set_session_id(session_a);
    request.set_key("nccl");
    request.set_value("forged");
    v1::PublishRendezvousResponse response;
    Report("publish_rendezvous_a",
           stub->PublishRendezvous(RawContext(credentials).get(), request, &response));
  }
  {
    v1::GetBlocksRequest request;
    request.set_session_id(session_a);
    set_prompt(&request);
    auto context = RawContext(credentials);
    auto reader = stub->GetBlocks(context.get(), request);
    v1::GetBlocksResponse response;
    uint64_t bytes = 0;
    while (reader->Read(&response)) bytes += response.data().size();
    Report("get_blocks_a", reader->Finish(), absl::StrCat("bytes=", bytes));
  }
  {
    v1::PutBlocksResponse response;
    auto context = RawContext(credentials);
    auto writer = stub->PutBlocks(context.get(), &response);
    v1::PutBlocksRequest header;
    header.mutable_header()->set_session_id(session_a);
    set_prompt(header.mutable_header());
    writer->Write(header);
    writer->WritesDone();
    Report("put_blocks_a", writer->Finish());
  }
  {
    v1::CloseSessionRequest request;
    request.set_session_id(session_a);
    v1::CloseSessionResponse response;
    Report("close_session_a",
           stub->CloseSession(RawContext(credentials).get(), request, &response));
  }
  {  // B's own session: A's prefix is not a hit, and GetBlocks finds nothing.
    v1::OpenSessionRequest open;
    v1::OpenSessionResponse session;
    grpc::Status status = stub->OpenSession(RawContext(credentials).get(), open, &session);
    Report("open_session_own", status);
    v1::OpenSequenceRequest request;
    request.set_session_id(session.session_id());
    set_prompt(&request);
    v1::OpenSequenceResponse response;
    status = stub->OpenSequence(RawContext(credentials).get(), request, &response);
    Report("open_sequence_own", status, absl::StrCat("cached=", response.num_cached_tokens()));
    v1::GetBlocksRequest get;
    get.set_session_id(session.session_id());
    set_prompt(&get);
    auto context = RawContext(credentials);
    auto reader = stub->GetBlocks(context.get(), get);
    v1::GetBlocksResponse chunk;
    uint32_t blocks = 0;
    while (reader->Read(&chunk)) {
      if (chunk.has_header()) blocks = chunk.header().num_blocks();
    }
    Report("get_blocks_own", reader->Finish(), absl::StrCat("blocks=", blocks));
    v1::CloseSessionRequest close;
    close.set_session_id(session.session_id());
    v1::CloseSessionResponse closed;
    Report("close_session_own", stub->CloseSession(RawContext(credentials).get(), close, &closed));
  }
  std::printf("probe done\n");
  return 0;
}

}  // namespace
}  // namespace kvcache::testing

int main(int argc, char** argv) { return kvcache::testing::Run(argc, argv); }
