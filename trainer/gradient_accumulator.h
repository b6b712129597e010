#pragma once

// Gradient accumulation over the micro-batches of one optimizer step, as autocast + no_sync
// do it: each micro-batch's weight gradients come out of the GEMM rounded to fp16/bf16 and are
// added, one micro-batch after the other, to fp32 gradients. When every micro-batch's
// low-precision gradients fit in `deferred_budget_bytes`, they are kept side by side and summed
// into fp32 once, span by span as the reducer asks, in the same order: the same numbers for
// about a third of the memory traffic.

#include <cstdint>

#include "absl/status/statusor.h"
#include "trainer/backend.h"

namespace mptrain {

class GradientAccumulator {
 public:
  static constexpr int64_t kDeferredBudgetBytes = int64_t{8} << 30;
  static constexpr int64_t kMetricSlots = 2;

  // n parameters; the fp32 buffer has kMetricSlots more, for what rides in the gradient
  // allreduce: the step's loss and its correct count (classification). `element_bytes`: what
  // one compute-dtype element takes in the backend's memory.
  static absl::StatusOr<GradientAccumulator> Create(Backend* backend, int64_t n,
                                                    DType compute_dtype, int64_t element_bytes,
                                                    int64_t accumulation_steps,
                                                    int64_t deferred_budget_bytes);

  Tensor grads() const { return grads_; }  // [1, n + kMetricSlots] f32
  Tensor param_grads() const { return grads_.FlatView(0, 1, n_); }  // [1, n] f32
  Tensor metrics() const { return grads_.FlatView(n_, 1, kMetricSlots); }  // [loss, correct]
  Tensor loss_slot() const { return grads_.FlatView(n_, 1, 1); }
  bool defers() const { return !slots_.empty(); }
  int64_t accumulation_steps() const { return accumulation_steps_; }

  // Where micro-batch `micro_batch` (0-based) writes its weight and bias gradients ([1, n]):
  // its own low-precision row when deferring (written over), otherwise the fp32 sums (written
  // over on the first micro-batch, added to after it).
  struct Target {
    Tensor flat;
    bool overwrite = false;
  };
  Target For(int64_t micro_batch) const;

  // After the last micro-batch's gradients of grads()[offset, offset + count) are computed:
  // makes that span final (sums the low-precision rows into fp32 in micro-batch order when
  // deferring; the metric slots, past the parameters, are not in them). Before this, the span is
  // undefined when deferring.
  absl::Status Finalize(int64_t offset, int64_t count);

 private:
  Backend* backend_ = nullptr;
  int64_t n_ = 0;
  int64_t accumulation_steps_ = 1;
  Tensor grads_;
  Tensor slots_;  // [A, n] compute dtype, when deferring
};

}  // namespace mptrain
