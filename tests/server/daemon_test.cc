// The daemon end to end over a real Unix socket, with a real gRPC health client: health reporting
// on the socket and on the health-only TCP port, drain, the latch of a device fault (through a pool
// memory that fails like a device with a sticky error), and leases on the injected clock.
#include "server/daemon.h"

#include <gmock/gmock.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/security/credentials.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "cache/pool_spec.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "tests/testing/fake_clock.h"
#include "tests/testing/fault_injection_pool_memory.h"
#include "tests/testing/grpc_kept_alive.h"
#include "tests/testing/poll_until.h"
#include "tests/testing/scoped_temp_dir.h"
#include "tests/testing/status_matchers.h"

namespace kvcache {
namespace {

using ::kvcache::testing::FaultInjectionPoolMemory;
using ::kvcache::testing::PollUntil;
using ::kvcache::testing::ScopedTempDir;
using ::kvcache::testing::StatusIs;
using ::testing::HasSubstr;

// grpc.health.v1.HealthCheckResponse.ServingStatus.
constexpr int kServing = 1;
constexpr int kNotServing = 2;
constexpr char kServiceName[] = "kvcache.v1.KvCache";
constexpr uint32_t kBlockSize = 16;  // DefaultPoolOptions' block size

// One unary call of `method` with `request` as its raw bytes; the response's bytes.
absl::StatusOr<std::string> RawUnaryCall(const std::shared_ptr<grpc::Channel>& channel,
                                         const std::string& method, const std::string& request) {
  grpc::Slice slice(request);
  const grpc::ByteBuffer request_buffer(&slice, 1);
  grpc::ByteBuffer response_buffer;
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request_buffer, &response_buffer,
                 [&](grpc::Status result) {
                   status = std::move(result);
                   done.Notify();
                 });
  done.WaitForNotification();
  if (!status.ok()) return FromGrpcStatus(status);
  grpc::Slice flat;
  if (!response_buffer.DumpToSingleSlice(&flat).ok()) return absl::DataLossError("no response");
  return std::string(reinterpret_cast<const char*>(flat.begin()), flat.size());
}

// grpc.health.v1.Health/Check, called raw: Debian's libgrpc++ serves the health service but ships
// no client stub for it. The request is `string service = 1`, the response
// `ServingStatus status = 1`; both are hand-serialized. Returns the serving status.
absl::StatusOr<int> CheckHealth(const std::shared_ptr<grpc::Channel>& channel,
                                const std::string& service) {
  std::string request;
  if (!service.empty()) {  // field 1, length-delimited; the names here are under 128 bytes
    request.push_back(0x0a);
    request.push_back(static_cast<char>(service.size()));
    request += service;
  }
  ASSIGN_OR_RETURN(const std::string response,
                   RawUnaryCall(channel, "/grpc.health.v1.Health/Check", request));
  // UNKNOWN (0) is the default and is not sent; any other status is tag 0x08 and a 1-byte varint.
  if (response.empty()) return 0;
  if (response.size() != 2 || response[0] != 0x08) {
    return absl::DataLossError("unexpected HealthCheckResponse bytes");
  }
  return response[1];
}

class DaemonTest : public ::testing::Test {
 protected:
  // What a derived fixture changes in the daemon's options.
  virtual void Customize(DaemonOptions& options) {}

  void SetUp() override {
    ::kvcache::testing::KeepGrpcInitialized();
    DaemonOptions options;
    options.listen = "unix://" + dir_.File("kv.sock");
    options.health_listen = "127.0.0.1:0";
    options.pools.push_back(DefaultPoolOptions());
    options.pools.back().num_blocks = 16;
    options.reaper_period = absl::Milliseconds(10);
    options.clock = &clock_;
    options.wrap_pool_memory = [this](const PoolOptions&, std::unique_ptr<PoolMemory> memory) {
      auto faulty = std::make_unique<FaultInjectionPoolMemory>(std::move(memory));
      memory_ = faulty.get();
      return faulty;
    };
    Customize(options);
    auto daemon = Daemon::Start(options);
    ASSERT_OK(daemon);
    daemon_ = *std::move(daemon);
    channel_ = grpc::CreateChannel(options.listen, grpc::InsecureChannelCredentials());
    stub_ = v1::KvCache::NewStub(channel_);
    health_channel_ =
        grpc::CreateChannel(daemon_->health_address(), grpc::InsecureChannelCredentials());
  }

