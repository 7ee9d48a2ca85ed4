// KvCacheClient's credentials (issue 14), against in-process fake daemons that record what each
// call carried: the bearer token goes with every call (unary, keep-alive, the close on
// destruction, the block streams) and nowhere else, never into an error; TLS and mutual TLS
// connect with the right files (tests/testing/test_pki.h) and fail UNAVAILABLE with the wrong
// ones; Connect refuses unusable options with INVALID_ARGUMENT.
#include <gmock/gmock.h>
#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server.h>
#include <grpcpp/server_builder.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/kv_cache_client.h"
#include "common/pool_layout.h"
#include "tests/testing/fake_session_service.h"
#include "tests/testing/grpc_kept_alive.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/status_matchers.h"
#include "tests/testing/test_files.h"
#include "tests/testing/test_pki.h"

namespace kvcache {
namespace {

using ::kvcache::testing::kTestClientAName;
using ::kvcache::testing::PollUntil;
using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::kvcache::testing::TestPki;
using ::kvcache::worker::testing::ReadFile;
using ::kvcache::worker::testing::WriteFile;
using ::testing::AllOf;
using ::testing::Each;
using ::testing::ElementsAre;
using ::testing::Ge;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::SizeIs;

constexpr char kToken[] = "kvc-test-token-7f3a9b";
constexpr char kExpectedAuthorization[] = "Bearer kvc-test-token-7f3a9b";
// How long a Connect that must fail waits: long enough for a handshake on a loaded machine.
constexpr absl::Duration kFailingConnectTimeout = absl::Seconds(2);

// A daemon that records each call's method, authorization header ("" when absent) and client
// certificate name ("" without one), and answers just enough for the client to go on.
class RecordingDaemon final : public kvcache::testing::FakeSessionService {
 public:
  static constexpr uint64_t kEpoch = 9;
  static constexpr PoolLayout kLayout{
      .num_layers = 1, .num_kv_heads = 1, .head_dim = 8, .block_size = 4, .dtype = DType::kFloat16};

  RecordingDaemon()
      : FakeSessionService(kEpoch, ::kvcache::testing::FakePool(kLayout, /*num_blocks=*/4)) {}

  struct Call {
    std::string method;
    std::string authorization;
    std::string client_name;
  };

  std::vector<Call> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }
  // The authorization headers of the calls of `method`, in order.
  std::vector<std::string> AuthorizationsOf(const std::string& method) {
    std::vector<std::string> values;
    for (const Call& call : calls()) {
      if (call.method == method) values.push_back(call.authorization);
    }
    return values;
  }

  grpc::Status Ping(grpc::ServerContext* context, const v1::PingRequest*,
                    v1::PingResponse* response) override {
    Record("Ping", *context);
    response->set_epoch(kEpoch);
    return grpc::Status::OK;
  }
  grpc::Status OpenSession(grpc::ServerContext* context, const v1::OpenSessionRequest* request,
                           v1::OpenSessionResponse* response) override {
    Record("OpenSession", *context);
    FakeSessionService::OpenSession(context, request, response);
    response->set_ttl_ms(300);  // a keep-alive every 100 ms
    return grpc::Status::OK;
  }
  grpc::Status KeepAlive(grpc::ServerContext* context, const v1::KeepAliveRequest* request,
                         v1::KeepAliveResponse* response) override {
    Record("KeepAlive", *context);
    return FakeSessionService::KeepAlive(context, request, response);
  }
  grpc::Status CloseSession(grpc::ServerContext* context, const v1::CloseSessionRequest* request,
                            v1::CloseSessionResponse* response) override {
    Record("CloseSession", *context);
    return FakeSessionService::CloseSession(context, request, response);
  }
  grpc::Status DescribePool(grpc::ServerContext* context, const v1::DescribePoolRequest* request,
                            v1::DescribePoolResponse* response) override {
    Record("DescribePool", *context);
    return FakeSessionService::DescribePool(context, request, response);
  }
  // Nothing cached: a header for no blocks.
  grpc::Status GetBlocks(grpc::ServerContext* context, const v1::GetBlocksRequest*,
                         grpc::ServerWriter<v1::GetBlocksResponse>* writer) override {
    Record("GetBlocks", *context);
    v1::GetBlocksResponse message;
    message.set_epoch(kEpoch);
    message.mutable_header();
    writer->Write(message);
    return grpc::Status::OK;
  }
  grpc::Status PutBlocks(grpc::ServerContext* context,
                         grpc::ServerReader<v1::PutBlocksRequest>* reader,
                         v1::PutBlocksResponse* response) override {
    Record("PutBlocks", *context);
    uint32_t blocks = 0;
    v1::PutBlocksRequest message;
    while (reader->Read(&message)) {
      if (message.has_header()) blocks = message.header().block_checksums_size();
    }
    response->set_epoch(kEpoch);
    response->set_num_blocks(blocks);
    response->set_num_stored(blocks);
    return grpc::Status::OK;
  }

