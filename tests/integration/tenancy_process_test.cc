// Identity and tenancy against the real kvcache-manager (issue 14): tenant B, by another uid on
// the Unix socket or by its bearer token over TLS, attacks tenant A's session, sequence, blocks,
// rendezvous and statistics through kvcache-tenant-probe, a process of its own; every attempt
// has its exact code and A's state is unchanged. Then bad credentials, roles, quotas and a
// SIGHUP reload.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "auth/identity_file.h"
#include "common/rpc/grpc_status.h"
#include "tests/integration/raw_channel.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/subprocess.h"
#include "tests/testing/test_pki.h"

namespace kvcache::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr absl::Duration kBound = absl::Seconds(20);
constexpr uint32_t kBlockSize = 16;
constexpr uint32_t kFirstToken = 500;
constexpr uint32_t kPromptTokens = 3 * kBlockSize + 5;
constexpr uid_t kOtherUid = 65534;  // nobody

constexpr char kTokenA[] = "token-of-tenant-a-0123456789";
constexpr char kTokenB[] = "token-of-tenant-b-9876543210";
constexpr char kReaderToken[] = "router-token-aaaaaaaaaaaaaaaa";
constexpr char kAdminToken[] = "operator-token-bbbbbbbbbbbbbb";

std::string DigestLine(const std::string& token) { return TokenDigestText(token); }

absl::Status StatusOf(const grpc::Status& status) { return FromGrpcStatus(status); }

class TenancyProcessTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* bin_dir = std::getenv("KVCACHE_BIN_DIR");
    ASSERT_NE(bin_dir, nullptr) << "KVCACHE_BIN_DIR must name the folder of kvcache-manager";
    bin_dir_ = bin_dir;
    chmod(dir_.path().c_str(), 0711);  // another uid reaches the socket, lists nothing
    ASSERT_EQ(mkdir(dir_.File("pki").c_str(), 0700), 0);
    absl::StatusOr<TestPki> pki = MakeTestPki(dir_.File("pki"));
    ASSERT_OK(pki);
    pki_ = *pki;
    WriteIdentities(/*with_tenant_b_token=*/true);
  }

  void TearDown() override {
    if (daemon_.has_value()) {
      EXPECT_OK(daemon_->Signal(SIGTERM));
      absl::StatusOr<int> status = daemon_->Wait(kBound);
      EXPECT_OK(status);
    }
  }

  void WriteIdentities(bool with_tenant_b_token) {
    std::ofstream out(dir_.File("identities"));
    out << "# tenants and their quotas\n"
        << "tenant tenant-a max_sessions=8\n"
        << "tenant tenant-b max_sessions=2 max_open_sequences=3 max_referenced_blocks=8 "
        << "max_put_bytes_in_flight=48KiB\n"
        << "uid " << getuid() << " tenant-a worker\n"
        << "uid " << kOtherUid << " tenant-b worker\n"
        << "token a-worker " << DigestLine(kTokenA) << " tenant-a worker\n"
        << "token router " << DigestLine(kReaderToken) << " tenant-a reader\n"
        << "token ops " << DigestLine(kAdminToken) << " tenant-a admin\n"
        << "subject tenant-a-worker tenant-a worker\n";
    if (with_tenant_b_token) {
      out << "token b-worker " << DigestLine(kTokenB) << " tenant-b worker\n";
    }
  }

  // Starts kvcache-manager with the identity file and `flags`; target_ is where it listens.
  void StartDaemon(const std::vector<std::string>& flags) {
    std::vector<std::string> argv = {bin_dir_ + "/kvcache-manager",
                                     "--identities=" + dir_.File("identities"),
                                     "--pool=p:blocks=32", "--session_ttl=30s"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    absl::StatusOr<Subprocess> daemon = Subprocess::Start(argv);
    ASSERT_OK(daemon);
    daemon_.emplace(*std::move(daemon));
    absl::StatusOr<std::string> line =
        daemon_->ReadLineStartingWith("kvcache-manager: listening on ", kBound);
    ASSERT_OK(line);
    const std::vector<std::string> words = absl::StrSplit(*line, ' ');
    ASSERT_GE(words.size(), 4u);
    target_ = words[3];
    if (!target_.empty() && target_.back() == ',') target_.pop_back();
  }
  void StartUnixDaemon() {
    StartDaemon({"--listen=unix://" + dir_.File("kv.sock"), "--socket_mode=0666"});
  }
  void StartTlsDaemon(bool mutual) {
    std::vector<std::string> flags = {"--listen=127.0.0.1:0", "--tls_cert=" + pki_.server_cert,
                                      "--tls_key=" + pki_.server_key};
    if (mutual) flags.push_back("--tls_client_ca=" + pki_.ca_cert);
    StartDaemon(flags);
  }

  // Tenant A's state: a session with a committed sequence over the prompt.
  struct TenantAState {
    uint64_t session_id = 0;
    uint64_t sequence_id = 0;
    std::vector<uint32_t> block_ids;
  };
  std::vector<uint32_t> Prompt() const {
    std::vector<uint32_t> prompt(kPromptTokens);
    for (uint32_t i = 0; i < kPromptTokens; ++i) prompt[i] = kFirstToken + i;
    return prompt;
  }
  TenantAState SetUpTenantA(v1::KvCache::Stub& stub, const RawCredentials& a) {
    TenantAState state;
    v1::OpenSessionRequest open;
    v1::OpenSessionResponse session;
    EXPECT_OK(StatusOf(stub.OpenSession(RawContext(a).get(), open, &session)));
    state.session_id = session.session_id();
    v1::OpenSequenceRequest request;
    request.set_session_id(state.session_id);
    request.set_pool("p");
    const std::vector<uint32_t> prompt = Prompt();
    request.mutable_tokens()->Add(prompt.begin(), prompt.end());
    v1::OpenSequenceResponse sequence;
    EXPECT_OK(StatusOf(stub.OpenSequence(RawContext(a).get(), request, &sequence)));
    state.sequence_id = sequence.sequence_id();
    state.block_ids.assign(sequence.block_ids().begin(), sequence.block_ids().end());
    v1::CommitSequenceRequest commit;
    commit.set_session_id(state.session_id);
    commit.set_sequence_id(state.sequence_id);
    commit.set_num_written_tokens(kPromptTokens);
    v1::CommitSequenceResponse committed;
    EXPECT_OK(StatusOf(stub.CommitSequence(RawContext(a).get(), commit, &committed)));
    EXPECT_EQ(committed.num_published_blocks(), 3u);
    return state;
  }

  // Lookup of A's prompt by A and A's statistics: what B must not change.
  std::string ObserveTenantA(v1::KvCache::Stub& stub, const RawCredentials& a,
                             const TenantAState& state) {
    v1::LookupRequest lookup;
    lookup.set_pool("p");
    const std::vector<uint32_t> prompt = Prompt();
    lookup.mutable_tokens()->Add(prompt.begin(), prompt.end());
    v1::LookupResponse found;
    EXPECT_OK(StatusOf(stub.Lookup(RawContext(a).get(), lookup, &found)));
    v1::GetStatsRequest stats_request;
    v1::GetStatsResponse stats;
    EXPECT_OK(StatusOf(stub.GetStats(RawContext(a).get(), stats_request, &stats)));
    // A's session and sequence still answer to A (Extend would change it: Fork, then release).
    v1::KeepAliveRequest keep;
    keep.set_session_id(state.session_id);
    v1::KeepAliveResponse kept;
    EXPECT_OK(StatusOf(stub.KeepAlive(RawContext(a).get(), keep, &kept)));
    return absl::StrCat(
        "lookup=", found.num_cached_blocks(), " referenced=", stats.pools(0).counts().referenced(),
        " prompt_tokens=", stats.pools(0).prompt_tokens(),
        " open_sequences=", stats.pools(0).open_sequences(), " sessions=", stats.open_sessions());
  }

  // Runs the probe as tenant B (`prefix`: how to become B) and returns NAME -> "CODE [extra]".
  std::map<std::string, std::string> RunProbe(const std::vector<std::string>& prefix,
                                              const TenantAState& state) {
    std::vector<std::string> argv = prefix;
    argv.insert(argv.end(), {bin_dir_ + "/kvcache-tenant-probe", target_, "tenant-a",
                             absl::StrCat(state.session_id), absl::StrCat(state.sequence_id), "p",
                             absl::StrCat(kFirstToken), absl::StrCat(kPromptTokens)});
    absl::StatusOr<Subprocess> probe = Subprocess::Start(argv);
    EXPECT_OK(probe);
    std::map<std::string, std::string> results;
    if (!probe.ok()) return results;
    while (true) {
      absl::StatusOr<std::string> line = probe->ReadLine(kBound);
      EXPECT_OK(line);
      if (!line.ok() || *line == "probe done") break;
      std::vector<std::string> words = absl::StrSplit(*line, absl::MaxSplits(' ', 2));
      if (words.size() >= 3 && words[0] == "probe") results[words[1]] = words[2];
    }
    absl::StatusOr<int> status = probe->Wait(kBound);
    EXPECT_OK(status);
    return results;
  }

  // Every attack on A's state gets its exact code; B's own view holds none of A's blocks.
  void ExpectTenantBIsolated(const std::map<std::string, std::string>& results) {
    const std::map<std::string, std::string> expected = {
        {"lookup_own_tenant", "OK blocks=0"},
        {"lookup_tenant_a", "PERMISSION_DENIED"},
        {"open_session_tenant_a", "PERMISSION_DENIED"},
        {"stats_own_tenant", "OK tenant=tenant-b prompt_tokens=0 hit_tokens=0 referenced=0"},
        {"stats_tenant_a", "PERMISSION_DENIED"},
        {"keep_alive_a", "PERMISSION_DENIED"},
        {"open_sequence_in_a", "PERMISSION_DENIED"},
        {"extend_a", "PERMISSION_DENIED"},
        {"commit_a", "PERMISSION_DENIED"},
        {"fork_a", "PERMISSION_DENIED"},
        {"release_a", "PERMISSION_DENIED"},
        {"publish_rendezvous_a", "PERMISSION_DENIED"},
        {"get_blocks_a", "PERMISSION_DENIED bytes=0"},
        {"put_blocks_a", "PERMISSION_DENIED"},
        {"close_session_a", "PERMISSION_DENIED"},
        {"open_session_own", "OK"},
        {"open_sequence_own", "OK cached=0"},
        {"get_blocks_own", "OK blocks=0"},
        {"close_session_own", "OK"},
    };
    EXPECT_EQ(results, expected);
  }

  // Tenant B as another uid on the Unix socket, where the test may switch uid; else (not root,
  // or the probe not executable by that uid) by B's bearer token on the same socket.
  std::vector<std::string> BecomeTenantBOnUnixSocket() {
    const std::vector<std::string> as_other_uid = {
        "/usr/bin/setpriv", absl::StrCat("--reuid=", kOtherUid),
        absl::StrCat("--regid=", kOtherUid), "--clear-groups"};
    if (geteuid() == 0) {
      std::vector<std::string> check = as_other_uid;
      check.insert(check.end(), {"/usr/bin/test", "-x", bin_dir_ + "/kvcache-tenant-probe"});
      absl::StatusOr<Subprocess> probe = Subprocess::Start(check);
      absl::StatusOr<int> status = probe.ok() ? probe->Wait(kBound) : probe.status();
      if (status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0) {
        std::printf("tenant B is uid %u on the Unix socket\n", kOtherUid);
        return as_other_uid;
      }
    }
    std::printf("tenant B is a bearer token on the Unix socket (cannot run as uid %u)\n",
                kOtherUid);
    return {"/usr/bin/env", absl::StrCat("KVCACHE_TOKEN=", kTokenB)};
  }

  std::string bin_dir_;
  ScopedTempDir dir_{"kvcache_tenancy"};  // socket, PKI, identities
  std::string target_;
  TestPki pki_;
  std::optional<Subprocess> daemon_;
};

