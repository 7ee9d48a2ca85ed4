// RecordChanges: how a lower tier tells its owner what it now holds — records that became
// visible, records that left (evicted, erased, dropped as corrupt) — in the order they happened,
// so that KV events (cache/kv_event_log.h) can announce each tier's blocks with its medium.
//
// A tier adds changes under its own mutex (that mutex orders them) and delivers them after
// releasing it: the listener may take other locks (the event log's) and never runs under the
// tier's mutex. Deliveries are serialized, so a listener sees every change once, in order, even
// when the writer thread and a loading thread deliver at the same time.
//
// Thread safety: thread-safe. Lock order: the tier's mutex, then pending_mu_; delivery_mu_, then
// pending_mu_.
#ifndef KVCACHE_TIERS_RECORD_CHANGES_H_
#define KVCACHE_TIERS_RECORD_CHANGES_H_

#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "tiers/block_record.h"

namespace kvcache {

struct RecordChange {
  enum class Kind : uint8_t { kStored, kRemoved };
  Kind kind = Kind::kStored;
  BlockRecordIdentity record;
};

// Called outside the tier's mutex with changes in the order they happened.
using RecordChangeListener = std::function<void(absl::Span<const RecordChange>)>;

class RecordChanges {
 public:
  explicit RecordChanges(RecordChangeListener listener) : listener_(std::move(listener)) {}

  // Under the tier's mutex. Nothing is kept without a listener.
  void Add(RecordChange::Kind kind, const BlockRecordIdentity& record) {
    if (!listener_) return;
    absl::MutexLock lock(&pending_mu_);
    pending_.push_back(RecordChange{kind, record});
  }

  // Outside the tier's mutex, after any section that may have added changes.
  void Deliver() {
    if (!listener_) return;
    absl::MutexLock delivery(&delivery_mu_);
    std::vector<RecordChange> changes;
    {
      absl::MutexLock lock(&pending_mu_);
      changes.swap(pending_);
    }
    if (!changes.empty()) listener_(changes);
  }

 private:
  const RecordChangeListener listener_;
  absl::Mutex delivery_mu_;
  absl::Mutex pending_mu_ ABSL_ACQUIRED_AFTER(delivery_mu_);
  std::vector<RecordChange> pending_ ABSL_GUARDED_BY(pending_mu_);
};

}  // namespace kvcache

#endif  // KVCACHE_TIERS_RECORD_CHANGES_H_
