#include "client/kv_cache_client.h"

#include <arpa/inet.h>
#include <grpcpp/channel.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>
#include <netinet/in.h>

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "client/page_releases.h"
#include "client/proto_convert.h"
#include "client/read_file.h"
#include "common/rpc/grpc_status.h"
#include "common/rpc/http2_tuning.h"
#include "common/rpc/manifest_proto.h"
#include "common/rpc/socket_send_buffer.h"
#include "common/status_macros.h"
#include "common/task_workers.h"

namespace kvcache {
namespace {

// A daemon on the same machine restarts in well under a second; the default 1 s first backoff
// (growing to 120 s) would keep a client away from it for much longer than the restart takes.
constexpr int kInitialReconnectBackoffMs = 100;
constexpr int kMaxReconnectBackoffMs = 2000;
// The destructor's CloseSession must not hold up shutdown for a full rpc_timeout.
constexpr absl::Duration kCloseOnDestroyTimeout = absl::Seconds(1);

// The daemon's epoch from an error reply's trailing metadata; 0 when absent.
uint64_t EpochFromTrailers(const grpc::ClientContext& context) {
  const auto& trailers = context.GetServerTrailingMetadata();
  auto it = trailers.find(std::string(kEpochMetadataKey));
  uint64_t epoch = 0;
  if (it == trailers.end() ||
      !absl::SimpleAtoi(absl::string_view(it->second.data(), it->second.size()), &epoch)) {
    return 0;
  }
  return epoch;
}

// Local sockets: nothing to encrypt, and no host name to verify a certificate against.
bool IsUnixTarget(absl::string_view target) {
  return absl::StartsWith(target, "unix:") || absl::StartsWith(target, "unix-abstract:");
}

// The PEM text of `path`. INVALID_ARGUMENT naming the file (never its contents: it may be a
// private key) when it cannot be read or holds no PEM block; an empty CA file must not fall back
// to gRPC's default roots unnoticed.
absl::StatusOr<std::string> ReadPemFile(absl::string_view what, const std::string& path) {
  absl::StatusOr<std::string> text = ReadFileToString(path);
  if (!text.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("TLS ", what, " file: ", text.status().message()));
  }
  if (!absl::StrContains(*text, "-----BEGIN ")) {
    return absl::InvalidArgumentError(
        absl::StrCat("the TLS ", what, " file '", path, "' holds no PEM block"));
  }
  return text;
}

// Insecure credentials without TLS; with it, SSL credentials from `tls`'s files, and the name to
// verify the daemon's certificate against in `args`.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> ChannelCredentials(
    const std::string& target, const ClientTlsOptions& tls, grpc::ChannelArguments* args) {
  if (!tls.enabled) return grpc::InsecureChannelCredentials();
  if (IsUnixTarget(target)) {
    return absl::InvalidArgumentError(absl::StrCat("TLS is for TCP targets; ", target,
                                                   " is a local socket: connect without TLS"));
  }
  if (tls.cert_file.empty() != tls.key_file.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("a TLS client certificate goes with its key: certificate file '",
                     tls.cert_file, "', key file '", tls.key_file, "'"));
  }
  grpc::SslCredentialsOptions ssl;
  if (!tls.ca_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_root_certs, ReadPemFile("CA", tls.ca_file));
  }
  if (!tls.cert_file.empty()) {
    ASSIGN_OR_RETURN(ssl.pem_cert_chain, ReadPemFile("certificate", tls.cert_file));
    ASSIGN_OR_RETURN(ssl.pem_private_key, ReadPemFile("key", tls.key_file));
  }
  if (!tls.server_name.empty()) args->SetSslTargetNameOverride(tls.server_name);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::SslCredentials(ssl);
  if (credentials == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("gRPC refused the TLS files for ", target,
                                                   ": CA '", tls.ca_file, "', certificate '",
                                                   tls.cert_file, "', key '", tls.key_file, "'"));
  }
  return credentials;
}

