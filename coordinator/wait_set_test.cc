#include "coordinator/wait_set.h"

#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

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
  // Each callback records its wait's deadline and when it ran: every wait expires (reason
  // kDeadline), none before its deadline, and in the order of their deadlines.
  struct Expiry {
    WaitSet::Clock::time_point deadline, ran;
    Reason reason;
  };
  std::mutex mutex;
  std::vector<Expiry> expiries;
  std::atomic<int> expired{0};
  WaitSet waits;
  // Deadlines from one base, 300 ms on: all 10,000 are in before the first expires (a wait
  // added after later deadlines already ran could not be in order), even under ASan.
  const WaitSet::Clock::time_point base = In(300);
  for (int i = 0; i < 10'000; ++i) {
    const WaitSet::Clock::time_point deadline = base + std::chrono::milliseconds(i % 50);
    waits.Wait("worker:" + std::to_string(i), deadline, [&, deadline](Reason reason) {
      const auto ran = WaitSet::Clock::now();
      std::lock_guard<std::mutex> lock(mutex);
      expiries.push_back({deadline, ran, reason});
      ++expired;
    });
  }
  for (int i = 0; i < 500 && expired.load() < 10'000; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  std::lock_guard<std::mutex> lock(mutex);
  ASSERT_EQ(expiries.size(), 10'000u);
  int early = 0, out_of_order = 0, not_expired = 0;
  for (size_t i = 0; i < expiries.size(); ++i) {
    early += expiries[i].ran < expiries[i].deadline;
    not_expired += expiries[i].reason != Reason::kDeadline;
    out_of_order += i > 0 && expiries[i].deadline < expiries[i - 1].deadline;
  }
  EXPECT_EQ(early, 0) << "callbacks ran before their deadline";
  EXPECT_EQ(not_expired, 0) << "callbacks ran for another reason than kDeadline";
  EXPECT_EQ(out_of_order, 0) << "callbacks ran out of their deadlines' order";
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
