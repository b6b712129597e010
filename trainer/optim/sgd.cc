#include "trainer/optim/sgd.h"

#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Sgd>> Sgd::Create(const OptimizerConfig& config, Backend* backend,
                                                 int64_t n, std::vector<DecaySpan> spans) {
  if (spans.empty()) spans.push_back({0, n, true});
  UpdateRule rule;
  rule.kind = UpdateKind::kSgd;
  rule.momentum = static_cast<float>(config.momentum);
  rule.weight_decay = static_cast<float>(config.weight_decay);
  rule.nesterov = config.nesterov;
  std::unique_ptr<Sgd> sgd(new Sgd(backend, rule, std::move(spans)));
  // The buffer exists even without momentum: checkpoints always carry it.
  ASSIGN_OR_RETURN(Tensor momentum, backend->Allocate(DType::kF32, 1, n));
  sgd->slots_.push_back({"momentum", momentum});
  return sgd;
}

absl::Status Sgd::Update(double lr, Tensor params, Tensor grads, StepStateBuffer step_state,
                         Tensor params_low) {
  UpdateRule rule = rule_;
  rule.lr = lr;
  // Without momentum the buffer is never read or changed (SgdUpdate): it is left out of the
  // update, which then moves a third fewer bytes (mlp8k: 2 GB less per step).
  const Tensor momentum = rule.momentum != 0 ? slots_[0].values : Tensor{};
  return UpdateInSpans(backend_, rule, spans_, params, grads, momentum, Tensor{}, step_state,
                       params_low);
}

}  // namespace mptrain
