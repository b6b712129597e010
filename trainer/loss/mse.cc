#include "trainer/loss/mse.h"

#include "common/status_macros.h"

namespace mptrain {

absl::Status MseLoss::Backward(Tensor output, Tensor targets, StepStateBuffer step_state,
                               Tensor metrics, Tensor d_output) {
  const int64_t numel = output.numel();
  const float accumulation = static_cast<float>(accumulation_steps_);
  const float norm = static_cast<float>(2.0 / static_cast<double>(numel));
  // The loss (its value for telemetry) and its gradient, seeded with scale / A: one pass.
  return backend_->SquaredErrorAndGradient(output, targets, static_cast<double>(numel),
                                           accumulation, metrics.FlatView(0, 1, 1), norm,
                                           step_state, accumulation, d_output);
}

absl::Status MseLoss::Evaluate(Tensor output, Tensor targets, Tensor sums) {
  return backend_->SumSquaredDifference(output, targets, static_cast<double>(output_dim_), 1.0f,
                                        sums.FlatView(0, 1, 1));
}

}  // namespace mptrain
