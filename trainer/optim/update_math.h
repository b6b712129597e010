#pragma once

// The per-parameter arithmetic of the optimizers, written once for the host (CPU backend, tests)
// and the GPU (the CUDA backend's update kernel): torch.optim.SGD (momentum, nesterov, weight
// decay; dampening 0), torch.optim.Adam (L2 weight decay) and torch.optim.AdamW (decoupled
// weight decay), in the order of PyTorch 1.13's single-tensor implementations, each operation
// rounded to fp32 as there. No absl, no protobuf: kernels.cu includes it.
//
// A backend applies an UpdateRule to every parameter i (Backend::UpdateParameters):
//   coefficients = PrepareUpdate(rule, state)       once per launch, after FinalizeStep
//   ApplyUpdate(rule, coefficients, g_i, &p_i, &a_i, &b_i)   unless state.skipped
// with g_i the unscaled, clipped gradient (gradient · inv_scale · clip_coef). The optimizer
// state a (SGD's momentum buffer, Adam's exp_avg) and b (Adam's exp_avg_sq) starts at zero.

#include <cmath>
#include <cstdint>

#include "trainer/host_device.h"
#include "trainer/step_math.h"

namespace mptrain {

#if !defined(__CUDACC__)
using std::pow;
using std::sqrt;
#endif

enum class UpdateKind : int32_t { kSgd = 0, kAdam = 1 };

// What one optimizer step applies. Passed by value to the device.
struct UpdateRule {
  UpdateKind kind = UpdateKind::kSgd;
  double lr = 0;             // This step's learning rate (the schedule's, on the host).
  float weight_decay = 0;
  // kSgd
  float momentum = 0;
  bool nesterov = false;
  // kAdam
  float beta1 = 0.9f;
  float beta2 = 0.999f;
  float eps = 1e-8f;
  double beta1_d = 0.9;      // The betas as the user wrote them (bias corrections use doubles).
  double beta2_d = 0.999;
  double weight_decay_d = 0;
  bool decoupled_weight_decay = false;  // AdamW
};

// The scalars of one step, computed once (in double where PyTorch computes them in Python).
struct UpdateCoefficients {
  float neg_lr = 0;           // SGD: alpha of param.add_(d_p, alpha=-lr)
  float neg_step_size = 0;    // Adam: -lr / (1 - beta1^t)
  float bias2_sqrt = 1;       // Adam: sqrt(1 - beta2^t)
  float decay = 1;            // AdamW: 1 - lr * weight_decay
  float one_minus_beta1 = 0;
  float one_minus_beta2 = 0;
};

// `state` is the StepState after FinalizeStep: Adam's step count t is the number of steps
// applied so far, this one included (a skipped step does not advance it, as GradScaler.step
// skips optimizer.step()).
MPTRAIN_HD inline UpdateCoefficients PrepareUpdate(const UpdateRule& rule, const StepState& state) {
  UpdateCoefficients c;
  c.neg_lr = static_cast<float>(-rule.lr);
  if (rule.kind == UpdateKind::kAdam) {
    const double t = static_cast<double>(state.steps_done - state.skipped_total);
    const double bias1 = 1.0 - pow(rule.beta1_d, t);
    const double bias2 = 1.0 - pow(rule.beta2_d, t);
    c.neg_step_size = static_cast<float>(-(rule.lr / bias1));
    c.bias2_sqrt = static_cast<float>(sqrt(bias2));
    c.decay = static_cast<float>(1.0 - rule.lr * rule.weight_decay_d);
    c.one_minus_beta1 = static_cast<float>(1.0 - rule.beta1_d);
    c.one_minus_beta2 = static_cast<float>(1.0 - rule.beta2_d);
  }
  return c;
}

// torch.optim.SGD._single_tensor_sgd with dampening 0. A momentum buffer that starts at zero
// gives exactly PyTorch's first step (buf = clone(d_p)).
MPTRAIN_HD inline void SgdUpdate(const UpdateRule& rule, const UpdateCoefficients& c, float grad,
                                 float* param, float* momentum_buffer) {
  float d_p = grad;
  if (rule.weight_decay != 0) d_p = d_p + rule.weight_decay * *param;
  if (rule.momentum != 0) {
    *momentum_buffer = *momentum_buffer * rule.momentum + d_p;
    d_p = rule.nesterov ? d_p + rule.momentum * *momentum_buffer : *momentum_buffer;
  }
  *param = *param + c.neg_lr * d_p;
}

// torch.optim.Adam / AdamW._single_tensor_adam (amsgrad off, maximize off).
MPTRAIN_HD inline void AdamUpdate(const UpdateRule& rule, const UpdateCoefficients& c, float grad,
                                  float* param, float* exp_avg, float* exp_avg_sq) {
  if (rule.decoupled_weight_decay) {
    *param = *param * c.decay;                              // param.mul_(1 - lr * wd)
  } else if (rule.weight_decay != 0) {
    grad = grad + rule.weight_decay * *param;               // grad.add(param, alpha=wd)
  }
  *exp_avg = *exp_avg * rule.beta1 + c.one_minus_beta1 * grad;             // mul_.add_
  *exp_avg_sq = *exp_avg_sq * rule.beta2 + c.one_minus_beta2 * grad * grad;  // mul_.addcmul_
  const float denom = sqrt(*exp_avg_sq) / c.bias2_sqrt + rule.eps;
  *param = *param + c.neg_step_size * (*exp_avg / denom);                  // addcdiv_
}

MPTRAIN_HD inline void ApplyUpdate(const UpdateRule& rule, const UpdateCoefficients& c, float grad,
                                   float* param, float* a, float* b) {
  if (rule.kind == UpdateKind::kAdam) {
    AdamUpdate(rule, c, grad, param, a, b);
  } else {
    SgdUpdate(rule, c, grad, param, a);
  }
}

}  // namespace mptrain