TEST_F(TenancyProcessTest, TwoUidsOnTheUnixSocketAreTwoTenants) {
  ASSERT_NO_FATAL_FAILURE(StartUnixDaemon());
  const RawCredentials a;  // the test's own uid: tenant-a
  std::unique_ptr<v1::KvCache::Stub> stub = RawStub(target_, a);
  const TenantAState state = SetUpTenantA(*stub, a);
  const std::string before = ObserveTenantA(*stub, a, state);
  EXPECT_THAT(before, HasSubstr("lookup=3 "));

  ExpectTenantBIsolated(RunProbe(BecomeTenantBOnUnixSocket(), state));
  EXPECT_EQ(ObserveTenantA(*stub, a, state), before);
}

TEST_F(TenancyProcessTest, TwoTokensOverTlsAreTwoTenants) {
  ASSERT_NO_FATAL_FAILURE(StartTlsDaemon(/*mutual=*/false));
  const RawCredentials a{.token = kTokenA, .ca_file = pki_.ca_cert};
  std::unique_ptr<v1::KvCache::Stub> stub = RawStub(target_, a);
  const TenantAState state = SetUpTenantA(*stub, a);
  const std::string before = ObserveTenantA(*stub, a, state);
  EXPECT_THAT(before, HasSubstr("lookup=3 "));

  ExpectTenantBIsolated(RunProbe(
      {"/usr/bin/env", absl::StrCat("KVCACHE_TOKEN=", kTokenB), "KVCACHE_TLS_CA=" + pki_.ca_cert},
      state));
  EXPECT_EQ(ObserveTenantA(*stub, a, state), before);
}

