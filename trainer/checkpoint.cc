#include "trainer/checkpoint.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <functional>
#include <limits>
#include <iterator>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "io/regular_file.h"
#include "io/safetensors.h"

namespace mptrain {
namespace {

constexpr char kFormat[] = "mptrain-checkpoint-v1";

std::string HexFloat(double value) { return absl::StrFormat("%a", value); }

// The __metadata__ of one checkpoint file, each value parsed strictly: a value that does not
// parse whole, overflows or is out of range is an error naming the file and the key, never a
// silently clamped number or an exception.
class MetadataFields {
 public:
  MetadataFields(const std::string& path, const std::map<std::string, std::string>& metadata)
      : path_(path), metadata_(metadata) {}

  absl::StatusOr<std::string> String(const std::string& key) const {
    auto it = metadata_.find(key);
    if (it == metadata_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ": not a training checkpoint (no ", key, " in __metadata__)"));
    }
    return it->second;
  }

  // A decimal integer ('-' and digits only: no spaces, '+' or hex) in [min, max].
  absl::StatusOr<int64_t> Integer(const std::string& key, int64_t min, int64_t max) const {
    absl::StatusOr<std::string> text = String(key);
    if (!text.ok()) return text.status();
    const std::string& s = *text;
    const bool negative = !s.empty() && s[0] == '-';
    const size_t first = negative ? 1 : 0;
    if (s.size() == first || s.size() > 40) return Malformed(key, "not a decimal integer");
    int64_t value = 0;
    for (size_t i = first; i < s.size(); ++i) {
      if (s[i] < '0' || s[i] > '9') return Malformed(key, "not a decimal integer");
      const int64_t digit = s[i] - '0';
      // Accumulated with the sign, so that INT64_MIN parses too.
      if (__builtin_mul_overflow(value, int64_t{10}, &value) ||
          (negative ? __builtin_sub_overflow(value, digit, &value)
                    : __builtin_add_overflow(value, digit, &value))) {
        return Malformed(key, "too large for int64");
      }
    }
    if (value < min || value > max) {
      return Malformed(key, absl::StrCat("out of range [", min, ", ", max, "]"));
    }
    return value;
  }

  // A finite float > 0, written as C99 hex (or decimal) floating point.
  absl::StatusOr<float> PositiveFloat(const std::string& key) const {
    absl::StatusOr<std::string> text = String(key);
    if (!text.ok()) return text.status();
    const std::string& s = *text;
    // strtod would skip leading spaces; refuse them as the integers do.
    if (s.empty() || std::isspace(static_cast<unsigned char>(s[0]))) {
      return Malformed(key, "not a number");
    }
    errno = 0;
    char* end = nullptr;
    const double value = std::strtod(s.c_str(), &end);
    if (end != s.c_str() + s.size()) return Malformed(key, "not a number");
    // Range-checked before narrowing: a double beyond FLT_MAX has no float value.
    if (errno == ERANGE || !std::isfinite(value) || !(value > 0) ||
        value > std::numeric_limits<float>::max() ||
        static_cast<float>(value) == 0) {
      return Malformed(key, "expected a finite float > 0");
    }
    return static_cast<float>(value);
  }

 private:
  // The value is not shown: the file may be anyone's, and its metadata is its content.
  absl::Status Malformed(const std::string& key, const std::string& why) const {
    return absl::InvalidArgumentError(absl::StrCat(path_, ": __metadata__ ", key, " is ", why));
  }

  const std::string& path_;
  const std::map<std::string, std::string>& metadata_;
};

// Errors may name the tensors of `known` (the model's): the file's other names stay unsaid.
SafetensorsReadOptions FiniteOnly(const std::set<std::string>* known) {
  SafetensorsReadOptions options;
  options.require_finite = true;
  options.known_names = known;
  return options;
}

}  // namespace