// The host of a gRPC TCP target ("dns:///h:p", "dns:h:p", "ipv4:h:p", "ipv6:[h]:p", "[h]:p",
// "h:p", "h"), brackets removed.
absl::string_view TargetHost(absl::string_view target) {
  for (absl::string_view scheme : {"dns:", "ipv4:", "ipv6:"}) {
    if (absl::ConsumePrefix(&target, scheme)) break;
  }
  if (absl::ConsumePrefix(&target, "//")) {  // an authority ("dns://8.8.8.8/host:port")
    const size_t slash = target.find('/');
    target = slash == absl::string_view::npos ? "" : target.substr(slash + 1);
  }
  if (absl::ConsumePrefix(&target, "[")) return target.substr(0, target.find(']'));
  // One colon: host:port; more: a bare IPv6 address, kept whole.
  const size_t colon = target.find(':');
  if (colon != absl::string_view::npos && target.find(':', colon + 1) == absl::string_view::npos) {
    return target.substr(0, colon);
  }
  return target;
}

// A plaintext TCP channel shows the token to everyone on the path; loopback never leaves the
// machine. INVALID_ARGUMENT (naming the target and the option, never the token) otherwise.
absl::Status CheckTokenTransport(const std::string& target, const ClientOptions& options) {
  if (options.bearer_token.empty() || options.tls.enabled || options.allow_plaintext_token ||
      IsUnixTarget(target) || IsLoopbackTarget(target)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "refusing to send the bearer token over plaintext TCP to ", target,
      ", which is not a loopback address: use TLS (--tls), or allow it on a trusted network "
      "with --allow_plaintext_token (ClientOptions::allow_plaintext_token)"));
}

}  // namespace

bool IsLoopbackTarget(absl::string_view target) {
  if (IsUnixTarget(target)) return false;
  const std::string host(TargetHost(target));
  if (absl::EqualsIgnoreCase(host, "localhost")) return true;
  in_addr ipv4{};
  if (inet_pton(AF_INET, host.c_str(), &ipv4) == 1) {
    return (ntohl(ipv4.s_addr) >> 24) == 127;
  }
  in6_addr ipv6{};
  if (inet_pton(AF_INET6, host.c_str(), &ipv6) == 1) {
    if (IN6_IS_ADDR_LOOPBACK(&ipv6)) return true;
    return IN6_IS_ADDR_V4MAPPED(&ipv6) && ipv6.s6_addr[12] == 127;
  }
  return false;
}

absl::Status CheckBearerToken(absl::string_view token) {
  // gRPC sends a header value only if it is printable ASCII, and aborts the process on another.
  for (const unsigned char c : token) {
    if (c < 0x21 || c > 0x7e) {
      // Neither the token nor the character: a secret stays out of errors.
      return absl::InvalidArgumentError(
          "the bearer token holds a character that cannot go in a gRPC header "
          "(only visible ASCII, no spaces)");
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<grpc::Channel>> CreateDaemonChannel(const std::string& target,
                                                                   const ClientOptions& options) {
  RETURN_IF_ERROR(CheckBearerToken(options.bearer_token));
  RETURN_IF_ERROR(CheckTokenTransport(target, options));
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(options.max_message_bytes);
  args.SetMaxSendMessageSize(options.max_message_bytes);
  args.SetInt(GRPC_ARG_HTTP2_MAX_FRAME_SIZE, kHttp2FrameBytes);
  args.SetInt(GRPC_ARG_HTTP2_STREAM_LOOKAHEAD_BYTES, kHttp2WindowBytes);
  // Puts send MiBs: a Unix socket's default 208 KiB send buffer had them go out in ~200 KiB turns.
  SetConnectionSendBuffer(&args, kBlockStreamSendBufferBytes);
  // GRPC_ARG_MIN_RECONNECT_BACKOFF_MS stays gRPC's: 1.51 takes it as the shortest time a
  // connection attempt may take, handshake included, and a short one makes attempts to a daemon
  // that is just starting (or a loaded machine) time out "before receiving SETTINGS frame".
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, kInitialReconnectBackoffMs);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, kMaxReconnectBackoffMs);
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::ChannelCredentials> credentials,
                   ChannelCredentials(target, options.tls, &args));
  std::shared_ptr<grpc::Channel> channel = grpc::CreateCustomChannel(target, credentials, args);
  if (channel == nullptr) return absl::InvalidArgumentError(absl::StrCat("bad target ", target));
  return channel;
}

