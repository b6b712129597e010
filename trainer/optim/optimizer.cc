#include "trainer/optim/optimizer.h"

#include "trainer/optim/adam.h"
#include "trainer/optim/sgd.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                         Backend* backend, int64_t n) {
  if (config.type == OptimizerType::kSgd) {
    auto sgd = Sgd::Create(config, backend, n);
    if (!sgd.ok()) return sgd.status();
    return std::unique_ptr<Optimizer>(std::move(*sgd));
  }
  auto adam = Adam::Create(config, backend, n);
  if (!adam.ok()) return adam.status();
  return std::unique_ptr<Optimizer>(std::move(*adam));
}

}  // namespace mptrain
