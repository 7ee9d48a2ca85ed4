#include "server/watch_events.h"

#include <google/protobuf/arena.h>

#include <vector>

#include "absl/strings/str_cat.h"

namespace kvcache {
namespace {

// A live response's first arena block, per watcher (the daemon bounds them): kMaxEventsPerResponse
// events of a commit's blocks each fit, so a watcher's responses are built without allocating.
constexpr size_t kArenaBlockBytes = 1 << 20;
// How long the thread waits for the log before it looks at cancellation again.
constexpr absl::Duration kPollPeriod = absl::Milliseconds(200);
// Once an event arrives, more gather until its flush deadline (KvEventLog::FlushDeadline, 20 ms
// after it happened) before sending: one response (one write, one wake-up of the watcher) then
// carries every event of a burst. Routers act on tens of milliseconds (vLLM publishes once per
// engine step); a commit makes one event. rpc_bench, on two cores with both consumers and
// /metrics on: a write per 2 ms cost the control plane ~20%, per 10 ms ~13% (0.87x), per 25 ms
// ~9% (0.91x; each consumer alone within noise of 1.0x).

void ToProto(const Hash128& hash, v1::BlockHash* out) {
  out->set_hi(hash.hi);
  out->set_lo(hash.lo);
}

}  // namespace

void ToProto(const KvEvent& event, v1::KvEvent* out) {
  out->set_sequence(event.sequence);
  out->set_time_unix_micros(absl::ToUnixMicros(event.time));
  switch (event.kind) {
    case KvEventKind::kBlocksStored: {
      v1::BlocksStored* stored = out->mutable_blocks_stored();
      stored->set_pool(event.pool);
      stored->set_tenant(event.tenant);
      stored->set_medium(event.medium);
      stored->set_block_size(event.block_size);
      if (event.parent_hash.has_value()) ToProto(*event.parent_hash, stored->mutable_parent_hash());
      stored->set_manifest_digest(event.manifest_digest);
      for (size_t i = 0; i < event.blocks.size(); ++i) {
        const StoredBlock& block = event.blocks[i];
        v1::StoredBlock* stored_block = stored->add_blocks();
        ToProto(block.hash, stored_block->mutable_hash());
        stored_block->mutable_token_ids()->Add(block.token_ids.begin(), block.token_ids.end());
        stored_block->set_extras_digest(block.extras_digest);
        if (!event.page_keys.empty()) stored_block->set_page_key(event.page_keys[i]);
      }
      break;
    }
    case KvEventKind::kBlocksRemoved: {
      v1::BlocksRemoved* removed = out->mutable_blocks_removed();
      removed->set_pool(event.pool);
      removed->set_tenant(event.tenant);
      removed->set_medium(event.medium);
      for (const Hash128& hash : event.removed) ToProto(hash, removed->add_hashes());
      for (const std::string& key : event.page_keys) removed->add_page_keys(key);
      break;
    }
    case KvEventKind::kAllBlocksCleared:
      out->mutable_all_blocks_cleared()->set_pool(event.pool);
      break;
  }
}

WatchEventsReactor::WatchEventsReactor(KvEventLog* log, uint64_t epoch, std::atomic<int>* active,
                                       const std::atomic<bool>* stopping)
    : log_(log), epoch_(epoch), active_(active), stopping_(stopping) {}

void WatchEventsReactor::Start(uint64_t start_sequence, uint64_t start_epoch, bool need_snapshot,
                               KvEventFilter filter, CallLimits::Ticket stream) {
  filter_ = std::move(filter);
  stream_ = std::move(stream);
  thread_ = std::thread([this, start_sequence, start_epoch, need_snapshot] {
    Run(start_sequence, start_epoch, need_snapshot);
  });
}

bool WatchEventsReactor::ending() const {
  return cancelled() || stopping_->load(std::memory_order_relaxed);
}

void WatchEventsReactor::Reject(const grpc::Status& status) { Finish(status); }

bool WatchEventsReactor::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void WatchEventsReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  cancelled_ = true;
}

void WatchEventsReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  write_ok_ = ok;
}

bool WatchEventsReactor::WriteAndWait(v1::WatchEventsResponse& response) {
  response.set_head_sequence(log_->next_sequence());
  {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return false;
    writing_ = true;
  }
  StartWrite(&response);
  absl::MutexLock lock(&mu_);
  auto written = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !writing_; };
  mu_.Await(absl::Condition(&written));
  return write_ok_ && !cancelled_;
}

