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
#include "trainer/training_config.h"

namespace mptrain {

// One per-parameter state buffer: [1, n] f32, zero at the start.
struct OptimizerSlot {
  std::string name;  // Checkpoint tensor prefix: "<name>.layers.{i}.weight".
  Tensor values;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  virtual const std::vector<OptimizerSlot>& slots() const = 0;
  // Phase 3 of the step with learning rate `lr`: params (and params_low, when not empty) are
  // updated from grads unless step_state says the step is skipped.
  virtual absl::Status Update(double lr, Tensor params, Tensor grads, StepStateBuffer step_state,
                              Tensor params_low) = 0;
};

// The optimizer of `config` for n parameters, its state allocated on `backend`.
absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                         Backend* backend, int64_t n);

}  // namespace mptrain
