#pragma once

// A training loss as a strategy over the backend's primitives: the loop hands it the model's
// output and the micro-batch's targets; it adds the loss to the step's loss slot and seeds the
// backward pass, with autocast's precision and GradScaler's scale (read on the backend, never
// on the host).

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/training_config.h"

namespace mptrain {

class Loss {
 public:
  virtual ~Loss() = default;
  // One micro-batch of an optimizer step of `accumulation_steps` micro-batches:
  //   metrics[0] += loss / accumulation_steps
  //   metrics[1] += correct predictions (classification losses; others leave it)
  //   d_output = round(∂loss/∂output · scale / accumulation_steps)   (the chain PyTorch runs for
  //              scaler.scale(loss / A).backward(), scale = step_state.scale)
  // output [B, C] in the compute dtype; targets [B, target_columns()] f32; metrics [1, 2] f32;
  // d_output like output.
  virtual absl::Status Backward(Tensor output, Tensor targets, StepStateBuffer step_state,
                                Tensor metrics, Tensor d_output) = 0;
  // Evaluation of `rows` <= B rows, no gradient: sums[0] += Σ over rows of each sample's loss
  // (the same formula, one sample at a time), sums[1] += correct predictions (classifiers).
  virtual absl::Status Evaluate(Tensor output, Tensor targets, Tensor sums) = 0;
  // Columns of a target row: the model's outputs, or 1 (a class id) for a classifier.
  virtual int64_t target_columns() const = 0;
  // Whether metrics[1] counts correct predictions.
  virtual bool classifies() const = 0;
};

// The loss of `config` for micro-batches of `micro_batch_size` rows; its scratch is allocated
// on `backend`. INVALID_ARGUMENT naming the field when the configuration does not fit.
absl::StatusOr<std::unique_ptr<Loss>> MakeLoss(const LossConfig& config, const ModelConfig& model,
                                               Backend* backend, DType compute_dtype,
                                               int64_t micro_batch_size,
                                               int64_t accumulation_steps);

}  // namespace mptrain