TEST_F(TenancyProcessTest, BadCredentialsAreRefusedAndTheDaemonServesOn) {
  ASSERT_NO_FATAL_FAILURE(StartTlsDaemon(/*mutual=*/false));
  auto ping = [&](const RawCredentials& credentials) {
    std::unique_ptr<v1::KvCache::Stub> stub = RawStub(target_, credentials);
    v1::PingRequest request;
    v1::PingResponse response;
    return StatusOf(stub->Ping(RawContext(credentials).get(), request, &response));
  };
  const std::string secret = "wrong-token-that-must-never-be-echoed";
  EXPECT_THAT(ping({.ca_file = pki_.ca_cert}),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("no credential")));
  const absl::Status wrong = ping({.token = secret, .ca_file = pki_.ca_cert});
  EXPECT_THAT(wrong, StatusIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(std::string(wrong.message()), Not(HasSubstr(secret)));
  {  // A scheme other than Bearer.
    std::unique_ptr<v1::KvCache::Stub> stub = RawStub(target_, {.ca_file = pki_.ca_cert});
    grpc::ClientContext context;
    context.AddMetadata("authorization", absl::StrCat("Basic ", kTokenA));
    v1::PingRequest request;
    v1::PingResponse response;
    const absl::Status basic = StatusOf(stub->Ping(&context, request, &response));
    EXPECT_THAT(basic, StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("Bearer")));
    EXPECT_THAT(std::string(basic.message()), Not(HasSubstr(kTokenA)));
  }
  // Plaintext to the TLS port: no handshake, no call.
  EXPECT_THAT(ping({.token = kTokenA}), StatusIs(absl::StatusCode::kUnavailable));
  // The daemon is unaffected.
  EXPECT_OK(ping({.token = kTokenA, .ca_file = pki_.ca_cert}));
}

