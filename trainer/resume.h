#pragma once

// Resuming from a checkpoint that only one host holds (as DeepSpeed and torchrun jobs load on
// rank 0 and broadcast): rank 0 reads the file; parameters, optimizer state (momentum), scaler
// state and step reach every other rank through the job's collective, and the data position
// follows from the step. A rank other than 0 never opens the file, so the checkpoint need not
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
};

// Called by every rank of the job at the same point. `params` and `momentum` are the rank's
// flat f32 tensors of `layout`; on return they hold the checkpoint's values on every rank.
// Rank 0: the errors of ReadTrainingCheckpoint for `path` (the others then fail too, at once).
// Other ranks: UNAVAILABLE "rank 0 could not read the resume checkpoint" when it failed (its own
// error is the job's cause); the collective's errors; INTERNAL for a malformed state.
absl::StatusOr<ResumeState> LoadResumeState(const std::string& path, int rank,
                                            const ParameterLayout& layout, Backend* backend,
                                            Tensor params, Tensor momentum);

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
