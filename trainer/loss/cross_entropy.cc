#include "trainer/loss/cross_entropy.h"

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<CrossEntropyLoss>> CrossEntropyLoss::Create(
    Backend* backend, int64_t classes, double label_smoothing, DType compute_dtype,
    int64_t micro_batch_size, int64_t accumulation_steps) {
  if (classes < 1) return absl::InvalidArgumentError("cross_entropy needs model.output_dim >= 1");
  if (!(label_smoothing >= 0 && label_smoothing <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("label_smoothing must be in [0, 1], got ", label_smoothing));
  }
  std::unique_ptr<CrossEntropyLoss> loss(new CrossEntropyLoss());
  loss->backend_ = backend;
  loss->classes_ = classes;
  loss->on_ = static_cast<float>(1.0 - label_smoothing);
  loss->off_ = static_cast<float>(label_smoothing / static_cast<double>(classes));
  loss->accumulation_steps_ = accumulation_steps;
  const int64_t b = micro_batch_size;
  loss->fused_ = backend->HasFusedSoftmaxCrossEntropy();
  if (loss->fused_) return loss;
  ASSIGN_OR_RETURN(loss->log_probs_, backend->Allocate(DType::kF32, b, classes));
  ASSIGN_OR_RETURN(loss->target_dist_, backend->Allocate(DType::kF32, b, classes));
  ASSIGN_OR_RETURN(loss->probs_, backend->Allocate(DType::kF32, b, classes));
  if (compute_dtype != DType::kF32) {
    ASSIGN_OR_RETURN(loss->grad_f32_, backend->Allocate(DType::kF32, b, classes));
  }
  return loss;
}

absl::Status CrossEntropyLoss::Backward(Tensor output, Tensor targets, StepStateBuffer step_state,
                                        Tensor metrics, Tensor d_output) {
  const int64_t rows = output.rows;
  const float accumulation = static_cast<float>(accumulation_steps_);
  const float inv_rows = static_cast<float>(1.0 / static_cast<double>(rows));
  if (fused_) {
    return backend_->SoftmaxCrossEntropy(output, targets, on_, off_, -static_cast<double>(rows),
                                         accumulation, metrics, inv_rows, step_state,
                                         accumulation, d_output);
  }
  const Tensor log_probs = log_probs_.RowSlice(0, rows);
  const Tensor q = target_dist_.RowSlice(0, rows);
  const Tensor probs = probs_.RowSlice(0, rows);
  RETURN_IF_ERROR(backend_->LogSoftmaxRows(output, log_probs));
  RETURN_IF_ERROR(backend_->SmoothedOneHot(targets, on_, off_, q));
  // loss / A = −Σ q · log p / B / A
  RETURN_IF_ERROR(backend_->SumProduct(q, log_probs, -static_cast<double>(rows), accumulation,
                                       metrics.FlatView(0, 1, 1)));
  RETURN_IF_ERROR(backend_->CountArgmaxMatches(output, targets, metrics.FlatView(1, 1, 1)));
  RETURN_IF_ERROR(backend_->Exp(log_probs, probs));
  if (grad_f32_.empty()) {
    return backend_->ScaledDifference(probs, q, inv_rows, step_state, accumulation, d_output);
  }
  // The fp32 gradient, then rounded to the logits' dtype (autocast's cast backward).
  const Tensor grad = grad_f32_.RowSlice(0, rows);
  RETURN_IF_ERROR(backend_->ScaledDifference(probs, q, inv_rows, step_state, accumulation, grad));
  return backend_->Cast(grad, d_output);
}

absl::Status CrossEntropyLoss::Evaluate(Tensor output, Tensor targets, Tensor sums) {
  const int64_t rows = output.rows;
  if (fused_) {
    return backend_->SoftmaxCrossEntropy(output, targets, on_, off_, -1.0, 1.0f, sums, 0.0f,
                                         StepStateBuffer{}, 1.0f, Tensor{});
  }
  const Tensor log_probs = log_probs_.RowSlice(0, rows);
  const Tensor q = target_dist_.RowSlice(0, rows);
  RETURN_IF_ERROR(backend_->LogSoftmaxRows(output, log_probs));
  RETURN_IF_ERROR(backend_->SmoothedOneHot(targets, on_, off_, q));
  RETURN_IF_ERROR(backend_->SumProduct(q, log_probs, -1.0, 1.0f, sums.FlatView(0, 1, 1)));
  return backend_->CountArgmaxMatches(output, targets, sums.FlatView(1, 1, 1));
}

}  // namespace mptrain