absl::Status WaitForDaemon(grpc::Channel& channel, const std::string& target,
                           const ClientOptions& options) {
  if (!channel.WaitForConnected(absl::ToChronoTime(absl::Now() + options.connect_timeout))) {
    return absl::UnavailableError(absl::StrCat(
        "cannot connect to the kvcache daemon at ", target, " within ",
        absl::FormatDuration(options.connect_timeout),
        options.tls.enabled ? " (over TLS: is the daemon's certificate trusted and named as the "
                              "target, and is the client certificate one it accepts?)"
                            : ""));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvCacheClient>> KvCacheClient::Connect(std::string target,
                                                                      ClientOptions options) {
  ASSIGN_OR_RETURN(std::shared_ptr<grpc::Channel> channel, CreateDaemonChannel(target, options));
  RETURN_IF_ERROR(WaitForDaemon(*channel, target, options));
  return std::make_unique<KvCacheClient>(std::move(channel), std::move(options));
}

KvCacheClient::KvCacheClient(std::shared_ptr<grpc::ChannelInterface> channel, ClientOptions options)
    : stub_(v1::KvCache::NewStub(channel)),
      generic_stub_(std::move(channel)),
      options_(std::move(options)),
      authorization_(
          options_.bearer_token.empty() ? "" : absl::StrCat("Bearer ", options_.bearer_token)),
      page_releases_(std::make_unique<PageReleases>(this)) {}

KvCacheClient::~KvCacheClient() {
  page_releases_.reset();  // before the session closes: that releases what it had queued
  absl::MutexLock lifecycle(&lifecycle_mu_);
  StopKeepAlive();
  SessionRef session;
  {
    absl::MutexLock lock(&mu_);
    if (!session_open_ || epoch_changed_ || session_lost_) return;
    session = session_;
    session_open_ = false;
  }
  v1::CloseSessionRequest request;
  StampSession(session, &request);
  v1::CloseSessionResponse response;
  grpc::ClientContext context;
  context.set_deadline(
      absl::ToChronoTime(absl::Now() + std::min(options_.rpc_timeout, kCloseOnDestroyTimeout)));
  AddCredentials(&context);
  // Best effort: if it fails the lease simply runs out.
  stub_->CloseSession(&context, request, &response).IgnoreError();
}

void KvCacheClient::PrepareContext(grpc::ClientContext* context, absl::Duration timeout) const {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  context->set_wait_for_ready(options_.wait_for_ready);
  AddCredentials(context);
}

void KvCacheClient::AddCredentials(grpc::ClientContext* context) const {
  if (!authorization_.empty()) context->AddMetadata("authorization", authorization_);
}

KvCacheClient::SessionRef KvCacheClient::CurrentSession() const {
  absl::MutexLock lock(&mu_);
  return session_;
}

absl::StatusOr<KvCacheClient::SessionRef> KvCacheClient::RequireSession(const char* call) const {
  absl::MutexLock lock(&mu_);
  if (!session_open_) {
    return absl::FailedPreconditionError(
        absl::StrCat(call, " needs an open session: call OpenSession first"));
  }
  return session_;
}

absl::Status KvCacheClient::CheckReply(const char* name, const grpc::ClientContext& context,
                                       const grpc::Status& grpc_status, uint64_t reply_epoch,
                                       const SessionRef& session, bool session_call) {
  const absl::Status status = FromGrpcStatus(grpc_status);
  if (!status.ok()) {
    // Only a request that carried an epoch can be fenced; the code is passed on unchanged.
    if (session_call && session.epoch != 0 &&
        status.code() == absl::StatusCode::kFailedPrecondition) {
      // A reply stamped with the session's own epoch failed for another reason (streams carry
      // no stamp: their FAILED_PRECONDITION is taken as a restart).
      const uint64_t new_epoch = EpochFromTrailers(context);
      if (new_epoch != session.epoch) NoteEpochChange(session, new_epoch);
    } else if (session_call && status.code() == absl::StatusCode::kAborted) {
      NoteSessionLost(session, status);
    }
    return status;
  }
  if (session.epoch != 0 && reply_epoch != session.epoch) {
    NoteEpochChange(session, reply_epoch);
    return absl::FailedPreconditionError(absl::StrCat(
        name, ": the kvcache daemon restarted (epoch ", session.epoch, " is now ", reply_epoch,
        "); this client's session, sequences and block ids are gone: "
        "open a new session and recompute"));
  }
  return absl::OkStatus();
}

void KvCacheClient::NoteEpochChange(const SessionRef& session, uint64_t new_epoch) {
  {
    absl::MutexLock lock(&mu_);
    // Already seen, or a reply about a session that has since been replaced.
    if (epoch_changed_ || session_.session_id != session.session_id ||
        session_.epoch != session.epoch) {
      return;
    }
    epoch_changed_ = true;
  }
  if (options_.on_epoch_change) options_.on_epoch_change(session.epoch, new_epoch);
}

void KvCacheClient::NoteSessionLost(const SessionRef& session, const absl::Status& status) {
  {
    absl::MutexLock lock(&mu_);
    // A session the user closed is not lost; its ABORTED answers are expected.
    if (session_lost_ || !session_open_ || session_.session_id != session.session_id ||
        session_.epoch != session.epoch) {
      return;
    }
    session_lost_ = true;
  }
  if (options_.on_session_lost) options_.on_session_lost(status);
}

absl::StatusOr<uint64_t> KvCacheClient::Ping() {
  v1::PingResponse response;
  RETURN_IF_ERROR(Call(&v1::KvCache::StubInterface::Ping, "Ping", v1::PingRequest(), &response,
                       CurrentSession(), false));
  return response.epoch();
}

absl::StatusOr<KvCacheClient::ServerVersion> KvCacheClient::GetServerVersion() {
  v1::PingResponse response;
  RETURN_IF_ERROR(Call(&v1::KvCache::StubInterface::Ping, "Ping", v1::PingRequest(), &response,
                       CurrentSession(), false));
  return ServerVersion{.version = response.server_version(),
                       .revision = response.server_revision()};
}

absl::StatusOr<std::vector<KvCacheClient::PoolInfo>> KvCacheClient::ListPools() {
  v1::ListPoolsResponse response;
  RETURN_IF_ERROR(Call(&v1::KvCache::StubInterface::ListPools, "ListPools", v1::ListPoolsRequest(),
                       &response, CurrentSession(), false));
  std::vector<PoolInfo> pools;
  for (const v1::PoolInfo& pool : response.pools()) pools.push_back(ToPoolInfo(pool));
  return pools;
}

absl::StatusOr<KvCacheClient::PoolDescription> KvCacheClient::DescribePool(absl::string_view pool) {
  v1::DescribePoolRequest request;
  request.set_pool(std::string(pool));
  v1::DescribePoolResponse response;
  RETURN_IF_ERROR(Call(&v1::KvCache::StubInterface::DescribePool, "DescribePool", request,
                       &response, CurrentSession(), false));
  PoolDescription description{.pool = ToPoolInfo(response.pool()),
                              .counts = ToBlockCounts(response.counts()),
                              .epoch = response.epoch()};
  for (const v1::ManifestInUse& use : response.manifests()) {
    description.manifests.push_back(ManifestInUse{.digest = use.digest(),
                                                  .tenant = use.tenant(),
                                                  .manifest = ToManifestFields(use.manifest()),
                                                  .sessions = use.sessions()});
  }
  return description;
}

absl::StatusOr<KvCacheClient::LookupResult> KvCacheClient::Lookup(
    absl::string_view pool, absl::string_view tenant, absl::Span<const uint32_t> tokens,
    absl::string_view cache_salt, const ExtraKeys& extra_keys,
    const std::optional<ManifestFields>& manifest, absl::Span<const std::string> restore_parts) {
  v1::LookupRequest request;
  request.mutable_restore_parts()->Add(restore_parts.begin(), restore_parts.end());
  if (manifest.has_value()) ToProto(*manifest, request.mutable_manifest());
  request.set_pool(std::string(pool));
  request.set_tenant(std::string(tenant));
  request.mutable_tokens()->Add(tokens.begin(), tokens.end());
  request.set_cache_salt(std::string(cache_salt));
  FillExtraKeys(extra_keys, request.mutable_extra_keys());
  v1::LookupResponse response;
  RETURN_IF_ERROR(Call(&v1::KvCache::StubInterface::Lookup, "Lookup", request, &response,
                       CurrentSession(), false));
  return LookupResult{.num_cached_tokens = response.num_cached_tokens(),
                      .num_cached_blocks = response.num_cached_blocks(),
                      .cached_tokens_by_tier = ToTierTokens(response.cached_tokens_by_tier()),
                      .part_masks = ToVector(response.part_masks())};
}

absl::StatusOr<KvCacheClient::Stats> KvCacheClient::GetStats(absl::string_view pool) {
  v1::GetStatsRequest request;
  request.set_pool(std::string(pool));
  v1::GetStatsResponse response;
  RETURN_IF_ERROR(Call(&v1::KvCache::StubInterface::GetStats, "GetStats", request, &response,
                       CurrentSession(), false));
  Stats stats;
  for (const v1::PoolStats& pool_stats : response.pools()) {
    stats.pools.push_back(ToPoolStats(pool_stats));
  }
  stats.open_sessions = response.open_sessions();
  return stats;
}

absl::StatusOr<std::vector<KvCacheClient::ListedSession>> KvCacheClient::ListSessions(
    absl::string_view tenant) {
  v1::ListSessionsRequest request;
  request.set_tenant(std::string(tenant));
  v1::ListSessionsResponse response;
  RETURN_IF_ERROR(Call(&v1::KvCache::StubInterface::ListSessions, "ListSessions", request,
                       &response, CurrentSession(), false));
  std::vector<ListedSession> sessions;
  for (const v1::SessionInfo& info : response.sessions()) {
    sessions.push_back(ListedSession{.session_id = info.session_id(),
                                     .tenant = info.tenant(),
                                     .principal = info.principal(),
                                     .client_name = info.client_name(),
                                     .ttl = absl::Milliseconds(info.ttl_ms()),
                                     .expires_in = absl::Milliseconds(info.expires_in_ms()),
                                     .open_sequences = info.open_sequences()});
  }
  return sessions;
}

std::unique_ptr<EventWatch> KvCacheClient::WatchEvents(const WatchOptions& options) {
  auto watch = std::unique_ptr<EventWatch>(new EventWatch());
  watch->context_.set_wait_for_ready(options_.wait_for_ready);
  AddCredentials(&watch->context_);
  v1::WatchEventsRequest request;
  request.set_start_sequence(options.start_sequence);
  request.set_epoch(options.epoch);
  request.set_tenant(options.tenant);
  request.set_pool(options.pool);
  watch->reader_ = stub_->WatchEvents(&watch->context_, request);
  return watch;
}

absl::StatusOr<v1::WatchEventsResponse> EventWatch::Next() {
  if (!finished_) {
    v1::WatchEventsResponse response;
    if (reader_->Read(&response)) return response;
    final_status_ = FromGrpcStatus(reader_->Finish());
    if (final_status_.ok()) final_status_ = absl::UnavailableError("the event stream ended");
    finished_ = true;
  }
  return final_status_;
}

EventWatch::~EventWatch() {
  if (!finished_) {
    context_.TryCancel();
    v1::WatchEventsResponse ignored;
    while (reader_->Read(&ignored)) {
    }
    reader_->Finish();
  }
}

absl::StatusOr<KvCacheClient::SessionInfo> KvCacheClient::OpenSession(
    std::string tenant, std::string client_name, absl::Duration ttl,
    const std::optional<ManifestFields>& manifest) {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  {
    absl::MutexLock lock(&mu_);
    if (session_open_ && !epoch_changed_ && !session_lost_) {
      return absl::AlreadyExistsError(absl::StrCat("session ", session_.session_id,
                                                   " is open; close it before opening another"));
    }
  }
  // A lost or fenced session's keep-alive thread may still be running (transient errors).
  StopKeepAlive();
  v1::OpenSessionRequest request;
  request.set_tenant(std::move(tenant));
  request.set_client_name(std::move(client_name));
  request.set_ttl_ms(static_cast<uint32_t>(std::max<int64_t>(0, absl::ToInt64Milliseconds(ttl))));
  if (manifest.has_value()) ToProto(*manifest, request.mutable_manifest());
  v1::OpenSessionResponse response;
  // No epoch to check against: this call is what sets it.
  RETURN_IF_ERROR(Call(&v1::KvCache::StubInterface::OpenSession, "OpenSession", request, &response,
                       SessionRef(), false));
  const SessionRef session{.session_id = response.session_id(), .epoch = response.epoch()};
  const absl::Duration granted = absl::Milliseconds(response.ttl_ms());
  {
    absl::MutexLock lock(&mu_);
    session_ = session;
    session_open_ = true;
    epoch_changed_ = false;
    session_lost_ = false;
    stop_keepalive_ = false;
  }
  // ttl/3 leaves two more tries before the lease ends if one keep-alive is lost or late.
  const absl::Duration period = std::max(granted / 3, absl::Milliseconds(1));
  keepalive_thread_ = std::thread([this, session, period] { KeepAliveLoop(session, period); });
  return SessionInfo{.session_id = session.session_id, .epoch = session.epoch, .ttl = granted};
}

absl::StatusOr<uint32_t> KvCacheClient::CloseSession() {
  absl::MutexLock lifecycle(&lifecycle_mu_);
  StopKeepAlive();
  v1::CloseSessionRequest request;
  v1::CloseSessionResponse response;
  const absl::Status status = SessionCall(&v1::KvCache::StubInterface::CloseSession, "CloseSession",
                                          CurrentSession(), &request, &response);
  {
    // Closed or not, the user is done with it: ABORTED from here on is expected, not a loss.
    absl::MutexLock lock(&mu_);
    session_open_ = false;
  }
  RETURN_IF_ERROR(status);
  return response.released_sequences();
}

void KvCacheClient::StopKeepAlive() {
  {
    absl::MutexLock lock(&mu_);
    stop_keepalive_ = true;
    if (keepalive_context_ != nullptr) keepalive_context_->TryCancel();
  }
  if (keepalive_thread_.joinable()) keepalive_thread_.join();
}

void KvCacheClient::KeepAliveLoop(SessionRef session, absl::Duration period) {
  v1::KeepAliveRequest request;
  StampSession(session, &request);
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(&stop_keepalive_), period);
      if (stop_keepalive_) return;
    }
    grpc::ClientContext context;
    // A keep-alive must arrive within the lease to matter; waiting longer only delays the next.
    PrepareContext(&context, std::min(options_.rpc_timeout, period * 3));
    {
      absl::MutexLock lock(&mu_);
      if (stop_keepalive_) return;
      keepalive_context_ = &context;
    }
    v1::KeepAliveResponse response;
    const absl::Status status = FromGrpcStatus(stub_->KeepAlive(&context, request, &response));
    {
      absl::MutexLock lock(&mu_);
      keepalive_context_ = nullptr;
      if (stop_keepalive_) return;
    }
    switch (status.code()) {
      case absl::StatusCode::kOk:
        if (response.epoch() != session.epoch) {
          NoteEpochChange(session, response.epoch());
          NoteSessionLost(session, absl::FailedPreconditionError("the kvcache daemon restarted"));
          return;
        }
        break;
      case absl::StatusCode::kFailedPrecondition:
        NoteEpochChange(session, EpochFromTrailers(context));
        NoteSessionLost(session, status);
        return;
      case absl::StatusCode::kAborted:
      case absl::StatusCode::kNotFound:
        NoteSessionLost(session, status);
        return;
      default:
        // UNAVAILABLE, DEADLINE_EXCEEDED...: the daemon may be busy or restarting; a restart
        // shows up as FAILED_PRECONDITION on a later try.
        break;
    }
  }
}