  void TearDown() override {
    if (daemon_ != nullptr) {
      for (Pool* pool : daemon_->manager().pools()) EXPECT_OK(pool->CheckInvariants());
      daemon_.reset();
    }
  }

  template <typename Request, typename Response>
  absl::Status Call(grpc::Status (v1::KvCache::Stub::*method)(grpc::ClientContext*, const Request&,
                                                              Response*),
                    const Request& request, Response* response) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    return FromGrpcStatus(((*stub_).*method)(&context, request, response));
  }

  uint64_t OpenSession(absl::Duration ttl = absl::Seconds(10)) {
    v1::OpenSessionRequest request;
    request.set_ttl_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(ttl)));
    v1::OpenSessionResponse response;
    EXPECT_OK(Call(&v1::KvCache::Stub::OpenSession, request, &response));
    return response.session_id();
  }

  absl::StatusOr<v1::OpenSequenceResponse> OpenSequence(uint64_t session, size_t num_tokens) {
    v1::OpenSequenceRequest request;
    request.set_session_id(session);
    request.set_pool("default");
    for (size_t i = 0; i < num_tokens; ++i) request.add_tokens(static_cast<uint32_t>(100 + i));
    v1::OpenSequenceResponse response;
    RETURN_IF_ERROR(Call(&v1::KvCache::Stub::OpenSequence, request, &response));
    return response;
  }

  // A sequence of `num_tokens` tokens whose first `num_committed` tokens are committed.
  absl::StatusOr<v1::OpenSequenceResponse> OpenCommitted(uint64_t session, size_t num_tokens,
                                                         uint32_t num_committed) {
    ASSIGN_OR_RETURN(v1::OpenSequenceResponse opened, OpenSequence(session, num_tokens));
    v1::CommitSequenceRequest commit;
    commit.set_session_id(session);
    commit.set_sequence_id(opened.sequence_id());
    commit.set_num_written_tokens(num_committed);
    v1::CommitSequenceResponse committed;
    RETURN_IF_ERROR(Call(&v1::KvCache::Stub::CommitSequence, commit, &committed));
    return opened;
  }

  // The status a GetBlocks stream of the first `num_tokens` tokens ends with.
  absl::Status GetBlocks(uint64_t session, size_t num_tokens) {
    v1::GetBlocksRequest request;
    request.set_session_id(session);
    request.set_pool("default");
    for (size_t i = 0; i < num_tokens; ++i) request.add_tokens(static_cast<uint32_t>(100 + i));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    std::unique_ptr<grpc::ClientReader<v1::GetBlocksResponse>> reader =
        stub_->GetBlocks(&context, request);
    v1::GetBlocksResponse response;
    while (reader->Read(&response)) {
    }
    return FromGrpcStatus(reader->Finish());
  }

  // On the main address and on the health-only port, which must agree at every change.
  void ExpectHealth(int expected) {
    for (const std::shared_ptr<grpc::Channel>& channel : {channel_, health_channel_}) {
      const char* where = channel == channel_ ? "socket" : "health port";
      for (const std::string service : {"", kServiceName}) {
        absl::StatusOr<int> health = CheckHealth(channel, service);
        ASSERT_OK(health) << where << ", service '" << service << "'";
        EXPECT_EQ(*health, expected) << where << ", service '" << service << "'";
      }
    }
  }

  ScopedTempDir dir_{"kvcache-daemon"};         // for the socket
  ::kvcache::testing::FakeClock clock_;         // declared before daemon_, so it outlives it
  FaultInjectionPoolMemory* memory_ = nullptr;  // the "default" pool's, owned by it
  std::unique_ptr<Daemon> daemon_;
  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<grpc::Channel> health_channel_;  // the health-only port
  std::unique_ptr<v1::KvCache::Stub> stub_;
};

TEST_F(DaemonTest, HealthIsServingForTheServerAndTheService) {
  ExpectHealth(kServing);
  EXPECT_THAT(CheckHealth(channel_, "no.such.Service"), StatusIs(absl::StatusCode::kNotFound));
}

