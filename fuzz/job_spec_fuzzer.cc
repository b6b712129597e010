// Fuzzes the job spec path of SubmitJob and trainctl: JSON parsing, defaults, validation and the
// memory estimate. Whatever the bytes, nothing may crash, and on a spec that validates:
// defaults stay idempotent and the estimate is non-negative and adds up.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "common/job_spec.h"
#include "common/resource_estimate.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view json(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<mptrain::v1::JobSpec> spec = mptrain::ParseJobSpecJson(json);
  if (!spec.ok()) return 0;

  mptrain::ApplyJobSpecDefaults(&*spec);
  const std::string once = spec->SerializeAsString();
  mptrain::ApplyJobSpecDefaults(&*spec);
  if (spec->SerializeAsString() != once) abort();  // ApplyJobSpecDefaults is idempotent.

  if (!mptrain::ValidateJobSpec(*spec).ok()) return 0;

  const mptrain::RankMemoryEstimate estimate = mptrain::EstimateRankMemory(*spec);
  if (estimate.parameters < 0 || estimate.gradients < 0 || estimate.optimizer < 0 ||
      estimate.activations < 0 || estimate.workspace < 0 || estimate.total < 0) {
    abort();
  }
  // total saturates, so it is at least each of its parts.
  if (estimate.total < estimate.parameters || estimate.total < estimate.gradients ||
      estimate.total < estimate.optimizer || estimate.total < estimate.activations ||
      estimate.total < estimate.workspace) {
    abort();
  }
  (void)estimate.Describe();
  // The MLP's shape (a GPT spec has none of its fields; its estimate is checked above).
  if (!spec->model().has_gpt()) {
    if (mptrain::ParameterCount(spec->model()) <= 0) abort();
    if (mptrain::LayerWidths(spec->model()).size() !=
        static_cast<size_t>(spec->model().hidden_dims_size()) + 2) {
      abort();
    }
  } else if (estimate.parameters <= 0) {
    abort();  // Every GPT has parameters.
  }
  (void)mptrain::LossScalingEnabled(*spec);
  return 0;
}
