#include "common/resource_estimate.h"

#include <limits>

#include "common/job_spec.h"
#include "gtest/gtest.h"

namespace mptrain {
namespace {

v1::JobSpec Mlp(int64_t in, std::vector<int64_t> hidden, int64_t out, int64_t batch) {
  v1::JobSpec spec;
  spec.set_device(v1::CPU);
  spec.mutable_model()->set_input_dim(in);
  for (int64_t width : hidden) spec.mutable_model()->add_hidden_dims(width);
  spec.mutable_model()->set_output_dim(out);
  spec.set_micro_batch_size(batch);
  spec.set_accumulation_steps(1);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

TEST(EstimateRankMemory, SeedJob_CountsEveryBuffer) {
  // Linear 1024 -> 16, fp16: n = 16400 parameters.
  RankMemoryEstimate estimate = EstimateRankMemory(Mlp(1024, {}, 16, 64));
  EXPECT_EQ(estimate.parameters, 16400 * 6);
  EXPECT_EQ(estimate.gradients, 16402 * 4);  // + loss and correct count
  EXPECT_EQ(estimate.optimizer, 16400 * 4);
  EXPECT_EQ(estimate.activations, 64 * 1024 * 2 + 64 * 2 * 16 * 2 + 2 * 64 * (1024 + 16) * 4);
  EXPECT_EQ(estimate.total, estimate.parameters + estimate.gradients + estimate.optimizer +
                                estimate.activations + estimate.workspace);
  EXPECT_LT(estimate.total, int64_t{1} << 30);
}

TEST(EstimateRankMemory, Adam_KeepsTwoMoments) {
  v1::JobSpec spec = Mlp(1024, {}, 16, 64);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  EXPECT_EQ(EstimateRankMemory(spec).optimizer, 2 * 16400 * 4);
}

TEST(EstimateRankMemory, CompressedGradients_CountTheCopyThatTravels) {
  v1::JobSpec spec = Mlp(1024, {}, 16, 64);
  spec.set_grad_comm_dtype(v1::FP16);
  EXPECT_EQ(EstimateRankMemory(spec).gradients, 16402 * 4 + 16400 * 4);  // CPU: 4-byte floats
  spec.set_device(v1::CUDA);
  EXPECT_EQ(EstimateRankMemory(spec).gradients, 16402 * 4 + 16400 * 2);  // GPU: 2 bytes
}

TEST(EstimateRankMemory, Norm_CountsItsParametersAndActivations) {
  v1::JobSpec plain = Mlp(64, {128, 32}, 8, 16);
  v1::JobSpec normed = plain;
  normed.mutable_model()->set_norm(v1::BATCH_NORM);
  const RankMemoryEstimate a = EstimateRankMemory(plain), b = EstimateRankMemory(normed);
  // Weight and bias per hidden feature: 2 · (128 + 32) parameters, each with its fp32 master,
  // low-precision copy, gradient and momentum.
  EXPECT_EQ(b.parameters - a.parameters, 2 * (128 + 32) * (4 + 2));
  EXPECT_EQ(b.gradients - a.gradients, 2 * (128 + 32) * 4);
  EXPECT_EQ(b.activations - a.activations, 3 * 16 * (128 + 32) * 4);
}

TEST(EstimateRankMemory, HugeLayers_AreTerabytesWithoutOverflow) {
  RankMemoryEstimate estimate = EstimateRankMemory(
      Mlp(int64_t{1} << 20, {int64_t{1} << 20, int64_t{1} << 20}, int64_t{1} << 20, 1));
  EXPECT_GT(estimate.total, int64_t{40} << 40);  // > 40 TiB
  EXPECT_LT(estimate.total, std::numeric_limits<int64_t>::max());
  EXPECT_NE(estimate.Describe().find("TiB"), std::string::npos) << estimate.Describe();
}

TEST(EstimateRankMemory, HugeMicroBatch_IsDominatedByActivations) {
  RankMemoryEstimate estimate = EstimateRankMemory(Mlp(1024, {}, 16, int64_t{1} << 24));
  EXPECT_GT(estimate.activations, int64_t{100} << 30);
  EXPECT_GT(estimate.activations, estimate.parameters);
}

TEST(EstimateRankMemory, CudaAddsItsWorkspace) {
  v1::JobSpec spec = Mlp(64, {}, 8, 8);
  const int64_t cpu = EstimateRankMemory(spec).total;
  spec.set_device(v1::CUDA);
  EXPECT_GE(EstimateRankMemory(spec).total - cpu, int64_t{800} << 20);
}

TEST(FormatBytes, Units) {
  EXPECT_EQ(FormatBytes(512), "512 B");
  EXPECT_EQ(FormatBytes(1536), "1.5 KiB");
  EXPECT_EQ(FormatBytes(int64_t{3} << 30), "3.0 GiB");
}

}  // namespace
}  // namespace mptrain
