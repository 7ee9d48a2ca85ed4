#include "server/daemon.h"

#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/impl/server_builder_option.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "auth/identity_file.h"
#include "cache/cuda_pool_memory.h"
#include "cache/pool_spec.h"
#include "common/cuda/cuda_device.h"
#include "common/rpc/http2_tuning.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

constexpr absl::string_view kUnixScheme = "unix://";
// The name gRPC health clients ask about besides "" (the whole server).
constexpr char kServiceName[] = "kvcache.v1.KvCache";

// A missing directory is made owner-only, or traversable by all when the socket is for others.
absl::Status PrepareSocketPath(const std::string& path, mode_t socket_mode) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    const mode_t dir_mode = (socket_mode & 0077) == 0 ? 0700 : 0711;
    if (mkdir(dir.c_str(), dir_mode) != 0 && errno != EEXIST) {
      return absl::UnavailableError(
          absl::StrCat("cannot create socket directory ", dir, ": ", std::strerror(errno)));
    }
  }
  // A socket left by a daemon that died would make the bind fail.
  struct stat info;
  if (lstat(path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) unlink(path.c_str());
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadPemFile(const std::string& path, absl::string_view what) {
  std::ifstream in(path);
  std::stringstream text;
  if (in) text << in.rdbuf();
  if (!in || text.str().empty()) {
    return absl::InvalidArgumentError(absl::StrCat("cannot read the ", what, " file ", path));
  }
  return text.str();
}

// Who owns this daemon's shared-memory names (ShmNameFor): its listen address, the same at each
// start, so that a restart reclaims what a killed predecessor left. A Unix socket's path is made
// absolute. Port 0 is another address at each start: there is no predecessor to find, and two
// such daemons on one node must not share names, so the process and the epoch tell them apart.
std::string ShmOwner(const std::string& listen, const std::string& socket_path, uint64_t epoch) {
  if (!socket_path.empty()) {
    if (socket_path.front() == '/') return absl::StrCat(kUnixScheme, socket_path);
    char cwd[PATH_MAX];
    if (getcwd(cwd, sizeof(cwd)) != nullptr)
      return absl::StrCat(kUnixScheme, cwd, "/", socket_path);
    return listen;
  }
  if (absl::EndsWith(listen, ":0")) return absl::StrCat(listen, "#", getpid(), ".", epoch);
  return listen;
}

// Memory that workers on this node map in place: shared host memory or a CUDA IPC export.
absl::StatusOr<std::unique_ptr<PoolMemory>> CreatePoolMemory(const std::string& device,
                                                             const PoolOptions& pool,
                                                             const std::string& shm_owner) {
  if (device == "host") {
    return HostPoolMemory::CreateShared(ShmNameFor(shm_owner, pool.name), pool.layout.BlockBytes(),
                                        pool.num_blocks);
  }
  ASSIGN_OR_RETURN(int index, ParseCudaDevice(device));
  return CreateCudaPoolMemory(index, pool.layout.BlockBytes(), pool.num_blocks);
}

// TLS credentials from the PEM files; INVALID_ARGUMENT naming a file that cannot be read.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> TlsCredentials(
    const TlsServerOptions& tls) {
  if (tls.key_file.empty()) return absl::InvalidArgumentError("TLS needs a key file (--tls_key)");
  grpc::SslServerCredentialsOptions ssl;
  grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
  ASSIGN_OR_RETURN(pair.cert_chain, ReadPemFile(tls.cert_file, "TLS certificate"));
  ASSIGN_OR_RETURN(pair.private_key, ReadPemFile(tls.key_file, "TLS key"));
  ssl.pem_key_cert_pairs.push_back(std::move(pair));
  if (!tls.client_ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile(tls.client_ca_file, "TLS client CA"));
    ssl.client_certificate_request = GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY;
  }
  return grpc::SslServerCredentials(ssl);
}

// Keeps a server builder from adding gRPC's reflection service, which registers itself with every
// builder of the process: the health-only port must serve nothing but health.
class WithoutReflection final : public grpc::ServerBuilderOption {
 public:
  void UpdateArguments(grpc::ChannelArguments*) override {}
  void UpdatePlugins(std::vector<std::unique_ptr<grpc::ServerBuilderPlugin>>* plugins) override {
    plugins->erase(std::remove_if(plugins->begin(), plugins->end(),
                                  [](const std::unique_ptr<grpc::ServerBuilderPlugin>& plugin) {
                                    return plugin->name() == "proto_server_reflection";
                                  }),
                   plugins->end());
  }
};

