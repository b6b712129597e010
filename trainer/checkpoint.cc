#include "trainer/checkpoint.h"

#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"
#include "io/safetensors.h"

namespace mptrain {
namespace {

constexpr char kFormat[] = "mptrain-checkpoint-v1";

std::string HexFloat(double value) { return absl::StrFormat("%a", value); }

absl::StatusOr<double> ParseHexFloat(const std::string& text, const std::string& what) {
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end == nullptr || *end != '\0') {
    return absl::InvalidArgumentError(absl::StrCat("metadata ", what, " is not a number"));
  }
  return value;
}

}  // namespace

std::string CheckpointPath(const std::string& directory, int64_t step) {
  return absl::StrFormat("%s/step-%08d.safetensors", directory, step);
}

absl::Status WriteTrainingCheckpoint(const std::string& path, const ParameterLayout& layout,
                                     const TrainingCheckpoint& checkpoint) {
  TensorMap tensors = ParametersToTensors(layout, checkpoint.parameters);
  for (auto& [name, tensor] : ParametersToTensors(layout, checkpoint.momentum)) {
    tensors["momentum." + name] = std::move(tensor);
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
  return WriteSafetensors(path, tensors, metadata);
}

absl::StatusOr<TrainingCheckpoint> ReadTrainingCheckpoint(const std::string& path,
                                                          const ParameterLayout& layout) {
  std::map<std::string, std::string> metadata;
  ASSIGN_OR_RETURN(TensorMap tensors, ReadSafetensors(path, &metadata));
  auto field = [&](const std::string& key) -> absl::StatusOr<std::string> {
    auto it = metadata.find(key);
    if (it == metadata.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": not a training checkpoint (no ", key, " in __metadata__)"));
    }
    return it->second;
  };
  ASSIGN_OR_RETURN(std::string format, field("format"));
  if (format != kFormat) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": format ", format, ", expected ",
                                                   kFormat));
  }
  TrainingCheckpoint checkpoint;
  ASSIGN_OR_RETURN(checkpoint.parameters, TensorsToParameters(layout, tensors, path));
  TensorMap momentum;
  for (auto& [name, tensor] : tensors) {
    if (name.rfind("momentum.", 0) == 0) momentum[name.substr(9)] = tensor;
  }
  ASSIGN_OR_RETURN(checkpoint.momentum, TensorsToParameters(layout, momentum, path + " (momentum)"));
  int64_t growth_tracker = 0;
  bool ok = true;
  ASSIGN_OR_RETURN(std::string step, field("step"));
  ASSIGN_OR_RETURN(std::string cursor, field("data_cursor"));
  ASSIGN_OR_RETURN(std::string tracker, field("growth_tracker"));
  ASSIGN_OR_RETURN(std::string skipped, field("skipped_total"));
  ASSIGN_OR_RETURN(std::string steps_done, field("steps_done"));
  ASSIGN_OR_RETURN(std::string scale_text, field("scale"));
  ok = absl::SimpleAtoi(step, &checkpoint.step) && absl::SimpleAtoi(cursor, &checkpoint.data_cursor) &&
       absl::SimpleAtoi(tracker, &growth_tracker) &&
       absl::SimpleAtoi(skipped, &checkpoint.step_state.skipped_total) &&
       absl::SimpleAtoi(steps_done, &checkpoint.step_state.steps_done);
  if (!ok) return absl::InvalidArgumentError(absl::StrCat(path, ": malformed metadata"));
  ASSIGN_OR_RETURN(double scale, ParseHexFloat(scale_text, "scale"));
  checkpoint.step_state.scale = static_cast<float>(scale);
  checkpoint.step_state.growth_tracker = static_cast<int32_t>(growth_tracker);
  return checkpoint;
}

}  // namespace mptrain
