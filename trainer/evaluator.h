#pragma once

// Evaluation on held-out data: this rank's contiguous rows of the eval set go through the model
// in micro-batches (the last one shorter); each sample's loss and the correct predictions are
// summed, the sums averaged over ranks by one allreduce, and turned into the mean loss and the
// accuracy over the whole set. Blocks until the result is on the host (evaluation steps only).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/data/token_micro_batches.h"
#include "trainer/loss/loss.h"
#include "trainer/model/model.h"
#include "trainer/rank_data.h"

namespace mptrain {

struct EvalResult {
  double loss = 0;      // Mean over the set of each sample's loss.
  double accuracy = 0;  // Classifiers: the fraction of the set predicted right.
};

class Evaluator {
 public:
  // `shard`: this rank's rows; `total_rows`: the whole set's (all ranks).
  static absl::StatusOr<std::unique_ptr<Evaluator>> Create(Backend* backend, const RankData& shard,
                                                           int64_t total_rows, int64_t batch);
  // A language model's: `batches` micro-batches of `tokens` (this rank's, never shuffled) from
  // their start at every evaluation; the mean over every rank's B·T·batches positions.
  static absl::StatusOr<std::unique_ptr<Evaluator>> CreateForTokens(Backend* backend,
                                                                    TokenMicroBatches tokens,
                                                                    int64_t batches,
                                                                    int64_t tokens_per_batch);
  // Every rank must call it at the same step (it allreduces). `after_batch` (when given) is
  // called after each batch's sums are on the host; true stops the evaluation with ABORTED.
  absl::StatusOr<EvalResult> Run(Model* model, Loss* loss,
                                 const std::function<bool()>& after_batch = nullptr);

 private:
  Evaluator() = default;
  // Adds the language model's batches' sums to `totals` (loss sum, correct count).
  absl::Status RunTokens(Model* model, Loss* loss, double totals[2],
                         const std::function<absl::Status()>& after_batch);
  // One batch's sums_ added to `totals` on the host, and sums_ zeroed for the next: a float
  // total on the device would stop counting at 2^24 correct predictions (eval_batches x B·T
  // goes past that) and drop the loss sum's low bits over many batches.
  absl::Status AddBatchSums(double totals[2]);

  Backend* backend_ = nullptr;
  Tensor features_, targets_;  // This rank's rows (absent when it has none).
  Tensor sums_;                // [1, 2]: a batch's loss sum and correct count; then the totals
  int64_t rows_ = 0;
  int64_t total_rows_ = 0;
  int64_t batch_ = 0;
  std::optional<TokenMicroBatches> tokens_;
  int64_t token_batches_ = 0;
};

}  // namespace mptrain
