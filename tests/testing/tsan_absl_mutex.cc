// Makes Debian's absl::Mutex visible to ThreadSanitizer (KVCACHE_TSAN builds only; kvcache_test()
// compiles this into every test binary there).
//
// Debian's libabsl_synchronization is not built with -fsanitize=thread, so its Mutex never tells
// TSan that an unlock happens before the next lock: every access guarded by an absl::Mutex would
// be reported as a race. These definitions interpose on the library's (an executable's symbols
// come first), forward to it through dlsym(RTLD_NEXT), and add the happens-before edges a
// TSan-built abseil would annotate: release on the mutex's address before each unlock (and before
// Await/Wait, which unlock inside), acquire after each lock (and after Await/Wait return).
//
// One blind spot remains: a Condition that the waiting thread evaluates inside Await/LockWhen runs
// before the acquire below, so its reads of guarded state look unsynchronized. scripts/tsan.supp
// suppresses races in exactly those frames (absl::Condition's callers from the header).
//
// Thread safety: as absl::Mutex.
#include <dlfcn.h>

#include <cstdlib>

#include "absl/synchronization/mutex.h"

extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);

namespace {

template <typename F>
F Real(const char* symbol) {
  void* real = dlsym(RTLD_NEXT, symbol);
  if (real == nullptr) abort();  // a different abseil: fail loudly rather than run unsynchronized
  return reinterpret_cast<F>(real);
}

}  // namespace

namespace absl {
ABSL_NAMESPACE_BEGIN

#define KVCACHE_REAL(type, symbol) static const auto real = Real<type>(symbol)

void Mutex::Lock() {
  KVCACHE_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex4LockEv");
  real(this);
  __tsan_acquire(this);
}
void Mutex::ReaderLock() {
  KVCACHE_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex10ReaderLockEv");
  real(this);
  __tsan_acquire(this);
}
bool Mutex::TryLock() {
  KVCACHE_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex7TryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}
bool Mutex::ReaderTryLock() {
  KVCACHE_REAL(bool (*)(Mutex*), "_ZN4absl7debian35Mutex13ReaderTryLockEv");
  const bool locked = real(this);
  if (locked) __tsan_acquire(this);
  return locked;
}
void Mutex::Unlock() {
  KVCACHE_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex6UnlockEv");
  __tsan_release(this);
  real(this);
}
void Mutex::ReaderUnlock() {
  KVCACHE_REAL(void (*)(Mutex*), "_ZN4absl7debian35Mutex12ReaderUnlockEv");
  __tsan_release(this);
  real(this);
}
void Mutex::LockWhen(const Condition& cond) {
  KVCACHE_REAL(void (*)(Mutex*, const Condition&),
               "_ZN4absl7debian35Mutex8LockWhenERKNS0_9ConditionE");
  real(this, cond);
  __tsan_acquire(this);
}
void Mutex::ReaderLockWhen(const Condition& cond) {
  KVCACHE_REAL(void (*)(Mutex*, const Condition&),
               "_ZN4absl7debian35Mutex14ReaderLockWhenERKNS0_9ConditionE");
  real(this, cond);
  __tsan_acquire(this);
}
bool Mutex::LockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  KVCACHE_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex19LockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const bool result = real(this, cond, timeout);
  __tsan_acquire(this);  // held whatever the result
  return result;
}
bool Mutex::LockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  KVCACHE_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex20LockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool result = real(this, cond, deadline);
  __tsan_acquire(this);
  return result;
}
bool Mutex::ReaderLockWhenWithTimeout(const Condition& cond, absl::Duration timeout) {
  KVCACHE_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex25ReaderLockWhenWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  const bool result = real(this, cond, timeout);
  __tsan_acquire(this);
  return result;
}
bool Mutex::ReaderLockWhenWithDeadline(const Condition& cond, absl::Time deadline) {
  KVCACHE_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex26ReaderLockWhenWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  const bool result = real(this, cond, deadline);
  __tsan_acquire(this);
  return result;
}
void Mutex::Await(const Condition& cond) {
  KVCACHE_REAL(void (*)(Mutex*, const Condition&),
               "_ZN4absl7debian35Mutex5AwaitERKNS0_9ConditionE");
  __tsan_release(this);
  real(this, cond);
  __tsan_acquire(this);
}
bool Mutex::AwaitWithTimeout(const Condition& cond, absl::Duration timeout) {
  KVCACHE_REAL(bool (*)(Mutex*, const Condition&, absl::Duration),
               "_ZN4absl7debian35Mutex16AwaitWithTimeoutERKNS0_9ConditionENS0_8DurationE");
  __tsan_release(this);
  const bool result = real(this, cond, timeout);
  __tsan_acquire(this);
  return result;
}
bool Mutex::AwaitWithDeadline(const Condition& cond, absl::Time deadline) {
  KVCACHE_REAL(bool (*)(Mutex*, const Condition&, absl::Time),
               "_ZN4absl7debian35Mutex17AwaitWithDeadlineERKNS0_9ConditionENS0_4TimeE");
  __tsan_release(this);
  const bool result = real(this, cond, deadline);
  __tsan_acquire(this);
  return result;
}
void CondVar::Wait(Mutex* mu) {
  KVCACHE_REAL(void (*)(CondVar*, Mutex*), "_ZN4absl7debian37CondVar4WaitEPNS0_5MutexE");
  __tsan_release(mu);
  real(this, mu);
  __tsan_acquire(mu);
}
bool CondVar::WaitWithTimeout(Mutex* mu, absl::Duration timeout) {
  KVCACHE_REAL(bool (*)(CondVar*, Mutex*, absl::Duration),
               "_ZN4absl7debian37CondVar15WaitWithTimeoutEPNS0_5MutexENS0_8DurationE");
  __tsan_release(mu);
  const bool result = real(this, mu, timeout);
  __tsan_acquire(mu);
  return result;
}
bool CondVar::WaitWithDeadline(Mutex* mu, absl::Time deadline) {
  KVCACHE_REAL(bool (*)(CondVar*, Mutex*, absl::Time),
               "_ZN4absl7debian37CondVar16WaitWithDeadlineEPNS0_5MutexENS0_4TimeE");
  __tsan_release(mu);
  const bool result = real(this, mu, deadline);
  __tsan_acquire(mu);
  return result;
}

#undef KVCACHE_REAL

ABSL_NAMESPACE_END
}  // namespace absl
