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
  ASSIGN_OR_RETURN(mlp->grads_, backend->Allocate(DType::kF32, 1, n + 1));
  ASSIGN_OR_RETURN(mlp->params_low_, backend->Allocate(compute_dtype, 1, n));
  mlp->accumulation_steps_ = accumulation_steps;
  const int64_t slot_bytes = accumulation_steps * n * mlp->params_low_.element_bytes;
  if (compute_dtype != DType::kF32 && accumulation_steps > 1 &&
      slot_bytes <= deferred_budget_bytes) {
    ASSIGN_OR_RETURN(mlp->gradient_slots_,
                     backend->Allocate(compute_dtype, accumulation_steps, n));
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
    mlp->outputs_.push_back(y);
    mlp->pre_.push_back(pre);
    mlp->output_grads_.push_back(dy);
  }
  mlp->output_grad_ = mlp->output_grads_.back();
  int64_t bucket_bytes = 0;
  for (size_t i = mlp->layout_.layers.size(); i-- > 0;) {
    const LayerLayout& layer = mlp->layout_.layers[i];
    const int64_t bytes = (layer.in * layer.out + layer.out) * 4;
    if (mlp->bucket_first_layer_.empty() || bucket_bytes + bytes > kBucketBytes) {
      mlp->bucket_first_layer_.push_back(i);
      bucket_bytes = bytes;
    } else {
      mlp->bucket_first_layer_.back() = i;
      bucket_bytes += bytes;
    }
  }
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
  const Tensor weights = compute_dtype_ == DType::kF32 ? params_ : params_low_;
  Tensor input = x;
  if (compute_dtype_ != DType::kF32) {
    if (!x_unchanged || cast_source_ != x.data) RETURN_IF_ERROR(backend_->Cast(x, input_low_));
    cast_source_ = x.data;
    input = input_low_;
  }
  first_input_ = input;
  for (size_t i = 0; i < layout_.layers.size(); ++i) {
    RETURN_IF_ERROR(backend_->LinearForward(input, Weight(weights, i), Bias(weights, i),
                                            LayerActivation(i), pre_[i], outputs_[i]));
    input = outputs_[i];
  }
  return absl::OkStatus();
}

absl::Status Mlp::SpanReady(int64_t offset, int64_t count, const BucketReady& on_bucket_ready) {
  if (defers_accumulation()) {
    // grads[span] = Σ_micro-batches f32(slot[span]), in micro-batch order; the loss slot (past
    // the parameters) is not in the slots.
    const int64_t params = std::min(count, layout_.total - offset);
    RETURN_IF_ERROR(backend_->SumRowsToF32(gradient_slots_.ColumnSlice(offset, params),
                                           grads_.FlatView(offset, 1, params)));
  }
  if (!on_bucket_ready) return absl::OkStatus();
  return on_bucket_ready(grads_.FlatView(offset, 1, count));
}

absl::Status Mlp::Backward(int64_t micro_batch, const BucketReady& on_bucket_ready) {
  const Tensor weights = compute_dtype_ == DType::kF32 ? params_ : params_low_;
  const bool last = micro_batch + 1 == accumulation_steps_;
  // Where this micro-batch's weight and bias gradients go: its own low-precision slot when
  // deferring; otherwise into the fp32 sums, written over on the first micro-batch.
  const Tensor target = defers_accumulation() ? gradient_slots_.RowSlice(micro_batch, 1) : grads_;
  const bool overwrite = defers_accumulation() || micro_batch == 0;
  size_t bucket = 0;
  for (size_t i = layout_.layers.size(); i-- > 0;) {
    const LayerLayout& layer = layout_.layers[i];
    Tensor d_pre = output_grads_[i];
    if (LayerActivation(i) != ActivationKind::kNone) {
      RETURN_IF_ERROR(
          backend_->ActivationBackward(LayerActivation(i), pre_[i], output_grads_[i], d_pre));
    }
    const Tensor layer_input = i == 0 ? first_input_ : outputs_[i - 1];
    const bool ends_bucket = last && bucket < bucket_first_layer_.size() &&
                             bucket_first_layer_[bucket] == i;
    const int64_t bucket_end = bucket == 0 ? layout_.total + 1  // with the loss slot
                                           : layout_.layers[bucket_first_layer_[bucket - 1]].weight_offset;
    // The last layer of the backward pass, alone in the last bucket and large: its weight
    // gradient goes in row chunks (output features), each reduced while the next is computed.
    const int64_t weight_bytes = layer.in * layer.out * 4;
    const int64_t chunks = std::min<int64_t>(layer.out, weight_bytes / kChunkBytes);
    const bool chunked = ends_bucket && on_bucket_ready && i == 0 &&
                         bucket + 1 == bucket_first_layer_.size() &&
                         bucket_end == layer.bias_offset + layer.out + (bucket == 0) &&
                         chunks > 1;
    if (!chunked) {
      RETURN_IF_ERROR(backend_->LinearBackward(layer_input, Weight(weights, i), d_pre,
                                               i == 0 ? Tensor{} : output_grads_[i - 1],
                                               Weight(target, i), Bias(target, i), overwrite));
    } else {
      for (int64_t c = 0; c < chunks; ++c) {
        const int64_t first = layer.out * c / chunks, count = layer.out * (c + 1) / chunks - first;
        RETURN_IF_ERROR(backend_->LinearBackward(
            layer_input, Weight(weights, i).RowSlice(first, count), d_pre.ColumnSlice(first, count),
            Tensor{}, Weight(target, i).RowSlice(first, count),
            Bias(target, i).FlatView(first, 1, count), overwrite));
        RETURN_IF_ERROR(SpanReady(layer.weight_offset + first * layer.in, count * layer.in,
                                  on_bucket_ready));
      }
      // The biases (and the loss slot if this is the only bucket) last.
      RETURN_IF_ERROR(SpanReady(layer.bias_offset, bucket_end - layer.bias_offset,
                                on_bucket_ready));
      ++bucket;
      continue;
    }
    if (ends_bucket) {
      // Layers [i, end of the bucket] are done: one contiguous span of the flat buffer.
      RETURN_IF_ERROR(SpanReady(layer.weight_offset, bucket_end - layer.weight_offset,
                                on_bucket_ready));
      ++bucket;
    }
  }
  return absl::OkStatus();
}

}  // namespace mptrain
