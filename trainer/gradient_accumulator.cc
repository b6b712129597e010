#include "trainer/gradient_accumulator.h"

#include <algorithm>

#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<GradientAccumulator> GradientAccumulator::Create(Backend* backend, int64_t n,
                                                                DType compute_dtype,
                                                                int64_t element_bytes,
                                                                int64_t accumulation_steps,
                                                                int64_t deferred_budget_bytes) {
  if (n < 1 || accumulation_steps < 1) {
    return absl::InvalidArgumentError("gradient accumulation needs n >= 1 and A >= 1");
  }
  GradientAccumulator accumulator;
  accumulator.backend_ = backend;
  accumulator.n_ = n;
  accumulator.accumulation_steps_ = accumulation_steps;
  ASSIGN_OR_RETURN(accumulator.grads_, backend->Allocate(DType::kF32, 1, n + kMetricSlots));
  if (compute_dtype != DType::kF32 && accumulation_steps > 1 &&
      accumulation_steps * n * element_bytes <= deferred_budget_bytes) {
    ASSIGN_OR_RETURN(accumulator.slots_,
                     backend->Allocate(compute_dtype, accumulation_steps, n));
  }
  return accumulator;
}

GradientAccumulator::Target GradientAccumulator::For(int64_t micro_batch) const {
  if (defers()) return {slots_.RowSlice(micro_batch, 1), true};
  return {param_grads(), micro_batch == 0};
}

absl::Status GradientAccumulator::Finalize(int64_t offset, int64_t count) {
  if (!defers()) return absl::OkStatus();
  // grads[span] = Σ_micro-batches f32(slot[span]), in micro-batch order.
  const int64_t params = std::min(count, n_ - offset);
  if (params <= 0) return absl::OkStatus();
  return backend_->SumRowsToF32(slots_.ColumnSlice(offset, params),
                                grads_.FlatView(offset, 1, params));
}

}  // namespace mptrain
