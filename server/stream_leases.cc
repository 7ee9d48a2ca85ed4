#include "server/stream_leases.h"

#include <cassert>

#include "absl/strings/str_cat.h"

namespace kvcache {

StreamLeases::StreamLeases() : notifier_([this] { NotifyLoop(); }) {}

StreamLeases::~StreamLeases() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  notifier_.join();
}

absl::StatusOr<std::shared_ptr<StreamLeases::Binding>> StreamLeases::Bind(
    const Session& session, std::function<void()> on_lease_end) {
  auto binding = std::shared_ptr<Binding>(new Binding(session.id, std::move(on_lease_end)));
  {
    absl::MutexLock lock(&mu_);
    by_session_[session.id].insert(binding);
  }
  // `closed` is set before SessionEnded is called: either that call finds this binding, or this
  // check sees the session ended.
  if (session.closed.load(std::memory_order_acquire)) {
    Unbind(*binding);
    return absl::AbortedError(absl::StrCat("session ", session.id, " has ended"));
  }
  return binding;
}

void StreamLeases::Unbind(Binding& binding) {
  {
    absl::MutexLock lock(&mu_);
    auto it = by_session_.find(binding.session_id_);
    if (it != by_session_.end()) {
      // abseil's hash sets of smart pointers look raw pointers up directly: O(1).
      auto member = it->second.find(&binding);
      if (member != it->second.end()) it->second.erase(member);
      if (it->second.empty()) by_session_.erase(it);
    }
  }
  absl::MutexLock lock(&binding.mu_);
  binding.unbound_ = true;
  // A notice that ended its stream inline on the notifier thread cannot be waited for here: it is
  // this very call's caller, and it touches nothing of the stream after on_lease_end returns.
  if (std::this_thread::get_id() == notifier_.get_id()) return;
  auto notified = [&binding]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(binding.mu_) { return !binding.notifying_; };
  binding.mu_.Await(absl::Condition(&notified));
}

void StreamLeases::SessionEnded(uint64_t session_id) {
  absl::MutexLock lock(&mu_);
  auto it = by_session_.find(session_id);
  if (it == by_session_.end()) return;
  for (const std::shared_ptr<Binding>& binding : it->second) to_notify_.push_back(binding);
  by_session_.erase(it);
}

size_t StreamLeases::bound() const {
  absl::MutexLock lock(&mu_);
  size_t count = 0;
  for (const auto& [session, bindings] : by_session_) count += bindings.size();
  return count;
}

void StreamLeases::Notify(Binding& binding) {
  {
    absl::MutexLock lock(&binding.mu_);
    if (binding.unbound_) return;
    binding.notifying_ = true;
  }
  binding.lease_ended_.store(true, std::memory_order_release);
  binding.on_lease_end_();
  absl::MutexLock lock(&binding.mu_);
  binding.notifying_ = false;
}

void StreamLeases::NotifyLoop() {
  absl::MutexLock lock(&mu_);
  auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !to_notify_.empty();
  };
  while (true) {
    mu_.Await(absl::Condition(&has_work));
    if (to_notify_.empty()) break;  // stopping, nothing left
    std::shared_ptr<Binding> binding = std::move(to_notify_.front());
    to_notify_.pop_front();
    mu_.Unlock();
    Notify(*binding);
    binding.reset();
    mu_.Lock();
  }
  assert(by_session_.empty() && "a stream outlived the server");
}

}  // namespace kvcache
