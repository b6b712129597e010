#include "trainer/data/sampler.h"

#include <algorithm>

#include "gtest/gtest.h"

namespace mptrain {
namespace {

// Printed by Debian's PyTorch 1.13:
//   g = torch.Generator(); g.manual_seed(s); torch.randperm(n, generator=g).tolist()
TEST(TorchRandperm, MatchesPyTorch) {
  EXPECT_EQ(TorchRandperm(10, 7), (std::vector<int64_t>{5, 0, 3, 4, 1, 7, 9, 6, 8, 2}));
  EXPECT_EQ(TorchRandperm(5, 0), (std::vector<int64_t>{4, 0, 1, 3, 2}));
  const std::vector<int64_t> large = TorchRandperm(1797, 42);
  EXPECT_EQ(std::vector<int64_t>(large.begin(), large.begin() + 12),
            (std::vector<int64_t>{879, 1100, 1133, 553, 798, 1, 1714, 91, 1751, 1766, 413, 691}));
}

TEST(DistributedSamplerIndices, EqualShardsCoverEveryRow_PaddingFromTheHead) {
  // n = 10, W = 4: 3 per rank, 12 in all: the permutation plus its first 2 again.
  const std::vector<int64_t> permutation = TorchRandperm(10, 7 + 2);
  std::vector<int64_t> seen;
  for (int rank = 0; rank < 4; ++rank) {
    const std::vector<int64_t> mine = DistributedSamplerIndices(10, 4, rank, 7, 2);
    ASSERT_EQ(mine.size(), 3u);
    for (size_t j = 0; j < mine.size(); ++j) {
      EXPECT_EQ(mine[j], permutation[(rank + 4 * j) % 10]);
    }
    seen.insert(seen.end(), mine.begin(), mine.end());
  }
  std::sort(seen.begin(), seen.end());
  for (int64_t row = 0; row < 10; ++row) {
    EXPECT_GE(std::count(seen.begin(), seen.end(), row), 1) << "row " << row;
  }
}

TEST(DistributedSamplerIndices, EachEpochIsANewPermutation) {
  EXPECT_NE(DistributedSamplerIndices(100, 2, 0, 3, 0), DistributedSamplerIndices(100, 2, 0, 3, 1));
  EXPECT_EQ(DistributedSamplerIndices(100, 2, 1, 3, 5), DistributedSamplerIndices(100, 2, 1, 3, 5));
}

}  // namespace
}  // namespace mptrain