absl::StatusOr<KvCacheClient::Sequence> KvCacheClient::OpenSequence(
    absl::string_view pool, absl::Span<const uint32_t> tokens, absl::string_view cache_salt,
    const ExtraKeys& extra_keys, uint32_t max_load_ms,
    absl::Span<const std::string> restore_parts) {
  const SessionRef session = CurrentSession();
  v1::OpenSequenceRequest request;
  FillPromptRequest(session.session_id, session.epoch, pool, tokens, cache_salt, extra_keys,
                    &request);
  request.set_max_load_ms(max_load_ms);
  request.mutable_restore_parts()->Add(restore_parts.begin(), restore_parts.end());
  v1::OpenSequenceResponse response;
  RETURN_IF_ERROR(Call(&v1::KvCache::StubInterface::OpenSequence, "OpenSequence", request,
                       &response, session, true));
  return Sequence{.sequence_id = response.sequence_id(),
                  .block_ids = ToVector(response.block_ids()),
                  .num_cached_tokens = response.num_cached_tokens(),
                  .cached_tokens_by_tier = ToTierTokens(response.cached_tokens_by_tier()),
                  .part_masks = ToVector(response.part_masks())};
}

absl::StatusOr<KvCacheClient::Extension> KvCacheClient::ExtendSequence(
    uint64_t sequence_id, absl::Span<const uint32_t> tokens) {
  v1::ExtendSequenceRequest request;
  request.set_sequence_id(sequence_id);
  request.mutable_tokens()->Add(tokens.begin(), tokens.end());
  v1::ExtendSequenceResponse response;
  RETURN_IF_ERROR(SessionCall(&v1::KvCache::StubInterface::ExtendSequence, "ExtendSequence",
                              CurrentSession(), &request, &response));
  return Extension{.new_block_ids = ToVector(response.new_block_ids()),
                   .num_tokens = response.num_tokens()};
}