 private:
  void Record(const char* method, const grpc::ServerContext& context) {
    Call call{.method = method, .authorization = "", .client_name = ""};
    const auto& metadata = context.client_metadata();
    if (auto it = metadata.find("authorization"); it != metadata.end()) {
      call.authorization.assign(it->second.data(), it->second.size());
    }
    const std::vector<grpc::string_ref> names =
        context.auth_context()->FindPropertyValues(GRPC_X509_CN_PROPERTY_NAME);
    if (!names.empty()) call.client_name.assign(names[0].data(), names[0].size());
    absl::MutexLock lock(&mu_);
    calls_.push_back(std::move(call));
  }

  absl::Mutex mu_;
  std::vector<Call> calls_ ABSL_GUARDED_BY(mu_);
};

// The fake daemon on a Unix socket, insecure (local): the bearer token's tests.
class BearerTokenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::kvcache::testing::KeepGrpcInitialized();
    address_ = "unix://" + dir_.File("kv.sock");
    grpc::ServerBuilder builder;
    builder.AddListeningPort(address_, grpc::InsecureServerCredentials());
    builder.RegisterService(&daemon_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  std::unique_ptr<KvCacheClient> Connect(std::string token) {
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client =
        KvCacheClient::Connect(address_, ClientOptions{.bearer_token = std::move(token)});
    EXPECT_OK(client);
    return client.ok() ? *std::move(client) : nullptr;
  }

  ScopedTempDir dir_;
  std::string address_;
  RecordingDaemon daemon_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(BearerTokenTest, EveryUnaryCallCarriesTheToken) {
  std::unique_ptr<KvCacheClient> client = Connect(kToken);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Ping());
  ASSERT_OK(client->DescribePool("default"));
  ASSERT_OK(client->OpenSession("", "test"));
  ASSERT_OK(client->CloseSession());
  const std::vector<RecordingDaemon::Call> calls = daemon_.calls();
  ASSERT_THAT(calls, SizeIs(Ge(4u)));
  for (const RecordingDaemon::Call& call : calls) {
    EXPECT_EQ(call.authorization, kExpectedAuthorization) << call.method;
  }
}

TEST_F(BearerTokenTest, KeepAlivesCarryTheToken) {
  std::unique_ptr<KvCacheClient> client = Connect(kToken);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->OpenSession("", "test"));
  ASSERT_TRUE(PollUntil([&] { return daemon_.AuthorizationsOf("KeepAlive").size() >= 2; }));
  EXPECT_THAT(daemon_.AuthorizationsOf("KeepAlive"), Each(std::string(kExpectedAuthorization)));
}

TEST_F(BearerTokenTest, TheCloseOnDestructionCarriesTheToken) {
  std::unique_ptr<KvCacheClient> client = Connect(kToken);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->OpenSession("", "test"));
  client.reset();
  EXPECT_THAT(daemon_.AuthorizationsOf("CloseSession"), ElementsAre(kExpectedAuthorization));
}

TEST_F(BearerTokenTest, BlockStreamsCarryTheToken) {
  std::unique_ptr<KvCacheClient> client = Connect(kToken);
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->OpenSession("", "test"));
  const std::vector<uint32_t> tokens(2 * RecordingDaemon::kLayout.block_size, 7);
  const std::string bytes(2 * RecordingDaemon::kLayout.BlockBytes(), 'k');
  absl::StatusOr<KvCacheClient::PutResult> put = client->PutBlocks("default", tokens, bytes);
  ASSERT_OK(put);
  EXPECT_EQ(put->num_stored, 2u);
  absl::StatusOr<KvCacheClient::GetResult> got = client->GetBlocks("default", tokens);
  ASSERT_OK(got);
  EXPECT_EQ(got->num_blocks, 0u);
  EXPECT_THAT(daemon_.AuthorizationsOf("PutBlocks"), ElementsAre(kExpectedAuthorization));
  EXPECT_THAT(daemon_.AuthorizationsOf("GetBlocks"), ElementsAre(kExpectedAuthorization));
}

