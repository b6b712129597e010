#include "trainer/mlp.h"

#include <algorithm>

#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(Backend* backend, const ModelConfig& model,
                                                 DType compute_dtype, int64_t batch,
                                                 int64_t accumulation_steps,
                                                 int64_t deferred_budget_bytes) {
  if (model.widths.size() < 2) {
    return absl::InvalidArgumentError("model: needs an input and an output width");
  }
  std::unique_ptr<Mlp> mlp(
      new Mlp(backend, MakeParameterLayout(model.widths), model.activation, compute_dtype));
  const int64_t n = mlp->layout_.total;
  ASSIGN_OR_RETURN(mlp->params_, backend->Allocate(DType::kF32, 1, n));
  ASSIGN_OR_RETURN(mlp->params_low_, backend->Allocate(compute_dtype, 1, n));
  ASSIGN_OR_RETURN(mlp->accumulator_,
                   GradientAccumulator::Create(backend, n, compute_dtype,
                                               mlp->params_low_.element_bytes,
                                               accumulation_steps, deferred_budget_bytes));
  ASSIGN_OR_RETURN(mlp->input_low_,
                   backend->Allocate(compute_dtype, batch, mlp->layout_.layers[0].in));
  for (size_t i = 0; i < mlp->layout_.layers.size(); ++i) {
    const int64_t out = mlp->layout_.layers[i].out;
    ASSIGN_OR_RETURN(Tensor y, backend->Allocate(compute_dtype, batch, out));
    // Without an activation, or with ReLU (whose backward reads the output), the layer keeps
    // one buffer: backends can fuse bias and ReLU into the GEMM.
    Tensor pre = y;
    if (mlp->LayerActivation(i) == ActivationKind::kGelu) {
      ASSIGN_OR_RETURN(pre, backend->Allocate(compute_dtype, batch, out));
    }
    ASSIGN_OR_RETURN(Tensor dy, backend->Allocate(compute_dtype, batch, out));
    mlp->outputs_.push_back(y);
    mlp->pre_.push_back(pre);
    mlp->output_grads_.push_back(dy);
  }
  mlp->output_grad_ = mlp->output_grads_.back();
  return mlp;
}

ActivationKind Mlp::LayerActivation(size_t layer) const {
  return layer + 1 == layout_.layers.size() ? ActivationKind::kNone : activation_;
}

Tensor Mlp::Weight(Tensor flat, size_t layer) const {
  const LayerLayout& l = layout_.layers[layer];
  return flat.FlatView(l.weight_offset, l.out, l.in);
}

Tensor Mlp::Bias(Tensor flat, size_t layer) const {
  const LayerLayout& l = layout_.layers[layer];
  return flat.FlatView(l.bias_offset, 1, l.out);
}

absl::Status Mlp::RefreshLowPrecisionWeights() {
  if (compute_dtype_ == DType::kF32) return absl::OkStatus();
  return backend_->Cast(params_, params_low_);
}

absl::Status Mlp::Forward(Tensor x, bool x_unchanged) {
  const int64_t rows = x.rows;
  if (rows < 1 || rows > input_low_.rows) {
    return absl::InvalidArgumentError("Mlp::Forward: x must have 1 to micro_batch_size rows");
  }
  rows_ = rows;
  const Tensor weights = compute_dtype_ == DType::kF32 ? params_ : params_low_;
  Tensor input = x;
  if (compute_dtype_ != DType::kF32) {
    const Tensor input_low = input_low_.RowSlice(0, rows);
    if (!x_unchanged || cast_source_ != x.data) RETURN_IF_ERROR(backend_->Cast(x, input_low));
    cast_source_ = x.data;
    input = input_low;
  }
  first_input_ = input;
  for (size_t i = 0; i < layout_.layers.size(); ++i) {
    const Tensor y = outputs_[i].RowSlice(0, rows);
    RETURN_IF_ERROR(backend_->LinearForward(input, Weight(weights, i), Bias(weights, i),
                                            LayerActivation(i), pre_[i].RowSlice(0, rows), y));
    input = y;
  }
  return absl::OkStatus();
}

absl::Status Mlp::Backward(int64_t micro_batch, LayerGradientObserver* observer) {
  if (rows_ != input_low_.rows) {
    return absl::FailedPreconditionError("Mlp::Backward needs a forward pass of a whole batch");
  }
  const Tensor weights = compute_dtype_ == DType::kF32 ? params_ : params_low_;
  const bool last = micro_batch + 1 == accumulator_.accumulation_steps();
  if (!last) observer = nullptr;
  const GradientAccumulator::Target target = accumulator_.For(micro_batch);
  for (size_t i = layout_.layers.size(); i-- > 0;) {
    const LayerLayout& layer = layout_.layers[i];
    Tensor d_pre = output_grads_[i];
    if (LayerActivation(i) != ActivationKind::kNone) {
      RETURN_IF_ERROR(
          backend_->ActivationBackward(LayerActivation(i), pre_[i], output_grads_[i], d_pre));
    }
    const Tensor layer_input = i == 0 ? first_input_ : outputs_[i - 1];
    // The first layer (whose input gradient is not needed) may go in row chunks of its output
    // features, each handed over while the next is computed.
    const std::vector<RowRange> chunks =
        i == 0 && observer != nullptr ? observer->FirstLayerRowChunks()
                                      : std::vector<RowRange>{{0, layer.out}};
    if (chunks.size() == 1) {
      RETURN_IF_ERROR(backend_->LinearBackward(layer_input, Weight(weights, i), d_pre,
                                               i == 0 ? Tensor{} : output_grads_[i - 1],
                                               Weight(target.flat, i), Bias(target.flat, i),
                                               target.overwrite));
    } else {
      for (const RowRange& rows : chunks) {
        RETURN_IF_ERROR(backend_->LinearBackward(
            layer_input, Weight(weights, i).RowSlice(rows.first, rows.count),
            d_pre.ColumnSlice(rows.first, rows.count), Tensor{},
            Weight(target.flat, i).RowSlice(rows.first, rows.count),
            Bias(target.flat, i).FlatView(rows.first, 1, rows.count), target.overwrite));
        RETURN_IF_ERROR(observer->FirstLayerRowsReady(rows));
      }
    }
    if (observer != nullptr) RETURN_IF_ERROR(observer->LayerReady(i));
  }
  if (last && observer == nullptr) {
    return accumulator_.Finalize(0, layout_.total + GradientAccumulator::kMetricSlots);
  }
  return absl::OkStatus();
}

}  // namespace mptrain
