#include "common/task_workers.h"

#include <algorithm>
#include <chrono>
#include <utility>

namespace kvcache {

int TaskWorkers::DefaultThreads() {
  return std::clamp(static_cast<int>(std::thread::hardware_concurrency() / 4), 1, 4);
}

TaskWorkers::TaskWorkers(int threads)
    : TaskWorkers(threads, static_cast<int>(std::thread::hardware_concurrency()) >= 4 * threads
                               ? kSpin
                               : absl::ZeroDuration()) {}

TaskWorkers::TaskWorkers(int threads, absl::Duration spin) : spin_(spin) {
  for (int i = 0; i < threads; ++i) threads_.emplace_back([this] { Loop(); });
}

TaskWorkers::~TaskWorkers() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
    stopping_now_.store(true);
    work_.SignalAll();
  }
  for (std::thread& thread : threads_) thread.join();
}

void TaskWorkers::Group::Run(absl::AnyInvocable<void() &&> task) {
  if (workers_ == nullptr || workers_->threads_.empty()) {
    std::move(task)();
    return;
  }
  workers_->Enqueue(this, std::move(task));
}

void TaskWorkers::Group::Wait() {
  if (workers_ != nullptr) workers_->WaitFor(this);
}

void TaskWorkers::Enqueue(const Group* group, absl::AnyInvocable<void() &&> task) {
  absl::MutexLock lock(&mu_);
  ++pending_[group];
  queue_.push_back(Task{group, std::move(task)});
  queued_.store(queue_.size());
  // A worker still looking takes it (it checks the queue under mu_ before it sleeps); only the
  // tasks past the lookers' number need a sleeper woken.
  if (static_cast<size_t>(looking_.load()) < queue_.size()) work_.Signal();
}

int64_t TaskWorkers::SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

void TaskWorkers::ExpectWork(absl::Duration within) {
  if (threads_.empty()) return;
  const int64_t until = SteadyNanos() + absl::ToInt64Nanoseconds(within);
  int64_t current = expect_until_ns_.load();
  while (current < until && !expect_until_ns_.compare_exchange_weak(current, until)) {
  }
  absl::MutexLock lock(&mu_);
  work_.SignalAll();
}

bool TaskWorkers::Group::RunOneQueued() {
  return workers_ != nullptr && workers_->RunOneQueued(this);
}

bool TaskWorkers::RunOneQueued(const Group* group) {
  Task task;
  {
    absl::MutexLock lock(&mu_);
    auto it = std::find_if(queue_.begin(), queue_.end(),
                           [group](const Task& queued) { return queued.group == group; });
    if (it == queue_.end()) return false;
    task = std::move(*it);
    queue_.erase(it);
    queued_.store(queue_.size());
  }
  ran_by_callers_.fetch_add(1, std::memory_order_relaxed);
  RunTask(std::move(task));
  return true;
}

void TaskWorkers::WaitFor(const Group* group) {
  // The group's own queued tasks first, on this thread: the workers may be busy with others'.
  // No task of the group is queued while it waits (Run and Wait are its owner's).
  while (RunOneQueued(group)) {
  }
  absl::MutexLock lock(&mu_);
  while (pending_.contains(group)) done_.Wait(&mu_);
}

void TaskWorkers::LookForWork() {
  looking_.fetch_add(1);
  // A steady clock: a wall clock set back would keep the worker looking for as long.
  const int64_t until =
      std::max(SteadyNanos() + absl::ToInt64Nanoseconds(spin_), expect_until_ns_.load());
  for (int i = 1; queued_.load(std::memory_order_relaxed) == 0 &&
                  !stopping_now_.load(std::memory_order_relaxed);
       ++i) {
    if (i % 64 == 0 && SteadyNanos() >= until) break;
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
  // Enqueue reads looking_ under mu_ after it queued: a task it left unsignalled is in the queue
  // when this worker, having stopped looking, takes mu_.
  looking_.fetch_sub(1);
}

void TaskWorkers::Loop() {
  bool ran = false;
  while (true) {
    if ((ran && spin_ > absl::ZeroDuration()) || Expecting()) LookForWork();
    Task task;
    {
      absl::MutexLock lock(&mu_);
      while (!stopping_ && queue_.empty() && !Expecting()) work_.Wait(&mu_);
      if (stopping_ && queue_.empty()) return;  // nothing left to run
      if (queue_.empty()) continue;  // woken by ExpectWork: look for the tasks it announced
      task = std::move(queue_.front());
      queue_.pop_front();
      queued_.store(queue_.size());
    }
    ran_on_workers_.fetch_add(1, std::memory_order_relaxed);
    RunTask(std::move(task));
    ran = true;
  }
}

void TaskWorkers::RunTask(Task task) {
  std::move(task.run)();
  absl::MutexLock lock(&mu_);
  auto it = pending_.find(task.group);
  if (--it->second == 0) {
    pending_.erase(it);
    done_.SignalAll();
  }
}

void RunInSlices(TaskWorkers* workers, size_t count, size_t slices,
                 absl::FunctionRef<void(size_t begin, size_t end)> run) {
  if (count == 0) return;
  slices = std::clamp<size_t>(slices, 1, count);
  TaskWorkers::Group group(workers);
  for (size_t slice = 1; slice < slices; ++slice) {
    group.Run([run, begin = count * slice / slices, end = count * (slice + 1) / slices] {
      run(begin, end);
    });
  }
  run(0, count / slices);
  group.Wait();
}

}  // namespace kvcache
