#include "trainer/mlp.h"

#include <algorithm>

#include "common/status_macros.h"
#include "trainer/norm_math.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Mlp>> Mlp::Create(Backend* backend, const ModelConfig& model,
                                                 DType compute_dtype, int64_t batch,
                                                 int64_t accumulation_steps,
                                                 int64_t deferred_budget_bytes) {
  if (model.widths.size() < 2) {
    return absl::InvalidArgumentError("model: needs an input and an output width");
  }
  std::unique_ptr<Mlp> mlp(new Mlp(backend, MakeParameterLayout(model.widths, model.norm),
                                   model.activation, compute_dtype));
  mlp->world_size_ = backend->collective()->world_size();
  const int64_t n = mlp->layout_.total;
  ASSIGN_OR_RETURN(mlp->params_, backend->Allocate(DType::kF32, 1, n));
  ASSIGN_OR_RETURN(mlp->params_low_, backend->Allocate(compute_dtype, 1, n));
  // The norms' affine gradients are fp32 (their parameters are not cast by autocast), so they
  // cannot wait in the low-precision rows of deferred accumulation: with a norm, every
  // micro-batch adds into the fp32 gradients (the same numbers, more memory traffic).
  if (model.norm != NormKind::kNone) deferred_budget_bytes = 0;
  ASSIGN_OR_RETURN(mlp->accumulator_,
                   GradientAccumulator::Create(backend, n, compute_dtype,
                                               mlp->params_low_.element_bytes,
                                               accumulation_steps, deferred_budget_bytes));
  if (mlp->layout_.buffers_total > 0) {
    ASSIGN_OR_RETURN(mlp->buffers_, backend->Allocate(DType::kF32, 1, mlp->layout_.buffers_total));
    const std::vector<float> initial = InitializeBuffers(mlp->layout_);
    RETURN_IF_ERROR(backend->Upload(initial.data(), mlp->buffers_));
  }
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
    NormBuffers norm;
    if (mlp->layout_.layers[i].has_norm()) {
      // The Linear's output z gets a buffer of its own: the norm's backward reads it.
      ASSIGN_OR_RETURN(pre, backend->Allocate(compute_dtype, batch, out));
      const DType norm_dtype = model.norm == NormKind::kLayerNorm ? DType::kF32 : compute_dtype;
      ASSIGN_OR_RETURN(norm.zn, backend->Allocate(norm_dtype, batch, out));
      ASSIGN_OR_RETURN(norm.d_zn, backend->Allocate(norm_dtype, batch, out));
      if (IsBatchNorm(model.norm)) {
        ASSIGN_OR_RETURN(norm.stats, backend->Allocate(DType::kF32, 1, 2 * out + 1));
        norm.gathered = norm.stats;
        if (mlp->SynchronisesNormStatistics()) {
          ASSIGN_OR_RETURN(norm.gathered,
                           backend->Allocate(DType::kF32, mlp->world_size_, 2 * out + 1));
        }
        ASSIGN_OR_RETURN(norm.mean_invstd, backend->Allocate(DType::kF32, 2, out));
        ASSIGN_OR_RETURN(norm.sums, backend->Allocate(DType::kF32, 2, out));
      } else {
        ASSIGN_OR_RETURN(norm.row_stats, backend->Allocate(DType::kF32, batch, 2));
      }
    }
    mlp->outputs_.push_back(y);
    mlp->pre_.push_back(pre);
    mlp->output_grads_.push_back(dy);
    mlp->norms_.push_back(norm);
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

Tensor Mlp::NormWeight(size_t layer) const {
  const LayerLayout& l = layout_.layers[layer];
  return params_.FlatView(l.norm_weight_offset, 1, l.norm_features);
}

Tensor Mlp::NormBias(size_t layer) const {
  const LayerLayout& l = layout_.layers[layer];
  return params_.FlatView(l.norm_bias_offset, 1, l.norm_features);
}

absl::Status Mlp::NormForward(size_t i, Tensor z, bool training) {
  const LayerLayout& l = layout_.layers[i];
  const NormBuffers& norm = norms_[i];
  const int64_t rows = z.rows;
  const Tensor zn = norm.zn.RowSlice(0, rows);
  if (layout_.norm == NormKind::kLayerNorm) {
    return backend_->LayerNormForward(z, NormWeight(i), NormBias(i), kNormEps,
                                      norm.row_stats.RowSlice(0, rows), zn);
  }
  if (training) {
    RETURN_IF_ERROR(backend_->BatchNormStatistics(z, kNormEps, norm.stats));
    if (SynchronisesNormStatistics()) {
      // Every forward, no_sync or not: torch's SyncBatchNorm all-gathers (mean, invstd, count).
      RETURN_IF_ERROR(backend_->collective()->AllGather(norm.stats, norm.gathered));
    }
    RETURN_IF_ERROR(backend_->BatchNormCombineStatistics(
        norm.gathered, kNormEps, kBatchNormMomentum,
        buffers_.FlatView(l.running_offset, 2, l.out), norm.mean_invstd));
  } else {
    RETURN_IF_ERROR(backend_->BatchNormRunningStatistics(
        buffers_.FlatView(l.running_offset, 2, l.out), kNormEps, norm.mean_invstd));
  }
  return backend_->BatchNormApply(z, norm.mean_invstd, NormWeight(i), NormBias(i), zn);
}

absl::Status Mlp::NormBackward(size_t i, Tensor dy, const GradientAccumulator::Target& target) {
  const LayerLayout& l = layout_.layers[i];
  const NormBuffers& norm = norms_[i];
  const Tensor dweight = target.flat.FlatView(l.norm_weight_offset, 1, l.norm_features);
  const Tensor dbias = target.flat.FlatView(l.norm_bias_offset, 1, l.norm_features);
  // d zn = dy · act'(zn), in zn's dtype (fp32 after a layer norm).
  RETURN_IF_ERROR(backend_->ActivationBackward(LayerActivation(i), norm.zn, dy, norm.d_zn));
  // dz overwrites dy (the compute dtype): it is the Linear's output gradient from here on.
  if (layout_.norm == NormKind::kLayerNorm) {
    return backend_->LayerNormBackward(norm.d_zn, pre_[i], norm.row_stats, NormWeight(i), dy,
                                       dweight, dbias, target.overwrite);
  }
  RETURN_IF_ERROR(backend_->BatchNormBackwardReduce(norm.d_zn, pre_[i], norm.mean_invstd,
                                                    norm.sums, dweight, dbias, target.overwrite));
  double count = static_cast<double>(pre_[i].rows);
  if (SynchronisesNormStatistics()) {
    // Every backward, no_sync or not: torch's SyncBatchNorm sums (Σ dy, Σ dy·(z − mean)) over
    // ranks. The affine gradients above stay this rank's (DDP averages them on the stepping
    // micro-batch, with every other gradient).
    RETURN_IF_ERROR(backend_->collective()->AllReduceSum(norm.sums));
    count *= world_size_;
  }
  return backend_->BatchNormBackwardInput(norm.d_zn, pre_[i], norm.mean_invstd, NormWeight(i),
                                          norm.sums, count, dy);
}

absl::Status Mlp::RefreshLowPrecisionWeights() {
  if (compute_dtype_ == DType::kF32) return absl::OkStatus();
  return backend_->Cast(params_, params_low_);
}

absl::Status Mlp::Forward(Tensor x, bool x_unchanged, bool training) {
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
    if (layout_.layers[i].has_norm()) {
      const Tensor z = pre_[i].RowSlice(0, rows);
      RETURN_IF_ERROR(backend_->LinearForward(input, Weight(weights, i), Bias(weights, i),
                                              ActivationKind::kNone, z, z));
      RETURN_IF_ERROR(NormForward(i, z, training));
      RETURN_IF_ERROR(
          backend_->ActivationForward(LayerActivation(i), norms_[i].zn.RowSlice(0, rows), y));
    } else {
      RETURN_IF_ERROR(backend_->LinearForward(input, Weight(weights, i), Bias(weights, i),
                                              LayerActivation(i), pre_[i].RowSlice(0, rows), y));
    }
    input = y;
  }
  if (training && IsBatchNorm(layout_.norm)) ++num_batches_tracked_;
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
    if (layer.has_norm()) {
      RETURN_IF_ERROR(NormBackward(i, output_grads_[i], target));
    } else if (LayerActivation(i) != ActivationKind::kNone) {
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
