#include "common/task_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace kvcache {
namespace {

TEST(TaskWorkersTest, WithoutThreadsTasksRunInline) {
  std::vector<int> ran;
  TaskWorkers::Group alone(nullptr);
  alone.Run([&ran] { ran.push_back(1); });
  EXPECT_EQ(ran.size(), 1u);
  TaskWorkers none(0);
  TaskWorkers::Group group(&none);
  group.Run([&ran] { ran.push_back(2); });
  EXPECT_EQ(ran.size(), 2u);
  group.Wait();
}

TEST(TaskWorkersTest, WaitReturnsOnceEveryTaskOfItsGroupRan) {
  TaskWorkers workers(3);
  EXPECT_EQ(workers.threads(), 3);
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int caller = 0; caller < 4; ++caller) {
    callers.emplace_back([&workers, &wrong] {
      for (int round = 0; round < 50; ++round) {
        std::vector<int> done(64, 0);  // each task writes its own element
        TaskWorkers::Group group(&workers);
        for (int i = 0; i < 64; ++i) group.Run([&done, i] { done[i] = i + 1; });
        group.Wait();
        for (int i = 0; i < 64; ++i) wrong += done[i] != i + 1;
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(wrong.load(), 0);
}

// Another caller's task holding a pool's only worker until destroyed.
class OnlyWorkerTaken {
 public:
  explicit OnlyWorkerTaken(TaskWorkers* workers) : group_(workers) {
    group_.Run([this] {
      taken_.Notify();
      release_.WaitForNotification();
    });
    taken_.WaitForNotification();
  }
  ~OnlyWorkerTaken() {
    release_.Notify();
    group_.Wait();
  }
  TaskWorkers::Group& group() { return group_; }

 private:
  absl::Notification taken_, release_;
  TaskWorkers::Group group_;
};

TEST(TaskWorkersTest, ACallerRunsItsOwnTasksWhileTheWorkersAreBusy) {
  TaskWorkers workers(1);
  const OnlyWorkerTaken other(&workers);
  int ran = 0;
  {
    TaskWorkers::Group mine(&workers);
    for (int i = 0; i < 8; ++i) mine.Run([&ran] { ++ran; });
    mine.Wait();  // runs all eight itself
  }
  EXPECT_EQ(ran, 8);
}

// A caller waiting for one of its tasks helps with its others still queued, first queued first,
// and learns when none is left to help with.
TEST(TaskWorkersTest, RunOneQueuedRunsTheGroupsFirstQueuedTaskOnTheCaller) {
  TaskWorkers workers(1, absl::ZeroDuration());
  OnlyWorkerTaken other(&workers);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<int> ran;
  bool all_on_caller = true;
  {
    TaskWorkers::Group mine(&workers);
    for (int i = 0; i < 3; ++i) {
      mine.Run([&, i] {
        ran.push_back(i);
        all_on_caller &= std::this_thread::get_id() == caller;
      });
    }
    EXPECT_TRUE(mine.RunOneQueued());
    EXPECT_EQ(ran, std::vector<int>({0}));
    EXPECT_TRUE(mine.RunOneQueued());
    EXPECT_TRUE(mine.RunOneQueued());
    EXPECT_FALSE(mine.RunOneQueued());
    EXPECT_FALSE(other.group().RunOneQueued());  // its one task is running, not queued
  }
  EXPECT_EQ(ran, std::vector<int>({0, 1, 2}));
  EXPECT_TRUE(all_on_caller);
  TaskWorkers::Group inline_group(nullptr);
  EXPECT_FALSE(inline_group.RunOneQueued());
}

// Workers that look for the next task before they sleep: tasks handed out one at a time, some
// while a worker still looks and some after every worker slept, each run by a worker without the
// caller waiting for it (a task left queued unsignalled would only run inside Wait).
TEST(TaskWorkersTest, TasksHandedOutWhileWorkersLookOrSleepAllRunOnWorkers) {
  for (const absl::Duration spin : {absl::Milliseconds(5), absl::ZeroDuration()}) {
    TaskWorkers workers(2, spin);
    TaskWorkers::Group group(&workers);
    const std::thread::id caller = std::this_thread::get_id();
    for (int i = 0; i < 40; ++i) {
      absl::Notification ran;
      std::atomic<bool> on_worker{false};
      group.Run([&] {
        on_worker = std::this_thread::get_id() != caller;
        ran.Notify();
      });
      ASSERT_TRUE(ran.WaitForNotificationWithTimeout(absl::Seconds(10))) << i;
      EXPECT_TRUE(on_worker.load()) << i;
      // Next task: at once, while the worker looks; a little later; or after it slept.
      absl::SleepFor(absl::Milliseconds(i % 3 == 0 ? 0 : (i % 3 == 1 ? 2 : 12)));
    }
    group.Wait();
  }
}

// ExpectWork wakes every sleeping worker to look for tasks until its deadline: tasks handed out
// meanwhile run on them, once each; past the deadline they sleep again, and a pool destroyed
// while its workers look stops at once rather than at the deadline.
TEST(TaskWorkersTest, ExpectWorkWakesTheWorkersToLookUntilItsDeadline) {
  const auto all_looking = [](const TaskWorkers& workers, int count) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    while (workers.looking_for_work() != count && absl::Now() < until) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    return workers.looking_for_work() == count;
  };
  {
    TaskWorkers workers(2, absl::ZeroDuration());
    ASSERT_TRUE(all_looking(workers, 0));  // nothing to do: asleep
    workers.ExpectWork(absl::Milliseconds(300));
    EXPECT_TRUE(all_looking(workers, 2));
    std::atomic<int> ran{0};
    {
      TaskWorkers::Group group(&workers);
      for (int i = 0; i < 100; ++i) group.Run([&ran] { ran.fetch_add(1); });
    }
    EXPECT_EQ(ran.load(), 100);
    EXPECT_TRUE(all_looking(workers, 0));  // the deadline passed: asleep again
    workers.ExpectWork(absl::Hours(1));
    EXPECT_TRUE(all_looking(workers, 2));
  }  // joins now, not in an hour
  TaskWorkers none(0);
  none.ExpectWork(absl::Seconds(1));
  EXPECT_EQ(none.looking_for_work(), 0);
}

// RunInSlices visits every index once, in contiguous slices, the first on the calling thread;
// with no workers, or fewer items than slices, it still covers them all and nothing more.
TEST(TaskWorkersTest, RunInSlicesVisitsEveryIndexOnceInContiguousSlices) {
  TaskWorkers workers(2, absl::ZeroDuration());
  const std::thread::id caller = std::this_thread::get_id();
  for (TaskWorkers* pool : {&workers, static_cast<TaskWorkers*>(nullptr)}) {
    for (const size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{100}}) {
      for (const size_t slices : {size_t{1}, size_t{3}, size_t{5}}) {
        std::vector<std::atomic<int>> visits(count);
        std::atomic<int> calls{0};
        std::atomic<bool> first_on_caller{false};
        RunInSlices(pool, count, slices, [&](size_t begin, size_t end) {
          ASSERT_LT(begin, end);
          ASSERT_LE(end, count);
          ++calls;
          if (begin == 0) first_on_caller = std::this_thread::get_id() == caller;
          for (size_t i = begin; i < end; ++i) ++visits[i];
        });
        for (size_t i = 0; i < count; ++i) {
          EXPECT_EQ(visits[i].load(), 1) << "index " << i << " of " << count << ", " << slices;
        }
        EXPECT_EQ(calls.load(), static_cast<int>(std::min(count, slices)));
        if (count > 0) {
          EXPECT_TRUE(first_on_caller.load());
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvcache
