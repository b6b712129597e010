#include "trainer/resume.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace mptrain {
namespace {

// Header layout (floats): [0] 1 = rank 0 read the checkpoint, 0 = it failed; [1] version;
// then 16-bit pieces, least significant first: step (4), skipped_total (4), steps_done (4),
// growth_tracker (2), the scale's bits (2), the parameter count (4).
constexpr float kVersion = 1;
constexpr int kStep = 2, kSkippedTotal = 6, kStepsDone = 10, kGrowthTracker = 14, kScale = 16,
              kParameters = 18;

void Put(std::vector<float>* header, int at, uint64_t value, int pieces) {
  for (int i = 0; i < pieces; ++i) {
    (*header)[at + i] = static_cast<float>((value >> (16 * i)) & 0xffff);
  }
}

absl::StatusOr<uint64_t> Get(const std::vector<float>& header, int at, int pieces) {
  uint64_t value = 0;
  for (int i = 0; i < pieces; ++i) {
    const float piece = header[at + i];
    if (!(piece >= 0 && piece <= 65535) || piece != std::floor(piece)) {
      return absl::InternalError(
          absl::StrCat("resume state from rank 0 is malformed (float ", at + i, ")"));
    }
    value |= static_cast<uint64_t>(piece) << (16 * i);
  }
  return value;
}

}  // namespace

std::vector<float> EncodeResumeHeader(const TrainingCheckpoint* checkpoint, int64_t parameters) {
  std::vector<float> header(kResumeHeaderFloats, 0.0f);
  header[1] = kVersion;
  Put(&header, kParameters, static_cast<uint64_t>(parameters), 4);
  if (checkpoint == nullptr) return header;
  header[0] = 1;
  const StepState& state = checkpoint->step_state;
  Put(&header, kStep, static_cast<uint64_t>(checkpoint->step), 4);
  Put(&header, kSkippedTotal, static_cast<uint64_t>(state.skipped_total), 4);
  Put(&header, kStepsDone, static_cast<uint64_t>(state.steps_done), 4);
  Put(&header, kGrowthTracker, static_cast<uint32_t>(state.growth_tracker), 2);
  uint32_t scale_bits = 0;
  std::memcpy(&scale_bits, &state.scale, sizeof(scale_bits));
  Put(&header, kScale, scale_bits, 2);
  return header;
}

absl::StatusOr<ResumeState> DecodeResumeHeader(const std::vector<float>& header,
                                               int64_t parameters) {
  if (header.size() != kResumeHeaderFloats || header[1] != kVersion) {
    return absl::InternalError("resume state from rank 0 is malformed (size or version)");
  }
  ASSIGN_OR_RETURN(uint64_t count, Get(header, kParameters, 4));
  if (count != static_cast<uint64_t>(parameters)) {
    return absl::InternalError(absl::StrCat("rank 0 resumes ", count, " parameters, this rank has ",
                                            parameters));
  }
  if (header[0] != 1) {
    return absl::UnavailableError(
        "rank 0 could not read the resume checkpoint (its own error says why)");
  }
  constexpr uint64_t kMaxInt64 = std::numeric_limits<int64_t>::max();
  ResumeState state;
  ASSIGN_OR_RETURN(uint64_t step, Get(header, kStep, 4));
  ASSIGN_OR_RETURN(uint64_t skipped_total, Get(header, kSkippedTotal, 4));
  ASSIGN_OR_RETURN(uint64_t steps_done, Get(header, kStepsDone, 4));
  ASSIGN_OR_RETURN(uint64_t growth_tracker, Get(header, kGrowthTracker, 2));
  ASSIGN_OR_RETURN(uint64_t scale_bits, Get(header, kScale, 2));
  if (step > kMaxInt64 || skipped_total > kMaxInt64 || steps_done > kMaxInt64 ||
      growth_tracker > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return absl::InternalError("resume state from rank 0 is out of range");
  }
  const uint32_t bits = static_cast<uint32_t>(scale_bits);
  float scale = 0;
  std::memcpy(&scale, &bits, sizeof(scale));
  if (!std::isfinite(scale) || !(scale > 0)) {
    return absl::InternalError("resume state from rank 0 has a scale that is not finite > 0");
  }
  state.step = static_cast<int64_t>(step);
  state.step_state.scale = scale;
  state.step_state.growth_tracker = static_cast<int32_t>(growth_tracker);
  state.step_state.skipped_total = static_cast<int64_t>(skipped_total);
  state.step_state.steps_done = static_cast<int64_t>(steps_done);
  return state;
}

std::vector<std::string> FindResumeCandidates(const std::string& recorded,
                                              const std::string& stamp) {
  std::vector<std::string> candidates = {recorded};
  const size_t slash = recorded.rfind('/');
  if (stamp.empty() || slash == std::string::npos) return candidates;
  const std::string directory = slash == 0 ? "/" : recorded.substr(0, slash);
  const std::optional<int64_t> below = CheckpointStep(recorded.substr(slash + 1));
  // The recorded path was resolved (confined) before: its directory is reached without links.
  absl::StatusOr<std::set<int64_t>> steps =
      FindJobCheckpoints(directory, stamp, /*no_symlinks=*/recorded[0] == '/');
  if (!steps.ok()) return candidates;
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {
    if (below.has_value() && *it >= *below) continue;
    candidates.push_back(CheckpointPath(directory, *it));
  }
  return candidates;
}

absl::StatusOr<ResumeState> LoadResumeState(const std::vector<std::string>& candidates, int rank,
                                            const ParameterTable& table, Backend* backend,
                                            Tensor params, const std::vector<ResumeSlot>& slots,
                                            Tensor buffers, const std::string& expected_stamp) {
  Collective* collective = backend->collective();
  std::vector<float> header;
  absl::Status read = absl::OkStatus();
  std::string path;
  std::vector<std::string> unreadable;
  if (rank == 0) {
    std::vector<std::string> names;
    for (const ResumeSlot& slot : slots) names.push_back(slot.name);
    absl::StatusOr<TrainingCheckpoint> checkpoint =
        absl::InvalidArgumentError("no checkpoint to resume from");
    for (const std::string& candidate : candidates) {
      checkpoint = ReadTrainingCheckpoint(candidate, table, names);
      if (checkpoint.ok() && !expected_stamp.empty() && checkpoint->job_id != expected_stamp) {
        // Whose it is stays unsaid: the stamp is the file's bytes.
        checkpoint = absl::PermissionDeniedError(absl::StrCat(
            candidate, " is not a checkpoint of this job (stamped by another job, or by none): "
            "ignored"));
      }
      if (checkpoint.ok()) {
        path = candidate;
        break;
      }
      unreadable.push_back(std::string(checkpoint.status().message()));
      if (read.ok()) read = checkpoint.status();  // The recorded one's error is the cause.
    }
    if (checkpoint.ok()) {
      read = absl::OkStatus();
      RETURN_IF_ERROR(backend->Upload(checkpoint->parameters.data(), params));
      for (const ResumeSlot& slot : slots) {
        RETURN_IF_ERROR(
            backend->Upload(checkpoint->optimizer_state.at(slot.name).data(), slot.values));
      }
      if (!buffers.empty()) RETURN_IF_ERROR(backend->Upload(checkpoint->buffers.data(), buffers));
      header = EncodeResumeHeader(&*checkpoint, table.total());
    } else {
      // Still take part in the header's broadcast, so the others fail at once instead of
      // waiting out the collective timeout.
      if (candidates.size() > 1) {
        read = absl::Status(read.code(), absl::StrCat(read.message(), "; and none of the job's ",
                                                      candidates.size() - 1,
                                                      " older checkpoints could be read"));
      }
      header = EncodeResumeHeader(nullptr, table.total());
    }
  } else {
    header = EncodeResumeHeader(nullptr, table.total());
  }
  ASSIGN_OR_RETURN(Tensor header_tensor, backend->Allocate(DType::kF32, 1, kResumeHeaderFloats));
  RETURN_IF_ERROR(backend->Upload(header.data(), header_tensor));
  RETURN_IF_ERROR(collective->Broadcast(header_tensor, 0));
  RETURN_IF_ERROR(backend->Download(header_tensor, header.data()));
  if (!read.ok()) return read;
  ASSIGN_OR_RETURN(ResumeState state, DecodeResumeHeader(header, table.total()));
  state.path = std::move(path);
  state.unreadable = std::move(unreadable);
  RETURN_IF_ERROR(collective->Broadcast(params, 0));
  for (const ResumeSlot& slot : slots) RETURN_IF_ERROR(collective->Broadcast(slot.values, 0));
  if (!buffers.empty()) RETURN_IF_ERROR(collective->Broadcast(buffers, 0));
  return state;
}

}  // namespace mptrain
