#include "comm/stop_token.h"

#include <chrono>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(StopToken, RequestStop_RunsEachCallbackOnce_KeepsFirstReason) {
  StopToken token;
  std::vector<std::string> seen;
  auto first = token.OnStop([&](const std::string& reason) { seen.push_back("a:" + reason); });
  auto second = token.OnStop([&](const std::string& reason) { seen.push_back("b:" + reason); });
  EXPECT_FALSE(token.stop_requested());
  EXPECT_EQ(token.reason(), "");
  token.RequestStop("signal 15");
  token.RequestStop("the coordinator ended the job");
  EXPECT_TRUE(token.stop_requested());
  EXPECT_EQ(token.reason(), "signal 15");
  EXPECT_EQ(seen, (std::vector<std::string>{"a:signal 15", "b:signal 15"}));
}

TEST(StopToken, OnStopAfterTrip_RunsAtOnce) {
  StopToken token;
  token.RequestStop("cancelled");
  std::string seen;
  auto registration = token.OnStop([&](const std::string& reason) { seen = reason; });
  EXPECT_EQ(seen, "cancelled");
}

TEST(StopToken, DestroyedRegistration_IsNotCalled) {
  StopToken token;
  int calls = 0;
  auto registration = token.OnStop([&](const std::string&) { ++calls; });
  registration.reset();
  token.RequestStop("x");
  EXPECT_EQ(calls, 0);
}

TEST(StopToken, UnregisterWaitsForACallbackRunningOnAnotherThread) {
  StopToken token;
  std::atomic<bool> entered{false};
  std::atomic<bool> finished{false};
  auto registration = token.OnStop([&](const std::string&) {
    entered = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    finished = true;
  });
  std::thread stopper([&] { token.RequestStop("x"); });
  while (!entered) std::this_thread::yield();
  registration.reset();  // Must not return while the callback still runs.
  EXPECT_TRUE(finished);
  stopper.join();
}

}  // namespace
}  // namespace mptrain
