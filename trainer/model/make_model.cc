#include "trainer/model/make_model.h"

#include "trainer/mlp.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Model>> MakeModel(const TrainingConfig& config, Backend* backend) {
  absl::StatusOr<std::unique_ptr<Mlp>> mlp =
      Mlp::Create(backend, config.model, config.compute_dtype, config.micro_batch_size,
                  config.accumulation_steps);
  if (!mlp.ok()) return mlp.status();
  return std::unique_ptr<Model>(std::move(*mlp));
}

}  // namespace mptrain