TEST_F(BearerTokenTest, WithoutATokenNoCallCarriesAuthorization) {
  std::unique_ptr<KvCacheClient> client = Connect("");
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->Ping());
  ASSERT_OK(client->OpenSession("", "test"));
  const std::vector<uint32_t> tokens(RecordingDaemon::kLayout.block_size, 7);
  ASSERT_OK(client->GetBlocks("default", tokens));
  for (const RecordingDaemon::Call& call : daemon_.calls()) {
    EXPECT_THAT(call.authorization, IsEmpty()) << call.method;
  }
}

TEST_F(BearerTokenTest, ConnectRefusesATokenAHeaderCannotCarryWithoutQuotingIt) {
  const std::vector<std::string> tokens = {"kvc-secret-1 with-space", "kvc-secret-2\nsecond-line",
                                           std::string("kvc-secret-3\0", 13),
                                           "kvc-secret-4\xc3\xa9"};
  for (const std::string& token : tokens) {
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client =
        KvCacheClient::Connect(address_, ClientOptions{.bearer_token = token});
    EXPECT_THAT(client, StatusIs(absl::StatusCode::kInvalidArgument,
                                 AllOf(HasSubstr("bearer token"), Not(HasSubstr("kvc-secret")))));
  }
  EXPECT_THAT(daemon_.calls(), IsEmpty());
}

TEST_F(BearerTokenTest, ConnectRefusesTlsForAUnixTarget) {
  ClientOptions options;
  options.tls.enabled = true;
  EXPECT_THAT(KvCacheClient::Connect(address_, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(address_)));
  EXPECT_THAT(KvCacheClient::Connect("unix-abstract:kvcache-test", options),
              StatusIs(absl::StatusCode::kInvalidArgument));
}

TEST(IsLoopbackTargetTest, LoopbackHostsInEveryTargetForm) {
  for (const char* target :
       {"127.0.0.1:5000", "127.8.9.10:5000", "localhost:5000", "LOCALHOST", "[::1]:5000", "::1",
        "dns:///localhost:5000", "dns:localhost:5000", "dns://8.8.8.8/127.0.0.1:5000",
        "ipv4:127.0.0.1:5000", "ipv6:[::1]:5000", "[::ffff:127.0.0.1]:5000"}) {
    EXPECT_TRUE(IsLoopbackTarget(target)) << target;
  }
  for (const char* target :
       {"192.0.2.1:5000", "10.0.0.1:5000", "128.0.0.1:5000", "example.com:5000",
        "localhost.example.com:5000", "dns:///kvcache.local:5000", "[2001:db8::1]:5000",
        "ipv4:192.0.2.1:5000", "unix:///tmp/kv.sock", "unix-abstract:kvcache", ""}) {
    EXPECT_FALSE(IsLoopbackTarget(target)) << target;
  }
}

// Regression (issue 29, item 6): the token went over plaintext TCP to any host.
TEST(PlaintextTokenTest, ConnectRefusesATokenOverPlaintextTcpToANonLoopbackHost) {
  // 192.0.2.0/24 is TEST-NET-1: nothing answers there.
  for (const char* target : {"192.0.2.1:5000", "dns:///kvcache.example:5000"}) {
    absl::StatusOr<std::unique_ptr<KvCacheClient>> client = KvCacheClient::Connect(
        target, ClientOptions{.connect_timeout = absl::Milliseconds(100), .bearer_token = kToken});
    EXPECT_THAT(client,
                StatusIs(absl::StatusCode::kInvalidArgument,
                         AllOf(HasSubstr(target), HasSubstr("plaintext"),
                               HasSubstr("allow_plaintext_token"), Not(HasSubstr(kToken)))));
  }
}

