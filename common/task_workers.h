// TaskWorkers: a few threads that run a caller's tasks beside it. The daemon's sealed tiers seal
// and open records' bodies on them (tiers/record_seal.h: AES-256-GCM runs at a few GB/s a core,
// slower than a fast disk or a Redis Cluster delivers bytes, and done on the reading thread it
// would stall the reads it should keep in flight); the client copies a page batch on them
// (KvCacheClient::WritePages, ReadPagesInto) and checksums one (PutPages, PutBlocks).
//
// A caller hands out tasks in a Group and waits for them; while it waits it runs its group's
// queued tasks itself, so a pool busy with other callers' work never stalls it, and a pool of
// no threads (or no pool) runs everything on the caller's thread.
//
// A load hands out one task per record as its replies arrive, usually slower than the workers
// finish them: a worker that slept after each task would cost the handing thread a wake-up (a
// futex call) per record. So where the machine has cores to spare (four a worker), a worker that
// ran a task looks for the next one for kSpin before it sleeps, and a task finds a looking
// worker without waking one.
//
// Thread safety: thread-safe; a Group belongs to the one thread that made it.
#ifndef KVCACHE_COMMON_TASK_WORKERS_H_
#define KVCACHE_COMMON_TASK_WORKERS_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/functional/any_invocable.h"
#include "absl/functional/function_ref.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace kvcache {

class TaskWorkers {
 public:
  // The daemon's choice for its sealed tiers: a quarter of the machine's cores, 1 to 4.
  static int DefaultThreads();

  explicit TaskWorkers(int threads);
  // As above, with the time a worker looks for the next task before it sleeps (zero: never).
  TaskWorkers(int threads, absl::Duration spin);

  static constexpr absl::Duration kSpin = absl::Microseconds(50);
  // Runs what is queued, then joins.
  ~TaskWorkers();
  TaskWorkers(const TaskWorkers&) = delete;
  TaskWorkers& operator=(const TaskWorkers&) = delete;

  int threads() const { return static_cast<int>(threads_.size()); }
  absl::Duration spin() const { return spin_; }

  // Tasks are coming within `within` (a batch whose round trip is under way): sleeping workers
  // wake now and look for them until then, as after a task, so that the batch's tasks start
  // without a wake-up each (tens of microseconds on a busy or virtual machine, as long as a
  // slice of a page batch). Costs each idle worker up to `within` of a core.
  void ExpectWork(absl::Duration within) ABSL_LOCKS_EXCLUDED(mu_);
  // Workers looking for a task now (after one, or told to by ExpectWork) rather than asleep.
  int looking_for_work() const { return looking_.load(std::memory_order_relaxed); }

  // Queued tasks so far, by who ran them: a worker, or the group's owner while it waited (the
  // workers busy, or slow to wake). Tasks of a pool of no threads are not counted.
  uint64_t ran_on_workers() const { return ran_on_workers_.load(std::memory_order_relaxed); }
  uint64_t ran_by_callers() const { return ran_by_callers_.load(std::memory_order_relaxed); }

  class Group {
   public:
    // `workers` null: every task runs inside Run.
    explicit Group(TaskWorkers* workers) : workers_(workers) {}
    // Waits for the group's tasks.
    ~Group() { Wait(); }
    Group(const Group&) = delete;
    Group& operator=(const Group&) = delete;

    // Queues `task`, which must not touch what the caller uses until Wait returns.
    void Run(absl::AnyInvocable<void() &&> task);
    // Returns once every task Run queued has run, running the group's queued ones meanwhile.
    void Wait();
    // Runs the first of the group's tasks still queued on this thread; false when none is (each
    // has run or is running), so a caller waiting for one task can help rather than sleep.
    bool RunOneQueued();

   private:
    TaskWorkers* const workers_;
  };

 private:
  struct Task {
    const Group* group;
    absl::AnyInvocable<void() &&> run;
  };
  void Enqueue(const Group* group, absl::AnyInvocable<void() &&> task) ABSL_LOCKS_EXCLUDED(mu_);
  void WaitFor(const Group* group) ABSL_LOCKS_EXCLUDED(mu_);
  bool RunOneQueued(const Group* group) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // Runs `task` outside mu_, then counts it done in its group.
  void RunTask(Task task) ABSL_LOCKS_EXCLUDED(mu_);

  // Waits for a task to be queued, without the mutex: up to spin_, or until the deadline
  // ExpectWork set if that is later.
  void LookForWork();
  bool Expecting() const { return SteadyNanos() < expect_until_ns_.load(); }
  static int64_t SteadyNanos();  // std::chrono::steady_clock's now

  const absl::Duration spin_;
  std::atomic<int> looking_{0};              // workers in LookForWork
  std::atomic<size_t> queued_{0};            // queue_.size(), for LookForWork
  std::atomic<bool> stopping_now_{false};    // stopping_, for LookForWork
  std::atomic<int64_t> expect_until_ns_{0};  // ExpectWork's deadline, SteadyNanos()
  std::atomic<uint64_t> ran_on_workers_{0};
  std::atomic<uint64_t> ran_by_callers_{0};

  absl::Mutex mu_;
  absl::CondVar work_;  // a task queued, or stopping
  absl::CondVar done_;  // a task finished
  std::deque<Task> queue_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<const Group*, uint64_t> pending_ ABSL_GUARDED_BY(mu_);  // queued or running
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;  // constant after construction
};

// The least a copy must move before it is cut into slices for workers (RunInSlices): at
// memory's rate a thread copies 1 MiB in about 70 us, a few times what waking another thread to
// share it costs. The client's page copies, the daemon's tier-2 loads and its PutPages use it.
inline constexpr uint64_t kSlicedCopyMinBytes = uint64_t{1} << 20;

// Runs run(begin, end) over [0, count) cut into `slices` contiguous slices (at most count, none
// empty): the first on this thread, the others queued to `workers` (null: all here), and returns
// once all have run.
void RunInSlices(TaskWorkers* workers, size_t count, size_t slices,
                 absl::FunctionRef<void(size_t begin, size_t end)> run);

}  // namespace kvcache

#endif  // KVCACHE_COMMON_TASK_WORKERS_H_
