#include "trainer/loss/loss.h"

#include "trainer/loss/mse.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Loss>> MakeLoss(const LossConfig& config, const ModelConfig& model,
                                               Backend* backend, int64_t accumulation_steps) {
  switch (config.type) {
    case LossType::kMse:
      return std::unique_ptr<Loss>(
          new MseLoss(backend, model.output_dim(), accumulation_steps));
  }
  return absl::InvalidArgumentError("loss: unknown loss type");
}

}  // namespace mptrain
