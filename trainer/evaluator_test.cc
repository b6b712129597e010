// The evaluator's sums over many batches: the correct count goes on past 2^24 (a float total on
// the device stopped there: a loss that adds 1 per correct row, as the CUDA cross-entropy
// does, could not move it), and the loss sees its own batch's sums only.

#include "trainer/evaluator.h"

#include <memory>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "gtest/gtest.h"
#include "tests/fake_collectives.h"
#include "trainer/model/parameter_table.h"

namespace mptrain {
namespace {

// A model whose output is its input: nothing to train, only rows to count.
class PassThroughModel final : public Model {
 public:
  const ParameterTable& table() const override { return table_; }
  Tensor params() const override { return Tensor{}; }
  Tensor low_precision_params() const override { return Tensor{}; }
  absl::Status RefreshLowPrecisionWeights() override { return absl::OkStatus(); }
  GradientAccumulator* accumulator() override { return nullptr; }
  Tensor buffers() const override { return Tensor{}; }
  int64_t buffer_counter() const override { return 0; }
  void RestoreProgress(int64_t, int64_t) override {}
  absl::Status InitializeParameters(uint64_t) override { return absl::OkStatus(); }
  bool BroadcastsBuffers() const override { return false; }
  bool StepIsReplayable() const override { return false; }
  bool ComputesFirstWeightInRowChunks() const override { return false; }
  absl::Status Forward(Tensor x, bool, bool) override {
    output_ = x;
    return absl::OkStatus();
  }
  Tensor output() const override { return output_; }
  Tensor output_grad() const override { return Tensor{}; }
  absl::Status Backward(int64_t, LayerGradientObserver*) override {
    return absl::UnimplementedError("evaluation only");
  }

 private:
  ParameterTable table_;
  Tensor output_;
};

// Every row is "correct" and has a loss of 0.5, added one row at a time in float arithmetic
// onto whatever `sums` holds, as a kernel's atomicAdd(sums + 1, 1.0f) per row would.
class CountEveryRowLoss final : public Loss {
 public:
  explicit CountEveryRowLoss(Backend* backend) : backend_(backend) {}
  absl::Status Backward(Tensor, Tensor, StepStateBuffer, Tensor, Tensor) override {
    return absl::UnimplementedError("evaluation only");
  }
  absl::Status Evaluate(Tensor output, Tensor, Tensor sums) override {
    float host[2];
    if (absl::Status s = backend_->Download(sums, host); !s.ok()) return s;
    if (host[0] != 0 || host[1] != 0) ++calls_with_earlier_sums_;
    for (int64_t r = 0; r < output.rows; ++r) {
      host[0] += 0.5f;
      host[1] += 1.0f;
    }
    return backend_->Upload(host, sums);
  }
  int64_t target_columns() const override { return 1; }
  bool classifies() const override { return true; }
  int calls_with_earlier_sums_ = 0;

 private:
  Backend* backend_;
};

TEST(Evaluator, CorrectCountGoesPast2To24_EachBatchStartsFromZero) {
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  // 5 batches of 2^22 rows: 20,971,520 rows in all, past 2^24 = 16,777,216.
  constexpr int64_t kBatch = int64_t{1} << 22, kRows = 5 * kBatch;
  RankData shard;
  shard.features.rows = kRows;
  shard.features.cols = 1;
  shard.features.values.assign(kRows, 0.0f);
  shard.targets.rows = kRows;
  shard.targets.cols = 1;
  shard.targets.values.assign(kRows, 0.0f);
  shard.total_rows = kRows;
  auto evaluator = Evaluator::Create(&backend, shard, kRows, kBatch);
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  PassThroughModel model;
  CountEveryRowLoss loss(&backend);
  auto result = (*evaluator)->Run(&model, &loss);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->accuracy, 1.0) << "counted " << result->accuracy * kRows << " of " << kRows;
  EXPECT_DOUBLE_EQ(result->loss, 0.5);
  EXPECT_EQ(loss.calls_with_earlier_sums_, 0) << "a batch's loss saw an earlier batch's sums";
  // A second evaluation starts over.
  result = (*evaluator)->Run(&model, &loss);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->accuracy, 1.0);
}

RankData Rows(int64_t rows) {
  RankData shard;
  shard.features.rows = shard.targets.rows = rows;
  shard.features.cols = shard.targets.cols = 1;
  shard.features.values.assign(rows, 0.0f);
  shard.targets.values.assign(rows, 0.0f);
  shard.total_rows = rows;
  return shard;
}

TEST(Evaluator, AfterBatch_CalledOncePerBatch_TrueStopsWithAborted) {
  CpuBackend backend(std::make_unique<testing::SingleRankCollective>());
  auto evaluator = Evaluator::Create(&backend, Rows(10), 10, 4);  // Batches of 4, 4 and 2.
  ASSERT_TRUE(evaluator.ok()) << evaluator.status();
  PassThroughModel model;
  CountEveryRowLoss loss(&backend);
  int calls = 0;
  auto result = (*evaluator)->Run(&model, &loss, [&] {
    ++calls;
    return false;
  });
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(result->accuracy, 1.0);
  // A stop after the second batch: no third batch, no allreduce, ABORTED saying where.
  calls = 0;
  result = (*evaluator)->Run(&model, &loss, [&] { return ++calls == 2; });
  EXPECT_TRUE(absl::IsAborted(result.status())) << result.status();
  EXPECT_EQ(result.status().message(), "stopped while evaluating (2 of 3 batches)");
  EXPECT_EQ(calls, 2);
}

}  // namespace
}  // namespace mptrain
