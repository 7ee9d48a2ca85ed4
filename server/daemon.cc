#include "server/daemon.h"

#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_builder.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cache/cuda_pool_memory.h"
#include "common/cuda/cuda_device.h"
#include "common/rpc/http2_tuning.h"
#include "common/status_macros.h"

namespace kvcache {
namespace {

constexpr absl::string_view kUnixScheme = "unix://";
// The name gRPC health clients ask about besides "" (the whole server).
constexpr char kServiceName[] = "kvcache.v1.KvCache";

absl::Status PrepareSocketPath(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos && slash > 0) {
    const std::string dir = path.substr(0, slash);
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::UnavailableError(
          absl::StrCat("cannot create socket directory ", dir, ": ", std::strerror(errno)));
    }
  }
  // A socket left by a daemon that died would make the bind fail.
  struct stat info;
  if (lstat(path.c_str(), &info) == 0 && S_ISSOCK(info.st_mode)) unlink(path.c_str());
  return absl::OkStatus();
}

// Memory that workers on this node map in place: shared host memory or a CUDA IPC export.
absl::StatusOr<std::unique_ptr<PoolMemory>> CreatePoolMemory(const std::string& device,
                                                             const PoolOptions& pool,
                                                             uint64_t epoch) {
  if (device == "host") {
    return HostPoolMemory::CreateShared(ShmNameFor(pool.name, epoch), pool.layout.BlockBytes(),
                                        pool.num_blocks);
  }
  ASSIGN_OR_RETURN(int index, ParseCudaDevice(device));
  return CreateCudaPoolMemory(index, pool.layout.BlockBytes(), pool.num_blocks);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Daemon>> Daemon::Start(const DaemonOptions& options) {
  auto daemon = std::unique_ptr<Daemon>(new Daemon());
  daemon->address_ = options.listen;
  if (absl::StartsWith(options.listen, kUnixScheme)) {
    daemon->socket_path_ = options.listen.substr(kUnixScheme.size());
    RETURN_IF_ERROR(PrepareSocketPath(daemon->socket_path_));
  } else if (!options.allow_insecure_tcp) {
    return absl::InvalidArgumentError(
        absl::StrCat("TCP address ", options.listen,
                     " needs TLS, which this build does not configure; pass --insecure to listen "
                     "without it (loopback and trusted networks only)"));
  }
  if (options.pools.empty()) return absl::InvalidArgumentError("no pools configured");

  const uint64_t epoch = CacheManager::NewEpoch();
  daemon->manager_ = std::make_unique<CacheManager>(options.session_limits, options.clock, epoch);
  for (const PoolOptions& pool : options.pools) {
    ASSIGN_OR_RETURN(std::unique_ptr<PoolMemory> memory,
                     CreatePoolMemory(options.device, pool, epoch));
    if (options.wrap_pool_memory) memory = options.wrap_pool_memory(pool, std::move(memory));
    RETURN_IF_ERROR(daemon->manager_->AddPool(pool, std::move(memory)));
  }
  daemon->service_ =
      std::make_unique<KvCacheService>(daemon->manager_.get(), options.max_message_bytes);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  int bound_port = 0;
  if (daemon->socket_path_.empty()) {
    builder.AddListeningPort(options.listen, grpc::InsecureServerCredentials(), &bound_port);
  } else {
    ASSIGN_OR_RETURN(daemon->unix_listener_, UnixListener::Bind(daemon->socket_path_));
  }
  builder.RegisterService(daemon->service_.get());
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.SetMaxSendMessageSize(options.max_message_bytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kHttp2WindowBytes);
  daemon->server_ = builder.BuildAndStart();
  if (daemon->server_ == nullptr) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", options.listen));
  }
  // Before the Unix listener hands over its first connection, so no health check sees the
  // service unknown.
  {
    absl::MutexLock lock(&daemon->health_mu_);
    daemon->health_ = daemon->server_->GetHealthCheckService();
    if (daemon->health_ != nullptr) daemon->health_->SetServingStatus(kServiceName, true);
  }
  if (daemon->unix_listener_ != nullptr) {
    daemon->unix_listener_->Serve(daemon->server_.get());
  } else if (bound_port != 0 && absl::EndsWith(options.listen, ":0")) {
    daemon->address_ =
        absl::StrCat(options.listen.substr(0, options.listen.size() - 1), bound_port);
  }
  // Installed after serving started: a fault latched before this runs the listener right here.
  Daemon* raw = daemon.get();
  daemon->manager_->device_faults().SetListener(
      [raw](const absl::Status&) { raw->ReportNotServing(); });
  daemon->manager_->StartReaper(options.reaper_period);
  return daemon;
}

void Daemon::ReportNotServing() {
  absl::MutexLock lock(&health_mu_);
  // Every service, "" included. gRPC ignores updates after its own shutdown set NOT_SERVING.
  if (health_ != nullptr) health_->SetServingStatus(false);
}

void Daemon::Shutdown(absl::Duration grace) {
  if (server_ == nullptr) return;
  manager_->device_faults().SetListener(nullptr);
  {
    absl::MutexLock lock(&health_mu_);
    health_ = nullptr;
  }
  if (unix_listener_ != nullptr) unix_listener_->Stop();
  server_->Shutdown(std::chrono::system_clock::now() + absl::ToChronoMilliseconds(grace));
  if (!socket_path_.empty()) unlink(socket_path_.c_str());
}

Daemon::~Daemon() { Shutdown(absl::ZeroDuration()); }

}  // namespace kvcache
