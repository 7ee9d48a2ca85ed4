#include "cache/session_registry.h"

#include <openssl/sha.h>
#include <sys/random.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "common/tenant.h"

namespace kvcache {
namespace {

inline constexpr size_t kMaxClientNameBytes = 256;
// Luby-Rackoff: four rounds of a pseudorandom function make a pseudorandom permutation; two more
// cost nothing here (one SHA-256 per round, once per OpenSession and per unknown id).
inline constexpr int kFeistelRounds = 6;

std::array<uint8_t, 32> RandomKey() {
  std::array<uint8_t, 32> key;
  size_t filled = 0;
  while (filled < key.size()) {
    const ssize_t got = getrandom(key.data() + filled, key.size() - filled, 0);
    if (got > 0) filled += static_cast<size_t>(got);
  }
  return key;
}

uint32_t Round(const std::array<uint8_t, 32>& key, int round, uint32_t half) {
  uint8_t input[32 + 1 + 4];
  std::memcpy(input, key.data(), key.size());
  input[32] = static_cast<uint8_t>(round);
  std::memcpy(input + 33, &half, sizeof(half));
  uint8_t digest[SHA256_DIGEST_LENGTH];
  SHA256(input, sizeof(input), digest);
  uint32_t out;
  std::memcpy(&out, digest, sizeof(out));
  return out;
}

}  // namespace

SessionRegistry::SessionRegistry(const SessionLimits& limits, const Clock* clock,
                                 TenantQuotas* quotas)
    : limits_(limits), clock_(clock), id_key_(RandomKey()), quotas_(quotas) {}

uint64_t SessionRegistry::IdOf(uint64_t counter) const {
  uint32_t left = static_cast<uint32_t>(counter >> 32);
  uint32_t right = static_cast<uint32_t>(counter);
  for (int round = 0; round < kFeistelRounds; ++round) {
    const uint32_t next = left ^ Round(id_key_, round, right);
    left = right;
    right = next;
  }
  return (static_cast<uint64_t>(left) << 32) | right;
}

uint64_t SessionRegistry::CounterOf(uint64_t session_id) const {
  uint32_t left = static_cast<uint32_t>(session_id >> 32);
  uint32_t right = static_cast<uint32_t>(session_id);
  for (int round = kFeistelRounds - 1; round >= 0; --round) {
    const uint32_t previous = right ^ Round(id_key_, round, left);
    right = left;
    left = previous;
  }
  return (static_cast<uint64_t>(left) << 32) | right;
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Open(
    std::string principal, std::string tenant, std::string client_name, absl::Duration ttl,
    std::shared_ptr<const CompatibilityManifest> manifest) {
  if (stopped_opening_.load(std::memory_order_acquire)) {
    return absl::UnavailableError(
        "the daemon is draining (shutting down): open the session on another daemon");
  }
  if (tenant.empty() || tenant.size() > kMaxTenantBytes ||
      client_name.size() > kMaxClientNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tenant (", tenant.size(), " bytes) must have 1 to ", kMaxTenantBytes,
        " bytes and client_name (", client_name.size(), " bytes) at most ", kMaxClientNameBytes));
  }
  if (ttl == absl::ZeroDuration()) ttl = limits_.default_ttl;
  ttl = std::clamp(ttl, limits_.min_ttl, limits_.max_ttl);
  absl::MutexLock lock(&mu_);
  if (sessions_.size() >= limits_.max_sessions) {
    return absl::ResourceExhaustedError(
        absl::StrCat("daemon holds its maximum of ", limits_.max_sessions, " sessions"));
  }
  RETURN_IF_ERROR(quotas_->TryAcquire(tenant, QuotaResource::kSessions, 1));
  uint64_t id = IdOf(next_counter_++);
  if (id == 0) id = IdOf(next_counter_++);  // 0 means "no session" on the wire
  auto session = std::make_shared<Session>(id, std::move(principal), std::move(tenant),
                                           std::move(client_name), ttl, std::move(manifest));
  sessions_.emplace(session->id, Entry{session, clock_->Now() + ttl, next_opened_++});
  ++counters_[session->tenant].opened;
  return session;
}

absl::Status SessionRegistry::UnknownLocked(uint64_t session_id) const {
  const uint64_t counter = CounterOf(session_id);
  if (session_id != 0 && counter != 0 && counter < next_counter_) {
    return absl::AbortedError(
        absl::StrCat("session ", session_id, " has ended (closed or lease expired)"));
  }
  return absl::NotFoundError(absl::StrCat("session ", session_id, " does not exist"));
}

absl::Status SessionRegistry::ExpiredLocked(uint64_t session_id) const {
  return absl::AbortedError(absl::StrCat("session ", session_id, " has ended (lease expired)"));
}

void SessionRegistry::EndLocked(Session& session) {
  session.closed.store(true, std::memory_order_release);
  quotas_->Release(session.tenant, QuotaResource::kSessions, 1);
}

absl::StatusOr<std::shared_ptr<Session>> SessionRegistry::Get(uint64_t session_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return UnknownLocked(session_id);
  if (it->second.deadline <= clock_->Now()) return ExpiredLocked(session_id);
  return it->second.session;
}

absl::Status SessionRegistry::KeepAlive(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = sessions_.find(session_id);
  if (it == sessions_.end()) return UnknownLocked(session_id);
  const absl::Time now = clock_->Now();
  // A lease past its deadline has ended, swept or not: a keep-alive cannot bring it back.
  if (it->second.deadline <= now) return ExpiredLocked(session_id);
  it->second.deadline = now + it->second.session->ttl;
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
  EndLocked(*session);
  ++counters_[session->tenant].closed;
  return session;
}

std::vector<std::shared_ptr<Session>> SessionRegistry::TakeExpired() {
  const absl::Time now = clock_->Now();
  std::vector<std::pair<uint64_t, std::shared_ptr<Session>>> expired;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (it->second.deadline <= now) {
        EndLocked(*it->second.session);
        ++counters_[it->second.session->tenant].expired;
        expired.emplace_back(it->second.opened, std::move(it->second.session));
        sessions_.erase(it++);
      } else {
        ++it;
      }
    }
  }
  // In opening order, not the map's: a sweep then releases blocks in an order that replays (the
  // simulation depends on it).
  std::sort(expired.begin(), expired.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::shared_ptr<Session>> sessions;
  sessions.reserve(expired.size());
  for (auto& [opened, session] : expired) sessions.push_back(std::move(session));
  return sessions;
}

size_t SessionRegistry::size() const {
  absl::ReaderMutexLock lock(&mu_);
  return sessions_.size();
}

std::vector<SessionRegistry::Listed> SessionRegistry::List(absl::string_view tenant) const {
  std::vector<Listed> listed;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [id, entry] : sessions_) {
    if (tenant.empty() || entry.session->tenant == tenant) {
      listed.push_back(Listed{.session = entry.session, .deadline = entry.deadline});
    }
  }
  return listed;
}

absl::flat_hash_map<std::string, SessionCounters> SessionRegistry::Counters() const {
  absl::ReaderMutexLock lock(&mu_);
  absl::flat_hash_map<std::string, SessionCounters> counters = counters_;
  for (auto& [tenant, tenant_counters] : counters) {
    tenant_counters.open =
        tenant_counters.opened - tenant_counters.closed - tenant_counters.expired;
  }
  return counters;
}

}  // namespace kvcache
