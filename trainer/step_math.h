#pragma once

// The arithmetic of one optimizer step around the optimizer itself, shared by every backend
// (host and device code): torch.amp.GradScaler's unscale / inf check / scale update and
// torch.nn.utils.clip_grad_norm_'s coefficient.
//
// A backend runs the step in three phases over the flat fp32 gradient buffer:
//   1. Backend::GradientStatistics: for each gradient g: found_inf |= !isfinite(g);
//      u = g * inv_scale; sumsq += u * u
//   2. Backend::FinalizeStep (FinalizeStep() below): skip or step, the clip coefficient, the
//      next scale
//   3. Backend::UpdateParameters: unless skipped, the optimizer's update
//      (trainer/optim/update_math.h) of every parameter with the gradient u * clip_coef.

#include <cmath>
#include <cstdint>

#include "trainer/host_device.h"

namespace mptrain {

#if !defined(__CUDACC__)
using std::isfinite;
using std::sqrt;
#endif

// Fixed configuration of the scaler and clipping, copied to the device once.
struct StepConfig {
  float max_grad_norm = 0;  // 0: no clipping.
  bool scaler_enabled = false;
  float growth_factor = 2.0f;
  float backoff_factor = 0.5f;
  int32_t growth_interval = 2000;
};

// Mutable scaler state and the statistics of the last step. Lives on the device between steps
// (no host synchronisation inside a step); snapshots are copied back for telemetry.
struct StepState {
  float scale = 1.0f;          // The scale the next micro-batches multiply the loss by.
  int32_t growth_tracker = 0;  // Clean steps since the last growth or backoff.
  int32_t found_inf = 0;       // Phase 1 result.
  int32_t skipped = 0;         // Whether the last step was skipped.
  int64_t skipped_total = 0;
  int64_t steps_done = 0;
  double sum_squares = 0;      // Phase 1 result (unscaled gradients).
  float clip_coef = 1.0f;
  float last_scale = 1.0f;     // The scale the last step's gradients were computed with.
  float last_loss = 0;         // Effective-batch loss of the last step, averaged over ranks.
  float last_grad_norm = 0;    // Global L2 norm of the last step's unscaled gradients.
  float last_correct = 0;      // Correct predictions of the last step, averaged over ranks.
};

// inv_scale as GradScaler computes it: the reciprocal in double, then rounded to float.
MPTRAIN_HD inline float InverseScale(float scale) {
  return static_cast<float>(1.0 / static_cast<double>(scale));
}

// Phase 2. `loss` is the averaged effective-batch loss of this step (for telemetry only).
MPTRAIN_HD inline void FinalizeStep(const StepConfig& config, float loss, StepState* state) {
  // Without a scaler PyTorch neither checks nor skips: non-finite gradients are applied.
  const bool skip = config.scaler_enabled && state->found_inf != 0;
  state->last_scale = state->scale;
  state->last_loss = loss;
  // inf or NaN on overflow steps, as the norm of the unscaled gradients is.
  float norm = static_cast<float>(sqrt(state->sum_squares));
  state->last_grad_norm = norm;
  state->clip_coef = 1.0f;
  if (config.max_grad_norm > 0 && !skip) {
    // torch.nn.utils.clip_grad_norm_: coef = max_norm / (norm + 1e-6), clamped to 1.
    float coef = config.max_grad_norm / (norm + 1e-6f);
    state->clip_coef = coef < 1.0f ? coef : 1.0f;
  }
  state->steps_done += 1;
  state->skipped = skip ? 1 : 0;
  if (skip) state->skipped_total += 1;
  if (!config.scaler_enabled) return;
  // torch._amp_update_scale_
  if (skip) {
    state->scale *= config.backoff_factor;
    state->growth_tracker = 0;
  } else {
    int32_t successful = state->growth_tracker + 1;
    if (successful == config.growth_interval) {
      float grown = state->scale * config.growth_factor;
      if (isfinite(grown)) state->scale = grown;
      state->growth_tracker = 0;
    } else {
      state->growth_tracker = successful;
    }
  }
}

}  // namespace mptrain
