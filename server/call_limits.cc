#include "server/call_limits.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache {

CallLimits::Ticket& CallLimits::Ticket::operator=(Ticket&& other) noexcept {
  if (this != &other) {
    Release();
    limits_ = std::exchange(other.limits_, nullptr);
    connection_ = std::move(other.connection_);
    resource_ = other.resource_;
    amount_ = std::exchange(other.amount_, 0);
  }
  return *this;
}

void CallLimits::Ticket::Release() {
  if (limits_ == nullptr) return;
  std::exchange(limits_, nullptr)->Release(connection_, resource_, std::exchange(amount_, 0));
}

absl::StatusOr<CallLimits::Ticket> CallLimits::AdmitStream(absl::string_view connection,
                                                           absl::string_view method) {
  return Admit(connection, Resource::kStreams, 1, method);
}

absl::StatusOr<CallLimits::Ticket> CallLimits::AdmitPutBytes(absl::string_view connection,
                                                             uint64_t bytes) {
  return Admit(connection, Resource::kPutBytes, bytes, "put");
}

absl::StatusOr<CallLimits::Ticket> CallLimits::Admit(absl::string_view connection,
                                                     Resource resource, uint64_t amount,
                                                     absl::string_view what) {
  const bool streams = resource == Resource::kStreams;
  const uint64_t per_connection =
      streams ? options_.max_streams_per_connection : options_.max_put_bytes_per_connection;
  const uint64_t in_total = streams ? options_.max_streams : options_.max_put_bytes;
  const absl::string_view unit = streams ? " streams" : " bytes";
  absl::MutexLock lock(&mu_);
  uint64_t& refused = streams ? refused_streams_ : refused_puts_;
  if (amount > per_connection || amount > in_total) {
    ++refused;
    return absl::ResourceExhaustedError(absl::StrCat(
        "a put of ", amount, " bytes exceeds the daemon's put bound of ",
        std::min(per_connection, in_total),
        " bytes (--max_put_bytes_per_connection, --max_put_bytes); send it in smaller puts"));
  }
  auto found = by_connection_.find(connection);
  const uint64_t held = found == by_connection_.end() ? 0 : found->second.of(resource);
  if (held + amount > per_connection) {
    ++refused;
    return absl::ResourceExhaustedError(
        absl::StrCat(what, ": this connection holds ", held, unit, " of its ", per_connection,
                     streams ? " (--max_streams_per_connection); finish one first"
                             : " (--max_put_bytes_per_connection) in puts not finished yet"));
  }
  if (total_.of(resource) + amount > in_total) {
    ++refused;
    return absl::UnavailableError(absl::StrCat(
        what, ": the daemon holds ", total_.of(resource), unit, " of its ", in_total,
        streams ? " (--max_streams)" : " of puts in flight (--max_put_bytes)", "; retry later"));
  }
  if (found == by_connection_.end()) {
    found = by_connection_.emplace(std::string(connection), Held{}).first;
  }
  found->second.of(resource) += amount;
  total_.of(resource) += amount;
  return Ticket(this, std::string(connection), resource, amount);
}

void CallLimits::Release(const std::string& connection, Resource resource, uint64_t amount) {
  absl::MutexLock lock(&mu_);
  total_.of(resource) -= amount;
  auto found = by_connection_.find(connection);
  if (found == by_connection_.end()) return;
  found->second.of(resource) -= amount;
  if (found->second.streams == 0 && found->second.put_bytes == 0) by_connection_.erase(found);
}

CallLimitUsage CallLimits::Usage() const {
  absl::MutexLock lock(&mu_);
  return CallLimitUsage{.streams = static_cast<uint32_t>(total_.streams),
                        .put_bytes = total_.put_bytes,
                        .refused_streams = refused_streams_,
                        .refused_puts = refused_puts_};
}

uint64_t CallLimits::HeldBy(absl::string_view connection, Resource resource) const {
  absl::MutexLock lock(&mu_);
  auto found = by_connection_.find(connection);
  if (found == by_connection_.end()) return 0;
  Held held = found->second;
  return held.of(resource);
}

}  // namespace kvcache
