#include "trainer/loss/loss.h"

#include "trainer/loss/cross_entropy.h"
#include "trainer/loss/mse.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Loss>> MakeLoss(const LossConfig& config, const ModelConfig& model,
                                               Backend* backend, DType compute_dtype,
                                               int64_t micro_batch_size,
                                               int64_t accumulation_steps) {
  switch (config.type) {
    case LossType::kMse:
      return std::unique_ptr<Loss>(
          new MseLoss(backend, model.output_dim(), accumulation_steps));
    case LossType::kCrossEntropy: {
      auto loss = CrossEntropyLoss::Create(backend, model.output_dim(), config.label_smoothing,
                                           compute_dtype, micro_batch_size, accumulation_steps);
      if (!loss.ok()) return loss.status();
      return std::unique_ptr<Loss>(std::move(*loss));
    }
  }
  return absl::InvalidArgumentError("loss: unknown loss type");
}

}  // namespace mptrain
