#include "trainer/precision.h"

#include <cmath>
#include <limits>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

TEST(RoundToF16, RepresentableValues_AreExact) {
  EXPECT_EQ(RoundToF16(1.0f), 1.0f);
  EXPECT_EQ(RoundToF16(-0.5f), -0.5f);
  EXPECT_EQ(RoundToF16(65504.0f), 65504.0f);
}

TEST(RoundToF16, RoundsToNearestEven) {
  // Between 1 and 1 + 2^-10 the midpoint rounds to the even neighbour (1).
  EXPECT_EQ(RoundToF16(1.0f + 0x1.0p-11f), 1.0f);
  EXPECT_EQ(RoundToF16(1.0f + 3 * 0x1.0p-11f), 1.0f + 2 * 0x1.0p-10f);
}

TEST(RoundToF16, OverflowBecomesInf_AsGpuConversionDoes) {
  EXPECT_TRUE(std::isinf(RoundToF16(65520.0f)));
  EXPECT_TRUE(std::isinf(RoundToF16(-1e6f)));
  EXPECT_EQ(RoundToF16(65519.0f), 65504.0f);
  EXPECT_TRUE(std::isnan(RoundToF16(std::nanf(""))));
}

TEST(RoundToBF16, KeepsEightBitsOfMantissa_WithTiesToEven) {
  EXPECT_EQ(RoundToBF16(1.0f), 1.0f);
  EXPECT_EQ(RoundToBF16(1.0f + 0x1.0p-8f), 1.0f);  // Tie: to even.
  EXPECT_EQ(RoundToBF16(1.0f + 3 * 0x1.0p-8f), 1.0f + 0x1.0p-6f);
  EXPECT_EQ(RoundToBF16(1.0f + 0x1.0p-7f), 1.0f + 0x1.0p-7f);
  EXPECT_EQ(RoundToBF16(1e38f), RoundToBF16(1e38f));
  EXPECT_TRUE(std::isinf(RoundToBF16(std::numeric_limits<float>::max())));
  EXPECT_TRUE(std::isnan(RoundToBF16(std::nanf(""))));
}

TEST(RoundTo, F32_IsIdentity) { EXPECT_EQ(RoundTo(DType::kF32, 1.0f + 1e-7f), 1.0f + 1e-7f); }

}  // namespace
}  // namespace mptrain
