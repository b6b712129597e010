#pragma once

// The one place where the wire spec becomes the trainer's configuration.

#include "absl/status/statusor.h"
#include "proto/mptrain.pb.h"
#include "trainer/training_config.h"

namespace mptrain {

// Applies the spec's defaults (common/job_spec.h's ApplyJobSpecDefaults, on a copy: the only
// place a rank applies them), checks every rule (ValidateJobSpec) and converts. INVALID_ARGUMENT
// naming the field when a rule is broken.
absl::StatusOr<TrainingConfig> TrainingConfigFromSpec(const v1::JobSpec& spec);

}  // namespace mptrain
