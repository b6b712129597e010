#include "trainer/gradient_communicator.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<GradientCommunicator>> GradientCommunicator::Create(
    Backend* backend, Collective* collective, DType wire_dtype, Tensor grads,
    int64_t param_count) {
  if (param_count <= 0 || param_count > grads.numel() || grads.dtype != DType::kF32) {
    return absl::InvalidArgumentError(
        "gradient communicator: needs f32 gradients holding the parameter count");
  }
  std::unique_ptr<GradientCommunicator> communicator(
      new GradientCommunicator(backend, collective, wire_dtype, grads, param_count));
  if (wire_dtype != DType::kF32) {
    ASSIGN_OR_RETURN(communicator->wire_, backend->Allocate(wire_dtype, 1, param_count));
  }
  return communicator;
}

absl::Status GradientCommunicator::Start(Tensor span) {
  Collective* collective = collective_;
  if (wire_dtype_ == DType::kF32) return collective->AllReduceMeanAsync(span);
  const auto* base = static_cast<const char*>(grads_.data);
  const auto* first = static_cast<const char*>(span.data);
  const int64_t offset = (first - base) / grads_.element_bytes;
  if (first < base || offset + span.numel() > grads_.numel()) {
    return absl::InternalError("gradient communicator: a span outside the gradients");
  }
  // The parameter gradients of the span travel compressed; the metric slots after them in f32.
  const int64_t params = std::max<int64_t>(0, std::min(offset + span.numel(), param_count_) -
                                                  std::min(offset, param_count_));
  if (params > 0) {
    Tensor wire = wire_.FlatView(offset, 1, params);
    RETURN_IF_ERROR(backend_->CompressGradients(grads_.FlatView(offset, 1, params),
                                                static_cast<float>(collective->world_size()),
                                                wire));
    RETURN_IF_ERROR(collective->AllReduceSumCompressedAsync(wire));
    covered_ += params;
  }
  if (params < span.numel()) {
    const int64_t metrics_offset = offset + params;
    RETURN_IF_ERROR(collective->AllReduceMeanAsync(
        grads_.FlatView(metrics_offset, 1, span.numel() - params)));
  }
  return absl::OkStatus();
}

absl::Status GradientCommunicator::Finish() {
  Collective* collective = collective_;
  RETURN_IF_ERROR(collective->JoinAllReduces());
  if (wire_dtype_ == DType::kF32) return absl::OkStatus();
  if (covered_ != param_count_) {
    return absl::InternalError(absl::StrCat("gradient communicator: the step's spans covered ",
                                            covered_, " of ", param_count_, " gradients"));
  }
  covered_ = 0;
  // Widening is exact: the fp32 gradients become the sums of the compressed values.
  return backend_->Cast(wire_, grads_.FlatView(0, 1, param_count_));
}

}  // namespace mptrain
