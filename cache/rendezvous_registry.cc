#include "cache/rendezvous_registry.h"

#include <vector>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

absl::Status CheckKey(const std::string& key) {
  if (key.empty() || key.size() > kMaxRendezvousKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous key has ", key.size(),
                                                   " bytes; want 1 to ", kMaxRendezvousKeyBytes));
  }
  return absl::OkStatus();
}

}  // namespace

std::string RendezvousRegistry::Scoped(const std::string& tenant, const std::string& key) {
  // Length-prefixed, so no (tenant, key) pair can impersonate another.
  return absl::StrCat(tenant.size(), ":", tenant, key);
}

absl::Status RendezvousRegistry::Publish(const std::string& tenant, const std::string& key,
                                         std::string value, uint64_t session_id) {
  if (absl::Status status = CheckKey(key); !status.ok()) return status;
  if (value.empty() || value.size() > kMaxRendezvousValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("rendezvous value has ", value.size(),
                                                   " bytes; want 1 to ", kMaxRendezvousValueBytes));
  }
  std::vector<Callback> woken;
  {
    absl::MutexLock lock(&mu_);
    auto it = entries_.find(Scoped(tenant, key));
    if (it == entries_.end()) {
      if (entries_.size() >= kMaxRendezvousEntries) {
        return absl::ResourceExhaustedError("the daemon holds its maximum of rendezvous keys");
      }
      it = entries_.emplace(Scoped(tenant, key), Entry{}).first;
    }
    Entry& entry = it->second;
    if (entry.has_value && entry.owner != session_id) {
      return absl::AlreadyExistsError(
          absl::StrCat("rendezvous key '", key, "' is held by another session"));
    }
    entry.value = std::move(value);
    entry.owner = session_id;
    entry.has_value = true;
    for (auto& [ticket, callback] : entry.waiters) {
      ticket_keys_.erase(ticket);
      woken.push_back(std::move(callback));
    }
    entry.waiters.clear();
    value = entry.value;
  }
  for (Callback& callback : woken) callback(value);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> RendezvousRegistry::Await(const std::string& tenant,
                                                   const std::string& key, Callback on_value) {
  if (absl::Status status = CheckKey(key); !status.ok()) return status;
  std::string value;
  {
    absl::MutexLock lock(&mu_);
    Entry& entry = entries_[Scoped(tenant, key)];
    if (!entry.has_value) {
      const uint64_t ticket = next_ticket_++;
      entry.waiters.emplace(ticket, std::move(on_value));
      ticket_keys_.emplace(ticket, Scoped(tenant, key));
      return ticket;
    }
    value = entry.value;
  }
  on_value(value);
  return 0;
}

bool RendezvousRegistry::Cancel(uint64_t ticket) {
  absl::MutexLock lock(&mu_);
  auto key = ticket_keys_.find(ticket);
  if (key == ticket_keys_.end()) return false;
  auto entry = entries_.find(key->second);
  entry->second.waiters.erase(ticket);
  if (!entry->second.has_value && entry->second.waiters.empty()) entries_.erase(entry);
  ticket_keys_.erase(key);
  return true;
}

void RendezvousRegistry::DropSession(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  for (auto it = entries_.begin(); it != entries_.end();) {
    Entry& entry = it->second;
    if (entry.has_value && entry.owner == session_id) {
      entry.has_value = false;
      entry.value.clear();
      if (entry.waiters.empty()) {
        entries_.erase(it++);
        continue;
      }
    }
    ++it;
  }
}

size_t RendezvousRegistry::parked_waiters() const {
  absl::MutexLock lock(&mu_);
  return ticket_keys_.size();
}

}  // namespace kvcache
