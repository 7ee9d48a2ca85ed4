#include "cache/device_fault_latch.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace kvcache {

bool DeviceFaultLatch::IsDeviceFault(const absl::Status& status) {
  return absl::IsInternal(status) || absl::IsDataLoss(status);
}

absl::Status DeviceFaultLatch::status() const {
  if (!latched_.load(std::memory_order_acquire)) return absl::OkStatus();
  absl::MutexLock lock(&mu_);
  return fault_;
}

absl::Status DeviceFaultLatch::Check(absl::Status result, absl::string_view pool) {
  if (!IsDeviceFault(result)) return result;
  Listener listener;
  absl::Status latched;
  {
    absl::MutexLock lock(&mu_);
    if (!fault_.ok()) return fault_;  // a fault latched first: that one is the cause
    fault_ = absl::UnavailableError(
        absl::StrCat("the daemon's pool memory failed and cannot be used until the daemon "
                     "restarts; first fault, in pool '",
                     pool, "': ", result.ToString()));
    latched_.store(true, std::memory_order_release);
    listener = listener_;
    latched = fault_;
  }
  if (listener) listener(latched);
  return latched;
}

void DeviceFaultLatch::SetListener(Listener listener) {
  absl::Status latched;
  {
    absl::MutexLock lock(&mu_);
    listener_ = std::move(listener);
    if (fault_.ok() || !listener_) return;
    latched = fault_;
    listener = listener_;
  }
  listener(latched);
}

}  // namespace kvcache