TEST_F(DaemonTest, HealthPortHasItsBoundPortAndServesNothingElse) {
  EXPECT_FALSE(absl::EndsWith(daemon_->health_address(), ":0")) << daemon_->health_address();
  v1::PingResponse pong;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  EXPECT_EQ(
      v1::KvCache::NewStub(health_channel_)->Ping(&context, v1::PingRequest(), &pong).error_code(),
      grpc::StatusCode::UNIMPLEMENTED);
}

TEST_F(DaemonTest, DrainTurnsHealthNotServingWhileCallsAreStillServed) {
  const uint64_t session = OpenSession();
  daemon_->Drain();
  ExpectHealth(kNotServing);
  v1::PingResponse pong;
  EXPECT_OK(Call(&v1::KvCache::Stub::Ping, v1::PingRequest(), &pong));
  ASSERT_OK(OpenCommitted(session, 2 * kBlockSize + 3, 2 * kBlockSize));
  v1::KeepAliveRequest keep_alive;
  keep_alive.set_session_id(session);
  v1::KeepAliveResponse kept;
  EXPECT_OK(Call(&v1::KvCache::Stub::KeepAlive, keep_alive, &kept));
  // New sessions go to another daemon.
  v1::OpenSessionResponse opened;
  EXPECT_THAT(Call(&v1::KvCache::Stub::OpenSession, v1::OpenSessionRequest(), &opened),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("draining")));
  ExpectHealth(kNotServing);
}

TEST_F(DaemonTest, DeviceFaultInAForkTurnsHealthNotServingAndPoolCallsUnavailable) {
  const uint64_t session = OpenSession();
  // Two full blocks and a partial one: a fork copies the partial block.
  absl::StatusOr<v1::OpenSequenceResponse> parent =
      OpenCommitted(session, 2 * kBlockSize + 3, 2 * kBlockSize);
  ASSERT_OK(parent);
  ASSERT_NO_FATAL_FAILURE(ExpectHealth(kServing));

  memory_->FailNth(FaultInjectionPoolMemory::Op::kCopyBlock, 1,
                   FaultInjectionPoolMemory::StickyCudaError());
  v1::ForkSequenceRequest fork;
  fork.set_session_id(session);
  fork.set_sequence_id(parent->sequence_id());
  v1::ForkSequenceResponse forked;
  const absl::Status fault = Call(&v1::KvCache::Stub::ForkSequence, fork, &forked);
  EXPECT_THAT(fault, StatusIs(absl::StatusCode::kUnavailable,
                              HasSubstr("INTERNAL: copying a block: an illegal memory access")));
  // The listener ran before the fork's reply left: no waiting needed.
  ExpectHealth(kNotServing);

  // Every later call that needs the pool answers the same latched status, on any sequence.
  EXPECT_EQ(OpenSequence(session, kBlockSize).status(), fault);
  EXPECT_EQ(Call(&v1::KvCache::Stub::ForkSequence, fork, &forked), fault);
  v1::LookupRequest lookup;
  lookup.set_pool("default");
  for (uint32_t i = 0; i < 2 * kBlockSize; ++i) lookup.add_tokens(100 + i);
  v1::LookupResponse looked_up;
  EXPECT_EQ(Call(&v1::KvCache::Stub::Lookup, lookup, &looked_up), fault);
  EXPECT_EQ(GetBlocks(session, 2 * kBlockSize), fault);
  // Calls that need no block still work: the transport probe and ending the lease.
  v1::PingResponse pong;
  EXPECT_OK(Call(&v1::KvCache::Stub::Ping, v1::PingRequest(), &pong));
  v1::ReleaseSequenceRequest release;
  release.set_session_id(session);
  release.set_sequence_id(parent->sequence_id());
  v1::ReleaseSequenceResponse released;
  EXPECT_OK(Call(&v1::KvCache::Stub::ReleaseSequence, release, &released));
  ExpectHealth(kNotServing);
}

