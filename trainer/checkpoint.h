#pragma once

// Training checkpoints: everything needed to continue a run bit-identically — fp32 parameters,
// SGD momentum buffers, the scaler state (scale, growth tracker, skipped total), the step and
// the data position — in one safetensors file written atomically. Tensors are named as in the
// output checkpoint (layers.{i}.weight / .bias) plus momentum.layers.{i}.weight / .bias; the
// scalars live in the header's __metadata__ (floats in exact hex notation).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/parameter_layout.h"
#include "trainer/step_math.h"

namespace mptrain {

struct TrainingCheckpoint {
  int64_t step = 0;         // Optimizer steps completed.
  int64_t data_cursor = 0;  // Next row of this rank's shard (rank 0's; see train_loop.cc).
  std::vector<float> parameters;
  std::vector<float> momentum;
  StepState step_state;
};

// The file of step `step` in `directory`: <directory>/step-00000100.safetensors.
std::string CheckpointPath(const std::string& directory, int64_t step);

absl::Status WriteTrainingCheckpoint(const std::string& path, const ParameterLayout& layout,
                                     const TrainingCheckpoint& checkpoint);

// NOT_FOUND / INVALID_ARGUMENT naming the file when it is missing, malformed or does not fit
// the model.
absl::StatusOr<TrainingCheckpoint> ReadTrainingCheckpoint(const std::string& path,
                                                          const ParameterLayout& layout);

}  // namespace mptrain
