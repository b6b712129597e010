#include "worker/self_fence.h"

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(SelfFence, FencesOnlyAfterTheFullTimeoutOfSilence) {
  SelfFence fence(10'000, /*now_ms=*/1'000);
  EXPECT_FALSE(fence.ShouldFence(1'000));
  EXPECT_FALSE(fence.ShouldFence(10'999));
  EXPECT_TRUE(fence.ShouldFence(11'000));
  EXPECT_EQ(fence.SilentMs(11'000), 10'000);
}

TEST(SelfFence, FencesOncePerSilence) {
  SelfFence fence(10'000, 0);
  EXPECT_TRUE(fence.ShouldFence(10'000));
  EXPECT_FALSE(fence.ShouldFence(10'050));
  EXPECT_FALSE(fence.ShouldFence(60'000));
  // Contact again, then another silence: fences again after another full timeout.
  EXPECT_EQ(fence.OnContact(61'000), 61'000) << "says how long the fenced silence lasted";
  EXPECT_FALSE(fence.ShouldFence(70'999));
  EXPECT_TRUE(fence.ShouldFence(71'000));
}

TEST(SelfFence, AQuickCoordinatorRestart_DoesNotFence) {
  // Heartbeats every second, then the coordinator is away for 8 s (a restart), then answers.
  SelfFence fence(10'000, 0);
  int64_t now = 0;
  for (; now <= 5'000; now += 1'000) {
    EXPECT_EQ(fence.OnContact(now), 0);
    EXPECT_FALSE(fence.ShouldFence(now));
  }
  const int64_t last_contact = now - 1'000;
  for (int64_t t = last_contact + 100; t < last_contact + 8'000; t += 100) {
    EXPECT_FALSE(fence.ShouldFence(t)) << t;
  }
  EXPECT_EQ(fence.OnContact(last_contact + 8'000), 0) << "not fenced: nothing to report";
  EXPECT_FALSE(fence.ShouldFence(last_contact + 8'000 + 9'999));
}

TEST(SelfFence, ContactsArrivingOutOfOrder_DoNotMoveTheClockBack) {
  SelfFence fence(10'000, 0);
  fence.OnContact(5'000);
  fence.OnContact(3'000);  // A slow call's answer.
  EXPECT_FALSE(fence.ShouldFence(14'999));
  EXPECT_TRUE(fence.ShouldFence(15'000));
}

TEST(SelfFence, ZeroDisables_EvenWhenTheCoordinatorSendsATimeout) {
  SelfFence fence(0, 0);
  fence.UseCoordinatorTimeout(3'000);
  EXPECT_FALSE(fence.enabled());
  EXPECT_FALSE(fence.ShouldFence(1'000'000'000));
}

TEST(SelfFence, TheCoordinatorsTimeoutReplacesTheFlag) {
  SelfFence fence(10'000, 0);
  fence.UseCoordinatorTimeout(3'000);
  EXPECT_EQ(fence.fence_after_ms(), 3'000);
  EXPECT_FALSE(fence.ShouldFence(2'999));
  EXPECT_TRUE(fence.ShouldFence(3'000));
  fence.UseCoordinatorTimeout(0);  // Not sent: kept.
  EXPECT_EQ(fence.fence_after_ms(), 3'000);
}

}  // namespace
}  // namespace mptrain
