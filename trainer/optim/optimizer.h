#pragma once

// An optimizer as a strategy over the backend's primitives: it owns its per-parameter state
// (named, for checkpoints) and turns this step's learning rate into the update rule that the
// backend applies to every parameter (Backend::UpdateParameters, formulas in update_math.h).
// GradScaler's unscale / inf check / skip and clipping happen around it (train_loop.cc); a
// skipped step leaves the parameters and this state untouched.

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/model/parameter_table.h"
#include "trainer/training_config.h"

namespace mptrain {

// One per-parameter state buffer: [1, n] f32, zero at the start.
struct OptimizerSlot {
  std::string name;  // Checkpoint tensor prefix: "<name>.layers.{i}.weight".
  Tensor values;
};

// Consecutive parameters [begin, end) of the flat buffer in one weight-decay group: nanoGPT's
// two groups (decay on 2-D tensors only) are many such spans of the GPT's table.
struct DecaySpan {
  int64_t begin = 0;
  int64_t end = 0;
  bool decay = true;
};

// The table's maximal runs of parameters sharing ParameterSpec::weight_decay, covering
// [0, total()); one span when every parameter decays (the MLP).
std::vector<DecaySpan> DecaySpansOf(const ParameterTable& table);

// backend->UpdateParameters(rule, ...) over each span, with rule's weight decay zeroed on the
// spans that do not decay: one call over everything when `spans` is one span that decays or
// the rule has no decay (the same arithmetic as before decay groups). slot_a, slot_b and
// params_low may be empty.
absl::Status UpdateInSpans(Backend* backend, const UpdateRule& rule,
                           const std::vector<DecaySpan>& spans, Tensor params, Tensor grads,
                           Tensor slot_a, Tensor slot_b, StepStateBuffer step_state,
                           Tensor params_low);

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const std::vector<OptimizerSlot>& slots() const = 0;
  // Phase 3 of the step with learning rate `lr`: params (and params_low, when not empty) are
  // updated from grads unless step_state says the step is skipped.
  virtual absl::Status Update(double lr, Tensor params, Tensor grads, StepStateBuffer step_state,
                              Tensor params_low) = 0;
};

// The optimizer of `config` for n parameters, its state allocated on `backend`; weight decay
// only on the spans that decay (empty: every parameter decays).
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                         Backend* backend, int64_t n,
                                                         std::vector<DecaySpan> spans = {});

}  // namespace mptrain
