#include "common/resource_estimate.h"

#include <limits>
#include <utility>

#include "common/job_spec.h"
#include "gtest/gtest.h"
#include "trainer/model/gpt_memory_plan.h"

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

v1::JobSpec Gpt124m(v1::DeviceKind device, v1::Precision precision, int64_t batch) {
  v1::JobSpec spec;
  spec.set_device(device);
  spec.set_precision(precision);
  v1::GptSpec* gpt = spec.mutable_model()->mutable_gpt();
  gpt->set_vocab_size(50257);
  gpt->set_padded_vocab_size(50304);
  gpt->set_context_length(1024);
  gpt->set_layers(12);
  gpt->set_heads(12);
  gpt->set_width(768);
  spec.mutable_optimizer()->set_kind(v1::ADAMW);
  spec.set_micro_batch_size(batch);
  spec.set_accumulation_steps(4);
  ApplyJobSpecDefaults(&spec);
  return spec;
}

// The GPT's activations are its model's own plan (trainer/model/gpt_memory_plan.h) plus the
// loop's token buffers: no second copy of the arithmetic to drift from the allocations.
TEST(EstimateRankMemory, Gpt_ActivationsAreTheModelsPlan) {
  for (v1::DeviceKind device : {v1::CPU, v1::CUDA}) {
    for (v1::Precision precision : {v1::FP32, v1::BF16}) {
      const v1::JobSpec spec = Gpt124m(device, precision, 4);
      GptConfig config;
      config.vocab_size = 50257, config.padded_vocab_size = 50304, config.context_length = 1024;
      config.layers = 12, config.heads = 12, config.width = 768;
      const DType dtype = precision == v1::FP32 ? DType::kF32 : DType::kBF16;
      const GptBackendTraits traits = TraitsForDevice(device == v1::CUDA, dtype, 4, config);
      const double plan = PlanGptActivations(config, dtype, 4, traits).Bytes(traits);
      const double N = 4 * 1024;
      const double loss_scratch = traits.fused_loss ? 0 : (dtype == DType::kF32 ? 3 : 4) * N * 50257 * 4;
      EXPECT_EQ(EstimateRankMemory(spec).activations,
                static_cast<int64_t>(plan + loss_scratch + 2 * 2 * N * 4 + 8))
          << device << " " << precision;
    }
  }
}

// GPT-2 124M at 16 x 1024 tokens in bf16 on one GPU: measured at 9.8 GiB of GPU memory (CUDA
// context included) on the H200 (BENCHMARKS.md); the estimate is of that order, with no T x T
// attention matrix on the GPU (cuDNN keeps one log-sum-exp per row) but one per head on the CPU.
TEST(EstimateRankMemory, Gpt124m_OnCuda_IsTheMeasuredOrder_TheCpuKeepsAttentionProbabilities) {
  const RankMemoryEstimate cuda = EstimateRankMemory(Gpt124m(v1::CUDA, v1::BF16, 16));
  EXPECT_GT(cuda.total, int64_t{8} << 30);
  EXPECT_LT(cuda.total, int64_t{12} << 30);
  const RankMemoryEstimate cpu = EstimateRankMemory(Gpt124m(v1::CPU, v1::BF16, 16));
  // 12 layers x 16 x 12 heads x 1024 x 1024 f32 probabilities: 9 GiB more at least.
  EXPECT_GT(cpu.activations - cuda.activations, int64_t{9} << 30);
}

// deterministic on the GPU: cuDNN's deterministic attention backward keeps dP, B·H·T² 2-byte
// values, in its workspace (16 x 12 x 1024² x 2 = 384 MiB here; 2 GiB at T = 2048, 16 heads);
// fp32 attention (our kernel) and the CPU need none.
TEST(EstimateRankMemory, Gpt_DeterministicOnCuda_CountsTheAttentionWorkspace) {
  v1::JobSpec spec = Gpt124m(v1::CUDA, v1::BF16, 16);
  const int64_t fused = EstimateRankMemory(spec).workspace;
  spec.set_deterministic(true);
  EXPECT_EQ(EstimateRankMemory(spec).workspace - fused, int64_t{16} * 12 * 1024 * 1024 * 2);
  for (auto [device, precision] : {std::pair{v1::CUDA, v1::FP32}, std::pair{v1::CPU, v1::BF16}}) {
    v1::JobSpec other = Gpt124m(device, precision, 16);
    const int64_t before = EstimateRankMemory(other).workspace;
    other.set_deterministic(true);
    EXPECT_EQ(EstimateRankMemory(other).workspace, before) << device << " " << precision;
  }
}

}  // namespace
}  // namespace mptrain