std::optional<uint64_t> WatchEventsReactor::SendSnapshot(uint64_t resume_sequence,
                                                         uint64_t resume_epoch) {
  log_->CountSnapshot();
  KvEventLog::Snapshot snapshot = log_->TakeSnapshot(filter_);
  KvEvent cleared;
  cleared.sequence = snapshot.next_sequence - 1;
  cleared.kind = KvEventKind::kAllBlocksCleared;
  cleared.pool = filter_.pool;
  // Until the last message, next_sequence stays where the watcher came from: a stream cut
  // during the snapshot resumes with a whole new one.
  v1::WatchEventsResponse response;
  response.set_epoch(resume_epoch);
  response.set_snapshot(true);
  response.set_next_sequence(resume_sequence);
  ToProto(cleared, response.add_events());
  for (const KvEvent& event : snapshot.events) {
    if (static_cast<size_t>(response.events_size()) == kMaxEventsPerResponse) {
      if (!WriteAndWait(response)) return std::nullopt;
      response.clear_events();
    }
    ToProto(event, response.add_events());
  }
  response.set_epoch(epoch_);
  response.set_next_sequence(snapshot.next_sequence);
  response.set_snapshot_end(true);
  if (!WriteAndWait(response)) return std::nullopt;
  return snapshot.next_sequence;
}

void WatchEventsReactor::Run(uint64_t start_sequence, uint64_t start_epoch, bool need_snapshot) {
  uint64_t cursor = start_sequence;
  uint64_t cursor_epoch = start_epoch;
  bool snapshot = need_snapshot;
  bool unsent_progress = false;  // the cursor passed events this watcher does not see
  std::vector<char> arena_block(kArenaBlockBytes);
  google::protobuf::ArenaOptions arena_options;
  arena_options.initial_block = arena_block.data();
  arena_options.initial_block_size = arena_block.size();
  google::protobuf::Arena arena(arena_options);
  while (!ending()) {
    if (snapshot) {
      std::optional<uint64_t> next = SendSnapshot(cursor, cursor_epoch);
      if (!next.has_value()) break;
      cursor = *next;
      cursor_epoch = epoch_;
      snapshot = false;
      continue;
    }
    KvEventLog::ReadResult read = log_->Read(cursor, kMaxEventsPerResponse);
    if (read.lost) {
      // Fell behind the buffer: the events in between are gone, the index is not.
      log_->CountDropped(KvEventSink::kGrpc, log_->first_sequence() - cursor);
      snapshot = true;
      continue;
    }
    if (read.events.empty()) {
      if (unsent_progress) {
        v1::WatchEventsResponse progress;
        progress.set_epoch(epoch_);
        progress.set_next_sequence(cursor);
        if (!WriteAndWait(progress)) break;
        unsent_progress = false;
      }
      if (log_->WaitFor(cursor, kPollPeriod)) log_->WaitForFlush(cursor);
      continue;
    }
    // Built in the arena, emptied once the response is sent: a commit's event holds a message per
    // block, and thousands of small allocations per response would cost the requests' CPU.
    arena.Reset();
    v1::WatchEventsResponse& response =
        *google::protobuf::Arena::CreateMessage<v1::WatchEventsResponse>(&arena);
    response.set_epoch(epoch_);
    for (const auto& event : read.events) {
      if (filter_.Matches(*event)) ToProto(*event, response.add_events());
    }
    cursor = read.next_sequence;
    if (response.events().empty()) {
      unsent_progress = true;
      continue;
    }
    response.set_next_sequence(cursor);
    if (!WriteAndWait(response)) break;
    unsent_progress = false;
  }
  if (cancelled()) {
    Finish(grpc::Status(grpc::StatusCode::CANCELLED, "watch cancelled"));
  } else if (stopping_->load(std::memory_order_relaxed)) {
    Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "the daemon is shutting down; resume from the last next_sequence"));
  } else {
    Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the event stream broke"));
  }
}

void WatchEventsReactor::OnDone() {
  active_->fetch_sub(1, std::memory_order_relaxed);
  if (thread_.joinable()) {
    // gRPC may run OnDone inline in the thread's own Finish; then nothing follows it there.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }
  delete this;
}

}  // namespace kvcache
