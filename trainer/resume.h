#pragma once

// Resuming from a checkpoint that only one host holds (as DeepSpeed and torchrun jobs load on
// rank 0 and broadcast): rank 0 reads the file; parameters, every optimizer state buffer,
// scaler state and step (Adam's step count is the scaler's applied steps) reach every other
// rank through the job's collective, and the data position and learning rate follow from the
// step. A rank other than 0 never opens the file, so the checkpoint need not
// be on its disk. Every rank ends with rank 0's state exactly (broadcasts copy bits).

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "trainer/backend.h"
#include "trainer/checkpoint.h"
#include "trainer/parameter_layout.h"
#include "trainer/step_math.h"

namespace mptrain {

struct ResumeState {
  int64_t step = 0;      // Optimizer steps completed at the checkpoint.
  StepState step_state;  // scale, growth_tracker, skipped_total, steps_done; the rest default.
  // Rank 0: the candidate it read, and why each one before it could not be (empty when the
  // first was read).
  std::string path;
  std::vector<std::string> unreadable;
};

// One optimizer state buffer (momentum, Adam's exp_avg, ...): its checkpoint name and the rank's
// flat f32 tensor of it.
struct ResumeSlot {
  std::string name;
  Tensor values;
};

// Called by every rank of the job at the same point. `params` and each slot's values are the
// rank's flat f32 tensors of `table`; on return they hold the checkpoint's values on every
// rank (broadcast in the order given, which every rank must share). `buffers` (the batch
// norms' running statistics, [1, table.buffers_total()]; empty without batch norms) too,
// broadcast last.
// Rank 0 reads the first of `candidates` that it can (the checkpoint to resume from, then older
// ones of the same job: FindResumeCandidates); the others ignore them. With `expected_stamp`
// non-empty, a candidate not stamped with it (another job's file put in its place, or an
// unstamped one) counts as unreadable: a job resumes only from its own checkpoints.
// Rank 0: the error of ReadTrainingCheckpoint for the first candidate when none could be read,
// naming how many others were tried (the others then fail too, at once). Other ranks:
// UNAVAILABLE "rank 0 could not read the resume checkpoint" when it failed (its own error is
// the job's cause); the collective's errors; INTERNAL for a malformed state.
absl::StatusOr<ResumeState> LoadResumeState(const std::vector<std::string>& candidates, int rank,
                                            const ParameterTable& table, Backend* backend,
                                            Tensor params, const std::vector<ResumeSlot>& slots,
                                            Tensor buffers = {},
                                            const std::string& expected_stamp = "");

// What rank 0 tries, in order: `recorded` (the checkpoint the coordinator last heard of), then
// the older checkpoints of the job stamped `stamp` in its directory, newest first — a recorded
// file lost or damaged on disk need not fail the job while an older one is there. Only files
// named step-<N>.safetensors below the recorded step's N, stamped with `stamp`, and not links
// count; with an empty stamp (a job without one), or a directory that cannot be read, only
// `recorded`.
std::vector<std::string> FindResumeCandidates(const std::string& recorded,
                                              const std::string& stamp);

// The scalars of a resume as floats that a broadcast carries exactly: every integer in 16-bit
// pieces (each a float holding 0..65535), the scale by its bits. `checkpoint` null: rank 0
// failed. Exposed for tests.
inline constexpr int kResumeHeaderFloats = 22;
std::vector<float> EncodeResumeHeader(const TrainingCheckpoint* checkpoint, int64_t parameters);
// INTERNAL when the header is malformed or its parameter count is not `parameters`;
// UNAVAILABLE when rank 0 said it failed.
absl::StatusOr<ResumeState> DecodeResumeHeader(const std::vector<float>& header,
                                               int64_t parameters);

}  // namespace mptrain