TEST_F(DaemonTest, DeviceFaultWhileStreamingBlocksEndsTheStreamUnavailable) {
  const uint64_t session = OpenSession();
  absl::StatusOr<v1::OpenSequenceResponse> opened =
      OpenCommitted(session, 2 * kBlockSize + 1, 2 * kBlockSize);
  ASSERT_OK(opened);
  ASSERT_OK(GetBlocks(session, 2 * kBlockSize));  // bytes staged through Read, as on a device

  // The first staged read fails: the stream ends with the latched status, its staging buffer
  // freed and its blocks unpinned (TearDown checks the invariants).
  memory_->FailNth(FaultInjectionPoolMemory::Op::kRead, 1,
                   absl::DataLossError("uncorrectable ECC error"));
  EXPECT_THAT(GetBlocks(session, 2 * kBlockSize),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("DATA_LOSS: uncorrectable ECC")));
  ExpectHealth(kNotServing);
  // The stream's pins are released in OnDone, which may trail the client's view of the stream.
  Pool* pool = daemon_->manager().pools()[0];
  const uint32_t held = static_cast<uint32_t>(opened->block_ids_size());
  EXPECT_TRUE(PollUntil([&] { return pool->Stats().referenced == held; }));
}

// Issue 17: a unary request whose bytes do not parse is answered by gRPC 1.51's callback server
// itself, before any handler or interceptor of ours sees the call, as UNIMPLEMENTED with an empty
// message; the proto's error list documents it. This pins that behaviour, and that the daemon
// serves on.
TEST_F(DaemonTest, AnUnparsableUnaryRequestIsUnimplementedAndChangesNothing) {
  // Field 1 (session_id, varint) with a truncated varint.
  EXPECT_THAT(RawUnaryCall(channel_, "/kvcache.v1.KvCache/OpenSequence", "\x08\xff\xff"),
              StatusIs(absl::StatusCode::kUnimplemented));
  EXPECT_THAT(RawUnaryCall(channel_, "/kvcache.v1.KvCache/Ping", std::string("\x0a\x7f", 2)),
              StatusIs(absl::StatusCode::kUnimplemented));
  v1::PingResponse pong;
  EXPECT_OK(Call(&v1::KvCache::Stub::Ping, v1::PingRequest(), &pong));
  EXPECT_EQ(daemon_->manager().sessions().size(), 0);
}

TEST_F(DaemonTest, LeasesRunOnTheInjectedClock) {
  // A lease far longer than the test: on real time it would never end here.
  constexpr absl::Duration kLease = absl::Minutes(1);
  const uint64_t session = OpenSession(kLease);
  v1::KeepAliveRequest keep_alive;
  keep_alive.set_session_id(session);
  v1::KeepAliveResponse kept;
  // The reaper runs on real time but reads the daemon's clock: the lease ends only once the fake
  // clock passes its deadline, which a keep-alive pushes to a full lease from the fake now.
  clock_.Advance(kLease - absl::Seconds(1));
  ASSERT_OK(Call(&v1::KvCache::Stub::KeepAlive, keep_alive, &kept));
  clock_.Advance(kLease - absl::Seconds(1));
  ASSERT_OK(Call(&v1::KvCache::Stub::KeepAlive, keep_alive, &kept));
  clock_.Advance(kLease);
  // Watched through GetStats: a keep-alive would itself renew the lease if it beat the reaper.
  EXPECT_TRUE(PollUntil([&] {
    v1::GetStatsResponse stats;
    return Call(&v1::KvCache::Stub::GetStats, v1::GetStatsRequest(), &stats).ok() &&
           stats.open_sessions() == 0;
  }));
  EXPECT_THAT(Call(&v1::KvCache::Stub::KeepAlive, keep_alive, &kept),
              StatusIs(absl::StatusCode::kAborted));
}

// Regression (issue 17): such pools failed at start with a shared-memory error ("Invalid
// argument", "File exists") rather than naming the pool.
TEST(DaemonStartTest, BadOrDuplicatePoolNamesAreRefusedBeforeAnyMemoryIsMade) {
  ::kvcache::testing::KeepGrpcInitialized();
  ScopedTempDir dir("kvcache-names");
  DaemonOptions options;
  options.listen = "unix://" + dir.File("kv.sock");
  options.pools = {DefaultPoolOptions()};
  options.pools[0].name = "a/b";
  EXPECT_THAT(Daemon::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("pool name 'a/b'")));
  options.pools = {DefaultPoolOptions(), DefaultPoolOptions()};
  EXPECT_THAT(Daemon::Start(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                               HasSubstr("two pools are named 'default'")));
  options.pools[1].name = "second";
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options);
  EXPECT_OK(daemon);
  if (daemon.ok()) daemon->reset();
}