std::optional<int64_t> CheckpointStep(absl::string_view name) {
  const std::string whole(name);
  if (!absl::ConsumePrefix(&name, "step-") || !absl::ConsumeSuffix(&name, ".safetensors") ||
      name.size() < 8 || name.size() > 18 ||
      !std::all_of(name.begin(), name.end(), absl::ascii_isdigit)) {
    return std::nullopt;
  }
  int64_t step = 0;
  if (!absl::SimpleAtoi(name, &step) || absl::StrFormat("step-%08d.safetensors", step) != whole) {
    return std::nullopt;
  }
  return step;
}

namespace {

// FindJobCheckpoints through an open directory.
absl::StatusOr<std::set<int64_t>> JobCheckpointsIn(int dir, const std::string& directory,
                                                    const std::string& stamp) {
  // fdopendir takes its descriptor: a copy.
  DIR* listing = fdopendir(fcntl(dir, F_DUPFD_CLOEXEC, 0));
  if (listing == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list checkpoint_dir ", directory, ": ", std::strerror(errno)));
  }
  std::vector<std::pair<int64_t, std::string>> named;
  while (const dirent* entry = readdir(listing)) {
    if (std::optional<int64_t> found = CheckpointStep(entry->d_name)) {
      named.emplace_back(*found, entry->d_name);
    }
  }
  closedir(listing);
  std::set<int64_t> steps;
  for (const auto& [found, name] : named) {
    auto metadata = ReadSafetensorsMetadataAt(dir, name, absl::StrCat(directory, "/", name));
    if (!metadata.ok()) continue;
    auto it = metadata->find("mptrain_job");
    if (it != metadata->end() && it->second == stamp) steps.insert(found);
  }
  return steps;
}

}  // namespace

absl::StatusOr<std::set<int64_t>> FindJobCheckpoints(const std::string& directory,
                                                     const std::string& stamp, bool no_symlinks) {
  int error = 0;
  const int dir = OpenDirectory(directory, no_symlinks, &error);
  if (dir < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read checkpoint_dir ", directory, ": ", std::strerror(error)));
  }
  ScopedFd dir_fd(dir);
  return JobCheckpointsIn(dir, directory, stamp);
}

std::string CheckpointPath(const std::string& directory, int64_t step) {
  return absl::StrFormat("%s/step-%08d.safetensors", directory, step);
}

CheckpointRetention::CheckpointRetention(std::string directory, std::string stamp, int keep,
                                         bool no_symlinks)
    : directory_(std::move(directory)),
      stamp_(std::move(stamp)),
      keep_(keep),
      no_symlinks_(no_symlinks) {}

absl::StatusOr<int> CheckpointRetention::Written(int64_t step, int64_t protected_from) {
  if (stamp_.empty() || keep_ < 0) return 0;
  int error = 0;
  const int dir = OpenDirectory(directory_, no_symlinks_, &error);
  if (dir < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read checkpoint_dir ", directory_, ": ", std::strerror(error)));
  }
  ScopedFd dir_fd(dir);
  if (!scanned_) {
    // Once: the files earlier attempts of the job left.
    ASSIGN_OR_RETURN(steps_, JobCheckpointsIn(dir, directory_, stamp_));
    scanned_ = true;
  }
  steps_.insert(step);
  // Newest first among those at or below `step`.
  std::vector<int64_t> surplus;
  int kept = 0;
  for (auto it = std::make_reverse_iterator(steps_.upper_bound(step)); it != steps_.rend(); ++it) {
    if (++kept > keep_ && *it < protected_from) surplus.push_back(*it);
  }
  int removed = 0;
  for (int64_t candidate : surplus) {
    const std::string name = CheckpointPath("", candidate).substr(1);  // "step-...safetensors"
    // Still the job's file (it may have been replaced since the directory was read)?
    auto metadata = ReadSafetensorsMetadataAt(dir, name, absl::StrCat(directory_, "/", name));
    auto stamp = metadata.ok() ? metadata->find("mptrain_job") : decltype(metadata->find(""))();
    if (!metadata.ok() || stamp == metadata->end() || stamp->second != stamp_) {
      steps_.erase(candidate);  // Not ours (any more): left alone.
      continue;
    }
    if (unlinkat(dir, name.c_str(), 0) == 0 || errno == ENOENT) {
      steps_.erase(candidate);
      ++removed;
    }
  }
  return removed;
}

