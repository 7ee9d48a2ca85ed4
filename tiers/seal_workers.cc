#include "tiers/seal_workers.h"

#include <algorithm>
#include <utility>

namespace kvcache {

int SealWorkers::DefaultThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency() / 4), 1, 4);
}

SealWorkers::SealWorkers(int threads) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

SealWorkers::~SealWorkers() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    work_.SignalAll();
  }
  for (std::thread& thread : threads_) thread.join();
}

void SealWorkers::Group::Run(absl::AnyInvocable<void() &&> task) {
  if (workers_ == nullptr || workers_->threads_.empty()) {
    std::move(task)();
    return;
  }
  workers_->Enqueue(this, std::move(task));
}

void SealWorkers::Group::Wait() {
  if (workers_ != nullptr) workers_->WaitFor(this);
}

void SealWorkers::Enqueue(const Group* group, absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  ++pending_[group];
  queue_.push_back(Task{group, std::move(task)});
  work_.Signal();
}

void SealWorkers::WaitFor(const Group* group) {
  mu_.Lock();
  // The group's own queued tasks first, on this thread: the workers may be busy with others'.
  // No task of the group is queued while it waits (Run and Wait are its owner's).
  for (auto it = queue_.begin(); it != queue_.end();) {
    if (it->group != group) {
      ++it;
      continue;
    }
    Task task = std::move(*it);
    queue_.erase(it);
    mu_.Unlock();
    RunTask(std::move(task));
    mu_.Lock();
    it = queue_.begin();
  }
  while (pending_.contains(group)) done_.Wait(&mu_);
  mu_.Unlock();
}

void SealWorkers::Loop() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty()) work_.Wait(&mu_);
      if (queue_.empty()) return;  // stopping, nothing left to run
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    RunTask(std::move(task));
  }
}

void SealWorkers::RunTask(Task task) {
  std::move(task.run)();
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(task.group);
  if (--it->second == 0) {
    pending_.erase(it);
    done_.SignalAll();
  }
}

}  // namespace kvcache