// One daemon per node: the pods on the node on its Unix socket, clients elsewhere on TCP, one
// cache behind both (deploy/k8s/overlays/node-daemon).
class DaemonTcpListenTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ::kvcache::testing::KeepGrpcInitialized();
    options_.listen = "unix://" + dir_.File("kv.sock");
    options_.tcp_listen = "127.0.0.1:0";
    options_.pools.push_back(DefaultPoolOptions());
    options_.pools.back().num_blocks = 16;
  }

  ScopedTempDir dir_{"kvcache-daemon"};  // for the socket
  DaemonOptions options_;
};

absl::StatusOr<uint64_t> PingEpoch(const std::string& target) {
  auto stub = v1::KvCache::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::PingResponse pong;
  RETURN_IF_ERROR(FromGrpcStatus(stub->Ping(&context, v1::PingRequest(), &pong)));
  return pong.epoch();
}

TEST_F(DaemonTcpListenTest, UnixSocketAndTcpServeOneDaemon) {
  options_.allow_insecure_tcp = true;
  absl::StatusOr<std::unique_ptr<Daemon>> daemon = Daemon::Start(options_);
  ASSERT_OK(daemon);
  EXPECT_EQ((*daemon)->address(), options_.listen);
  EXPECT_TRUE(absl::StartsWith((*daemon)->tcp_address(), "127.0.0.1:"));
  EXPECT_FALSE(absl::EndsWith((*daemon)->tcp_address(), ":0"));
  EXPECT_EQ((*daemon)->plaintext_tcp_address(), (*daemon)->tcp_address());
  absl::StatusOr<uint64_t> unix_epoch = PingEpoch(options_.listen);
  absl::StatusOr<uint64_t> tcp_epoch = PingEpoch((*daemon)->tcp_address());
  ASSERT_OK(unix_epoch);
  ASSERT_OK(tcp_epoch);
  EXPECT_EQ(*unix_epoch, *tcp_epoch);
  EXPECT_EQ(*unix_epoch, (*daemon)->manager().epoch());
}

