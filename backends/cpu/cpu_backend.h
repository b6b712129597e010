#pragma once

// The CPU backend: OpenBLAS GEMMs on fp32 values that hold exactly-representable fp16/bf16
// numbers (each rounding point of autocast is reproduced with precision.h), and a Collective
// (gloo in production). It lets CI, laptops and tests run the whole system without a GPU.

#include <deque>
#include <memory>
#include <vector>

#include "trainer/backend.h"

namespace mptrain {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(std::unique_ptr<Collective> collective);

  std::string Name() const override { return "cpu"; }
  absl::StatusOr<Tensor> Allocate(DType dtype, int64_t rows, int64_t cols) override;
  absl::Status Upload(const float* host, Tensor dst) override;
  absl::Status Download(Tensor src, float* host) override;
  absl::Status Zero(Tensor tensor) override;
  absl::Status Cast(Tensor src, Tensor dst) override;
  absl::Status CopyRowsWrapping(Tensor src, int64_t first, Tensor dst) override;
  absl::Status GatherRows(Tensor src, Tensor indices, Tensor dst) override;
  absl::Status LinearForward(Tensor x, Tensor w, Tensor b, ActivationKind act, Tensor pre,
                             Tensor y) override;
  absl::Status ActivationBackward(ActivationKind act, Tensor pre, Tensor dy,
                                  Tensor d_pre) override;
  absl::Status LinearBackward(Tensor x, Tensor w, Tensor dy, Tensor dx, Tensor dw_acc,
                              Tensor db_acc, bool overwrite_grads) override;
  absl::Status BiasGradient(Tensor dy, Tensor db_acc, bool overwrite_grads) override;
  absl::Status SumRowsToF32(Tensor rows, Tensor out) override;
  absl::Status ActivationForward(ActivationKind act, Tensor x, Tensor y) override;
  absl::Status BatchNormStatistics(Tensor x, float eps, Tensor stats) override;
  absl::Status BatchNormCombineStatistics(Tensor gathered, float eps, float momentum,
                                          Tensor running, Tensor mean_invstd) override;
  absl::Status BatchNormRunningStatistics(Tensor running, float eps, Tensor mean_invstd) override;
  absl::Status BatchNormApply(Tensor x, Tensor mean_invstd, Tensor weight, Tensor bias,
                              Tensor y) override;
  absl::Status BatchNormBackwardReduce(Tensor dy, Tensor x, Tensor mean_invstd, Tensor sums,
                                       Tensor dweight_acc, Tensor dbias_acc,
                                       bool overwrite_grads) override;
  absl::Status BatchNormBackwardInput(Tensor dy, Tensor x, Tensor mean_invstd, Tensor weight,
                                      Tensor sums, double count, Tensor dx) override;
  absl::Status LayerNormForward(Tensor x, Tensor weight, Tensor bias, float eps, Tensor row_stats,
                                Tensor y) override;
  absl::Status LayerNormBackward(Tensor dy, Tensor x, Tensor row_stats, Tensor weight, Tensor dx,
                                 Tensor dweight_acc, Tensor dbias_acc,
                                 bool overwrite_grads) override;
  absl::Status Add(Tensor a, Tensor b, Tensor out) override;
  absl::Status EmbeddingForward(Tensor ids, Tensor wte, Tensor wpe, int64_t seq_len,
                                Tensor out) override;
  absl::Status EmbeddingBackward(Tensor ids, Tensor dout, int64_t seq_len, Tensor dwte_acc,
                                 Tensor dwpe_acc, bool overwrite_wte, bool overwrite_wpe) override;
  absl::Status CausalAttentionForward(Tensor qkv, int64_t batch, int64_t heads, Tensor probs,
                                      Tensor y) override;
  absl::Status CausalAttentionBackward(Tensor qkv, Tensor probs, Tensor y, Tensor dy, int64_t batch,
                                       int64_t heads, Tensor dqkv) override;
  absl::Status ScaledDifference(Tensor a, Tensor b, float coef, StepStateBuffer step_state,
                                float seed_divisor, Tensor out) override;
  absl::Status SumSquaredDifference(Tensor a, Tensor b, double divide_by, float then_divide,
                                    Tensor acc) override;
  absl::Status SumProduct(Tensor a, Tensor b, double divide_by, float then_divide,
                          Tensor acc) override;
  absl::Status LogSoftmaxRows(Tensor x, Tensor out) override;
  absl::Status Exp(Tensor x, Tensor out) override;
  absl::Status SmoothedOneHot(Tensor ids, float on, float off, Tensor out) override;
  absl::Status CountArgmaxMatches(Tensor x, Tensor ids, Tensor acc) override;
  absl::Status CompressGradients(Tensor src, float divisor, Tensor dst) override;
  absl::Status GradientStatistics(Tensor grads, StepStateBuffer step_state) override;
  absl::Status FinalizeStep(const StepConfig& config, Tensor metrics,
                            StepStateBuffer step_state) override;
  absl::Status UpdateParameters(const UpdateRule& rule, Tensor params, Tensor grads,
                                Tensor slot_a, Tensor slot_b, StepStateBuffer step_state,
                                Tensor params_low) override;
  absl::StatusOr<StepStateBuffer> AllocateStepState(const StepState& initial) override;
  absl::StatusOr<StepState> ReadStepState(StepStateBuffer step_state) override;
  absl::Status SnapshotStats(StepStateBuffer step_state, int slot) override;
  absl::StatusOr<StepStats> ReadStats(int slot) override;
  absl::StatusOr<double> NowMs() override;
  Collective* collective() override { return collective_.get(); }
  // Bytes of the tensors Allocate handed out so far (what admission estimates:
  // common/resource_estimate.h).
  int64_t allocated_bytes() const { return allocated_bytes_; }

 private:
  std::unique_ptr<Collective> collective_;
  std::deque<std::unique_ptr<double[]>> allocations_;
  std::deque<std::unique_ptr<StepState>> step_states_;
  int64_t allocated_bytes_ = 0;
  std::vector<float> scratch_;
  std::vector<float> attention_scratch_;  // [3, T, T]: per (sequence, head) of attention
  StepStats stats_ring_[kStatsSlots];
};

}  // namespace mptrain
