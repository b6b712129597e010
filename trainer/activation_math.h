#pragma once

// Activation forward and backward in fp32, as PyTorch computes them for fp16/bf16 tensors
// (upcast, compute, round the result). Shared by the CPU backend and the CUDA kernels.

#include <cmath>

#include "trainer/backend_types.h"
#include "trainer/host_device.h"

namespace mptrain {

MPTRAIN_HD inline float ActivationForward(ActivationKind act, float x) {
  switch (act) {
    case ActivationKind::kRelu: return x > 0.0f ? x : 0.0f;
    // torch.nn.GELU() (approximate='none'): x * 0.5 * (1 + erf(x / sqrt(2))).
    case ActivationKind::kGelu: return x * 0.5f * (1.0f + erff(x * 0.70710678118654752f));
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
    case ActivationKind::kNone: return dy;
  }
  return dy;
}

}  // namespace mptrain