absl::Status ValidateCallLimits(const DaemonOptions& options) {
  const CallLimitOptions& limits = options.call_limits;
  if (limits.max_streams_per_connection == 0 || limits.max_streams == 0 ||
      limits.max_put_bytes_per_connection == 0 || limits.max_put_bytes == 0) {
    return absl::InvalidArgumentError(
        "--max_streams_per_connection, --max_streams, --max_put_bytes_per_connection and "
        "--max_put_bytes must each be at least 1");
  }
  if (options.max_calls_per_connection <= 0 ||
      static_cast<uint32_t>(options.max_calls_per_connection) <=
          limits.max_streams_per_connection) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max_calls_per_connection (", options.max_calls_per_connection,
        ") must exceed --max_streams_per_connection (", limits.max_streams_per_connection,
        "), so a connection's streams leave room for its other calls"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status Daemon::StartHealthServer(const std::string& listen) {
  grpc::ServerBuilder builder;
  builder.SetOption(std::make_unique<WithoutReflection>());
  unimplemented_ = std::make_unique<grpc::CallbackGenericService>();
  builder.RegisterCallbackGenericService(unimplemented_.get());
  int bound_port = 0;
  builder.AddListeningPort(listen, grpc::InsecureServerCredentials(), &bound_port);
  health_server_ = builder.BuildAndStart();
  if (health_server_ == nullptr || bound_port == 0) {
    health_server_.reset();
    return absl::UnavailableError(absl::StrCat("cannot listen for health checks on ", listen));
  }
  health_address_ = listen;
  if (absl::EndsWith(listen, ":0")) {
    health_address_ = absl::StrCat(listen.substr(0, listen.size() - 1), bound_port);
  }
  absl::MutexLock lock(&health_mu_);
  port_health_ = health_server_->GetHealthCheckService();
  if (port_health_ != nullptr) port_health_->SetServingStatus(kServiceName, true);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  auto daemon = std::unique_ptr<Daemon>(new Daemon());
  daemon->address_ = options.listen;
  daemon->identities_path_ = options.identities_path;
  const bool unix_socket = absl::StartsWith(options.listen, kUnixScheme);
  if (!unix_socket && !options.tcp_listen.empty()) {
    return absl::InvalidArgumentError(
        "a second TCP address (--tcp_listen) goes with a unix:// listen address");
  }
  const std::string& tcp_address = unix_socket ? options.tcp_listen : options.listen;
  std::shared_ptr<grpc::ServerCredentials> tcp_credentials;
  if (!options.tls.cert_file.empty() && !tcp_address.empty()) {
    ASSIGN_OR_RETURN(tcp_credentials, TlsCredentials(options.tls));
  } else if (options.allow_insecure_tcp) {
    tcp_credentials = grpc::InsecureServerCredentials();
  } else if (!tcp_address.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP address ", tcp_address,
                     " needs TLS (--tls_cert and --tls_key), or --insecure to listen without it "
                     "(loopback and trusted networks only)"));
  }
  if (unix_socket) {
    if ((options.socket_mode & 0077) != 0 && options.identities_path.empty()) {
      return absl::InvalidArgumentError(
          "a Unix socket open to other users needs an identity file (--identities) to tell "
          "them apart");
    }
    daemon->socket_path_ = options.listen.substr(kUnixScheme.size());
  }
  if (options.pools.empty()) return absl::InvalidArgumentError("no pools configured");
  RETURN_IF_ERROR(ValidateCallLimits(options));
  RETURN_IF_ERROR(ValidatePoolNames(options.pools));

  const uint64_t epoch = CacheManager::NewEpoch();
  if (options.kv_events_buffer == 0) {
    return absl::InvalidArgumentError("the KV event buffer needs room for at least one event");
  }
  daemon->manager_ =
      std::make_unique<CacheManager>(options.session_limits, options.clock, epoch,
                                     options.kv_events_buffer, options.record_kv_events);
  daemon->manager_->SetSessionEndedListener(
      [leases = &daemon->stream_leases_](uint64_t session_id) {
        leases->SessionEnded(session_id);
      });
  if (!options.identities_path.empty()) RETURN_IF_ERROR(daemon->ReloadIdentities());
  const std::string shm_owner = ShmOwner(options.listen, daemon->socket_path_, epoch);
  for (const PoolOptions& pool : options.pools) {
    ASSIGN_OR_RETURN(std::unique_ptr<PoolMemory> memory,
                     CreatePoolMemory(options.device, pool, shm_owner));
    if (options.wrap_pool_memory) memory = options.wrap_pool_memory(pool, std::move(memory));
    RETURN_IF_ERROR(daemon->manager_->AddPool(pool, std::move(memory)));
  }
  // After the pools: a daemon that found its names held by a live one (ALREADY_EXISTS) has
  // stopped without removing that one's socket.
  if (unix_socket) RETURN_IF_ERROR(PrepareSocketPath(daemon->socket_path_, options.socket_mode));

  if (!options.kv_events.endpoint.empty()) {
    ASSIGN_OR_RETURN(daemon->zmq_publisher_,
                     ZmqEventPublisher::Start(&daemon->manager_->events(), options.kv_events));
  }

  grpc::EnableDefaultHealthCheckService(true);
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  if (!options.health_listen.empty()) {
    RETURN_IF_ERROR(daemon->StartHealthServer(options.health_listen));
  }
  grpc::ServerBuilder builder;
  int bound_port = 0;
  if (!tcp_address.empty()) builder.AddListeningPort(tcp_address, tcp_credentials, &bound_port);
  if (unix_socket) {
    ASSIGN_OR_RETURN(daemon->unix_listener_,
                     UnixListener::Bind(daemon->socket_path_, options.socket_mode));
  }
  daemon->authenticator_ =
      std::make_unique<Authenticator>(&daemon->identities_, daemon->unix_listener_.get());
  daemon->call_limits_ = std::make_unique<CallLimits>(options.call_limits);
  daemon->service_ = std::make_unique<KvCacheService>(
      daemon->manager_.get(), &daemon->stream_leases_, daemon->authenticator_.get(),
      daemon->call_limits_.get(), options.max_message_bytes);
  builder.RegisterService(daemon->service_.get());
  std::vector<std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>> interceptors;
  if (!options.metrics_listen.empty()) {
    daemon->rpc_metrics_ = std::make_unique<RpcMetrics>();
    interceptors.push_back(daemon->rpc_metrics_->InterceptorFactory());
    Daemon* raw = daemon.get();
    daemon->metrics_ = std::make_shared<DaemonMetrics>(
        daemon->manager_.get(), daemon->rpc_metrics_.get(), daemon->call_limits_.get(),
        [raw]() -> uint64_t {
          return raw->zmq_publisher_ == nullptr ? 0 : raw->zmq_publisher_->published();
        });
    ASSIGN_OR_RETURN(daemon->metrics_server_,
                     MetricsHttpServer::Start(options.metrics_listen, daemon->metrics_));
    daemon->metrics_address_ = daemon->metrics_server_->address();
  }
  if (options.testing_interceptors) {
    for (auto& interceptor : options.testing_interceptors()) {
      interceptors.push_back(std::move(interceptor));
    }
  }
  if (!interceptors.empty()) builder.experimental().SetInterceptorCreators(std::move(interceptors));
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, options.max_calls_per_connection);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kHttp2WindowBytes);
  daemon->server_ = builder.BuildAndStart();
  if (daemon->server_ == nullptr || (!tcp_address.empty() && bound_port == 0)) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", tcp_address));
  }
  // Before the Unix listener hands over its first connection, so no health check sees the
  // service unknown.
  {
    absl::MutexLock lock(&daemon->health_mu_);
    daemon->health_ = daemon->server_->GetHealthCheckService();
    if (daemon->health_ != nullptr) daemon->health_->SetServingStatus(kServiceName, true);
  }
  const std::string bound_tcp_address =
      absl::EndsWith(tcp_address, ":0")
          ? absl::StrCat(tcp_address.substr(0, tcp_address.size() - 1), bound_port)
          : tcp_address;
  if (daemon->unix_listener_ != nullptr) {
    daemon->tcp_address_ = bound_tcp_address;
    daemon->unix_listener_->Serve(daemon->server_.get());
  } else {
    daemon->address_ = bound_tcp_address;
  }
  if (!tcp_address.empty() && options.tls.cert_file.empty()) {
    daemon->plaintext_tcp_address_ = bound_tcp_address;
  }
  // Installed after serving started: a fault latched before this runs the listener right here.
  Daemon* raw = daemon.get();
  daemon->manager_->device_faults().SetListener(
      [raw](const absl::Status&) { raw->ReportNotServing(); });
  daemon->manager_->StartReaper(options.reaper_period);
  return daemon;
}

