#include "worker/register_backoff.h"

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(RegisterBackoffTest, AfterRefusal_HonoursTheDelayAndDoublesUpToTheCap) {
  RegisterBackoff backoff;
  EXPECT_EQ(backoff.AfterRefusal(2'000, 0.0), 2'000);
  EXPECT_EQ(backoff.AfterRefusal(2'000, 0.0), 4'000);
  EXPECT_EQ(backoff.AfterRefusal(2'000, 0.0), 8'000);
  for (int i = 0; i < 10; ++i) backoff.AfterRefusal(2'000, 0.0);
  EXPECT_EQ(backoff.AfterRefusal(2'000, 0.0), RegisterBackoff::kMaxRefusedBaseMs);
  EXPECT_EQ(backoff.AfterRefusal(2'000, 0.5), 50'000);
  EXPECT_LE(backoff.AfterRefusal(2'000, 1.0), RegisterBackoff::kMaxRefusedWaitMs);
}

TEST(RegisterBackoffTest, AfterRefusal_JitterSpreadsAboveTheAskedDelay) {
  RegisterBackoff low, high;
  const int64_t a = low.AfterRefusal(10'000, 0.0);
  const int64_t b = high.AfterRefusal(10'000, 0.9);
  EXPECT_EQ(a, 10'000);
  EXPECT_EQ(b, 14'500);
}

TEST(RegisterBackoffTest, AfterRefusal_AHugeOrMissingDelayIsBounded) {
  RegisterBackoff huge;
  EXPECT_EQ(huge.AfterRefusal(int64_t{1} << 50, 0.0), RegisterBackoff::kMaxRefusedBaseMs);
  RegisterBackoff negative;
  EXPECT_EQ(negative.AfterRefusal(-5, 0.0), RegisterBackoff::kMaxRetryMs);
}

TEST(RegisterBackoffTest, AfterFailure_QuickRetriesDoubleToTwoSeconds) {
  RegisterBackoff backoff;
  EXPECT_EQ(backoff.AfterFailure(), 200);
  EXPECT_EQ(backoff.AfterFailure(), 400);
  EXPECT_EQ(backoff.AfterFailure(), 800);
  EXPECT_EQ(backoff.AfterFailure(), 1'600);
  EXPECT_EQ(backoff.AfterFailure(), 2'000);
  EXPECT_EQ(backoff.AfterFailure(), 2'000);
}

}  // namespace
}  // namespace mptrain