TEST_F(TenancyProcessTest, MutualTlsMapsCertificatesAndRefusesBadOnes) {
  ASSERT_NO_FATAL_FAILURE(StartTlsDaemon(/*mutual=*/true));
  auto stats = [&](const RawCredentials& credentials, v1::GetStatsResponse* response) {
    std::unique_ptr<v1::KvCache::Stub> stub = RawStub(target_, credentials);
    v1::GetStatsRequest request;
    return StatusOf(stub->GetStats(RawContext(credentials).get(), request, response));
  };
  v1::GetStatsResponse response;
  // tenant-a-worker's certificate is tenant-a.
  ASSERT_OK(stats(
      {.ca_file = pki_.ca_cert, .cert_file = pki_.client_a_cert, .key_file = pki_.client_a_key},
      &response));
  EXPECT_EQ(response.pools(0).tenant(), "tenant-a");
  // Signed by the CA but not in the identity file: the handshake passes, the call does not.
  EXPECT_THAT(
      stats(
          {.ca_file = pki_.ca_cert, .cert_file = pki_.client_b_cert, .key_file = pki_.client_b_key},
          &response),
      StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("tenant-b-worker")));
  // No certificate, an expired one, one from another CA: the handshake fails.
  EXPECT_THAT(stats({.token = kTokenA, .ca_file = pki_.ca_cert}, &response),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(stats({.ca_file = pki_.ca_cert,
                     .cert_file = pki_.expired_client_cert,
                     .key_file = pki_.expired_client_key},
                    &response),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(stats({.ca_file = pki_.ca_cert,
                     .cert_file = pki_.untrusted_client_cert,
                     .key_file = pki_.untrusted_client_key},
                    &response),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_OK(stats(
      {.ca_file = pki_.ca_cert, .cert_file = pki_.client_a_cert, .key_file = pki_.client_a_key},
      &response));
}

TEST_F(TenancyProcessTest, ReaderLooksAdminCrossesTenants) {
  ASSERT_NO_FATAL_FAILURE(StartUnixDaemon());
  const RawCredentials a;
  std::unique_ptr<v1::KvCache::Stub> stub = RawStub(target_, a);
  const TenantAState state = SetUpTenantA(*stub, a);
  const RawCredentials reader{.token = kReaderToken};
  const RawCredentials admin{.token = kAdminToken};
  const RawCredentials b{.token = kTokenB};

  v1::LookupRequest lookup;
  lookup.set_pool("p");
  const std::vector<uint32_t> prompt = Prompt();
  lookup.mutable_tokens()->Add(prompt.begin(), prompt.end());
  v1::LookupResponse found;
  ASSERT_OK(StatusOf(stub->Lookup(RawContext(reader).get(), lookup, &found)));
  EXPECT_EQ(found.num_cached_blocks(), 3u);  // the router's tenant is tenant-a
  v1::OpenSessionRequest open;
  v1::OpenSessionResponse session;
  EXPECT_THAT(StatusOf(stub->OpenSession(RawContext(reader).get(), open, &session)),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("reader")));
  v1::DescribePoolRequest describe;
  describe.set_pool("p");
  v1::DescribePoolResponse described;
  ASSERT_OK(StatusOf(stub->DescribePool(RawContext(reader).get(), describe, &described)));
  EXPECT_EQ(described.pool().mapping().kind(), v1::PoolMapping::KIND_UNSPECIFIED);
  ASSERT_OK(StatusOf(stub->DescribePool(RawContext(a).get(), describe, &described)));
  EXPECT_EQ(described.pool().mapping().kind(), v1::PoolMapping::KIND_SHM);

  // An admin may look into another tenant and see the whole daemon.
  lookup.set_tenant("tenant-a");
  ASSERT_OK(StatusOf(stub->Lookup(RawContext(admin).get(), lookup, &found)));
  EXPECT_EQ(found.num_cached_blocks(), 3u);
  lookup.set_tenant("tenant-b");
  ASSERT_OK(StatusOf(stub->Lookup(RawContext(admin).get(), lookup, &found)));
  EXPECT_EQ(found.num_cached_blocks(), 0u);
  v1::OpenSessionResponse b_session;
  ASSERT_OK(StatusOf(stub->OpenSession(RawContext(b).get(), open, &b_session)));
  v1::GetStatsRequest all;
  v1::GetStatsResponse stats;
  ASSERT_OK(StatusOf(stub->GetStats(RawContext(admin).get(), all, &stats)));
  EXPECT_EQ(stats.pools(0).tenant(), "");
  EXPECT_EQ(stats.open_sessions(), 2u);
  EXPECT_EQ(stats.pools(0).counts().referenced(), state.block_ids.size());
  // The admin cannot use a session it did not open.
  v1::KeepAliveRequest keep;
  keep.set_session_id(state.session_id);
  v1::KeepAliveResponse kept;
  EXPECT_THAT(StatusOf(stub->KeepAlive(RawContext(admin).get(), keep, &kept)),
              StatusIs(absl::StatusCode::kPermissionDenied));
}

// Issue 31's compatibility manifests are per tenant too: an equal manifest in another tenant
// never meets A's blocks, and DescribePool shows a tenant only its own manifests (an admin all).
TEST_F(TenancyProcessTest, EqualManifestsInTwoTenantsNeverMeet) {
  ASSERT_NO_FATAL_FAILURE(StartUnixDaemon());
  const RawCredentials a;
  const RawCredentials b{.token = kTokenB};
  const RawCredentials reader{.token = kReaderToken};
  const RawCredentials admin{.token = kAdminToken};
  std::unique_ptr<v1::KvCache::Stub> stub = RawStub(target_, a);
  v1::CompatibilityManifest manifest;  // the default pool layout: 16 tokens of 2 KiB, fp16
  manifest.set_model_id("m");
  manifest.set_model_config_digest("rope");
  manifest.set_kv_dtype("fp16");
  manifest.set_page_tokens(kBlockSize);
  v1::PagePart* part = manifest.add_parts();
  part->set_name("kv");
  part->set_bytes(32768);
  const std::vector<uint32_t> prompt = Prompt();

  // Opens a session of `who` bound to the manifest; an OpenSequence of the prompt in it, whose
  // blocks are committed and released; returns its cached tokens.
  const auto open_prompt = [&](const RawCredentials& who) -> uint32_t {
    v1::OpenSessionRequest open;
    *open.mutable_manifest() = manifest;
    v1::OpenSessionResponse session;
    EXPECT_OK(StatusOf(stub->OpenSession(RawContext(who).get(), open, &session)));
    v1::OpenSequenceRequest request;
    request.set_session_id(session.session_id());
    request.set_pool("p");
    request.mutable_tokens()->Add(prompt.begin(), prompt.end());
    v1::OpenSequenceResponse sequence;
    EXPECT_OK(StatusOf(stub->OpenSequence(RawContext(who).get(), request, &sequence)));
    v1::CommitSequenceRequest commit;
    commit.set_session_id(session.session_id());
    commit.set_sequence_id(sequence.sequence_id());
    commit.set_num_written_tokens(kPromptTokens);
    v1::CommitSequenceResponse committed;
    EXPECT_OK(StatusOf(stub->CommitSequence(RawContext(who).get(), commit, &committed)));
    v1::ReleaseSequenceRequest release;
    release.set_session_id(session.session_id());
    release.set_sequence_id(sequence.sequence_id());
    v1::ReleaseSequenceResponse released;
    EXPECT_OK(StatusOf(stub->ReleaseSequence(RawContext(who).get(), release, &released)));
    return sequence.num_cached_tokens();
  };
  EXPECT_EQ(open_prompt(a), 0u);
  EXPECT_EQ(open_prompt(b), 0u);              // B's equal manifest does not find A's blocks
  EXPECT_EQ(open_prompt(a), 3 * kBlockSize);  // A's second session does

  // DescribePool: {tenant: sessions} of the manifests each caller sees, all of one digest.
  const auto manifests_seen = [&](const RawCredentials& who) {
    v1::DescribePoolRequest describe;
    describe.set_pool("p");
    v1::DescribePoolResponse described;
    EXPECT_OK(StatusOf(stub->DescribePool(RawContext(who).get(), describe, &described)));
    std::map<std::string, uint32_t> seen;
    for (const v1::ManifestInUse& use : described.manifests()) {
      EXPECT_EQ(use.digest(), described.manifests(0).digest());
      EXPECT_EQ(use.manifest().model_config_digest(), "rope");
      seen[use.tenant()] = use.sessions();
    }
    return seen;
  };
  using Seen = std::map<std::string, uint32_t>;
  EXPECT_EQ(manifests_seen(a), (Seen{{"tenant-a", 2}}));
  EXPECT_EQ(manifests_seen(reader), (Seen{{"tenant-a", 2}}));
  EXPECT_EQ(manifests_seen(b), (Seen{{"tenant-b", 1}}));
  EXPECT_EQ(manifests_seen(admin), (Seen{{"tenant-a", 2}, {"tenant-b", 1}}));
}

TEST_F(TenancyProcessTest, QuotasBoundOneTenantAndSpareTheOther) {
  ASSERT_NO_FATAL_FAILURE(StartUnixDaemon());
  const RawCredentials a;
  const RawCredentials b{.token = kTokenB};
  std::unique_ptr<v1::KvCache::Stub> stub = RawStub(target_, a);
  auto open_session = [&](const RawCredentials& who, uint64_t* id) {
    v1::OpenSessionRequest request;
    v1::OpenSessionResponse response;
    const absl::Status status =
        StatusOf(stub->OpenSession(RawContext(who).get(), request, &response));
    *id = response.session_id();
    return status;
  };
  auto open_sequence = [&](const RawCredentials& who, uint64_t session, uint32_t tokens,
                           uint32_t first) {
    v1::OpenSequenceRequest request;
    request.set_session_id(session);
    request.set_pool("p");
    for (uint32_t i = 0; i < tokens; ++i) request.add_tokens(first + i);
    v1::OpenSequenceResponse response;
    return StatusOf(stub->OpenSequence(RawContext(who).get(), request, &response));
  };
  // max_sessions=2
  uint64_t b1 = 0, b2 = 0, b3 = 0;
  ASSERT_OK(open_session(b, &b1));
  ASSERT_OK(open_session(b, &b2));
  EXPECT_THAT(open_session(b, &b3),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("tenant 'tenant-b' quota max_sessions=2: 2 in use, 1 more")));
  // max_referenced_blocks=8 in pool p: 5 blocks, then 4 more is too many.
  ASSERT_OK(open_sequence(b, b1, 4 * kBlockSize + 1, 1000));
  EXPECT_THAT(open_sequence(b, b1, 4 * kBlockSize, 2000),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_referenced_blocks (pool 'p')=8: 5 in use, 4 more")));
  // max_open_sequences=3: two more small ones, then no more.
  ASSERT_OK(open_sequence(b, b1, 1, 3000));
  ASSERT_OK(open_sequence(b, b2, 1, 4000));
  EXPECT_THAT(open_sequence(b, b2, 1, 5000),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("max_open_sequences=3: 3 in use, 1 more")));
  // max_put_bytes_in_flight=48KiB: a put of two 32 KiB blocks is refused at its header; one of
  // one block passes that quota and meets the open-sequence one (a put holds a sequence).
  auto put = [&](uint32_t blocks) {
    v1::PutBlocksResponse response;
    auto context = RawContext(b);
    auto writer = stub->PutBlocks(context.get(), &response);
    v1::PutBlocksRequest header;
    header.mutable_header()->set_session_id(b2);
    header.mutable_header()->set_pool("p");
    for (uint32_t i = 0; i < blocks * kBlockSize; ++i)
      header.mutable_header()->add_tokens(7000 + i);
    for (uint32_t i = 0; i < blocks; ++i) header.mutable_header()->add_block_checksums(i);
    writer->Write(header);
    writer->WritesDone();
    return StatusOf(writer->Finish());
  };
  EXPECT_THAT(put(2), StatusIs(absl::StatusCode::kResourceExhausted,
                               HasSubstr("max_put_bytes_in_flight=49152: 0 in use, 65536 more")));
  EXPECT_THAT(put(1), StatusIs(absl::StatusCode::kResourceExhausted,
                               HasSubstr("max_open_sequences=3: 3 in use, 1 more")));
  // Tenant A is unaffected: it takes the rest of the pool's free blocks.
  uint64_t a1 = 0;
  ASSERT_OK(open_session(a, &a1));
  EXPECT_OK(open_sequence(a, a1, 20 * kBlockSize, 6000));
  v1::GetStatsRequest request;
  v1::GetStatsResponse stats;
  ASSERT_OK(StatusOf(stub->GetStats(RawContext(b).get(), request, &stats)));
  EXPECT_EQ(stats.pools(0).counts().referenced(), 7u);
  EXPECT_EQ(stats.pools(0).open_sequences(), 3u);
  EXPECT_EQ(stats.open_sessions(), 2u);
}

