#pragma once

// The MLP (Linear, [norm,] activation, ..., Linear) built from backend operations: its buffers,
// forward and backward under autocast. Written once for every backend.
//
// With a normalization (ModelConfig::norm), each hidden layer is Linear → norm → activation:
// z = round(x · wᵀ + b) in the compute dtype; then
//   batch norm (in z's dtype): statistics of z (sync_batch_norm: every rank's, gathered),
//     zn = round(BN(z)), y = round(act(zn)); the running statistics updated;
//   layer norm (fp32, autocast's fp32 list): zn = LN(f32(z)) in f32, y = act(zn) in f32,
//     stored rounded to the compute dtype (the next Linear's autocast cast).
// Backward: d_zn = dy · act'(zn) (in zn's dtype), then the norm's backward into dz (compute
// dtype) and its affine gradients (fp32), then the Linear's. sync_batch_norm gathers its
// statistics in every forward and sums its two gradient sums in every backward, no_sync or not.

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/gradient_accumulator.h"
#include "trainer/gradient_reducer.h"
#include "trainer/model/model.h"
#include "trainer/parameter_layout.h"
#include "trainer/training_config.h"

namespace mptrain {

class Mlp final : public Model {
 public:
  // Allocates parameters (fp32 masters), their gradients (GradientAccumulator: fp32, plus the
  // metric slots that ride in the gradient allreduce), low-precision weight
  // copies and the activations of one micro-batch.
  static constexpr int64_t kDeferredBudgetBytes = GradientAccumulator::kDeferredBudgetBytes;
  static absl::StatusOr<std::unique_ptr<Mlp>> Create(
      Backend* backend, const ModelConfig& model, DType compute_dtype, int64_t micro_batch_size,
      int64_t accumulation_steps = 1, int64_t deferred_budget_bytes = kDeferredBudgetBytes);

  const ParameterLayout& layout() const { return layout_; }

  // ---- Model (trainer/model/model.h) ----
  // The same parameters as a table (parameter_layout.h MlpParameterTable).
  const ParameterTable& table() const override { return table_; }
  Tensor params() const override { return params_; }        // [1, n] f32
  GradientAccumulator* accumulator() override { return &accumulator_; }
  Tensor loss_slot() const { return accumulator_.loss_slot(); }
  // [1, n] compute dtype; empty for fp32 (the masters are used directly).
  Tensor low_precision_params() const override {
    return compute_dtype_ == DType::kF32 ? Tensor{} : params_low_;
  }
  // [rows, out] compute dtype: the rows of the last Forward().
  Tensor output() const override { return outputs_.back().RowSlice(0, rows_); }
  Tensor output_grad() const override { return output_grad_; }   // [B, out] compute dtype

  // Batch norms' running statistics: [1, buffers_total] f32 (parameter_layout.h); empty
  // otherwise.
  Tensor buffers() const override { return buffers_; }
  int64_t buffer_counter() const override { return num_batches_tracked_; }
  // A batch norm counts every training forward (torch's num_batches_tracked).
  void RestoreProgress(int64_t steps_done, int64_t accumulation) override {
    if (IsBatchNorm(layout_.norm)) num_batches_tracked_ = steps_done * accumulation;
  }
  // torch.nn.Linear's initialisation (parameter_layout.h InitialLayoutParameters), drawn on
  // the host and uploaded.
  absl::Status InitializeParameters(uint64_t seed) override {
    const std::vector<float> initial = InitialLayoutParameters(layout_, seed);
    return backend_->Upload(initial.data(), params_);
  }
  // A local batch norm's statistics differ per rank (each sees its own data); sync_batch_norm's
  // are the same on every rank already (computed from the same gathered statistics).
  bool BroadcastsBuffers() const override {
    return layout_.norm == NormKind::kBatchNorm && world_size_ > 1;
  }
  bool StepIsReplayable() const override { return !IsBatchNorm(layout_.norm); }
  bool ComputesFirstWeightInRowChunks() const override { return true; }
  // Training forwards so far that updated the running statistics (torch's num_batches_tracked).
  int64_t num_batches_tracked() const { return num_batches_tracked_; }
  void set_num_batches_tracked(int64_t count) { num_batches_tracked_ = count; }

