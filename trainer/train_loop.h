#pragma once

// The data-parallel mixed-precision gradient-accumulation loop, with the semantics of PyTorch's
// DDP + autocast + GradScaler + no_sync, written once over the Backend interface.

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/training_config.h"

namespace mptrain {

// One optimizer step as this rank saw it (values averaged over ranks by the allreduce).
struct StepTelemetry {
  int64_t step = 0;        // 1-based optimizer step.
  double loss = 0;         // Effective-batch loss, averaged over ranks.
  double grad_norm = 0;    // Global L2 norm of the unscaled gradients before clipping.
  double loss_scale = 0;   // The scale used for this step.
  bool skipped = false;    // Overflow: the optimizer step was skipped.
  int64_t skipped_total = 0;
  double step_time_ms = 0;
  double samples_per_second = 0;  // Over all ranks.
  double lr = 0;                  // The learning rate the step used.
  // Classification losses: the fraction of the step's samples (all ranks) classified right.
  bool has_accuracy = false;
  double accuracy = 0;
  // Evaluation steps: the mean loss and the accuracy over the eval set (all ranks).
  bool has_eval = false;
  double eval_loss = 0;
  double eval_accuracy = 0;
};

// Receives what the loop produces; the rank process batches it to the coordinator.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  // After each optimizer step, as its statistics arrive (possibly a few steps late on
  // asynchronous backends). `record` is set on telemetry steps (every telemetry_every, and
  // the last step) and null otherwise.
  virtual void OnStep(int64_t step, const StepTelemetry* record) = 0;
  // Polled between optimizer steps, an evaluation's batches and a sample's tokens: true stops
  // the loop with ABORTED and StopReason().
  virtual bool ShouldStop() = 0;
  // After each evaluation batch and before each sampled token: work between optimizer steps,
  // progress for the coordinator's progress_timeout_s (a long evaluation or sample is not a
  // stall).
  virtual void OnWorkUnit() {}
  virtual std::string StopReason() { return "a stop was requested"; }
  // Rank 0, after a checkpoint file is complete (renamed into place).
  virtual void OnCheckpoint(int64_t step, const std::string& path) {}
  // The newest checkpoint step a restart of the job would resume from (the coordinator has
  // heard of it): it and newer ones are never removed (keep_checkpoints). With no one else to
  // tell, every checkpoint written counts as known.
  virtual int64_t AcknowledgedCheckpointStep() { return std::numeric_limits<int64_t>::max(); }
  // Something went wrong that does not stop training (older checkpoints that could not be
  // removed): for the rank's log.
  virtual void OnWarning(const std::string& message) {}
  // Rank 0, a language model's generated text (SampleConfig) after the step's evaluation or
  // the last step: for the job's events.
  virtual void OnSample(int64_t step, const std::string& text) {}
  // Set-up before the first step, for the rank's log: the model built (its memory allocated),
  // its parameters initialised and uploaded, milliseconds since RunTraining began.
  virtual void OnSetUp(double model_built_ms, double initialised_ms) {}
};

struct TrainingResult {
  std::vector<float> parameters;  // Final fp32 masters, flat (parameter_layout.h).
  // This rank's batch-norm running statistics, flat (parameter_layout.h); empty without.
  std::vector<float> buffers;
  std::string checksum;
  int64_t skipped_steps = 0;
  double final_loss_scale = 0;
  int64_t replayed_steps = 0;  // Steps run as a replay of a recorded one (record_steps).
};

// Runs optimizer steps up to config.steps on this rank, from the start or, with
// `resume_checkpoint`, from the step after that checkpoint (parameters, momentum, scaler state
// and data position restored: the run continues bit-identically). Every rank must be given a
// non-empty `resume_checkpoint` to resume, but only rank 0 reads it: the others receive its
// state through the collective and never open the path. Rank 0 writes a checkpoint every
// config.checkpoint_every steps and config.output_checkpoint at the end. Errors carry their
// cause (data files, checkpoint, backend, collective, stop request).
// `stamp`, when given, is stamped in the metadata of the checkpoints and the output checkpoint
// ("mptrain_job": the job's id and uid; "mptrain_owner": its owner; worker/rank_process.cc): a
// later attempt of the same job may then replace them, the job's older checkpoints go
// (keep_checkpoints), a resume takes only a checkpoint stamped with the job's own stamp (any
// other is skipped with a warning), and overwrite_output replaces only files stamped with the
// same owner (trainer/checkpoint.h: MayReplace).
// INVALID_ARGUMENT when config.world_size is not the collective's.
absl::StatusOr<TrainingResult> RunTraining(const TrainingConfig& config, int rank,
                                           Backend* backend, TrainingObserver* observer,
                                           const std::string& resume_checkpoint = "",
                                           const CheckpointStamp& stamp = {});

// The optimizer/scaler configuration of the step kernels.
StepConfig MakeStepConfig(const TrainingConfig& config);

}  // namespace mptrain