absl::Status WriteTrainingCheckpoint(const std::string& path, const ParameterTable& table,
                                     const TrainingCheckpoint& checkpoint,
                                     const SafetensorsWriteOptions& options) {
  TensorMap tensors = table.ToTensors(checkpoint.parameters);
  for (const auto& [state, values] : checkpoint.optimizer_state) {
    for (auto& [name, tensor] : table.ToTensors(values)) {
      tensors[state + "." + name] = std::move(tensor);
    }
  }
  if (table.buffers_total() > 0) {
    if (static_cast<int64_t>(checkpoint.buffers.size()) != table.buffers_total()) {
      return absl::InvalidArgumentError(absl::StrCat(path, ": ", checkpoint.buffers.size(),
                                                     " running statistics, the model has ",
                                                     table.buffers_total()));
    }
    for (auto& [name, tensor] :
         table.BuffersToTensors(checkpoint.buffers, checkpoint.num_batches_tracked)) {
      tensors[name] = std::move(tensor);
    }
  }
  const StepState& state = checkpoint.step_state;
  std::map<std::string, std::string> metadata = {
      {"format", kFormat},
      {"step", absl::StrCat(checkpoint.step)},
      {"data_cursor", absl::StrCat(checkpoint.data_cursor)},
      {"scale", HexFloat(state.scale)},
      {"growth_tracker", absl::StrCat(state.growth_tracker)},
      {"skipped_total", absl::StrCat(state.skipped_total)},
      {"steps_done", absl::StrCat(state.steps_done)},
  };
  if (!checkpoint.job_id.empty()) metadata["mptrain_job"] = checkpoint.job_id;
  if (!checkpoint.owner.empty()) metadata["mptrain_owner"] = checkpoint.owner;
  return WriteSafetensors(path, tensors, metadata, options);
}

FileOwnership CheckpointOwnership(const std::string& path, const CheckpointStamp& stamp) {
  struct stat st;
  if (::lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? FileOwnership::kAbsent : FileOwnership::kSomeoneElse;
  }
  if (!S_ISREG(st.st_mode)) return FileOwnership::kSomeoneElse;
  std::map<std::string, std::string> metadata;
  SafetensorsReadOptions header;
  header.header_only = true;
  if (!ReadSafetensors(path, &metadata, header).ok()) return FileOwnership::kUnreadable;
  const auto job = metadata.find("mptrain_job");
  if (!stamp.job.empty() && job != metadata.end() && job->second == stamp.job) {
    return FileOwnership::kThisJob;
  }
  // A run with no stamp (the trainer used as a library, its tests) cannot tell its files from
  // others' but by their lack of one: it owns the unstamped ones. A service job always has one.
  if (stamp.job.empty() && job == metadata.end()) return FileOwnership::kThisJob;
  const auto owner = metadata.find("mptrain_owner");
  if (!stamp.owner.empty() && owner != metadata.end() && owner->second == stamp.owner) {
    return FileOwnership::kSameOwner;
  }
  return FileOwnership::kSomeoneElse;
}

bool MayReplace(FileOwnership ownership, bool overwrite_output, bool resuming) {
  switch (ownership) {
    case FileOwnership::kAbsent:
    case FileOwnership::kThisJob:
      return true;
    case FileOwnership::kSameOwner:
      return overwrite_output;
    case FileOwnership::kUnreadable:
      return resuming;
    case FileOwnership::kSomeoneElse:
      return false;
  }
  return false;
}

bool CheckpointWrittenByJob(const std::string& path, const std::string& job_id) {
  if (job_id.empty()) return false;
  std::map<std::string, std::string> metadata;
  SafetensorsReadOptions header;
  header.header_only = true;  // A checkpoint may be gigabytes; its stamp is in the header.
  if (!ReadSafetensors(path, &metadata, header).ok()) return false;
  auto it = metadata.find("mptrain_job");
  return it != metadata.end() && it->second == job_id;
}