  // Rounds the fp32 masters into the compute-dtype copies. Called once per optimizer step:
  // the weights do not change between micro-batches.
  absl::Status RefreshLowPrecisionWeights() override;
  // x: [rows, input_dim] f32 in backend memory, 1 <= rows <= B (fewer only for evaluation:
  // Backward needs a whole batch). `x_unchanged`: x is the same unmodified tensor as in the
  // last call (the fixed synthetic batch), so its low-precision cast is reused. `training`
  // false: evaluation (batch norms use their running statistics and update nothing, as
  // model.eval()).
  absl::Status Forward(Tensor x, bool x_unchanged = false, bool training = true) override;
  // Backpropagates output_grad() of micro-batch `micro_batch` (0-based) of an optimizer step
  // into the accumulator. On the last one (accumulation_steps - 1) `observer`, when given, is
  // told as each layer's gradients are computed (last layer first) and makes them final (the
  // gradient reducer); without one, grads() is made final at the end. Before the last
  // micro-batch, grads() is undefined and `observer` is not used.
  absl::Status Backward(int64_t micro_batch, LayerGradientObserver* observer = nullptr) override;
  // The output of the norm after hidden layer `layer` in the last Forward() (tests).
  Tensor norm_output(size_t layer) const { return norms_[layer].zn; }
  bool defers_accumulation() const { return accumulator_.defers(); }

 private:
  Mlp(Backend* backend, ParameterLayout layout, ActivationKind activation, DType compute_dtype)
      : backend_(backend),
        layout_(std::move(layout)),
        table_(MlpParameterTable(layout_)),
        activation_(activation),
        compute_dtype_(compute_dtype) {}

  // The buffers of the norm after hidden layer i (empty tensors for the others).
  struct NormBuffers {
    Tensor zn;           // [B, out] the norm's output (compute dtype for batch norm, f32 for LN)
    Tensor d_zn;         // [B, out] d loss / d zn, zn's dtype
    Tensor stats;        // BN: [1, 2·out + 1] this rank's mean, invstd, count
    Tensor gathered;     // BN: [W, 2·out + 1] every rank's (sync), or `stats` itself (local)
    Tensor mean_invstd;  // BN: [2, out] what normalised the batch
    Tensor sums;         // BN: [2, out] Σ dy, Σ dy·(z − mean) (summed over ranks for sync)
    Tensor row_stats;    // LN: [B, 2] each row's mean and rstd
  };
  absl::Status NormForward(size_t layer, Tensor z, bool training);
  absl::Status NormBackward(size_t layer, Tensor dy, const GradientAccumulator::Target& target);
  Tensor NormWeight(size_t layer) const;
  Tensor NormBias(size_t layer) const;

  // sync_batch_norm across more than one rank. In a world of one, torch's SyncBatchNorm is a
  // plain batch norm (no collective), and so is ours.
  bool SynchronisesNormStatistics() const {
    return layout_.norm == NormKind::kSyncBatchNorm && world_size_ > 1;
  }
  Tensor Weight(Tensor flat, size_t layer) const;
  Tensor Bias(Tensor flat, size_t layer) const;
  ActivationKind LayerActivation(size_t layer) const;

  Backend* backend_;
  ParameterLayout layout_;
  ParameterTable table_;
  ActivationKind activation_;
  DType compute_dtype_;
  Tensor params_, params_low_;
  GradientAccumulator accumulator_;
  Tensor input_low_;                  // [B, in] the input in the compute dtype
  Tensor first_input_;                // What the first layer read in the last Forward().
  const void* cast_source_ = nullptr; // The x whose cast input_low_ holds.
  std::vector<Tensor> pre_;           // per layer [B, out]: before the activation
  std::vector<Tensor> outputs_;       // per layer [B, out]: after it
  std::vector<Tensor> output_grads_;  // per layer [B, out]: d loss / d output (in place to d pre)
  std::vector<NormBuffers> norms_;    // per layer
  Tensor buffers_;                    // running statistics
  int64_t num_batches_tracked_ = 0;
  int world_size_ = 1;
  Tensor output_grad_;
  int64_t rows_ = 0;                  // Rows of the last Forward().
};

}  // namespace mptrain
