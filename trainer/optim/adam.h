#pragma once

#include "trainer/optim/optimizer.h"

namespace mptrain {

// torch.optim.Adam (L2 weight decay added to the gradient) and torch.optim.AdamW (decoupled
// weight decay): bias-corrected moments, eps added after the square root. State: "exp_avg",
// "exp_avg_sq"; the step count is the number of applied steps (the step state's steps_done -
// skipped_total), so a skipped step does not advance it.
class Adam final : public Optimizer {
 public:
  // `spans`: the weight-decay groups (optimizer.h DecaySpan); empty: all n decay.
  static absl::StatusOr<std::unique_ptr<Adam>> Create(const OptimizerConfig& config,
                                                      Backend* backend, int64_t n,
                                                      std::vector<DecaySpan> spans = {});
  const std::vector<OptimizerSlot>& slots() const override { return slots_; }
  absl::Status Update(double lr, Tensor params, Tensor grads, StepStateBuffer step_state,
                      Tensor params_low) override;

 private:
  Adam(Backend* backend, UpdateRule rule, std::vector<DecaySpan> spans)
      : backend_(backend), rule_(rule), spans_(std::move(spans)) {}

  Backend* backend_;
  UpdateRule rule_;
  std::vector<DecaySpan> spans_;
  std::vector<OptimizerSlot> slots_;
};

}  // namespace mptrain