TEST_F(DaemonTcpListenTest, TcpNeedsTlsOrInsecure) {
  EXPECT_THAT(Daemon::Start(options_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs TLS")));
}

TEST_F(DaemonTcpListenTest, GoesOnlyWithAUnixSocket) {
  options_.allow_insecure_tcp = true;
  options_.listen = "127.0.0.1:0";
  EXPECT_THAT(Daemon::Start(options_),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--tcp_listen")));
}

// Issue 29: pool shared memory is named after the listen address, so a second daemon on the same
// address would find the first's names; it refuses while the first lives, and touches neither its
// pool nor its socket.
TEST_F(DaemonTcpListenTest, SecondDaemonOnTheSameAddressRefusesWhileTheFirstLives) {
  options_.allow_insecure_tcp = true;
  absl::StatusOr<std::unique_ptr<Daemon>> first = Daemon::Start(options_);
  ASSERT_OK(first);
  const std::string shm_name = (*first)->manager().pools()[0]->memory().mapping().shm_name;
  options_.tcp_listen = "";
  EXPECT_THAT(Daemon::Start(options_),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("belongs to a live daemon")));
  EXPECT_OK(PingEpoch(options_.listen));
  EXPECT_EQ((*first)->manager().pools()[0]->memory().mapping().shm_name, shm_name);

  first->reset();
  absl::StatusOr<std::unique_ptr<Daemon>> next = Daemon::Start(options_);
  ASSERT_OK(next);
  EXPECT_EQ((*next)->manager().pools()[0]->memory().mapping().shm_name, shm_name);
}

// ---- Call limits and deadlines (issue 17, item 6) ----

constexpr char kHoldBackKey[] = "x-kvcache-test-hold-back-ms";

// What the daemon answered each method, as its status left the server.
class SentStatuses {
 public:
  void Record(const std::string& method, grpc::StatusCode code) {
    absl::MutexLock lock(&mu_);
    codes_[method] = code;
  }
  std::optional<grpc::StatusCode> Of(const std::string& method) const {
    absl::MutexLock lock(&mu_);
    auto found = codes_.find(method);
    return found == codes_.end() ? std::nullopt : std::optional(found->second);
  }

 private:
  mutable absl::Mutex mu_;
  std::map<std::string, grpc::StatusCode> codes_ ABSL_GUARDED_BY(mu_);
};

// Holds a call back before its handler for the milliseconds its kHoldBackKey metadata asks, as a
// saturated server's queues would, and records the status the daemon sends it.
class HoldBackInterceptor final : public grpc::experimental::Interceptor {
 public:
  HoldBackInterceptor(std::string method, SentStatuses* sent)
      : method_(std::move(method)), sent_(sent) {}

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    using grpc::experimental::InterceptionHookPoints;
    if (methods->QueryInterceptionHookPoint(InterceptionHookPoints::POST_RECV_INITIAL_METADATA)) {
      const auto* metadata = methods->GetRecvInitialMetadata();
      auto found = metadata->find(kHoldBackKey);
      int hold_ms = 0;
      if (found != metadata->end() &&
          absl::SimpleAtoi(absl::string_view(found->second.data(), found->second.size()),
                           &hold_ms)) {
        held_ = true;
        absl::SleepFor(absl::Milliseconds(hold_ms));
      }
    }
    if (held_ && methods->QueryInterceptionHookPoint(InterceptionHookPoints::PRE_SEND_STATUS)) {
      sent_->Record(method_, methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  const std::string method_;
  SentStatuses* const sent_;
  bool held_ = false;
};

class HoldBackInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit HoldBackInterceptorFactory(SentStatuses* sent) : sent_(sent) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new HoldBackInterceptor(info->method(), sent_);
  }

 private:
  SentStatuses* const sent_;
};

// Any method, unary or streaming, called raw over one HTTP/2 stream: `request` is sent as its
// one message, every response is read, and the call's status returned. Without `half_close` the
// client never ends its side: a put then stalls after that message until its deadline or Cancel.
class OneMessageCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  OneMessageCall(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                 const std::string& request, absl::Duration deadline, absl::Duration hold_back,
                 bool half_close = true)
      : stub_(channel) {
    grpc::Slice slice(request);
    request_ = grpc::ByteBuffer(&slice, 1);
    context_.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    if (hold_back > absl::ZeroDuration()) {
      context_.AddMetadata(kHoldBackKey, absl::StrCat(absl::ToInt64Milliseconds(hold_back)));
    }
    stub_.PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
    if (half_close) {
      StartWriteLast(&request_, grpc::WriteOptions());
    } else {
      StartWrite(&request_);
    }
    StartRead(&response_);
    StartCall();
  }

  absl::Status Await() {
    done_.WaitForNotification();
    return FromGrpcStatus(status_);
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (ok) StartRead(&response_);
  }
  void OnDone(const grpc::Status& status) override {
    status_ = status;
    done_.Notify();
  }

 private:
  grpc::GenericStub stub_;
  grpc::ClientContext context_;
  grpc::ByteBuffer request_;
  grpc::ByteBuffer response_;
  grpc::Status status_;
  absl::Notification done_;
};

absl::Status CallRaw(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                     const std::string& request, absl::Duration deadline,
                     absl::Duration hold_back = absl::ZeroDuration(), bool half_close = true) {
  OneMessageCall call(channel, method, request, deadline, hold_back, half_close);
  return call.Await();
}

// A channel of its own: gRPC would otherwise share one connection among channels to one target.
std::shared_ptr<grpc::Channel> NewConnection(const std::string& target) {
  static std::atomic<int> next{0};
  grpc::ChannelArguments args;
  args.SetInt("kvcache.test.connection", next.fetch_add(1));
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

class DaemonLimitsTest : public DaemonTest {
 protected:
  static constexpr uint32_t kStreamsPerConnection = 2;
  static constexpr uint32_t kStreams = 3;
  static constexpr uint64_t kPutBlocksPerConnection = 2;

  void Customize(DaemonOptions& options) override {
    listen_ = options.listen;
    block_bytes_ = options.pools.front().layout.BlockBytes();
    options.call_limits =
        CallLimitOptions{.max_streams_per_connection = kStreamsPerConnection,
                         .max_streams = kStreams,
                         .max_put_bytes_per_connection = kPutBlocksPerConnection * block_bytes_,
                         .max_put_bytes = 3 * block_bytes_};
    options.max_calls_per_connection = 16;
    options.testing_interceptors = [this] {
      std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> out;
      out.push_back(std::make_unique<HoldBackInterceptorFactory>(&sent_));
      return out;
    };
  }

  static std::string Method(const std::string& name) { return "/kvcache.v1.KvCache/" + name; }

  std::string AwaitRequest(uint64_t session, const std::string& key) {
    v1::AwaitRendezvousRequest request;
    request.set_session_id(session);
    request.set_key(key);
    return request.SerializeAsString();
  }

  // A put header for `num_blocks` full blocks, and the PutBlocksRequest carrying it.
  std::string PutHeader(uint64_t session, uint32_t num_blocks) {
    v1::PutBlocksRequest request;
    v1::PutBlocksHeader* header = request.mutable_header();
    header->set_session_id(session);
    header->set_pool("default");
    for (uint32_t i = 0; i < num_blocks * kBlockSize; ++i) header->add_tokens(7000 + i);
    for (uint32_t i = 0; i < num_blocks; ++i) header->add_block_checksums(i);
    return request.SerializeAsString();
  }

  // Whether every long call's place and every put byte has been given back, and no block is
  // held.
  bool AllGivenBack() {
    const CallLimitUsage usage = daemon_->call_limits().Usage();
    return usage.streams == 0 && usage.put_bytes == 0 &&
           daemon_->manager().pools().front()->Stats().referenced == 0;
  }

  std::string listen_;
  uint64_t block_bytes_ = 0;
  SentStatuses sent_;
};

// Every method of the service, held back by the server past its deadline, is answered
// DEADLINE_EXCEEDED by the daemon itself (not only by the client's timer) and changes nothing:
// no session, no sequence, no block, no place taken.
TEST_F(DaemonLimitsTest, EveryCallHeldPastItsDeadlineIsRefusedAndChangesNothing) {
  const uint64_t session = OpenSession();
  v1::OpenSequenceRequest open;
  open.set_session_id(session);
  open.set_pool("default");
  for (uint32_t i = 0; i < 3 * kBlockSize; ++i) open.add_tokens(i);
  const std::map<std::string, std::string> valid_requests = {
      {"OpenSequence", open.SerializeAsString()},
      {"AwaitRendezvous", AwaitRequest(session, "held")},
      {"PutBlocks", PutHeader(session, 1)},
  };
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::KvCache::service_full_name());
  ASSERT_NE(service, nullptr);
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string name = service->method(i)->name();
    auto valid = valid_requests.find(name);
    const std::string request = valid == valid_requests.end() ? "" : valid->second;
    EXPECT_THAT(CallRaw(channel_, Method(name), request, absl::Milliseconds(100),
                        /*hold_back=*/absl::Milliseconds(300)),
                StatusIs(absl::StatusCode::kDeadlineExceeded))
        << name;
    // The client's timer fired first; what matters is what the daemon did when it got there.
    EXPECT_TRUE(::kvcache::testing::PollUntil([&] { return sent_.Of(Method(name)).has_value(); }))
        << name;
    EXPECT_EQ(sent_.Of(Method(name)), grpc::StatusCode::DEADLINE_EXCEEDED) << name;
  }
  EXPECT_EQ(daemon_->manager().sessions().size(), 1);
  EXPECT_EQ(daemon_->manager().pools().front()->Stats().open_sequences, 0u);
  EXPECT_TRUE(AllGivenBack());
}

