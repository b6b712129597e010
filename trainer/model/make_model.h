#pragma once

// The model of a training configuration, as MakeLoss and MakeOptimizer make theirs: built once
// per rank, its parameters, gradients and the activations of one micro-batch allocated on
// `backend`.

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/model/model.h"
#include "trainer/training_config.h"

namespace mptrain {

// INVALID_ARGUMENT naming the field when the configuration does not describe a model this build
// trains; RESOURCE_EXHAUSTED (or the backend's error) when its memory cannot be had.
absl::StatusOr<std::unique_ptr<Model>> MakeModel(const TrainingConfig& config, Backend* backend);

}  // namespace mptrain
