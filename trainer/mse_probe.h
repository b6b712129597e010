#pragma once

// For gradient checks (tests): the MSE loss of one fp32 micro-batch through an Mlp at given
// parameters (accumulation 1, loss scale 1), and the gradients the backward pass computes for
// it, to compare with central finite differences of the loss.

#include <cstdint>
#include <vector>

#include "trainer/backend.h"
#include "trainer/loss/mse.h"
#include "trainer/mlp.h"

namespace mptrain::testing {

class MseProbe {
 public:
  // x [batch, input_dim] and y [batch, output_dim], row-major.
  MseProbe(Backend* backend, Mlp* mlp, const std::vector<float>& x, const std::vector<float>& y)
      : backend_(backend), mlp_(mlp), loss_(backend, OutputDim(mlp), 1) {
    const int64_t batch = static_cast<int64_t>(x.size()) / InputDim(mlp);
    x_ = *backend->Allocate(DType::kF32, batch, InputDim(mlp));
    y_ = *backend->Allocate(DType::kF32, batch, OutputDim(mlp));
    StepState unit_scale;
    unit_scale.scale = 1.0f;
    state_ = *backend->AllocateStepState(unit_scale);
    ok_ = backend->Upload(x.data(), x_).ok() && backend->Upload(y.data(), y_).ok();
  }

  bool ok() const { return ok_; }

  // The loss at `params` (layout().total values); fills `grads` (the same count) when given.
  double LossAt(const std::vector<float>& params, std::vector<float>* grads) {
    const int64_t n = mlp_->layout().total;
    bool ok = backend_->Upload(params.data(), mlp_->params()).ok() &&
              backend_->Zero(mlp_->grads()).ok() && mlp_->Forward(x_).ok() &&
              loss_.Backward(mlp_->output(), y_, state_, mlp_->metrics(), mlp_->output_grad())
                  .ok() &&
              mlp_->Backward(/*micro_batch=*/0).ok();
    std::vector<float> all(n + 2);
    ok = ok && backend_->Download(mlp_->grads(), all.data()).ok();
    ok_ = ok_ && ok;
    if (grads != nullptr) grads->assign(all.begin(), all.begin() + n);
    return static_cast<double>(all[n]);  // The loss slot.
  }

 private:
  static int64_t InputDim(Mlp* mlp) { return mlp->layout().layers.front().in; }
  static int64_t OutputDim(Mlp* mlp) { return mlp->layout().layers.back().out; }

  Backend* backend_;
  Mlp* mlp_;
  MseLoss loss_;
  Tensor x_, y_;
  StepStateBuffer state_;
  bool ok_ = false;
};

}  // namespace mptrain::testing