TEST(PlaintextTokenTest, TheRefusalCoversOnlyTokensOverPlaintextTcpToNonLoopbackHosts) {
  const absl::Duration timeout = absl::Milliseconds(100);
  // Allowed explicitly, or without a token: Connect gets as far as connecting.
  ClientOptions allowed{.connect_timeout = timeout, .bearer_token = kToken};
  allowed.allow_plaintext_token = true;
  const ClientOptions anonymous{.connect_timeout = timeout};
  for (const ClientOptions& options : {allowed, anonymous}) {
    EXPECT_THAT(KvCacheClient::Connect("192.0.2.1:5000", options),
                StatusIs(absl::StatusCode::kUnavailable));
  }
  // Loopback: nothing listens on port 1, but the token may go there.
  EXPECT_THAT(KvCacheClient::Connect(
                  "127.0.0.1:1", ClientOptions{.connect_timeout = timeout, .bearer_token = kToken}),
              StatusIs(absl::StatusCode::kUnavailable));
}

// A TLS daemon on 127.0.0.1, with a test PKI made once for the suite.
class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    pki_dir_ = new ScopedTempDir();
    absl::StatusOr<TestPki> pki = kvcache::testing::MakeTestPki(pki_dir_->path());
    ASSERT_OK(pki);
    pki_ = new TestPki(*std::move(pki));
  }
  static void TearDownTestSuite() {
    delete pki_;
    pki_ = nullptr;
    delete pki_dir_;
    pki_dir_ = nullptr;
  }

  void SetUp() override {
    ::kvcache::testing::KeepGrpcInitialized();
    ASSERT_NE(pki_, nullptr);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // Starts the daemon with the server certificate; `client_certificate` is gRPC's mode for the
  // client's. Sets port_.
  void StartDaemon(grpc_ssl_client_certificate_request_type client_certificate) {
    grpc::SslServerCredentialsOptions ssl(client_certificate);
    ssl.pem_root_certs = ReadFile(pki_->ca_cert);
    ssl.pem_key_cert_pairs.push_back(
        {.private_key = ReadFile(pki_->server_key), .cert_chain = ReadFile(pki_->server_cert)});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &port_);
    builder.RegisterService(&daemon_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
  }
  void StartMutualTlsDaemon() {
    StartDaemon(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  }

  // TLS options that trust the test CA, with client A's certificate.
  static ClientTlsOptions ClientA() {
    return ClientTlsOptions{.enabled = true,
                            .ca_file = pki_->ca_cert,
                            .cert_file = pki_->client_a_cert,
                            .key_file = pki_->client_a_key,
                            .server_name = ""};
  }

  absl::StatusOr<std::unique_ptr<KvCacheClient>> Connect(
      const ClientTlsOptions& tls, const std::string& host = "localhost",
      absl::Duration connect_timeout = absl::Seconds(10)) {
    return KvCacheClient::Connect(
        absl::StrCat(host, ":", port_),
        ClientOptions{.connect_timeout = connect_timeout, .bearer_token = kToken, .tls = tls});
  }
  // A Connect that must fail: UNAVAILABLE, and the daemon saw no call.
  void ExpectRefused(const ClientTlsOptions& tls, const std::string& host = "localhost") {
    EXPECT_THAT(Connect(tls, host, kFailingConnectTimeout),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("TLS")));
    EXPECT_THAT(daemon_.calls(), IsEmpty());
  }

  static ScopedTempDir* pki_dir_;
  static TestPki* pki_;
  RecordingDaemon daemon_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

ScopedTempDir* TlsTest::pki_dir_ = nullptr;
TestPki* TlsTest::pki_ = nullptr;

TEST_F(TlsTest, MutualTlsWithTheCaAndAClientCertificateConnects) {
  ASSERT_NO_FATAL_FAILURE(StartMutualTlsDaemon());
  absl::StatusOr<std::unique_ptr<KvCacheClient>> client = Connect(ClientA());
  ASSERT_OK(client);
  ASSERT_OK((*client)->Ping());
  const std::vector<RecordingDaemon::Call> calls = daemon_.calls();
  ASSERT_THAT(calls, SizeIs(1));
  EXPECT_EQ(calls[0].client_name, kTestClientAName);
  EXPECT_EQ(calls[0].authorization, kExpectedAuthorization);
}

TEST_F(TlsTest, ServerOnlyTlsConnectsWithoutAClientCertificate) {
  ASSERT_NO_FATAL_FAILURE(StartDaemon(GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE));
  ClientTlsOptions tls = ClientA();
  tls.cert_file.clear();
  tls.key_file.clear();
  absl::StatusOr<std::unique_ptr<KvCacheClient>> client = Connect(tls, "127.0.0.1");
  ASSERT_OK(client);
  ASSERT_OK((*client)->Ping());
  EXPECT_EQ(daemon_.calls().at(0).client_name, "");
}

TEST_F(TlsTest, ServerNameOverridesTheTargetsHost) {
  ASSERT_NO_FATAL_FAILURE(StartMutualTlsDaemon());
  ClientTlsOptions tls = ClientA();
  tls.server_name = "localhost";
  absl::StatusOr<std::unique_ptr<KvCacheClient>> client = Connect(tls, "127.0.0.1");
  ASSERT_OK(client);
  ASSERT_OK((*client)->Ping());
  // A name the daemon's certificate does not carry.
  tls.server_name = "kvcache.example";
  EXPECT_THAT(Connect(tls, "127.0.0.1", kFailingConnectTimeout),
              StatusIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsTest, AnotherCaCannotVerifyTheDaemon) {
  ASSERT_NO_FATAL_FAILURE(StartMutualTlsDaemon());
  ClientTlsOptions tls = ClientA();
  tls.ca_file = pki_->other_ca_cert;
  ExpectRefused(tls);
}

TEST_F(TlsTest, TheDaemonRefusesAClientWithoutACertificate) {
  ASSERT_NO_FATAL_FAILURE(StartMutualTlsDaemon());
  ClientTlsOptions tls = ClientA();
  tls.cert_file.clear();
  tls.key_file.clear();
  ExpectRefused(tls);
}

TEST_F(TlsTest, TheDaemonRefusesACertificateOfAnotherCa) {
  ASSERT_NO_FATAL_FAILURE(StartMutualTlsDaemon());
  ClientTlsOptions tls = ClientA();
  tls.cert_file = pki_->untrusted_client_cert;
  tls.key_file = pki_->untrusted_client_key;
  ExpectRefused(tls);
}

TEST_F(TlsTest, TheDaemonRefusesAnExpiredCertificate) {
  ASSERT_NO_FATAL_FAILURE(StartMutualTlsDaemon());
  ClientTlsOptions tls = ClientA();
  tls.cert_file = pki_->expired_client_cert;
  tls.key_file = pki_->expired_client_key;
  ExpectRefused(tls);
}

TEST_F(TlsTest, APlaintextClientCannotReachATlsDaemon) {
  ASSERT_NO_FATAL_FAILURE(StartMutualTlsDaemon());
  EXPECT_THAT(Connect(ClientTlsOptions{}, "localhost", kFailingConnectTimeout),
              StatusIs(absl::StatusCode::kUnavailable));
  EXPECT_THAT(daemon_.calls(), IsEmpty());
}

TEST_F(TlsTest, ConnectNamesATlsFileItCannotUseButNotItsContents) {
  ClientTlsOptions tls = ClientA();
  tls.ca_file = pki_dir_->File("missing.pem");
  EXPECT_THAT(Connect(tls), StatusIs(absl::StatusCode::kInvalidArgument,
                                     AllOf(HasSubstr("CA"), HasSubstr(tls.ca_file))));

  // Not PEM: refused, named, not quoted (a key file is a secret).
  tls = ClientA();
  tls.key_file = pki_dir_->File("not_a_key.txt");
  WriteFile(tls.key_file, "kvc-secret-key-material");
  EXPECT_THAT(Connect(tls), StatusIs(absl::StatusCode::kInvalidArgument,
                                     AllOf(HasSubstr(tls.key_file), Not(HasSubstr("kvc-secret")))));

  // An empty CA file must not fall back to the system's roots.
  tls = ClientA();
  tls.ca_file = pki_dir_->File("empty.pem");
  WriteFile(tls.ca_file, "");
  EXPECT_THAT(Connect(tls), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(tls.ca_file)));

  tls = ClientA();
  tls.ca_file = pki_dir_->path();  // a directory
  EXPECT_THAT(Connect(tls), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(tls.ca_file)));
}

TEST_F(TlsTest, ConnectRefusesACertificateWithoutItsKey) {
  ClientTlsOptions tls = ClientA();
  tls.key_file.clear();
  EXPECT_THAT(Connect(tls), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key")));
  tls = ClientA();
  tls.cert_file.clear();
  EXPECT_THAT(Connect(tls), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("key")));
}

}  // namespace
}  // namespace kvcache
