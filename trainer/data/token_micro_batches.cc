#include "trainer/data/token_micro_batches.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<TokenMicroBatches> TokenMicroBatches::Create(Backend* backend,
                                                            TokenBatches batches) {
  const int64_t n = batches.tokens_per_micro_batch();
  TokenMicroBatches out(backend, std::move(batches));
  out.inputs_.resize(n);
  out.targets_.resize(n);
  out.staging_.resize(n);
  ASSIGN_OR_RETURN(out.x_, backend->Allocate(DType::kF32, n, 1));
  ASSIGN_OR_RETURN(out.y_, backend->Allocate(DType::kF32, n, 1));
  return out;
}

absl::Status TokenMicroBatches::Fill(Tensor x, Tensor y) {
  RETURN_IF_ERROR(batches_.Next(absl::MakeSpan(inputs_), absl::MakeSpan(targets_)));
  for (size_t i = 0; i < inputs_.size(); ++i) staging_[i] = static_cast<float>(inputs_[i]);
  RETURN_IF_ERROR(backend_->Upload(staging_.data(), x));
  for (size_t i = 0; i < targets_.size(); ++i) staging_[i] = static_cast<float>(targets_[i]);
  return backend_->Upload(staging_.data(), y);
}

absl::Status TokenMicroBatches::Next(Tensor* x, Tensor* y) {
  if (served_ < staged_) {
    *x = staged_x_[served_];
    *y = staged_y_[served_];
    ++served_;
    return absl::OkStatus();
  }
  RETURN_IF_ERROR(Fill(x_, y_));
  *x = x_;
  *y = y_;
  return absl::OkStatus();
}

absl::Status TokenMicroBatches::Stage(int64_t count) {
  const int64_t n = static_cast<int64_t>(inputs_.size());
  while (static_cast<int64_t>(staged_x_.size()) < count) {
    ASSIGN_OR_RETURN(Tensor x, backend_->Allocate(DType::kF32, n, 1));
    ASSIGN_OR_RETURN(Tensor y, backend_->Allocate(DType::kF32, n, 1));
    staged_x_.push_back(x);
    staged_y_.push_back(y);
  }
  for (int64_t i = 0; i < count; ++i) RETURN_IF_ERROR(Fill(staged_x_[i], staged_y_[i]));
  staged_ = count;
  served_ = 0;
  return absl::OkStatus();
}

absl::Status TokenMicroBatches::SeekTo(int64_t steps_done, int64_t accumulation) {
  staged_ = served_ = 0;
  if (steps_done < 0 || accumulation < 1 ||
      steps_done > std::numeric_limits<int64_t>::max() / accumulation) {
    return absl::InvalidArgumentError(
        absl::StrCat("token micro-batches: cannot seek to step ", steps_done));
  }
  return batches_.Seek(steps_done * accumulation);
}

}  // namespace mptrain