absl::StatusOr<KvCacheClient::Commit> KvCacheClient::CommitSequence(
    uint64_t sequence_id, uint32_t num_written_tokens, absl::Span<const uint32_t> part_masks) {
  v1::CommitSequenceRequest request;
  request.set_sequence_id(sequence_id);
  request.set_num_written_tokens(num_written_tokens);
  request.mutable_part_masks()->Add(part_masks.begin(), part_masks.end());
  v1::CommitSequenceResponse response;
  RETURN_IF_ERROR(SessionCall(&v1::KvCache::StubInterface::CommitSequence, "CommitSequence",
                              CurrentSession(), &request, &response));
  return Commit{.num_committed_blocks = response.num_committed_blocks(),
                .num_published_blocks = response.num_published_blocks()};
}

absl::Status KvCacheClient::ReleaseSequence(uint64_t sequence_id) {
  v1::ReleaseSequenceRequest request;
  request.set_sequence_id(sequence_id);
  v1::ReleaseSequenceResponse response;
  return SessionCall(&v1::KvCache::StubInterface::ReleaseSequence, "ReleaseSequence",
                     CurrentSession(), &request, &response);
}

absl::StatusOr<KvCacheClient::Fork> KvCacheClient::ForkSequence(uint64_t sequence_id) {
  v1::ForkSequenceRequest request;
  request.set_sequence_id(sequence_id);
  v1::ForkSequenceResponse response;
  RETURN_IF_ERROR(SessionCall(&v1::KvCache::StubInterface::ForkSequence, "ForkSequence",
                              CurrentSession(), &request, &response));
  Fork fork{.sequence_id = response.sequence_id(),
            .block_ids = ToVector(response.block_ids()),
            .copied_from_block = std::nullopt};
  if (response.has_copied_from_block()) fork.copied_from_block = response.copied_from_block();
  return fork;
}

