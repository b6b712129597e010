#include "trainer/optim/optimizer.h"

#include "common/status_macros.h"
#include "trainer/optim/adam.h"
#include "trainer/optim/sgd.h"

namespace mptrain {

std::vector<DecaySpan> DecaySpansOf(const ParameterTable& table) {
  std::vector<DecaySpan> spans;
  for (const ParameterSpec& spec : table.parameters()) {
    if (!spans.empty() && spans.back().decay == spec.weight_decay) {
      spans.back().end = spec.offset + spec.numel;
    } else {
      spans.push_back({spec.offset, spec.offset + spec.numel, spec.weight_decay});
    }
  }
  return spans;
}

absl::Status UpdateInSpans(Backend* backend, const UpdateRule& rule,
                           const std::vector<DecaySpan>& spans, Tensor params, Tensor grads,
                           Tensor slot_a, Tensor slot_b, StepStateBuffer step_state,
                           Tensor params_low) {
  const bool one_call = (spans.size() == 1 && spans[0].decay) ||
                        (rule.weight_decay == 0 && rule.weight_decay_d == 0) || spans.empty();
  if (one_call) {
    return backend->UpdateParameters(rule, params, grads, slot_a, slot_b, step_state, params_low);
  }
  auto view = [](Tensor t, const DecaySpan& span) {
    return t.empty() ? t : t.FlatView(span.begin, 1, span.end - span.begin);
  };
  for (const DecaySpan& span : spans) {
    UpdateRule span_rule = rule;
    if (!span.decay) {
      span_rule.weight_decay = 0;
      span_rule.weight_decay_d = 0;
    }
    RETURN_IF_ERROR(backend->UpdateParameters(span_rule, view(params, span), view(grads, span),
                                              view(slot_a, span), view(slot_b, span), step_state,
                                              view(params_low, span)));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                         Backend* backend, int64_t n,
                                                         std::vector<DecaySpan> spans) {
  if (spans.empty()) spans.push_back({0, n, true});
  if (config.type == OptimizerType::kSgd) {
    auto sgd = Sgd::Create(config, backend, n, std::move(spans));
    if (!sgd.ok()) return sgd.status();
    return std::unique_ptr<Optimizer>(std::move(*sgd));
  }
  auto adam = Adam::Create(config, backend, n, std::move(spans));
  if (!adam.ok()) return adam.status();
  return std::unique_ptr<Optimizer>(std::move(*adam));
}

}  // namespace mptrain
