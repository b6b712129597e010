// The draws behind every backend's FillNormal (normal_draws.h) and the host's fill.

#include "trainer/normal_draws.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "gtest/gtest.h"
#include "trainer/backend.h"

namespace mptrain {
namespace {

// Random123's known-answer vectors for philox4x32_10 (kat_vectors: counter, key -> output).
TEST(NormalDraws, Philox_MatchesRandom123sKnownAnswers) {
  struct Case {
    PhiloxWords counter;
    uint32_t key0, key1;
    PhiloxWords want;
  };
  const Case cases[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}},
       0xffffffff,
       0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}},
       0xa4093822,
       0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Case& c : cases) {
    const PhiloxWords got = Philox4x32x10(c.counter, c.key0, c.key1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(got.w[i], c.want.w[i]) << "word " << i;
  }
}

TEST(NormalDraws, UnitsAreInsideTheOpenInterval) {
  EXPECT_GT(UnitFromWords(0, 0), 0.0);
  EXPECT_EQ(UnitFromWords(0xffffffff, 0xffffffff), 1.0 - 0x1.0p-53);
  EXPECT_LT(UnitFromWords(0xffffffff, 0xffffffff), 1.0);
  EXPECT_TRUE(std::isfinite(StandardNormalDraw(0, 0)));
}

// Mean 0, variance 1, a normal's tails (Box-Muller's pairs: the even index's cos, the odd's
// sin of the same radius), and no two seeds or neighbouring streams alike.
TEST(NormalDraws, AreStandardNormal) {
  constexpr int64_t kDraws = 1 << 20;
  double sum = 0, squares = 0, fourth = 0;
  int64_t beyond_two = 0;
  for (int64_t i = 0; i < kDraws; ++i) {
    const double z = StandardNormalDraw(42, static_cast<uint64_t>(i));
    sum += z;
    squares += z * z;
    fourth += z * z * z * z;
    beyond_two += std::fabs(z) > 2.0;
  }
  const double mean = sum / kDraws, variance = squares / kDraws - mean * mean;
  EXPECT_NEAR(mean, 0.0, 5.0 / std::sqrt(double{kDraws}));
  EXPECT_NEAR(variance, 1.0, 0.01);
  EXPECT_NEAR(fourth / kDraws, 3.0, 0.05);  // A normal's kurtosis.
  EXPECT_NEAR(static_cast<double>(beyond_two) / kDraws, 0.0455, 0.002);
  // A pair's two values share the radius: z0² + z1² = -2 log u1.
  const double z0 = StandardNormalDraw(42, 10), z1 = StandardNormalDraw(42, 11);
  const PhiloxWords words = Philox4x32x10(PhiloxWords{{5, 0, 0, 0}}, 42, 0);
  EXPECT_NEAR(z0 * z0 + z1 * z1, -2.0 * std::log(UnitFromWords(words.w[0], words.w[1])), 1e-12);
  EXPECT_NE(StandardNormalDraw(42, 0), StandardNormalDraw(43, 0));
  EXPECT_NE(StandardNormalDraw(uint64_t{1} << 32, 0), StandardNormalDraw(0, 0));
  EXPECT_NE(StandardNormalDraw(0, uint64_t{2} << 32), StandardNormalDraw(0, 0));
}

// Every value a function of its index: any split, any thread count, the same floats.
TEST(NormalDraws, FillOnHost_IsTheDrawOfEachIndex) {
  const int64_t n = (int64_t{1} << 19) + 3;  // Over one chunk of the fill, not a multiple.
  std::vector<float> whole(n), tail(n - 1001);
  FillNormalOnHost(9, 77, 0.5, whole.data(), n);
  FillNormalOnHost(9, 77 + 1001, 0.5, tail.data(), n - 1001);
  for (int64_t i = 0; i < n; i += 997) {
    ASSERT_EQ(whole[i], static_cast<float>(0.5 * StandardNormalDraw(9, 77 + i))) << i;
  }
  for (int64_t i = 0; i < n - 1001; ++i) ASSERT_EQ(tail[i], whole[i + 1001]) << i;
}

TEST(NormalDraws, FillNormal_RefusesWhatItCannotFill) {
  float storage[8] = {};
  const Tensor f32{storage, DType::kF32, 2, 4, 4};
  EXPECT_TRUE(CheckFillNormal(f32, 0, 0.02).ok());
  EXPECT_TRUE(CheckFillNormal(f32, 5, 0.0).ok());
  EXPECT_EQ(CheckFillNormal(f32, -1, 0.02).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckFillNormal(f32, 0, -1.0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckFillNormal(f32, 0, std::nan("")).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckFillNormal(f32, std::numeric_limits<int64_t>::max() - 8, 0.02).ok());
  EXPECT_EQ(CheckFillNormal(f32, std::numeric_limits<int64_t>::max() - 7, 0.02).code(),
            absl::StatusCode::kInvalidArgument);
  const Tensor bf16{storage, DType::kBF16, 2, 4, 2};
  EXPECT_EQ(CheckFillNormal(bf16, 0, 0.02).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckFillNormal(f32.ColumnSlice(0, 2), 0, 0.02).code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mptrain
