#pragma once

// How the stepping micro-batch's gradients travel: DDP's communication hook. The gradient
// reducer hands each final span of the accumulator's grads() to Start(); Finish() after the
// backward pass orders all later work after every allreduce and leaves the mean over ranks in
// grads().
//   kF32         the allreduce mean of the fp32 gradients (DDP's default).
//   kF16, kBF16  DDP's fp16_compress_hook / bf16_compress_hook: each span's gradients are
//                rounded to the dtype and divided by the world size in it, summed across ranks
//                in it, and copied back into the fp32 gradients. The metric slots that ride in
//                the first span (loss, correct count) stay fp32: a separate small allreduce.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "trainer/backend.h"

namespace mptrain {

class GradientCommunicator {
 public:
  // grads: the accumulator's [1, param_count + metric slots] f32 gradients; spans handed to
  // Start() are views into it. For a compressed dtype it allocates a [1, param_count] buffer of
  // that dtype (the bytes that travel).
  static absl::StatusOr<std::unique_ptr<GradientCommunicator>> Create(
      Backend* backend, Collective* collective, DType wire_dtype, Tensor grads,
      int64_t param_count);

  DType wire_dtype() const { return wire_dtype_; }
  // Starts the allreduce of a final span of grads() (overlapping the rest of the backward pass).
  absl::Status Start(Tensor span);
  // After the last Start() of a step: later work sees the reduced gradients. INTERNAL when the
  // spans of the step did not cover every gradient exactly once.
  absl::Status Finish();

 private:
  GradientCommunicator(Backend* backend, Collective* collective, DType wire_dtype, Tensor grads,
                       int64_t param_count)
      : backend_(backend),
        collective_(collective),
        wire_dtype_(wire_dtype),
        grads_(grads),
        param_count_(param_count) {}

  Backend* backend_;
  Collective* collective_;
  DType wire_dtype_;
  Tensor grads_;
  int64_t param_count_;
  Tensor wire_;                 // [1, param_count] in wire_dtype_ (compressed only).
  int64_t covered_ = 0;         // Parameter gradients started this step.
};

}  // namespace mptrain
