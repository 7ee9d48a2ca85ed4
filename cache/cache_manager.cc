#include "cache/cache_manager.h"

#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace kvcache {

CacheManager::CacheManager(const SessionLimits& limits, const Clock* clock, uint64_t epoch,
                           size_t event_log_capacity, bool record_events)
    : epoch_(epoch),
      clock_(clock),
      record_events_(record_events),
      events_(event_log_capacity, clock),
      sessions_(limits, clock, &quotas_) {}

CacheManager::~CacheManager() {
  {
    absl::MutexLock lock(&reaper_mu_);
    stopping_ = true;
  }
  if (reaper_.joinable()) reaper_.join();
}

uint64_t CacheManager::NewEpoch() {
  std::random_device device;
  uint64_t epoch = 0;
  while (epoch == 0) epoch = (uint64_t{device()} << 32) ^ device();
  return epoch;
}

absl::Status CacheManager::AddPool(const PoolOptions& options, std::unique_ptr<PoolMemory> memory) {
  if (FindPool(options.name).ok()) {
    return absl::InvalidArgumentError(absl::StrCat("pool '", options.name, "' already exists"));
  }
  const uint32_t pool_index = static_cast<uint32_t>(pools_.size());
  const std::string medium(KvEventMediumOf(memory == nullptr ? "" : memory->kind()));
  // Before the pool: its disk tier announces what a restart restored while it is created. A pool
  // that fails to be created leaves an entry the next one's index replaces.
  events_.AddPool(pool_index, options.name, medium, options.layout.block_size);
  ASSIGN_OR_RETURN(auto pool, Pool::Create(options, pool_index, std::move(memory), device_faults_,
                                           &quotas_, record_events_ ? &events_ : nullptr, clock_));
  pools_.push_back(std::move(pool));
  return absl::OkStatus();
}

std::vector<Pool*> CacheManager::pools() const {
  std::vector<Pool*> pools;
  for (const auto& pool : pools_) pools.push_back(pool.get());
  return pools;
}

absl::StatusOr<Pool*> CacheManager::FindPool(absl::string_view name) const {
  for (const auto& pool : pools_) {
    if (pool->options().name == name) return pool.get();
  }
  std::vector<std::string> names;
  for (const auto& pool : pools_) names.push_back(pool->options().name);
  return absl::NotFoundError(
      absl::StrCat("no pool named '", name, "' (pools: ", absl::StrJoin(names, ", "), ")"));
}

absl::StatusOr<Pool*> CacheManager::PoolOfSequence(uint64_t sequence_id) const {
  const uint32_t index = Pool::PoolIndexOf(sequence_id);
  if (sequence_id == 0 || index >= pools_.size()) {
    return absl::NotFoundError(absl::StrCat("sequence ", sequence_id, " not found"));
  }
  return pools_[index].get();
}

absl::Status CacheManager::CheckEpoch(uint64_t epoch) const {
  if (epoch == 0 || epoch == epoch_) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("daemon epoch is ", epoch_,
                                                    ", request carries ", epoch,
                                                    ": the daemon restarted; open a new session"));
}

absl::StatusOr<std::shared_ptr<Session>> CacheManager::SessionFor(
    uint64_t session_id, uint64_t epoch, absl::string_view principal) const {
  RETURN_IF_ERROR(CheckEpoch(epoch));
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session, sessions_.Get(session_id));
  if (session->principal != principal) {
    return absl::PermissionDeniedError(
        absl::StrCat("session ", session_id, " belongs to another identity"));
  }
  return session;
}

uint32_t CacheManager::ReleaseSessionEverywhere(const Session& session) {
  uint32_t released = 0;
  for (const auto& pool : pools_) released += pool->ReleaseSession(session.id);
  rendezvous_.DropSession(session.id);
  if (session_ended_) session_ended_(session.id);
  return released;
}

absl::StatusOr<uint32_t> CacheManager::CloseSession(uint64_t session_id, uint64_t epoch,
                                                    absl::string_view principal) {
  absl::StatusOr<std::shared_ptr<Session>> owned = SessionFor(session_id, epoch, principal);
  if (!owned.ok() && !absl::IsAborted(owned.status())) return owned.status();
  absl::StatusOr<std::shared_ptr<Session>> session = sessions_.Close(session_id);
  // Closing an ended session is a no-op: its sequences were released when it ended.
  if (absl::IsAborted(session.status())) return 0;
  if (!session.ok()) return session.status();
  return ReleaseSessionEverywhere(**session);
}

size_t CacheManager::ExpireSessions() {
  const std::vector<std::shared_ptr<Session>> expired = sessions_.TakeExpired();
  for (const auto& session : expired) ReleaseSessionEverywhere(*session);
  // Pins end on the same timer (an atomic read per pool while none has expired).
  for (const auto& pool : pools_) pool->ExpirePins();
  return expired.size();
}

void CacheManager::StartReaper(absl::Duration period) {
  reaper_ = std::thread([this, period] { ReaperLoop(period); });
}

void CacheManager::ReaperLoop(absl::Duration period) {
  absl::MutexLock lock(&reaper_mu_);
  while (!stopping_) {
    reaper_mu_.AwaitWithTimeout(absl::Condition(&stopping_), period);
    if (stopping_) break;
    reaper_mu_.Unlock();
    ExpireSessions();
    reaper_mu_.Lock();
  }
}

}  // namespace kvcache