absl::Status KvCacheClient::PublishRendezvous(absl::string_view key, absl::string_view value) {
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("PublishRendezvous"));
  v1::PublishRendezvousRequest request;
  request.set_key(std::string(key));
  request.set_value(std::string(value));
  v1::PublishRendezvousResponse response;
  return SessionCall(&v1::KvCache::StubInterface::PublishRendezvous, "PublishRendezvous", session,
                     &request, &response);
}

absl::StatusOr<std::string> KvCacheClient::AwaitRendezvous(absl::string_view key,
                                                           absl::Duration timeout) {
  ASSIGN_OR_RETURN(const SessionRef session, RequireSession("AwaitRendezvous"));
  v1::AwaitRendezvousRequest request;
  StampSession(session, &request);
  request.set_key(std::string(key));
  v1::AwaitRendezvousResponse response;
  // Call() would bound the wait by rpc_timeout; the caller's timeout is the deadline here.
  grpc::ClientContext context;
  PrepareContext(&context, timeout);
  const grpc::Status status = stub_->AwaitRendezvous(&context, request, &response);
  RETURN_IF_ERROR(CheckReply("AwaitRendezvous", context, status, response.epoch(), session, true));
  return std::move(*response.mutable_value());
}

bool KvCacheClient::epoch_changed() const {
  absl::MutexLock lock(&mu_);
  return epoch_changed_;
}

bool KvCacheClient::session_lost() const {
  absl::MutexLock lock(&mu_);
  return session_lost_;
}

uint64_t KvCacheClient::session_id() const { return CurrentSession().session_id; }

uint64_t KvCacheClient::session_epoch() const { return CurrentSession().epoch; }

}  // namespace kvcache
