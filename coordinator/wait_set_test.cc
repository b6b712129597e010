#include "coordinator/wait_set.h"

#include <atomic>
#include <future>
#include <thread>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

using Reason = WaitSet::Reason;
auto In(int ms) { return WaitSet::Clock::now() + std::chrono::milliseconds(ms); }

TEST(WaitSet, Notify_RunsOnlyTheWaitsOnThatKey) {
  WaitSet waits;
  std::atomic<int> a{0}, b{0};
  waits.Wait("worker:a", In(10'000), [&](Reason reason) { a = reason == Reason::kNotified; });
  waits.Wait("worker:b", In(10'000), [&](Reason) { b = 1; });
  waits.Notify({"worker:a"});
  for (int i = 0; i < 500 && a.load() == 0; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(a.load(), 1) << "run soon, on the wait set's thread";
  EXPECT_EQ(b.load(), 0);
  EXPECT_EQ(waits.size(), 1u);
}

TEST(WaitSet, Deadline_RunsTheCallbackOnTheTimerThread) {
  WaitSet waits;
  std::promise<Reason> fired;
  const auto start = WaitSet::Clock::now();
  waits.Wait("k", In(50), [&](Reason reason) { fired.set_value(reason); });
  auto future = fired.get_future();
  ASSERT_EQ(future.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(future.get(), Reason::kDeadline);
  EXPECT_GE(WaitSet::Clock::now() - start, std::chrono::milliseconds(50));
  EXPECT_EQ(waits.size(), 0u);
}

TEST(WaitSet, Cancel_RunsOnce_AndALaterNotifyDoesNothing) {
  WaitSet waits;
  std::atomic<int> calls{0};
  uint64_t id = waits.Wait("k", In(10'000), [&](Reason reason) {
    ++calls;
    EXPECT_EQ(reason, Reason::kCancelled);
  });
  waits.Cancel(id);
  waits.Cancel(id);
  waits.Notify({"k"});
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(calls.load(), 1);
}

TEST(WaitSet, ManyWaitersOneThread_AllExpireInOrder) {
  WaitSet waits;
  std::atomic<int> expired{0};
  for (int i = 0; i < 10'000; ++i) {
    waits.Wait("worker:" + std::to_string(i), In(20 + i % 50), [&](Reason) { ++expired; });
  }
  for (int i = 0; i < 500 && expired.load() < 10'000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(expired.load(), 10'000);
}

TEST(WaitSet, Shutdown_RunsEveryPendingCallback) {
  std::atomic<int> shutdown{0};
  {
    WaitSet waits;
    for (int i = 0; i < 3; ++i) {
      waits.Wait("k", In(60'000), [&](Reason reason) { shutdown += reason == Reason::kShutdown; });
    }
  }
  EXPECT_EQ(shutdown.load(), 3);
}

}  // namespace
}  // namespace mptrain