// A long call ends at its deadline wherever it waits, and gives back its place, its put bytes
// and its blocks.
TEST_F(DaemonLimitsTest, LongCallsEndAtTheirDeadlineAndGiveBackWhatTheyHeld) {
  const uint64_t session = OpenSession(absl::Hours(1));
  // Parked: no one publishes the key.
  EXPECT_THAT(CallRaw(channel_, Method("AwaitRendezvous"), AwaitRequest(session, "never"),
                      absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // Watching: no event comes after the snapshot.
  EXPECT_THAT(CallRaw(channel_, Method("WatchEvents"), "", absl::Milliseconds(300)),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  // A put stalled after its header: its blocks are allocated and its bytes reserved meanwhile.
  EXPECT_THAT(CallRaw(channel_, Method("PutBlocks"), PutHeader(session, 2), absl::Milliseconds(300),
                      absl::ZeroDuration(), /*half_close=*/false),
              StatusIs(absl::StatusCode::kDeadlineExceeded));
  EXPECT_TRUE(::kvcache::testing::PollUntil([&] { return AllGivenBack(); }));
}

// Past its connection's bound a long call is refused at once with RESOURCE_EXHAUSTED while other
// connections go on; past the daemon's bound with UNAVAILABLE. Parked calls are then served.
TEST_F(DaemonLimitsTest, LongCallsPastTheBoundsAreRefusedAtOnceAndOthersGoOn) {
  const uint64_t session = OpenSession(absl::Hours(1));
  std::vector<std::unique_ptr<OneMessageCall>> parked;
  const auto park = [&](const std::shared_ptr<grpc::Channel>& channel) {
    parked.push_back(std::make_unique<OneMessageCall>(channel, Method("AwaitRendezvous"),
                                                      AwaitRequest(session, "go"),
                                                      absl::Seconds(30), absl::ZeroDuration()));
  };
  std::shared_ptr<grpc::Channel> second = NewConnection(listen_);
  park(channel_);
  park(channel_);
  ASSERT_TRUE(::kvcache::testing::PollUntil(
      [&] { return daemon_->call_limits().Usage().streams == kStreamsPerConnection; }));
  EXPECT_THAT(
      CallRaw(channel_, Method("AwaitRendezvous"), AwaitRequest(session, "go"), absl::Seconds(30)),
      StatusIs(absl::StatusCode::kResourceExhausted,
               HasSubstr("this connection holds 2 streams of its 2")));
  park(second);
  ASSERT_TRUE(::kvcache::testing::PollUntil(
      [&] { return daemon_->call_limits().Usage().streams == kStreams; }));
  EXPECT_THAT(CallRaw(NewConnection(listen_), Method("WatchEvents"), "", absl::Seconds(30)),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("(--max_streams)")));
  // Unary calls are never counted among the long ones.
  v1::PingResponse pong;
  EXPECT_OK(Call(&v1::KvCache::Stub::Ping, v1::PingRequest(), &pong));

  v1::PublishRendezvousRequest publish;
  publish.set_session_id(session);
  publish.set_key("go");
  publish.set_value("v");
  v1::PublishRendezvousResponse published;
  ASSERT_OK(Call(&v1::KvCache::Stub::PublishRendezvous, publish, &published));
  for (auto& call : parked) EXPECT_OK(call->Await());
  EXPECT_TRUE(::kvcache::testing::PollUntil([&] { return AllGivenBack(); }));
  EXPECT_EQ(daemon_->call_limits().Usage().refused_streams, 2u);
}

// Put bytes are bounded per connection (RESOURCE_EXHAUSTED) and a put larger than the bound alone
// says so; another connection's put goes on.
TEST_F(DaemonLimitsTest, PutBytesPastAConnectionsBoundAreRefusedAtOnce) {
  const uint64_t session = OpenSession(absl::Hours(1));
  EXPECT_THAT(CallRaw(channel_, Method("PutBlocks"), PutHeader(session, 3), absl::Seconds(30)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr(absl::StrCat("a put of ", 3 * block_bytes_, " bytes exceeds"))));
  // A put of two blocks stalls holding the connection's whole bound.
  OneMessageCall stalled(channel_, Method("PutBlocks"), PutHeader(session, 2), absl::Seconds(30),
                         absl::ZeroDuration(), /*half_close=*/false);
  ASSERT_TRUE(::kvcache::testing::PollUntil(
      [&] { return daemon_->call_limits().Usage().put_bytes == 2 * block_bytes_; }));
  EXPECT_THAT(CallRaw(channel_, Method("PutBlocks"), PutHeader(session, 1), absl::Seconds(30)),
              StatusIs(absl::StatusCode::kResourceExhausted,
                       HasSubstr("(--max_put_bytes_per_connection)")));
  // Another connection's put is admitted (it then fails for its made-up bytes, not its size).
  EXPECT_THAT(CallRaw(NewConnection(listen_), Method("PutBlocks"), PutHeader(session, 1),
                      absl::Seconds(30)),
              StatusIs(absl::StatusCode::kDataLoss));
  stalled.Cancel();
  EXPECT_THAT(stalled.Await(), StatusIs(absl::StatusCode::kCancelled));
  EXPECT_TRUE(::kvcache::testing::PollUntil([&] { return AllGivenBack(); }));
}

}  // namespace
}  // namespace kvcache
