#include "tiers/seal_workers.h"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"

namespace kvcache {
namespace {

TEST(SealWorkersTest, WithoutThreadsTasksRunInline) {
  std::vector<int> ran;
  SealWorkers::Group alone(nullptr);
  alone.Run([&ran] { ran.push_back(1); });
  EXPECT_EQ(ran.size(), 1u);
  SealWorkers none(0);
  SealWorkers::Group group(&none);
  group.Run([&ran] { ran.push_back(2); });
  EXPECT_EQ(ran.size(), 2u);
  group.Wait();
}

TEST(SealWorkersTest, WaitReturnsOnceEveryTaskOfItsGroupRan) {
  SealWorkers workers(3);
  EXPECT_EQ(workers.threads(), 3);
  std::vector<std::thread> callers;
  std::atomic<int> wrong{0};
  for (int caller = 0; caller < 4; ++caller) {
    callers.emplace_back([&workers, &wrong] {
      for (int round = 0; round < 50; ++round) {
        std::vector<int> done(64, 0);  // each task writes its own element
        SealWorkers::Group group(&workers);
        for (int i = 0; i < 64; ++i) group.Run([&done, i] { done[i] = i + 1; });
        group.Wait();
        for (int i = 0; i < 64; ++i) wrong += done[i] != i + 1;
      }
    });
  }
  for (std::thread& caller : callers) caller.join();
  EXPECT_EQ(wrong.load(), 0);
}

TEST(SealWorkersTest, ACallerRunsItsOwnTasksWhileTheWorkersAreBusy) {
  SealWorkers workers(1);
  absl::Notification release, blocking;
  SealWorkers::Group other(&workers);
  other.Run([&] {
    blocking.Notify();
    release.WaitForNotification();
  });
  blocking.WaitForNotification();  // the only worker is taken
  int ran = 0;
  {
    SealWorkers::Group mine(&workers);
    for (int i = 0; i < 8; ++i) mine.Run([&ran] { ++ran; });
    mine.Wait();  // runs all eight itself
  }
  EXPECT_EQ(ran, 8);
  release.Notify();
  other.Wait();
}

// Workers that look for the next task before they sleep: tasks handed out one at a time, some
// while a worker still looks and some after every worker slept, each run by a worker without the
// caller waiting for it (a task left queued unsignalled would only run inside Wait).
TEST(SealWorkersTest, TasksHandedOutWhileWorkersLookOrSleepAllRunOnWorkers) {
  for (const absl::Duration spin : {absl::Milliseconds(5), absl::ZeroDuration()}) {
    SealWorkers workers(2, spin);
    SealWorkers::Group group(&workers);
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

}  // namespace
}  // namespace kvcache
