#include "server/kv_cache_service.h"

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/grpc_status.h"
#include "common/status_macros.h"
#include "common/version.h"
#include "server/block_streams.h"
#include "server/proto_convert.h"
#include "server/unary_call.h"
#include "server/watch_events.h"

namespace kvcache {
namespace {

// Parks until the key has a value; the client's deadline (OnCancel) ends the wait otherwise.
class AwaitRendezvousReactor final : public grpc::ServerUnaryReactor {
 public:
  AwaitRendezvousReactor(RendezvousRegistry* registry, v1::AwaitRendezvousResponse* response)
      : registry_(registry), response_(response) {}

  // Holds `stream`, its place among the daemon's long calls, until done.
  void Start(const std::string& tenant, const std::string& key, CallLimits::Ticket stream) {
    stream_ = std::move(stream);
    absl::StatusOr<uint64_t> ticket =
        registry_->Await(tenant, key, [this](const std::string& value) { Answer(value); });
    if (!ticket.ok()) {
      FinishOnce(ToGrpcStatus(ticket.status()));
      return;
    }
    bool cancelled;
    {
      absl::MutexLock lock(&mu_);
      ticket_ = *ticket;
      cancelled = cancelled_;
    }
    // A cancel that came before the ticket existed could not unpark the waiter: do it now.
    if (cancelled && *ticket != 0 && registry_->Cancel(*ticket)) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "rendezvous wait cancelled"));
    }
  }
  void FinishOnce(const grpc::Status& status) {
    {
      absl::MutexLock lock(&mu_);
      if (finished_) return;
      finished_ = true;
    }
    Finish(status);  // the last touch: OnDone may delete this right after
  }
  void OnCancel() override {
    uint64_t ticket;
    {
      absl::MutexLock lock(&mu_);
      cancelled_ = true;
      ticket = ticket_;
    }
    // Only a waiter still parked can be finished here; otherwise its callback owns the finish.
    if (ticket != 0 && registry_->Cancel(ticket)) {
      FinishOnce(grpc::Status(grpc::StatusCode::CANCELLED, "rendezvous wait cancelled"));
    }
  }
  void OnDone() override { delete this; }

 private:
  void Answer(const std::string& value) {
    response_->set_value(value);
    FinishOnce(grpc::Status::OK);
  }

  RendezvousRegistry* const registry_;
  v1::AwaitRendezvousResponse* const response_;
  CallLimits::Ticket stream_;
  absl::Mutex mu_;
  uint64_t ticket_ ABSL_GUARDED_BY(mu_) = 0;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

absl::StatusOr<Identity> KvCacheService::Caller(const grpc::CallbackServerContext& context,
                                                const char* method, Role needed) const {
  if (context.deadline() <= std::chrono::system_clock::now()) {
    return absl::DeadlineExceededError(absl::StrCat(
        method, ": the call's deadline passed before the daemon got to it; nothing was done"));
  }
  if (context.IsCancelled()) {
    return absl::CancelledError(absl::StrCat(
        method, ": the call was cancelled before the daemon got to it; nothing was done"));
  }
  ASSIGN_OR_RETURN(Identity caller, authenticator_->Authenticate(context));
  RETURN_IF_ERROR(Permit(caller, needed, method));
  return caller;
}

absl::StatusOr<StreamCaller> KvCacheService::StreamCallerFor(
    const grpc::CallbackServerContext& context, const char* method, Role needed) const {
  ASSIGN_OR_RETURN(Identity caller, Caller(context, method, needed));
  ASSIGN_OR_RETURN(CallLimits::Ticket stream, call_limits_->AdmitStream(context.peer(), method));
  return StreamCaller{std::move(caller), std::move(stream)};
}

grpc::ServerUnaryReactor* KvCacheService::Ping(grpc::CallbackServerContext* context,
                                               const v1::PingRequest* request,
                                               v1::PingResponse* response) {
  return HandleUnary(*this, context, response, manager_->epoch(), "Ping", Role::kReader,
                     [&](const Identity&) {
                       response->set_server_version(std::string(Version()));
                       response->set_server_revision(std::string(Revision()));
                       return absl::OkStatus();
                     });
}

