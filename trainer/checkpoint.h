#pragma once

// Training checkpoints: everything needed to continue a run bit-identically — fp32 parameters,
// the optimizer's state buffers (SGD's momentum, Adam's exp_avg and exp_avg_sq; Adam's step
// count is steps_done - skipped_total), the scaler state (scale, growth tracker, skipped total),
// the step and the data position — in one safetensors file written atomically. Tensors are named
// as in the output checkpoint (layers.{i}.weight / .bias) plus <state>.layers.{i}.weight / .bias
// for each optimizer state buffer; the scalars live in the header's __metadata__ (floats in
// exact hex notation). With normalization layers: norms.{i}.weight / .bias with the parameters
// (and <state>.norms.{i}.*), and for batch norms the buffers norms.{i}.running_mean,
// .running_var and .num_batches_tracked (parameter_layout.h).

#include <cstdint>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "io/safetensors.h"
#include "trainer/parameter_layout.h"
#include "trainer/step_math.h"

namespace mptrain {

struct TrainingCheckpoint {
  int64_t step = 0;         // Optimizer steps completed.
  int64_t data_cursor = 0;  // Next row of this rank's shard (rank 0's; see train_loop.cc).
  std::vector<float> parameters;
  // The optimizer's state buffers by name ("momentum", "exp_avg", ...), each like parameters.
  std::map<std::string, std::vector<float>> optimizer_state;
  // Batch norms' running statistics (layout.buffers_total values; empty without batch norms),
  // and torch's num_batches_tracked (written only; a resume derives it from the step).
  std::vector<float> buffers;
  int64_t num_batches_tracked = 0;
  StepState step_state;
  // The job that wrote it (stamped as "mptrain_job"; empty: no stamp). Job ids never repeat, so
  // a later attempt of the same job may replace its own files, never another job's.
  std::string job_id;
  // The principal that job belongs to ("mptrain_owner"; empty: no stamp): overwrite_output
  // replaces only files of the same owner.
  std::string owner;
};

// What a job's files are stamped with: "mptrain_job" (its id and uid, never reused) and
// "mptrain_owner" (who submitted it). Empty fields: not stamped.
struct CheckpointStamp {
  std::string job;
  std::string owner;
};

// Whose file is at a path a job is about to write.
enum class FileOwnership {
  kAbsent,       // No file there.
  kThisJob,      // Stamped with the job's own stamp: an earlier attempt wrote it.
  kSameOwner,    // Stamped by another job of the same owner.
  kSomeoneElse,  // Another owner's, an unstamped file, or not a regular file.
  kUnreadable,   // A regular file whose header cannot be read (damaged, or not safetensors).
};
// Reads at most the header (a checkpoint may be gigabytes), never following a final link
// (lstat first; a link is kSomeoneElse). A `stamp` without a job (a library caller) owns the
// unstamped files as kThisJob.
FileOwnership CheckpointOwnership(const std::string& path, const CheckpointStamp& stamp);

// Whether a job may replace a file of `ownership`: its own always; its owner's other jobs'
// only with overwrite_output; a damaged file only when `resuming` (its own run dir after a
// crash mid-write); another owner's or an unstamped file never, whatever the spec says.
bool MayReplace(FileOwnership ownership, bool overwrite_output, bool resuming);

// Whether `path` is a safetensors file stamped as written by job `job_id` (false for "", a
// missing or unreadable file, or another job's).
bool CheckpointWrittenByJob(const std::string& path, const std::string& job_id);

// The file of step `step` in `directory`: <directory>/step-00000100.safetensors.
std::string CheckpointPath(const std::string& directory, int64_t step);

// The step of a file named as CheckpointPath names them ("step-00000100.safetensors" -> 100),
// nullopt for any other name.
std::optional<int64_t> CheckpointStep(absl::string_view name);

// The checkpoint files in `directory` stamped `stamp` (named as CheckpointPath names them;
// regular files only, each opened through the directory without following links, its header
// alone read), by step. With `no_symlinks` the directory itself is reached without following
// links (SafetensorsWriteOptions::no_symlinks). FAILED_PRECONDITION when it cannot be read.
absl::StatusOr<std::set<int64_t>> FindJobCheckpoints(const std::string& directory,
                                                     const std::string& stamp, bool no_symlinks);

// A job's checkpoint files in its checkpoint_dir, and which of them may go
// (JobSpec.keep_checkpoints). Its own files are those named as CheckpointPath names them and
// stamped with `stamp` (another job's, a user's, an unstamped file, a link or anything else
// there is never touched); the directory is read once, at the first Written, and with
// `no_symlinks` reached without following links (SafetensorsWriteOptions::no_symlinks), the
// files read and removed through it.
class CheckpointRetention {
 public:
  // keep < 0: every checkpoint stays. An empty `stamp`: nothing is ever removed.
  CheckpointRetention(std::string directory, std::string stamp, int keep, bool no_symlinks);

