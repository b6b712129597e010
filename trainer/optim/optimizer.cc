#include "trainer/optim/optimizer.h"

#include "trainer/optim/sgd.h"

namespace mptrain {

absl::StatusOr<std::unique_ptr<Optimizer>> MakeOptimizer(const OptimizerConfig& config,
                                                         Backend* backend, int64_t n) {
  auto sgd = Sgd::Create(config, backend, n);
  if (!sgd.ok()) return sgd.status();
  return std::unique_ptr<Optimizer>(std::move(*sgd));
}

}  // namespace mptrain
