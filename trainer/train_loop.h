#pragma once

// The data-parallel mixed-precision gradient-accumulation loop, with the semantics of PyTorch's
// DDP + autocast + GradScaler + no_sync, written once over the Backend interface.

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/mptrain.pb.h"
#include "trainer/backend.h"

namespace mptrain {

// Receives what the loop produces; the rank process batches it to the coordinator.
class TrainingObserver {
 public:
  virtual ~TrainingObserver() = default;
  // After each optimizer step, as its statistics arrive (possibly a few steps late on
  // asynchronous backends). `record` is set on telemetry steps (every telemetry_every, and
  // the last step) and null otherwise.
  virtual void OnStep(int64_t step, const v1::TelemetryRecord* record) = 0;
  // Polled between optimizer steps: true stops the loop with ABORTED and StopReason().
  virtual bool ShouldStop() = 0;
  virtual std::string StopReason() { return "a stop was requested"; }
  // Rank 0, after a checkpoint file is complete (renamed into place).
  virtual void OnCheckpoint(int64_t step, const std::string& path) {}
};

struct TrainingResult {
  std::vector<float> parameters;  // Final fp32 masters, flat (parameter_layout.h).
  std::string checksum;
  int64_t skipped_steps = 0;
  double final_loss_scale = 0;
};

// Runs optimizer steps up to spec.steps on this rank, from the start or, with
// `resume_checkpoint`, from the step after that checkpoint (parameters, momentum, scaler state
// and data position restored: the run continues bit-identically). Every rank must be given a
// non-empty `resume_checkpoint` to resume, but only rank 0 reads it: the others receive its
// state through the collective and never open the path. Rank 0 writes a checkpoint
// every spec.checkpoint_every steps and spec.output_checkpoint at the end. Errors carry their
// cause (data files, checkpoint, backend, collective, stop request).
// `job_id`, when given, is stamped in the output checkpoint's metadata ("mptrain_job"): a later
// attempt of the same job may then replace it (see worker/rank_process.cc).
absl::StatusOr<TrainingResult> RunTraining(const v1::JobSpec& spec, int rank, Backend* backend,
                                           TrainingObserver* observer,
                                           const std::string& resume_checkpoint = "",
                                           const std::string& job_id = "");

// The compute dtype of a precision: FP16/BF16 autocast, or FP32.
DType ComputeDType(v1::Precision precision);

// The optimizer/scaler configuration of a spec (after defaults).
StepConfig MakeStepConfig(const v1::JobSpec& spec);

}  // namespace mptrain
