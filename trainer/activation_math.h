#pragma once

// Activation forward and backward in fp32, as PyTorch computes them for fp16/bf16 tensors
// (upcast, compute, round the result). Shared by the CPU backend and the CUDA kernels.

#include <cmath>

#include "trainer/backend_types.h"
#include "trainer/host_device.h"

namespace mptrain {

// sqrt(2 / pi) and the cubic coefficient of GELU's tanh approximation.
constexpr float kGeluTanhBeta = 0.7978845608028654f;
constexpr float kGeluTanhKappa = 0.044715f;

MPTRAIN_HD inline float ActivationForward(ActivationKind act, float x) {
  switch (act) {
    case ActivationKind::kRelu: return x > 0.0f ? x : 0.0f;
    // torch.nn.GELU() (approximate='none'): x * 0.5 * (1 + erf(x / sqrt(2))).
    case ActivationKind::kGelu: return x * 0.5f * (1.0f + erff(x * 0.70710678118654752f));
    // PyTorch's GeluKernel (approximate='tanh'): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
    case ActivationKind::kGeluTanh: {
      const float inner = kGeluTanhBeta * (x + kGeluTanhKappa * x * x * x);
      return 0.5f * x * (1.0f + tanhf(inner));
    }
    case ActivationKind::kNone: return x;
  }
  return x;
}

// dy * act'(x).
MPTRAIN_HD inline float ActivationGradient(ActivationKind act, float x, float dy) {
  switch (act) {
    case ActivationKind::kRelu: return x > 0.0f ? dy : 0.0f;
    case ActivationKind::kGelu: {
      const float cdf = 0.5f * (1.0f + erff(x * 0.70710678118654752f));
      const float pdf = expf(-0.5f * x * x) * 0.39894228040143267f;
      return dy * (cdf + x * pdf);
    }
    case ActivationKind::kGeluTanh: {
      // PyTorch's GeluBackwardKernel (approximate='tanh'), term by term.
      const float x_sq = x * x;
      const float inner = kGeluTanhBeta * (x + kGeluTanhKappa * x_sq * x);
      const float tanh_inner = tanhf(inner);
      const float left = 0.5f * x;
      const float right = 1.0f + tanh_inner;
      const float left_derivative = 0.5f * right;
      const float tanh_derivative = 1.0f - tanh_inner * tanh_inner;
      const float inner_derivative = kGeluTanhBeta * (1.0f + 3.0f * kGeluTanhKappa * x_sq);
      const float right_derivative = left * tanh_derivative * inner_derivative;
      return dy * (left_derivative + right_derivative);
    }
    case ActivationKind::kNone: return dy;
  }
  return dy;
}

}  // namespace mptrain
