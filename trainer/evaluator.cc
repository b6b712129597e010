#include "trainer/evaluator.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::Create(Backend* backend,
                                                             const RankData& shard,
                                                             int64_t total_rows, int64_t batch) {
  if (total_rows < 1) return absl::InvalidArgumentError("eval_data: the set has no rows");
  std::unique_ptr<Evaluator> evaluator(new Evaluator());
  evaluator->backend_ = backend;
  evaluator->rows_ = shard.features.rows;
  evaluator->total_rows_ = total_rows;
  evaluator->batch_ = batch;
  if (evaluator->rows_ > 0) {
    ASSIGN_OR_RETURN(evaluator->features_,
                     backend->Allocate(DType::kF32, shard.features.rows, shard.features.cols));
    ASSIGN_OR_RETURN(evaluator->targets_,
                     backend->Allocate(DType::kF32, shard.targets.rows, shard.targets.cols));
    RETURN_IF_ERROR(backend->Upload(shard.features.values.data(), evaluator->features_));
    RETURN_IF_ERROR(backend->Upload(shard.targets.values.data(), evaluator->targets_));
  }
  ASSIGN_OR_RETURN(evaluator->sums_, backend->Allocate(DType::kF32, 1, 2));
  return evaluator;
}

absl::StatusOr<std::unique_ptr<Evaluator>> Evaluator::CreateForTokens(Backend* backend,
                                                                      TokenMicroBatches tokens,
                                                                      int64_t batches,
                                                                      int64_t tokens_per_batch) {
  if (batches < 1) return absl::InvalidArgumentError("eval_batches must be positive");
  std::unique_ptr<Evaluator> evaluator(new Evaluator());
  evaluator->backend_ = backend;
  evaluator->tokens_.emplace(std::move(tokens));
  evaluator->token_batches_ = batches;
  evaluator->total_rows_ = batches * tokens_per_batch * backend->collective()->world_size();
  ASSIGN_OR_RETURN(evaluator->sums_, backend->Allocate(DType::kF32, 1, 2));
  return evaluator;
}

absl::Status Evaluator::AddBatchSums(double totals[2]) {
  float sums[2];
  RETURN_IF_ERROR(backend_->Download(sums_, sums));
  totals[0] += sums[0];
  totals[1] += sums[1];
  return backend_->Zero(sums_);
}

absl::Status Evaluator::RunTokens(Model* model, Loss* loss, double totals[2],
                                  const std::function<absl::Status()>& after_batch) {
  RETURN_IF_ERROR(tokens_->Rewind());
  for (int64_t i = 0; i < token_batches_; ++i) {
    Tensor x, y;
    RETURN_IF_ERROR(tokens_->Next(&x, &y));
    RETURN_IF_ERROR(model->Forward(x, /*x_unchanged=*/false, /*training=*/false));
    RETURN_IF_ERROR(loss->Evaluate(model->output(), y, sums_));
    RETURN_IF_ERROR(AddBatchSums(totals));
    RETURN_IF_ERROR(after_batch());
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalResult> Evaluator::Run(Model* model, Loss* loss,
                                          const std::function<bool()>& after_batch) {
  RETURN_IF_ERROR(backend_->Zero(sums_));
  const int64_t batches = (tokens_.has_value() ? token_batches_ : 0) +
                          (batch_ > 0 ? (rows_ + batch_ - 1) / batch_ : 0);
  int64_t done = 0;
  auto batch_done = [&]() -> absl::Status {
    ++done;
    if (after_batch && after_batch()) {
      return absl::AbortedError(
          absl::StrCat("stopped while evaluating (", done, " of ", batches, " batches)"));
    }
    return absl::OkStatus();
  };
  double totals[2] = {0, 0};
  if (tokens_.has_value()) RETURN_IF_ERROR(RunTokens(model, loss, totals, batch_done));
  for (int64_t first = 0; first < rows_; first += batch_) {
    const int64_t rows = std::min(batch_, rows_ - first);
    RETURN_IF_ERROR(model->Forward(features_.RowSlice(first, rows), /*x_unchanged=*/false,
                                 /*training=*/false));
    RETURN_IF_ERROR(loss->Evaluate(model->output(), targets_.RowSlice(first, rows), sums_));
    RETURN_IF_ERROR(AddBatchSums(totals));
    RETURN_IF_ERROR(batch_done());
  }
  // This rank's totals, as floats (their relative error 2^-24), averaged over the ranks.
  const float rank_totals[2] = {static_cast<float>(totals[0]), static_cast<float>(totals[1])};
  RETURN_IF_ERROR(backend_->Upload(rank_totals, sums_));
  Collective* collective = backend_->collective();
  RETURN_IF_ERROR(collective->AllReduceMean(sums_));
  float sums[2];
  RETURN_IF_ERROR(backend_->Download(sums_, sums));
  // The mean over ranks times the ranks: the sums over the whole set.
  const double ranks = static_cast<double>(collective->world_size());
  EvalResult result;
  result.loss = static_cast<double>(sums[0]) * ranks / static_cast<double>(total_rows_);
  // The correct count is a whole number: rounded, so that the fp32 mean of 3 ranks' counts
  // (inexact) cannot make an accuracy of 1.00000003.
  result.accuracy =
      std::nearbyint(static_cast<double>(sums[1]) * ranks) / static_cast<double>(total_rows_);
  return result;
}

}  // namespace mptrain