  // After step `step`'s file is written: removes the job's files past the newest `keep` of
  // those at or below `step`, but never one at or above `protected_from` (the newest checkpoint
  // a restart would resume from — the coordinator may not have heard of the newer ones yet).
  // Files above `step` (an earlier attempt got further) stay: this run writes them again on
  // its way. Returns how many went; FAILED_PRECONDITION when the directory cannot be read (a
  // file that cannot be removed stays, and is not counted).
  absl::StatusOr<int> Written(int64_t step, int64_t protected_from);

 private:
  const std::string directory_;
  const std::string stamp_;
  const int keep_;
  const bool no_symlinks_;
  bool scanned_ = false;
  std::set<int64_t> steps_;  // The job's files, by step.
};

// `options.replace_existing = false` makes an existing file at `path` an ALREADY_EXISTS error
// instead of being replaced; otherwise the errors of WriteSafetensors.
absl::Status WriteTrainingCheckpoint(const std::string& path, const ParameterTable& table,
                                     const TrainingCheckpoint& checkpoint,
                                     const SafetensorsWriteOptions& options = {});

// The errors of ReadSafetensors (NOT_FOUND, PERMISSION_DENIED, INVALID_ARGUMENT naming the
// file), and INVALID_ARGUMENT naming the file and the tensor or metadata key when a tensor is
// missing, has the wrong shape or holds a NaN or Inf (parameters or the optimizer state
// buffers named in `optimizer_state`), or a metadata
// value is missing or malformed: step, data_cursor, skipped_total and steps_done must be
// decimal integers >= 0, growth_tracker one in [0, 2^31), scale a finite float > 0.
absl::StatusOr<TrainingCheckpoint> ReadTrainingCheckpoint(
    const std::string& path, const ParameterTable& table,
    const std::vector<std::string>& optimizer_state = {"momentum"});

// The parameters a run starts from (JobSpec.init_checkpoint): every parameter of `table`, of
// its shape, all finite; one with a default (the MLP's norms.{i}.weight / .bias: 1 and 0) may be
// left out.
// Running statistics are not read: they start at 0 and 1. The errors of ReadSafetensors, and INVALID_ARGUMENT naming
// the file and the tensor when one is missing, has the wrong shape or holds a NaN or Inf.
absl::StatusOr<std::vector<float>> ReadInitialParameters(const std::string& path,
                                                         const ParameterTable& table);

// The same for an MLP's layout (its table: parameter_layout.h MlpParameterTable), for the MLP's
// tests and tools.
absl::Status WriteTrainingCheckpoint(const std::string& path, const ParameterLayout& layout,
                                     const TrainingCheckpoint& checkpoint,
                                     const SafetensorsWriteOptions& options = {});
absl::StatusOr<TrainingCheckpoint> ReadTrainingCheckpoint(
    const std::string& path, const ParameterLayout& layout,
    const std::vector<std::string>& optimizer_state = {"momentum"});
absl::StatusOr<std::vector<float>> ReadInitialParameters(const std::string& path,
                                                         const ParameterLayout& layout);

}  // namespace mptrain