grpc::ServerUnaryReactor* KvCacheService::ListPools(grpc::CallbackServerContext* context,
                                                    const v1::ListPoolsRequest* request,
                                                    v1::ListPoolsResponse* response) {
  return HandleUnary(*this, context, response, manager_->epoch(), "ListPools", Role::kReader,
                     [&](const Identity& caller) {
                       for (Pool* pool : manager_->pools())
                         FillPoolInfo(*pool, caller, response->add_pools());
                       return absl::OkStatus();
                     });
}

grpc::ServerUnaryReactor* KvCacheService::DescribePool(grpc::CallbackServerContext* context,
                                                       const v1::DescribePoolRequest* request,
                                                       v1::DescribePoolResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "DescribePool", Role::kReader,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(Pool * pool, manager_->FindPool(request->pool()));
        FillPoolInfo(*pool, caller, response->mutable_pool());
        FillCounts(caller.role == Role::kAdmin ? pool->Stats() : pool->Stats(caller.tenant),
                   response->mutable_counts());
        FillManifestsInUse(*pool, manager_->sessions(),
                           caller.role == Role::kAdmin ? "" : caller.tenant, response);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::OpenSession(grpc::CallbackServerContext* context,
                                                      const v1::OpenSessionRequest* request,
                                                      v1::OpenSessionResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "OpenSession", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(std::string tenant, TenantFor(caller, request->tenant()));
        ASSIGN_OR_RETURN(auto manifest, ManifestOf(*request));
        ASSIGN_OR_RETURN(
            auto session,
            manager_->sessions().Open(caller.principal, std::move(tenant), request->client_name(),
                                      absl::Milliseconds(request->ttl_ms()), std::move(manifest)));
        response->set_session_id(session->id);
        response->set_ttl_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(session->ttl)));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::KeepAlive(grpc::CallbackServerContext* context,
                                                    const v1::KeepAliveRequest* request,
                                                    v1::KeepAliveResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "KeepAlive", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        RETURN_IF_ERROR(
            manager_->SessionFor(request->session_id(), request->epoch(), caller.principal)
                .status());
        return manager_->sessions().KeepAlive(request->session_id());
      });
}

grpc::ServerUnaryReactor* KvCacheService::CloseSession(grpc::CallbackServerContext* context,
                                                       const v1::CloseSessionRequest* request,
                                                       v1::CloseSessionResponse* response) {
  return HandleUnary(*this, context, response, manager_->epoch(), "CloseSession", Role::kWorker,
                     [&](const Identity& caller) -> absl::Status {
                       ASSIGN_OR_RETURN(uint32_t released,
                                        manager_->CloseSession(request->session_id(),
                                                               request->epoch(), caller.principal));
                       response->set_released_sequences(released);
                       return absl::OkStatus();
                     });
}

