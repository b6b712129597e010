#pragma once

// An independent, naive double-precision MLP (forward, MSE loss, backward, SGD step) that
// tests compare the training loop against. It shares no code with the backends.

#include <cmath>
#include <vector>

namespace mptrain::testing {

struct ReferenceLayer {
  int in = 0, out = 0;
  std::vector<double> weight;  // [out, in]
  std::vector<double> bias;    // [out]
};

enum class ReferenceActivation { kRelu, kGelu };

inline double RefAct(ReferenceActivation act, double x) {
  if (act == ReferenceActivation::kRelu) return x > 0 ? x : 0;
  return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
}

inline double RefActGrad(ReferenceActivation act, double x) {
  if (act == ReferenceActivation::kRelu) return x > 0 ? 1 : 0;
  return 0.5 * (1 + std::erf(x / std::sqrt(2.0))) +
         x * std::exp(-0.5 * x * x) / std::sqrt(2 * M_PI);
}

// Returns the MSE loss of one batch and adds d loss / d parameter * grad_multiplier into
// weight_grads / bias_grads (same shapes as the layers).
inline double ReferenceLossAndGrad(const std::vector<ReferenceLayer>& layers,
                                   ReferenceActivation act, const std::vector<double>& x,
                                   const std::vector<double>& y, int batch, double grad_multiplier,
                                   std::vector<std::vector<double>>* weight_grads,
                                   std::vector<std::vector<double>>* bias_grads) {
  std::vector<std::vector<double>> inputs{x}, pres;
  for (size_t l = 0; l < layers.size(); ++l) {
    const ReferenceLayer& layer = layers[l];
    std::vector<double> pre(batch * layer.out), out(batch * layer.out);
    for (int b = 0; b < batch; ++b) {
      for (int o = 0; o < layer.out; ++o) {
        double sum = layer.bias[o];
        for (int i = 0; i < layer.in; ++i) sum += inputs[l][b * layer.in + i] * layer.weight[o * layer.in + i];
        pre[b * layer.out + o] = sum;
        out[b * layer.out + o] = l + 1 == layers.size() ? sum : RefAct(act, sum);
      }
    }
    pres.push_back(pre);
    inputs.push_back(out);
  }
  const std::vector<double>& pred = inputs.back();
  double loss = 0;
  for (size_t i = 0; i < pred.size(); ++i) loss += (pred[i] - y[i]) * (pred[i] - y[i]);
  loss /= pred.size();
  std::vector<double> grad(pred.size());
  for (size_t i = 0; i < pred.size(); ++i) grad[i] = 2 * (pred[i] - y[i]) / pred.size();
  for (size_t l = layers.size(); l-- > 0;) {
    const ReferenceLayer& layer = layers[l];
    if (l + 1 != layers.size()) {
      for (size_t i = 0; i < grad.size(); ++i) grad[i] *= RefActGrad(act, pres[l][i]);
    }
    std::vector<double> grad_in(batch * layer.in, 0.0);
    for (int b = 0; b < batch; ++b) {
      for (int o = 0; o < layer.out; ++o) {
        const double g = grad[b * layer.out + o];
        (*bias_grads)[l][o] += g * grad_multiplier;
        for (int i = 0; i < layer.in; ++i) {
          (*weight_grads)[l][o * layer.in + i] += g * inputs[l][b * layer.in + i] * grad_multiplier;
          grad_in[b * layer.in + i] += g * layer.weight[o * layer.in + i];
        }
      }
    }
    grad = grad_in;
  }
  return loss;
}

}  // namespace mptrain::testing