absl::StatusOr<TrainingCheckpoint> ReadTrainingCheckpoint(
    const std::string& path, const ParameterTable& table,
    const std::vector<std::string>& optimizer_state) {
  std::map<std::string, std::string> metadata;
  // A resumed run must not inherit NaN weights or momentum: they would poison every step.
  const std::set<std::string> known = table.Names(optimizer_state);
  ASSIGN_OR_RETURN(TensorMap tensors, ReadSafetensors(path, &metadata, FiniteOnly(&known)));
  const MetadataFields fields(path, metadata);
  ASSIGN_OR_RETURN(std::string format, fields.String("format"));
  if (format != kFormat) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not a training checkpoint (its format is not ", kFormat, ")"));
  }
  TrainingCheckpoint checkpoint;
  ASSIGN_OR_RETURN(checkpoint.parameters, table.FromTensors(tensors, path));
  for (const std::string& state : optimizer_state) {
    const std::string prefix = state + ".";
    TensorMap buffers;
    for (auto& [name, tensor] : tensors) {
      if (name.rfind(prefix, 0) == 0) buffers[name.substr(prefix.size())] = tensor;
    }
    ASSIGN_OR_RETURN(checkpoint.optimizer_state[state],
                     table.FromTensors(buffers, path + " (" + state + ")"));
  }
  if (table.buffers_total() > 0) {
    ASSIGN_OR_RETURN(checkpoint.buffers, table.BuffersFromTensors(tensors, path));
  }
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  ASSIGN_OR_RETURN(checkpoint.step, fields.Integer("step", 0, kMax));
  ASSIGN_OR_RETURN(checkpoint.data_cursor, fields.Integer("data_cursor", 0, kMax));
  ASSIGN_OR_RETURN(int64_t growth_tracker,
                   fields.Integer("growth_tracker", 0, std::numeric_limits<int32_t>::max()));
  checkpoint.step_state.growth_tracker = static_cast<int32_t>(growth_tracker);
  ASSIGN_OR_RETURN(checkpoint.step_state.skipped_total, fields.Integer("skipped_total", 0, kMax));
  ASSIGN_OR_RETURN(checkpoint.step_state.steps_done, fields.Integer("steps_done", 0, kMax));
  ASSIGN_OR_RETURN(checkpoint.step_state.scale, fields.PositiveFloat("scale"));
  // Only compared with what the reader expects, never echoed (they are the file's bytes).
  if (auto job = metadata.find("mptrain_job"); job != metadata.end()) {
    checkpoint.job_id = job->second;
  }
  if (auto owner = metadata.find("mptrain_owner"); owner != metadata.end()) {
    checkpoint.owner = owner->second;
  }
  return checkpoint;
}

absl::StatusOr<std::vector<float>> ReadInitialParameters(const std::string& path,
                                                         const ParameterTable& table) {
  // A run started from NaN weights would report every step as skipped or diverged, not fail.
  const std::set<std::string> known = table.Names();
  ASSIGN_OR_RETURN(TensorMap tensors, ReadSafetensors(path, nullptr, FiniteOnly(&known)));
  // Parameters with a default (norm weights and biases: 1 and 0, as torch's) may be left out.
  return table.FromTensors(tensors, path, /*use_defaults=*/true);
}

absl::Status WriteTrainingCheckpoint(const std::string& path, const ParameterLayout& layout,
                                     const TrainingCheckpoint& checkpoint,
                                     const SafetensorsWriteOptions& options) {
  return WriteTrainingCheckpoint(path, MlpParameterTable(layout), checkpoint, options);
}

absl::StatusOr<TrainingCheckpoint> ReadTrainingCheckpoint(
    const std::string& path, const ParameterLayout& layout,
    const std::vector<std::string>& optimizer_state) {
  return ReadTrainingCheckpoint(path, MlpParameterTable(layout), optimizer_state);
}

absl::StatusOr<std::vector<float>> ReadInitialParameters(const std::string& path,
                                                         const ParameterLayout& layout) {
  return ReadInitialParameters(path, MlpParameterTable(layout));
}

}  // namespace mptrain