TEST_F(TenancyProcessTest, SighupReloadRefusesARemovedTokenAndKeepsLiveSessions) {
  ASSERT_NO_FATAL_FAILURE(StartUnixDaemon());
  const RawCredentials a;
  const RawCredentials b{.token = kTokenB};
  std::unique_ptr<v1::KvCache::Stub> stub = RawStub(target_, a);
  const TenantAState state = SetUpTenantA(*stub, a);
  v1::OpenSessionRequest open;
  v1::OpenSessionResponse b_session;
  ASSERT_OK(StatusOf(stub->OpenSession(RawContext(b).get(), open, &b_session)));

  WriteIdentities(/*with_tenant_b_token=*/false);
  ASSERT_OK(daemon_->Signal(SIGHUP));
  ASSERT_OK(daemon_->ReadLineStartingWith("kvcache-manager: reloaded", kBound));

  v1::KeepAliveRequest keep;
  keep.set_session_id(b_session.session_id());
  v1::KeepAliveResponse kept;
  EXPECT_THAT(StatusOf(stub->KeepAlive(RawContext(b).get(), keep, &kept)),
              StatusIs(absl::StatusCode::kUnauthenticated));
  // Tenant A's session and sequence live on.
  keep.set_session_id(state.session_id);
  EXPECT_OK(StatusOf(stub->KeepAlive(RawContext(a).get(), keep, &kept)));
  v1::ForkSequenceRequest fork;
  fork.set_session_id(state.session_id);
  fork.set_sequence_id(state.sequence_id);
  v1::ForkSequenceResponse forked;
  EXPECT_OK(StatusOf(stub->ForkSequence(RawContext(a).get(), fork, &forked)));

  // A broken file keeps the previous identities.
  std::ofstream(dir_.File("identities")) << "token b-worker not-a-digest tenant-b worker\n";
  ASSERT_OK(daemon_->Signal(SIGHUP));
  absl::StatusOr<std::string> line =
      daemon_->ReadLineStartingWith("kvcache-manager: SIGHUP", kBound);
  ASSERT_OK(line);
  EXPECT_THAT(*line, HasSubstr("line 1"));
  EXPECT_OK(StatusOf(stub->KeepAlive(RawContext(a).get(), keep, &kept)));
}

}  // namespace
}  // namespace kvcache::testing
