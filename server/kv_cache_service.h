// KvCacheService: the gRPC edge of the daemon. Each handler authenticates the caller and checks
// its role (server/authenticator.h), converts the request, calls the CacheManager within the
// caller's tenant and as its principal, converts the status once (ToGrpcStatus) and finishes;
// nothing blocks beyond a pool's short critical section, so handlers run inline on the callback
// reactor.
//
// Roles: reader may Ping, ListPools, DescribePool, Lookup, GetStats, ListSessions and
// WatchEvents (pool mappings are not shown to it); worker may call everything within its tenant;
// admin may also name another tenant (OpenSession, Lookup, GetStats) and sees whole-pool figures.
//
// Thread safety: thread-safe (all state lives in the CacheManager).
#ifndef KVCACHE_SERVER_KV_CACHE_SERVICE_H_
#define KVCACHE_SERVER_KV_CACHE_SERVICE_H_

#include <atomic>

#include "cache/cache_manager.h"
#include "kvcache/v1/kvcache.grpc.pb.h"
#include "server/arena_messages.h"
#include "server/authenticator.h"
#include "server/block_streams.h"
#include "server/call_limits.h"
#include "server/stream_leases.h"

namespace kvcache {

// The block data RPCs and the page calls that carry page bytes are served raw (grpc::ByteBuffer)
// so the bytes move between the socket and pool memory without being copied into protobuf
// messages; their wire formats are the messages' all the same.
class KvCacheService final
    : public v1::KvCache::WithRawCallbackMethod_GetBlocks<
          v1::KvCache::WithRawCallbackMethod_PutBlocks<v1::KvCache::WithRawCallbackMethod_GetPages<
              v1::KvCache::WithRawCallbackMethod_PutPages<v1::KvCache::CallbackService>>>> {
 public:
  // `max_message_bytes` bounds the chunks GetBlocks sends. The pointers must outlive the
  // service.
  KvCacheService(CacheManager* manager, StreamLeases* stream_leases,
                 const Authenticator* authenticator, CallLimits* call_limits, int max_message_bytes)
      : manager_(manager),
        stream_leases_(stream_leases),
        authenticator_(authenticator),
        call_limits_(call_limits),
        max_chunk_bytes_(static_cast<uint32_t>(max_message_bytes) - 4096) {
    SetMessageAllocatorFor_ExistsPages(&exists_pages_messages_);
  }

  // The authenticated caller of a call to `method`, if its role reaches `needed`;
  // UNAUTHENTICATED or PERMISSION_DENIED otherwise. DEADLINE_EXCEEDED (or CANCELLED) first when
  // the call's deadline passed (or its client cancelled it) before the daemon got to it: a call
  // that waited out its deadline in gRPC's queues then changes nothing.
  absl::StatusOr<Identity> Caller(const grpc::CallbackServerContext& context, const char* method,
                                  Role needed) const;
  // Caller, then a place for one more long call under the call limits (server/call_limits.h).
  absl::StatusOr<StreamCaller> StreamCallerFor(const grpc::CallbackServerContext& context,
                                               const char* method, Role needed) const;

  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* context,
                                 const v1::PingRequest* request,
                                 v1::PingResponse* response) override;
  grpc::ServerUnaryReactor* ListPools(grpc::CallbackServerContext* context,
                                      const v1::ListPoolsRequest* request,
                                      v1::ListPoolsResponse* response) override;
  grpc::ServerUnaryReactor* DescribePool(grpc::CallbackServerContext* context,
                                         const v1::DescribePoolRequest* request,
                                         v1::DescribePoolResponse* response) override;
  grpc::ServerUnaryReactor* OpenSession(grpc::CallbackServerContext* context,
                                        const v1::OpenSessionRequest* request,
                                        v1::OpenSessionResponse* response) override;
  grpc::ServerUnaryReactor* KeepAlive(grpc::CallbackServerContext* context,
                                      const v1::KeepAliveRequest* request,
                                      v1::KeepAliveResponse* response) override;
  grpc::ServerUnaryReactor* CloseSession(grpc::CallbackServerContext* context,
                                         const v1::CloseSessionRequest* request,
                                         v1::CloseSessionResponse* response) override;
  grpc::ServerUnaryReactor* OpenSequence(grpc::CallbackServerContext* context,
                                         const v1::OpenSequenceRequest* request,
                                         v1::OpenSequenceResponse* response) override;
  grpc::ServerUnaryReactor* ExtendSequence(grpc::CallbackServerContext* context,
                                           const v1::ExtendSequenceRequest* request,
                                           v1::ExtendSequenceResponse* response) override;
  grpc::ServerUnaryReactor* CommitSequence(grpc::CallbackServerContext* context,
                                           const v1::CommitSequenceRequest* request,
                                           v1::CommitSequenceResponse* response) override;
  grpc::ServerUnaryReactor* ReleaseSequence(grpc::CallbackServerContext* context,
                                            const v1::ReleaseSequenceRequest* request,
                                            v1::ReleaseSequenceResponse* response) override;
  grpc::ServerUnaryReactor* ForkSequence(grpc::CallbackServerContext* context,
                                         const v1::ForkSequenceRequest* request,
                                         v1::ForkSequenceResponse* response) override;
  grpc::ServerUnaryReactor* Lookup(grpc::CallbackServerContext* context,
                                   const v1::LookupRequest* request,
                                   v1::LookupResponse* response) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const v1::GetStatsRequest* request,
                                     v1::GetStatsResponse* response) override;
  grpc::ServerUnaryReactor* ListSessions(grpc::CallbackServerContext* context,
                                         const v1::ListSessionsRequest* request,
                                         v1::ListSessionsResponse* response) override;
  grpc::ServerWriteReactor<v1::WatchEventsResponse>* WatchEvents(
      grpc::CallbackServerContext* context, const v1::WatchEventsRequest* request) override;
  grpc::ServerUnaryReactor* PublishRendezvous(grpc::CallbackServerContext* context,
                                              const v1::PublishRendezvousRequest* request,
                                              v1::PublishRendezvousResponse* response) override;
  grpc::ServerUnaryReactor* AwaitRendezvous(grpc::CallbackServerContext* context,
                                            const v1::AwaitRendezvousRequest* request,
                                            v1::AwaitRendezvousResponse* response) override;
  // Pages named by an engine's keys (DESIGN §13), in server/page_calls.cc.
  grpc::ServerUnaryReactor* ExistsPages(grpc::CallbackServerContext* context,
                                        const v1::ExistsPagesRequest* request,
                                        v1::ExistsPagesResponse* response) override;
  grpc::ServerUnaryReactor* ReservePages(grpc::CallbackServerContext* context,
                                         const v1::ReservePagesRequest* request,
                                         v1::ReservePagesResponse* response) override;
  grpc::ServerUnaryReactor* CommitPages(grpc::CallbackServerContext* context,
                                        const v1::CommitPagesRequest* request,
                                        v1::CommitPagesResponse* response) override;
  grpc::ServerUnaryReactor* AcquirePages(grpc::CallbackServerContext* context,
                                         const v1::AcquirePagesRequest* request,
                                         v1::AcquirePagesResponse* response) override;
  // PutPagesRequest in, PutPagesResponse out (server/page_calls.cc).
  grpc::ServerUnaryReactor* PutPages(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  // GetPagesRequest in, GetPagesResponse out (server/page_calls.cc).
  grpc::ServerUnaryReactor* GetPages(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* PinPages(grpc::CallbackServerContext* context,
                                     const v1::PinPagesRequest* request,
                                     v1::PinPagesResponse* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* PutBlocks(grpc::CallbackServerContext* context,
                                                       grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* GetBlocks(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request) override;

  // Ends every event watch (UNAVAILABLE) within a poll period, before the server shuts down.
  void StopWatchers() { stopping_.store(true); }

  // Event watchers the daemon serves at once (each has a thread); more is RESOURCE_EXHAUSTED.
  static constexpr int kMaxWatchers = 64;

 private:
  CacheManager* const manager_;
  StreamLeases* const stream_leases_;
  const Authenticator* const authenticator_;
  CallLimits* const call_limits_;
  const uint32_t max_chunk_bytes_;
  ArenaMessageAllocator<v1::ExistsPagesRequest, v1::ExistsPagesResponse> exists_pages_messages_;
  std::atomic<int> watchers_{0};
  std::atomic<bool> stopping_{false};
};

}  // namespace kvcache

#endif  // KVCACHE_SERVER_KV_CACHE_SERVICE_H_
