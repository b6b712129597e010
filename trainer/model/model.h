#pragma once

// What the training loop trains (train_loop.cc), evaluates (evaluator.h) and checkpoints: a
// model of parameters described by a ParameterTable over one flat fp32 buffer (and, under
// autocast, its low-precision copy), gradients in a GradientAccumulator, the forward of one
// micro-batch into output(), and the backward of output_grad() (seeded by the loss) into the
// gradients, telling the gradient reducer as each of the table's groups is final. The loop, the
// evaluator, checkpoints and resume see only this interface; each model family (the MLP,
// trainer/mlp.h) implements it over the Backend's primitives. Made by MakeModel
// (trainer/model/make_model.h).

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "trainer/backend.h"
#include "trainer/gradient_accumulator.h"
#include "trainer/gradient_reducer.h"
#include "trainer/model/parameter_table.h"

namespace mptrain {

class Model {
 public:
  virtual ~Model() = default;

  // ---- Parameters, gradients, buffers ----
  virtual const ParameterTable& table() const = 0;
  virtual Tensor params() const = 0;  // [1, table().total()] f32: the masters
  // [1, total] in the compute dtype, refreshed once per step; empty for fp32 (the masters are
  // used directly).
  virtual Tensor low_precision_params() const = 0;
  // Rounds the masters into low_precision_params(): once per optimizer step (the weights do not
  // change between micro-batches) and after the parameters are loaded.
  virtual absl::Status RefreshLowPrecisionWeights() = 0;
  // The gradients (fp32, [1, total + kMetricSlots]: the loss and correct count ride in the
  // allreduce), accumulated over the step's micro-batches.
  virtual GradientAccumulator* accumulator() = 0;
  Tensor grads() { return accumulator()->grads(); }
  Tensor param_grads() { return accumulator()->param_grads(); }
  Tensor metrics() { return accumulator()->metrics(); }  // [1, 2]: loss, correct count

  // [1, table().buffers_total()] f32 (batch norms' running statistics); empty when none.
  virtual Tensor buffers() const = 0;
  // The value of the table's counters (batch norms' num_batches_tracked) for a checkpoint.
  virtual int64_t buffer_counter() const = 0;
  // The model's own progress after a resume at `steps_done` optimizer steps of `accumulation`
  // micro-batches (batch norms count their training forwards).
  virtual void RestoreProgress(int64_t steps_done, int64_t accumulation) = 0;

  // Writes into params() the parameters a run starts from without an init_checkpoint, from
  // `seed`: the same on every rank. The buffers' initial values are in buffers() from the start.
  virtual absl::Status InitializeParameters(uint64_t seed) = 0;

  // ---- How the loop treats it ----
  // DDP's broadcast_buffers: rank 0's buffers overwrite every rank's before the first forward
  // of each step and before an evaluation (local batch norms in a world of more than one).
  virtual bool BroadcastsBuffers() const = 0;
  // Whether a step's work is the same every step but for its data and learning rate, so that
  // it may be recorded once and replayed (Backend::BeginStepRecording): false when the host
  // counts something per forward.
  virtual bool StepIsReplayable() const = 0;
  // Whether Backward computes the first group's leading weight in the row chunks the
  // observer asks for (GradientReducer::Create's first_weight_in_row_chunks).
  virtual bool ComputesFirstWeightInRowChunks() const = 0;

  // ---- One micro-batch ----
  // x: the micro-batch's inputs in backend memory ([rows, inputs] f32), 1 <= rows <= the
  // micro-batch size (fewer only for evaluation: Backward needs a whole one). `x_unchanged`:
  // the same unmodified tensor as in the last call (its casts may be reused). `training` false:
  // evaluation (as model.eval(): nothing is updated).
  virtual absl::Status Forward(Tensor x, bool x_unchanged, bool training) = 0;
  virtual Tensor output() const = 0;       // The rows of the last Forward(), compute dtype.
  virtual Tensor output_grad() const = 0;  // Like output(): what the loss seeds.
  // Backpropagates output_grad() of micro-batch `micro_batch` (0-based) of an optimizer step
  // into the accumulator. On the last one `observer`, when given, is told as each group's
  // gradients are computed (the last group first) and makes them final; without one, grads()
  // is made final at the end. Before the last micro-batch grads() is undefined.
  virtual absl::Status Backward(int64_t micro_batch, LayerGradientObserver* observer) = 0;
};

}  // namespace mptrain