grpc::ServerUnaryReactor* KvCacheService::OpenSequence(grpc::CallbackServerContext* context,
                                                       const v1::OpenSequenceRequest* request,
                                                       v1::OpenSequenceResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "OpenSequence", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(auto session, manager_->SessionFor(request->session_id(), request->epoch(),
                                                            caller.principal));
        ASSIGN_OR_RETURN(Pool * pool, manager_->FindPool(request->pool()));
        SequenceSpec spec =
            ToSequenceSpec(request->tokens(), request->cache_salt(), request->extra_keys());
        spec.max_load_ms = request->max_load_ms();
        ASSIGN_OR_RETURN(spec.wanted_parts, WantedParts(pool->parts(), request->restore_parts()));
        ASSIGN_OR_RETURN(OpenedSequence opened, pool->Open(*session, spec));
        response->set_sequence_id(opened.sequence_id);
        response->mutable_block_ids()->Add(opened.block_ids.begin(), opened.block_ids.end());
        response->set_num_cached_tokens(opened.num_cached_tokens);
        v1::TierTokens* by_tier = response->mutable_cached_tokens_by_tier();
        by_tier->set_pool(opened.num_cached_tokens - opened.num_host_tier_tokens -
                          opened.num_disk_tier_tokens - opened.num_cluster_tier_tokens);
        by_tier->set_host(opened.num_host_tier_tokens);
        by_tier->set_disk(opened.num_disk_tier_tokens);
        by_tier->set_cluster(opened.num_cluster_tier_tokens);
        response->mutable_part_masks()->Add(opened.part_masks.begin(), opened.part_masks.end());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::ExtendSequence(grpc::CallbackServerContext* context,
                                                         const v1::ExtendSequenceRequest* request,
                                                         v1::ExtendSequenceResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "ExtendSequence", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(auto session, manager_->SessionFor(request->session_id(), request->epoch(),
                                                            caller.principal));
        ASSIGN_OR_RETURN(Pool * pool, manager_->PoolOfSequence(request->sequence_id()));
        ASSIGN_OR_RETURN(
            ExtendedSequence extended,
            pool->Extend(*session, request->sequence_id(),
                         absl::MakeConstSpan(request->tokens().data(), request->tokens_size())));
        response->mutable_new_block_ids()->Add(extended.new_block_ids.begin(),
                                               extended.new_block_ids.end());
        response->set_num_tokens(extended.num_tokens);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::CommitSequence(grpc::CallbackServerContext* context,
                                                         const v1::CommitSequenceRequest* request,
                                                         v1::CommitSequenceResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "CommitSequence", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(auto session, manager_->SessionFor(request->session_id(), request->epoch(),
                                                            caller.principal));
        ASSIGN_OR_RETURN(Pool * pool, manager_->PoolOfSequence(request->sequence_id()));
        ASSIGN_OR_RETURN(
            CommitResult result,
            pool->Commit(
                *session, request->sequence_id(), request->num_written_tokens(),
                absl::MakeConstSpan(request->part_masks().data(), request->part_masks_size())));
        response->set_num_committed_blocks(result.num_committed_blocks);
        response->set_num_published_blocks(result.num_published_blocks);
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::ReleaseSequence(grpc::CallbackServerContext* context,
                                                          const v1::ReleaseSequenceRequest* request,
                                                          v1::ReleaseSequenceResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "ReleaseSequence", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(auto session, manager_->SessionFor(request->session_id(), request->epoch(),
                                                            caller.principal));
        ASSIGN_OR_RETURN(Pool * pool, manager_->PoolOfSequence(request->sequence_id()));
        return pool->Release(*session, request->sequence_id());
      });
}

grpc::ServerUnaryReactor* KvCacheService::ForkSequence(grpc::CallbackServerContext* context,
                                                       const v1::ForkSequenceRequest* request,
                                                       v1::ForkSequenceResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "ForkSequence", Role::kWorker,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(auto session, manager_->SessionFor(request->session_id(), request->epoch(),
                                                            caller.principal));
        ASSIGN_OR_RETURN(Pool * pool, manager_->PoolOfSequence(request->sequence_id()));
        ASSIGN_OR_RETURN(ForkedSequence forked, pool->Fork(*session, request->sequence_id()));
        response->set_sequence_id(forked.sequence_id);
        response->mutable_block_ids()->Add(forked.block_ids.begin(), forked.block_ids.end());
        if (forked.copied_from_block != kNoBlock) {
          response->set_copied_from_block(forked.copied_from_block);
        }
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::Lookup(grpc::CallbackServerContext* context,
                                                 const v1::LookupRequest* request,
                                                 v1::LookupResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "Lookup", Role::kReader,
      [&](const Identity& caller) -> absl::Status {
        ASSIGN_OR_RETURN(std::string tenant, TenantFor(caller, request->tenant()));
        ASSIGN_OR_RETURN(Pool * pool, manager_->FindPool(request->pool()));
        ASSIGN_OR_RETURN(auto manifest, ManifestOf(*request));
        SequenceSpec spec =
            ToSequenceSpec(request->tokens(), request->cache_salt(), request->extra_keys());
        ASSIGN_OR_RETURN(spec.wanted_parts, WantedParts(pool->parts(), request->restore_parts()));
        ASSIGN_OR_RETURN(LookupResult result, pool->Lookup(tenant, spec, manifest.get()));
        response->set_num_cached_tokens(result.num_cached_tokens);
        response->set_num_cached_blocks(result.num_cached_blocks);
        v1::TierTokens* by_tier = response->mutable_cached_tokens_by_tier();
        by_tier->set_pool(result.num_cached_tokens - result.num_host_tier_tokens -
                          result.num_disk_tier_tokens);
        by_tier->set_host(result.num_host_tier_tokens);
        by_tier->set_disk(result.num_disk_tier_tokens);
        response->mutable_part_masks()->Add(result.part_masks.begin(), result.part_masks.end());
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::GetStats(grpc::CallbackServerContext* context,
                                                   const v1::GetStatsRequest* request,
                                                   v1::GetStatsResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "GetStats", Role::kReader,
      [&](const Identity& caller) -> absl::Status {
        // An admin that names no tenant sees the whole daemon; everyone else one tenant.
        std::string tenant;
        if (caller.role != Role::kAdmin || !request->tenant().empty()) {
          ASSIGN_OR_RETURN(tenant, TenantFor(caller, request->tenant()));
        }
        if (!request->pool().empty()) {
          ASSIGN_OR_RETURN(Pool * pool, manager_->FindPool(request->pool()));
          FillStats(*pool, tenant, response->add_pools());
        } else {
          for (Pool* pool : manager_->pools()) FillStats(*pool, tenant, response->add_pools());
        }
        response->set_open_sessions(static_cast<uint32_t>(
            tenant.empty() ? manager_->sessions().size()
                           : manager_->quotas().InUse(tenant, QuotaResource::kSessions)));
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* KvCacheService::ListSessions(grpc::CallbackServerContext* context,
                                                       const v1::ListSessionsRequest* request,
                                                       v1::ListSessionsResponse* response) {
  return HandleUnary(
      *this, context, response, manager_->epoch(), "ListSessions", Role::kReader,
      [&](const Identity& caller) -> absl::Status {
        std::string tenant;
        if (caller.role != Role::kAdmin || !request->tenant().empty()) {
          ASSIGN_OR_RETURN(tenant, TenantFor(caller, request->tenant()));
        }
        const absl::Time now = manager_->clock()->Now();
        const std::vector<Pool*> pools = manager_->pools();
        for (const SessionRegistry::Listed& listed : manager_->sessions().List(tenant)) {
          const Session& session = *listed.session;
          v1::SessionInfo* info = response->add_sessions();
          // An id is only worth something to the identity that opened it; admins see them
          // all.
          if (caller.role == Role::kAdmin || session.principal == caller.principal) {
            info->set_session_id(session.id);
          }
          info->set_tenant(session.tenant);
          info->set_principal(session.principal);
          info->set_client_name(session.client_name);
          info->set_ttl_ms(static_cast<uint32_t>(absl::ToInt64Milliseconds(session.ttl)));
          info->set_expires_in_ms(static_cast<uint32_t>(
              std::max<int64_t>(0, absl::ToInt64Milliseconds(listed.deadline - now))));
          uint32_t open_sequences = 0;
          for (Pool* pool : pools) open_sequences += pool->SequencesOfSession(session.id);
          info->set_open_sequences(open_sequences);
        }
        return absl::OkStatus();
      });
}

grpc::ServerWriteReactor<v1::WatchEventsResponse>* KvCacheService::WatchEvents(
    grpc::CallbackServerContext* context, const v1::WatchEventsRequest* request) {
  AddEpochTrailer(context, manager_->epoch());
  watchers_.fetch_add(1, std::memory_order_relaxed);
  auto* reactor =
      new WatchEventsReactor(&manager_->events(), manager_->epoch(), &watchers_, &stopping_);
  const absl::Status status = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(StreamCaller stream_caller,
                     StreamCallerFor(*context, "WatchEvents", Role::kReader));
    const Identity& caller = stream_caller.identity;
    KvEventFilter filter;
    if (caller.role != Role::kAdmin || !request->tenant().empty()) {
      ASSIGN_OR_RETURN(filter.tenant, TenantFor(caller, request->tenant()));
    }
    if (!request->pool().empty()) {
      RETURN_IF_ERROR(manager_->FindPool(request->pool()).status());
      filter.pool = request->pool();
    }
    if (watchers_.load(std::memory_order_relaxed) > kMaxWatchers) {
      return absl::ResourceExhaustedError(
          absl::StrCat("the daemon serves at most ", kMaxWatchers, " event watchers"));
    }
    const KvEventLog& log = manager_->events();
    const uint64_t start = request->start_sequence();
    // Another epoch's numbers mean nothing here; a start ahead of the log is one too.
    const bool need_snapshot = (request->epoch() != 0 && request->epoch() != manager_->epoch()) ||
                               start > log.next_sequence() || start < log.first_sequence();
    if (start < log.first_sequence() && request->epoch() == manager_->epoch()) {
      manager_->events().CountDropped(KvEventSink::kGrpc, log.first_sequence() - start);
    }
    if (start > 0 && !need_snapshot) manager_->events().CountReplay(KvEventSink::kGrpc);
    reactor->Start(start, request->epoch(), need_snapshot, std::move(filter),
                   std::move(stream_caller.stream));
    return absl::OkStatus();
  }();
  if (!status.ok()) reactor->Reject(ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* KvCacheService::PublishRendezvous(
    grpc::CallbackServerContext* context, const v1::PublishRendezvousRequest* request,
    v1::PublishRendezvousResponse* response) {
  return HandleUnary(*this, context, response, manager_->epoch(), "PublishRendezvous",
                     Role::kWorker, [&](const Identity& caller) -> absl::Status {
                       ASSIGN_OR_RETURN(auto session,
                                        manager_->SessionFor(request->session_id(),
                                                             request->epoch(), caller.principal));
                       return manager_->rendezvous().Publish(session->tenant, request->key(),
                                                             request->value(), session->id);
                     });
}

grpc::ServerUnaryReactor* KvCacheService::AwaitRendezvous(grpc::CallbackServerContext* context,
                                                          const v1::AwaitRendezvousRequest* request,
                                                          v1::AwaitRendezvousResponse* response) {
  response->set_epoch(manager_->epoch());
  AddEpochTrailer(context, manager_->epoch());
  auto* reactor = new AwaitRendezvousReactor(&manager_->rendezvous(), response);
  absl::StatusOr<StreamCaller> caller = StreamCallerFor(*context, "AwaitRendezvous", Role::kWorker);
  absl::StatusOr<std::shared_ptr<Session>> session =
      caller.ok() ? manager_->SessionFor(request->session_id(), request->epoch(),
                                         caller->identity.principal)
                  : caller.status();
  if (!session.ok()) {
    reactor->FinishOnce(ToGrpcStatus(session.status()));
  } else {
    reactor->Start((*session)->tenant, request->key(), std::move(caller->stream));
  }
  return reactor;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* KvCacheService::PutBlocks(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  AddEpochTrailer(context, manager_->epoch());
  return new PutBlocksReactor(manager_, stream_leases_, call_limits_, context, response,
                              StreamCallerFor(*context, "PutBlocks", Role::kWorker));
}

grpc::ServerWriteReactor<grpc::ByteBuffer>* KvCacheService::GetBlocks(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request) {
  AddEpochTrailer(context, manager_->epoch());
  return new GetBlocksReactor(manager_, stream_leases_, context, request, max_chunk_bytes_,
                              StreamCallerFor(*context, "GetBlocks", Role::kWorker));
}

}  // namespace kvcache
