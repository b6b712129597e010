#pragma once

#include "trainer/loss/loss.h"

namespace mptrain {

// torch.nn.functional.cross_entropy (mean over the micro-batch, optional label_smoothing) as
// autocast runs it: logits cast to fp32, log-softmax, the loss and its gradient in fp32, the
// gradient rounded back to the logits' dtype. With q the smoothed one-hot target
// ((1 − ε)·onehot + ε/C), over B rows:
//   loss = −Σ q · log_softmax(logits) / B
//   d_logits = round((softmax(logits) − q) / B · scale / A)
// Targets are class ids in [0, C), one per row (f32, exact below 2^24). metrics[1] counts the
// rows whose first maximal logit is the target (torch.argmax).
class CrossEntropyLoss final : public Loss {
 public:
  static absl::StatusOr<std::unique_ptr<CrossEntropyLoss>> Create(Backend* backend,
                                                                  int64_t classes,
                                                                  double label_smoothing,
                                                                  DType compute_dtype,
                                                                  int64_t micro_batch_size,
                                                                  int64_t accumulation_steps);

  absl::Status Backward(Tensor output, Tensor targets, StepStateBuffer step_state, Tensor metrics,
                        Tensor d_output) override;
  absl::Status Evaluate(Tensor output, Tensor targets, Tensor sums) override;
  int64_t target_columns() const override { return 1; }
  bool classifies() const override { return true; }

 private:
  CrossEntropyLoss() = default;

  Backend* backend_ = nullptr;
  int64_t classes_ = 0;
  float on_ = 1, off_ = 0;  // q = on · onehot + off
  int64_t accumulation_steps_ = 1;
  // Backend::SoftmaxCrossEntropy computes it all in one pass per row where the backend has it;
  // otherwise the composed ops use these [B, C] f32 scratch buffers.
  bool fused_ = false;
  Tensor log_probs_, target_dist_, probs_, grad_f32_;
};

}  // namespace mptrain
