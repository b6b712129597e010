#include "trainer/gradient_reducer.h"
#include "trainer/parameter_layout.h"

#include <utility>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"

namespace mptrain {
namespace {

class GradientReducerTest : public ::testing::Test {
 protected:
  GradientReducerTest() : backend_(std::make_unique<testing::SingleRankCollective>()) {}

  // Creates the reducer over a fresh accumulator; each span lands in spans_ as [offset, end).
  std::unique_ptr<GradientReducer> Make(const ParameterLayout& layout, int64_t bucket_bytes,
                                        int64_t chunk_bytes) {
    accumulator_ = *GradientAccumulator::Create(&backend_, layout.total, DType::kF32, 4, 1, 0);
    const float* base = static_cast<const float*>(accumulator_.grads().data);
    auto reducer = GradientReducer::Create(
        MlpParameterTable(layout), &accumulator_,
        [this, base](Tensor span) {
          const int64_t offset = static_cast<const float*>(span.data) - base;
          spans_.push_back({offset, offset + span.numel()});
          return absl::OkStatus();
        },
        bucket_bytes, chunk_bytes);
    EXPECT_TRUE(reducer.ok()) << reducer.status();
    return std::move(*reducer);
  }

  CpuBackend backend_;
  GradientAccumulator accumulator_;
  std::vector<std::pair<int64_t, int64_t>> spans_;
};

TEST_F(GradientReducerTest, SmallModel_OneBucketWithTheMetricSlots_WhenTheFirstLayerIsDone) {
  // 35 + 18 = 53 parameters, then the 2 metric slots.
  const ParameterLayout layout = MakeParameterLayout({6, 5, 3});
  auto reducer = Make(layout, 25 << 20, 64 << 20);
  EXPECT_EQ(reducer->bucket_count(), 1u);
  ASSERT_TRUE(reducer->LayerReady(1).ok());
  EXPECT_TRUE(spans_.empty()) << "the bucket is not complete before layer 0";
  ASSERT_TRUE(reducer->LayerReady(0).ok());
  EXPECT_EQ(spans_, (std::vector<std::pair<int64_t, int64_t>>{{0, 55}}));
}

TEST_F(GradientReducerTest, LayersOverTheCap_ReduceLastBucketFirst) {
  // Layer byte sizes (fp32): layer 0 = (4·8 + 8)·4 = 160, layer 1 = (8·8 + 8)·4 = 288,
  // layer 2 = (8·2 + 2)·4 = 72. Cap 400: {2, 1} then {0}.
  const ParameterLayout layout = MakeParameterLayout({4, 8, 8, 2});
  auto reducer = Make(layout, 400, 1 << 30);
  EXPECT_EQ(reducer->bucket_count(), 2u);
  ASSERT_TRUE(reducer->LayerReady(2).ok());
  EXPECT_TRUE(spans_.empty());
  ASSERT_TRUE(reducer->LayerReady(1).ok());
  ASSERT_EQ(spans_.size(), 1u);
  EXPECT_EQ(spans_[0], std::make_pair(layout.layers[1].weight_offset, layout.total + 2));
  ASSERT_TRUE(reducer->LayerReady(0).ok());
  ASSERT_EQ(spans_.size(), 2u);
  EXPECT_EQ(spans_[1], std::make_pair(int64_t{0}, layout.layers[1].weight_offset));
}

TEST_F(GradientReducerTest, LargeFirstLayerAloneInTheLastBucket_GoesInRowChunksThenBiases) {
  // Layer 0: 8 rows of 16 inputs = 512 weight bytes; chunks of 128 bytes: 4 chunks of 2 rows.
  const ParameterLayout layout = MakeParameterLayout({16, 8, 2});
  auto reducer = Make(layout, 100, 128);
  EXPECT_EQ(reducer->bucket_count(), 2u);
  const std::vector<RowRange> chunks = reducer->FirstLayerRowChunks();
  ASSERT_EQ(chunks.size(), 4u);
  ASSERT_TRUE(reducer->LayerReady(1).ok());
  for (const RowRange& rows : chunks) ASSERT_TRUE(reducer->FirstLayerRowsReady(rows).ok());
  ASSERT_TRUE(reducer->LayerReady(0).ok());
  // Every element of grads() (parameters and the metric slots) in exactly one span.
  std::vector<int> covered(layout.total + 2, 0);
  for (const auto& [offset, end] : spans_) {
    for (int64_t i = offset; i < end; ++i) covered[i] += 1;
  }
  for (int64_t i = 0; i < layout.total + 2; ++i) EXPECT_EQ(covered[i], 1) << "element " << i;
  EXPECT_EQ(spans_.size(), 1u + 4u + 1u) << "layer 1's bucket, 4 row chunks, layer 0's biases";
  EXPECT_EQ(spans_.back(), std::make_pair(layout.layers[0].bias_offset,
                                          layout.layers[1].weight_offset));
}

TEST_F(GradientReducerTest, FirstLayerSharingItsBucket_IsNotChunked) {
  const ParameterLayout layout = MakeParameterLayout({16, 8, 2});
  auto reducer = Make(layout, 1 << 20, 128);
  EXPECT_EQ(reducer->bucket_count(), 1u);
  EXPECT_EQ(reducer->FirstLayerRowChunks(), (std::vector<RowRange>{{0, 8}}));
}

TEST_F(GradientReducerTest, UnknownLayer_IsInvalidArgument) {
  auto reducer = Make(MakeParameterLayout({4, 2}), 1 << 20, 1 << 20);
  EXPECT_EQ(reducer->LayerReady(5).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace mptrain
