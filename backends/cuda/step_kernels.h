#pragma once

// Host launchers of the CUDA backend's optimizer-step kernels (step_kernels.cu).

#include <cuda_runtime.h>

#include <cstdint>

#include "backends/cuda/kernels.h"  // kReductionBlocks
#include "trainer/backend_types.h"
#include "trainer/optim/update_math.h"
#include "trainer/step_math.h"

namespace mptrain::cuda {

// Phase 1 of step_math.h over n gradients: state->found_inf and state->sum_squares.
// `partials` and `inf_flags` hold kReductionBlocks entries of scratch.
cudaError_t GradientStatistics(const float* grads, int64_t n, StepState* state, double* partials,
                               int* inf_flags, cudaStream_t stream);
// Phase 2: FinalizeStep(config, metrics[0], state) and state->last_correct = metrics[1] on
// one thread.
cudaError_t FinalizeStep(const StepConfig& config, const float* metrics, StepState* state,
                         cudaStream_t stream);
// Phase 3: the optimizer update of trainer/optim/update_math.h over n parameters unless the
// step is skipped; slot_a / slot_b may be null when the rule does not use them. `params_low`
// (may be null) receives the updated parameters rounded to `low_dtype`. `lr_on_device`, when
// not null, replaces rule.lr (a recorded step's learning rate, set before each replay).
cudaError_t UpdateParameters(const UpdateRule& rule, float* params, const float* grads,
                             float* slot_a, float* slot_b, int64_t n, const StepState* state,
                             void* params_low, DType low_dtype, const double* lr_on_device,
                             cudaStream_t stream);

}  // namespace mptrain::cuda
