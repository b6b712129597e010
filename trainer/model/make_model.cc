#include "trainer/model/make_model.h"

#include "trainer/mlp.h"
#include "trainer/model/gpt_model.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Model>> MakeModel(const TrainingConfig& config, Backend* backend) {
  if (config.model.gpt.enabled()) {
    // micro_batch_size counts sequences of context_length tokens.
    absl::StatusOr<std::unique_ptr<GptModel>> gpt =
        GptModel::Create(backend, config.model.gpt, config.compute_dtype, config.micro_batch_size,
                         config.accumulation_steps);
    if (!gpt.ok()) return gpt.status();
    return std::unique_ptr<Model>(std::move(*gpt));
  }
  absl::StatusOr<std::unique_ptr<Mlp>> mlp =
      Mlp::Create(backend, config.model, config.compute_dtype, config.micro_batch_size,
                  config.accumulation_steps);
  if (!mlp.ok()) return mlp.status();
  return std::unique_ptr<Model>(std::move(*mlp));
}

}  // namespace mptrain
