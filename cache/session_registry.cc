#include "cache/session_registry.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace kvcache {

inline constexpr size_t kMaxTenantBytes = 256;
inline constexpr size_t kMaxClientNameBytes = 256;

SessionRegistry::SessionRegistry(const SessionLimits& limits, const Clock* clock)
    : limits_(limits), clock_(clock) {}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Open(std::string tenant,
                                                               std::string client_name,
                                                               absl::Duration ttl) {
  if (tenant.size() > kMaxTenantBytes || client_name.size() > kMaxClientNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat("tenant (", tenant.size(),
                                                   " bytes) or client_name (", client_name.size(),
                                                   " bytes) exceeds ", kMaxTenantBytes, " bytes"));
  }
  if (ttl == absl::ZeroDuration()) ttl = limits_.default_ttl;
  ttl = std::clamp(ttl, limits_.min_ttl, limits_.max_ttl);
  absl::MutexLock lock(&mu_);
  if (sessions_.size() >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("daemon holds its maximum of ", limits_.max_sessions, " sessions"));
  }
  auto session =
      std::make_shared<Session>(next_id_++, std::move(tenant), std::move(client_name), ttl);
  sessions_.emplace(session->id, Entry{session, clock_->Now() + ttl});
  return session;
}

absl::Status SessionRegistry::UnknownLocked(uint64_t session_id) const {
  if (session_id != 0 && session_id < next_id_) {
    return absl::AbortedError(
        absl::StrCat("session ", session_id, " has ended (closed or lease expired)"));
  }
  return absl::NotFoundError(absl::StrCat("session ", session_id, " does not exist"));
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Get(uint64_t session_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return UnknownLocked(session_id);
  return it->second.session;
}

absl::Status SessionRegistry::KeepAlive(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return UnknownLocked(session_id);
  it->second.deadline = clock_->Now() + it->second.session->ttl;
  return absl::OkStatus();
}

absl::StatusOr<absl::Time> SessionRegistry::Deadline(uint64_t session_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return UnknownLocked(session_id);
  return it->second.deadline;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Close(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return UnknownLocked(session_id);
  std::shared_ptr<Session> session = std::move(it->second.session);
  sessions_.erase(it);
  session->closed.store(true, std::memory_order_release);
  return session;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::TakeExpired() {
  const absl::Time now = clock_->Now();
  std::vector<std::shared_ptr<Session>> expired;
  absl::MutexLock lock(&mu_);
  for (auto it = sessions_.begin(); it != sessions_.end();) {
    if (it->second.deadline <= now) {
      it->second.session->closed.store(true, std::memory_order_release);
      expired.push_back(std::move(it->second.session));
      sessions_.erase(it++);
    } else {
      ++it;
    }
  }
  return expired;
}

size_t SessionRegistry::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return sessions_.size();
}

}  // namespace kvcache
