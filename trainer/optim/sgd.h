#pragma once

#include "trainer/optim/optimizer.h"

namespace mptrain {

// torch.optim.SGD (dampening 0): momentum, nesterov, weight decay. State: "momentum".
class Sgd final : public Optimizer {
 public:
  // `spans`: the weight-decay groups (optimizer.h DecaySpan); empty: all n decay.
  static absl::StatusOr<std::unique_ptr<Sgd>> Create(const OptimizerConfig& config,
                                                      Backend* backend, int64_t n,
                                                      std::vector<DecaySpan> spans = {});
  const std::vector<OptimizerSlot>& slots() const override { return slots_; }
  absl::Status Update(double lr, Tensor params, Tensor grads, StepStateBuffer step_state,
                      Tensor params_low) override;

 private:
  Sgd(Backend* backend, UpdateRule rule, std::vector<DecaySpan> spans)
      : backend_(backend), rule_(rule), spans_(std::move(spans)) {}

  Backend* backend_;
  UpdateRule rule_;
  std::vector<DecaySpan> spans_;
  std::vector<OptimizerSlot> slots_;
};

}  // namespace mptrain
