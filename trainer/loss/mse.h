#pragma once

#include "trainer/loss/loss.h"

namespace mptrain {

// torch.nn.functional.mse_loss (mean over all elements) in fp32 on the autocast output:
//   loss = Σ (f32(pred) − target)² / numel, summed in double
//   d_pred = round((2 / numel) · (pred − target) · scale / A)
class MseLoss final : public Loss {
 public:
  MseLoss(Backend* backend, int64_t output_dim, int64_t accumulation_steps)
      : backend_(backend), output_dim_(output_dim), accumulation_steps_(accumulation_steps) {}

  absl::Status Backward(Tensor output, Tensor targets, StepStateBuffer step_state, Tensor metrics,
                        Tensor d_output) override;
  // A sample's loss: its squared error summed over the outputs, over output_dim.
  absl::Status Evaluate(Tensor output, Tensor targets, Tensor sums) override;
  int64_t target_columns() const override { return output_dim_; }
  bool classifies() const override { return false; }

 private:
  Backend* backend_;
  int64_t output_dim_;
  int64_t accumulation_steps_;
};

}  // namespace mptrain
