#pragma once

// The MLP (Linear, activation, ..., Linear) built from backend operations: its buffers, forward
// and backward under autocast. Written once for every backend.

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/parameter_layout.h"
#include "trainer/training_config.h"

namespace mptrain {

class Mlp {
 public:
  // Allocates parameters (fp32 masters), gradients (fp32, plus one trailing slot for the loss
  // that rides in the gradient allreduce), low-precision weight copies and the activations of
  // one micro-batch.
  //
  // Gradient accumulation over `accumulation_steps` micro-batches: autocast's weight gradients
  // come out of the GEMM rounded to fp16/bf16 and are added, one micro-batch after the other,
  // to the fp32 gradients. When the per-micro-batch low-precision gradients of all micro-batches
  // fit in `deferred_budget_bytes`, they are kept side by side and summed into fp32 once, on the
  // stepping micro-batch, in the same order: the same numbers for about a third of the memory
  // traffic.
  static constexpr int64_t kDeferredBudgetBytes = int64_t{8} << 30;
  static absl::StatusOr<std::unique_ptr<Mlp>> Create(
      Backend* backend, const ModelConfig& model, DType compute_dtype, int64_t micro_batch_size,
      int64_t accumulation_steps = 1, int64_t deferred_budget_bytes = kDeferredBudgetBytes);

  const ParameterLayout& layout() const { return layout_; }
  Tensor params() const { return params_; }        // [1, n] f32
  Tensor grads() const { return grads_; }          // [1, n + 1] f32, loss in the last slot
  Tensor loss_slot() const { return grads_.FlatView(layout_.total, 1, 1); }
  Tensor param_grads() const { return grads_.FlatView(0, 1, layout_.total); }  // [1, n] f32
  // [1, n] compute dtype; empty for fp32 (the masters are used directly).
  Tensor low_precision_params() const {
    return compute_dtype_ == DType::kF32 ? Tensor{} : params_low_;
  }
  Tensor output() const { return outputs_.back(); }     // [B, out] compute dtype
  Tensor output_grad() const { return output_grad_; }   // [B, out] compute dtype

  // Rounds the fp32 masters into the compute-dtype copies. Called once per optimizer step:
  // the weights do not change between micro-batches.
  absl::Status RefreshLowPrecisionWeights();
  // x: [B, input_dim] f32 in backend memory. `x_unchanged`: x is the same unmodified tensor
  // as in the last call (the fixed synthetic batch), so its low-precision cast is reused.
  absl::Status Forward(Tensor x, bool x_unchanged = false);
  // Backpropagates output_grad() of micro-batch `micro_batch` (0-based) of an optimizer step.
  // After the last one (accumulation_steps - 1), grads() holds the fp32 sum of every
  // micro-batch's gradients; before it, grads() is undefined. `on_bucket_ready(span)`, when
  // given, runs on the last micro-batch as soon as a span of grads() is final: each bucket
  // (last layers first), and, when the last bucket is one large layer, its weight gradient in
  // row chunks, so that only a small allreduce is left after the backward pass.
  using BucketReady = std::function<absl::Status(Tensor span)>;
  absl::Status Backward(int64_t micro_batch, const BucketReady& on_bucket_ready = {});
  bool defers_accumulation() const { return !gradient_slots_.empty(); }

  // Gradient buckets: consecutive layers, from the last, grouped up to kBucketBytes like DDP's
  // buckets; the first bucket also holds the loss slot.
  static constexpr int64_t kBucketBytes = 25 << 20;
  // A last layer above this many gradient bytes is reduced in chunks of about this size.
  static constexpr int64_t kChunkBytes = 64 << 20;
  size_t bucket_count() const { return bucket_first_layer_.size(); }

 private:
  Mlp(Backend* backend, ParameterLayout layout, ActivationKind activation, DType compute_dtype)
      : backend_(backend),
        layout_(std::move(layout)),
        activation_(activation),
        compute_dtype_(compute_dtype) {}

  Tensor Weight(Tensor flat, size_t layer) const;
  Tensor Bias(Tensor flat, size_t layer) const;
  ActivationKind LayerActivation(size_t layer) const;
  // Makes grads() span [offset, offset + count) final (sums the slots when deferring), then
  // hands it to the hook.
  absl::Status SpanReady(int64_t offset, int64_t count, const BucketReady& on_bucket_ready);

  Backend* backend_;
  ParameterLayout layout_;
  ActivationKind activation_;
  DType compute_dtype_;
  Tensor params_, grads_, params_low_;
  int64_t accumulation_steps_ = 1;
  Tensor gradient_slots_;             // [A, n] compute dtype, when deferring the accumulation
  Tensor input_low_;                  // [B, in] the input in the compute dtype
  Tensor first_input_;                // What the first layer read in the last Forward().
  const void* cast_source_ = nullptr; // The x whose cast input_low_ holds.
  std::vector<Tensor> pre_;           // per layer [B, out]: before the activation
  std::vector<Tensor> outputs_;       // per layer [B, out]: after it
  std::vector<Tensor> output_grads_;  // per layer [B, out]: d loss / d output (in place to d pre)
  Tensor output_grad_;
  // bucket_first_layer_[b]: the lowest layer of bucket b; buckets are ordered last layer first.
  std::vector<size_t> bucket_first_layer_;
};

}  // namespace mptrain