absl::Status Daemon::ReloadIdentities() {
  if (identities_path_.empty()) {
    return absl::FailedPreconditionError("the daemon runs without an identity file");
  }
  ASSIGN_OR_RETURN(IdentityFile file, LoadIdentityFile(identities_path_));
  manager_->quotas().SetLimits(file.limits);
  identities_.Install(std::move(file));
  return absl::OkStatus();
}

void Daemon::ReportNotServing() {
  absl::MutexLock lock(&health_mu_);
  // Every service, "" included. gRPC ignores updates after its own shutdown set NOT_SERVING.
  if (health_ != nullptr) health_->SetServingStatus(false);
  if (port_health_ != nullptr) port_health_->SetServingStatus(false);
}

void Daemon::Drain() {
  ReportNotServing();
  manager_->sessions().StopOpening();
}

void Daemon::Shutdown(absl::Duration grace) {
  if (server_ == nullptr) return;
  manager_->device_faults().SetListener(nullptr);
  {
    absl::MutexLock lock(&health_mu_);
    health_ = nullptr;
  }
  metrics_server_.reset();
  if (zmq_publisher_ != nullptr) zmq_publisher_->Stop();
  service_->StopWatchers();
  if (unix_listener_ != nullptr) unix_listener_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
  if (!socket_path_.empty()) unlink(socket_path_.c_str());
  {
    absl::MutexLock lock(&health_mu_);
    port_health_ = nullptr;
  }
  if (health_server_ != nullptr) health_server_->Shutdown(std::chrono::system_clock::now());
}

Daemon::~Daemon() { Shutdown(absl::ZeroDuration()); }

}  // namespace kvcache
