#include "trainer/optim/adam.h"

#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Adam>> Adam::Create(const OptimizerConfig& config,
                                                   Backend* backend, int64_t n,
                                                   std::vector<DecaySpan> spans) {
  if (spans.empty()) spans.push_back({0, n, true});
  UpdateRule rule;
  rule.kind = UpdateKind::kAdam;
  rule.weight_decay = static_cast<float>(config.weight_decay);
  rule.weight_decay_d = config.weight_decay;
  rule.decoupled_weight_decay = config.type == OptimizerType::kAdamW;
  rule.beta1 = static_cast<float>(config.beta1);
  rule.beta2 = static_cast<float>(config.beta2);
  rule.beta1_d = config.beta1;
  rule.beta2_d = config.beta2;
  rule.eps = static_cast<float>(config.eps);
  std::unique_ptr<Adam> adam(new Adam(backend, rule, std::move(spans)));
  for (const char* name : {"exp_avg", "exp_avg_sq"}) {
    ASSIGN_OR_RETURN(Tensor values, backend->Allocate(DType::kF32, 1, n));
    adam->slots_.push_back({name, values});
  }
  return adam;
}

absl::Status Adam::Update(double lr, Tensor params, Tensor grads, StepStateBuffer step_state,
                          Tensor params_low) {
  UpdateRule rule = rule_;
  rule.lr = lr;
  return UpdateInSpans(backend_, rule, spans_, params, grads, slots_[0].values, slots_[1].values,
                       step_state, params_low);
}

}  // namespace mptrain
