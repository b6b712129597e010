#include "trainer/optim/sgd.h"

#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Sgd>> Sgd::Create(const OptimizerConfig& config, Backend* backend,
                                                 int64_t n) {
  UpdateRule rule;
  rule.kind = UpdateKind::kSgd;
  rule.momentum = static_cast<float>(config.momentum);
  rule.weight_decay = static_cast<float>(config.weight_decay);
  rule.nesterov = config.nesterov;
  std::unique_ptr<Sgd> sgd(new Sgd(backend, rule));
  // The buffer exists even without momentum: checkpoints always carry it.
  ASSIGN_OR_RETURN(Tensor momentum, backend->Allocate(DType::kF32, 1, n));
  sgd->slots_.push_back({"momentum", momentum});
  return sgd;
}

absl::Status Sgd::Update(double lr, Tensor params, Tensor grads, StepStateBuffer step_state,
                         Tensor params_low) {
  UpdateRule rule = rule_;
  rule.lr = lr;
  return backend_->UpdateParameters(rule, params, grads, slots_[0].values, Tensor{}, step_state,
                                    params_low);
}

}  // namespace mptrain
