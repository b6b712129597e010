#include "client/format.h"

#include <cctype>

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/resource_estimate.h"
#include "google/protobuf/util/json_util.h"

namespace mptrain {
namespace {

std::string Precision(const v1::JobSpec& spec) {
  std::string name = v1::Precision_Name(spec.precision());
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  return name;
}

std::string Device(v1::DeviceKind kind) {
  std::string name = v1::DeviceKind_Name(kind);
  std::transform(name.begin(), name.end(), name.begin(), ::tolower);
  return name;
}

}  // namespace

std::string FormatUnixMs(int64_t unix_ms) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", absl::FromUnixMillis(unix_ms),
                          absl::UTCTimeZone());
}

std::string ToJson(const google::protobuf::Message& message, bool multiline) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = multiline;
  options.preserve_proto_field_names = true;
  // Every field, defaults too (rank 0's `rank`, `lr: 0`, `skipped: false`): one shape per
  // message, so that `jq '.placement[].rank'` never meets a missing key. NaN and infinities
  // are protobuf's JSON strings "NaN", "Infinity", "-Infinity".
  options.always_print_primitive_fields = true;
  std::string json;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!json.empty() && json.back() == '\n') json.pop_back();
  return json;
}

std::string FormatTable(const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> widths;
  for (const auto& row : rows) {
    if (widths.size() < row.size()) widths.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) widths[i] = std::max(widths[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
    }
    out += line + "\n";
  }
  return out;
}

std::string ShortState(v1::JobState state) { return v1::JobState_Name(state); }

std::string FormatDuration(int64_t ms) {
  if (ms < 0) ms = 0;
  const int64_t seconds = ms / 1000;
  if (seconds < 120) return absl::StrCat(seconds, "s");
  if (seconds < 2 * 3600) return absl::StrCat(seconds / 60, "m");
  if (seconds < 2 * 86400) return absl::StrCat(seconds / 3600, "h");
  return absl::StrCat(seconds / 86400, "d");
}

std::string FormatJobTable(const std::vector<v1::Job>& jobs, int64_t now_unix_ms) {
  if (jobs.empty()) return "No jobs.\n";
  std::vector<std::vector<std::string>> rows = {{"JOB", "NAME", "OWNER", "STATE", "DEVICE",
                                                 "RANKS", "STEP", "LOSS", "AGE", "DURATION",
                                                 "REASON"}};
  for (const v1::Job& job : jobs) {
    int64_t step = 0;
    for (const auto& progress : job.progress()) step = std::max(step, progress.step());
    // How long it ran (or has been running); "-" while it waits.
    std::string duration = "-";
    if (job.started_unix_ms() > 0) {
      const int64_t end = job.finished_unix_ms() > 0 ? job.finished_unix_ms() : now_unix_ms;
      duration = FormatDuration(end - job.started_unix_ms());
    }
    rows.push_back({job.job_id(), job.spec().name().empty() ? "-" : job.spec().name(),
                    job.owner().empty() ? "-" : job.owner(), ShortState(job.state()),
                    Device(job.spec().device()), absl::StrCat(job.spec().world_size()),
                    absl::StrCat(step, "/", job.spec().steps()),
                    job.has_latest_telemetry() ? absl::StrFormat("%.6f", job.latest_telemetry().loss())
                                               : "-",
                    job.submitted_unix_ms() > 0
                        ? FormatDuration(now_unix_ms - job.submitted_unix_ms())
                        : "-",
                    duration,
                    job.state() == v1::PENDING ? job.pending_reason() : job.error()});
  }
  return FormatTable(rows);
}

std::string FormatJobDetail(const v1::Job& job) {
  const v1::JobSpec& spec = job.spec();
  std::string out;
  absl::StrAppend(&out, "job:        ", job.job_id(), " (", spec.name(), ")\n");
  absl::StrAppend(&out, "state:      ", ShortState(job.state()), "\n");
  if (!job.owner().empty()) absl::StrAppend(&out, "owner:      ", job.owner(), "\n");
  if (!spec.labels().empty()) {
    std::vector<std::string> labels;  // Sorted: a map's order is not.
    for (const auto& [key, value] : spec.labels()) labels.push_back(absl::StrCat(key, "=", value));
    std::sort(labels.begin(), labels.end());
    absl::StrAppend(&out, "labels:     ", absl::StrJoin(labels, ", "), "\n");
  }
  if (job.submitted_unix_ms() > 0) {
    absl::StrAppend(&out, "submitted:  ", FormatUnixMs(job.submitted_unix_ms()), "\n");
  }
  if (job.started_unix_ms() > 0) {
    absl::StrAppend(&out, "started:    ", FormatUnixMs(job.started_unix_ms()), "\n");
  }
  if (job.finished_unix_ms() > 0) {
    absl::StrAppend(&out, "finished:   ", FormatUnixMs(job.finished_unix_ms()),
                    job.started_unix_ms() > 0
                        ? absl::StrCat(" (ran ", FormatDuration(job.finished_unix_ms() -
                                                                 job.started_unix_ms()),
                                       ")")
                        : "",
                    "\n");
  }
  if (!job.pending_reason().empty()) {
    absl::StrAppend(&out, "waiting:    ", job.pending_reason(), "\n");
  }
  if (!job.error().empty()) absl::StrAppend(&out, "error:      ", job.error(), "\n");
  if (job.state() == v1::FAILED) {
    // The rank the error names first is where to look.
    int rank = 0;
    const size_t at = job.error().find("rank ");
    if (at != std::string::npos) {
      size_t end = at + 5;
      while (end < job.error().size() && std::isdigit(static_cast<unsigned char>(job.error()[end]))) ++end;
      if (end > at + 5 && end - at - 5 < 6) rank = std::stoi(job.error().substr(at + 5, end - at - 5));
    }
    absl::StrAppend(&out, "logs:       trainctl logs ", job.job_id(), " --rank ", rank, "\n");
  }
  if (job.restarts() > 0 || job.spec().max_restarts() > 0) {
    absl::StrAppend(&out, "restarts:   ", job.restarts(), " of ", job.spec().max_restarts(), "\n");
  }
  for (int i = 0; i < job.failures_size(); ++i) {
    absl::StrAppend(&out, "failure ", i + 1, ":  ", job.failures(i), "\n");
  }
  if (job.latest_checkpoint_step() > 0) {
    absl::StrAppend(&out, "checkpoint: step ", job.latest_checkpoint_step(), " at ",
                    job.latest_checkpoint_path(), "\n");
  }
  std::string model;
  if (spec.model().has_gpt()) {
    const v1::GptSpec& gpt = spec.model().gpt();
    model = absl::StrCat("GPT ", gpt.layers(), " layers x ", gpt.width(), " wide, ", gpt.heads(),
                         " heads, context ", gpt.context_length(), ", vocab ", gpt.vocab_size());
    if (gpt.padded_vocab_size() > gpt.vocab_size()) {
      absl::StrAppend(&model, " (padded to ", gpt.padded_vocab_size(), ")");
    }
  } else {
    std::vector<std::string> widths;
    widths.push_back(absl::StrCat(spec.model().input_dim()));
    for (int64_t hidden : spec.model().hidden_dims()) widths.push_back(absl::StrCat(hidden));
    widths.push_back(absl::StrCat(spec.model().output_dim()));
    model = absl::StrCat("MLP ", absl::StrJoin(widths, "->"));
  }
  absl::StrAppend(&out, "model:      ", model, ", ", Precision(spec), ", ", spec.world_size(),
                  " x ", Device(spec.device()), "\n");
  absl::StrAppend(&out, "schedule:   ", spec.steps(), " steps x ", spec.accumulation_steps(),
                  " micro-batches of ", spec.micro_batch_size(), " per rank\n");
  // The loss, the optimizer and the learning-rate schedule, in the spec's own words.
  // (Unset kinds are the defaults: the coordinator stores specs with their defaults applied.)
  const v1::LossKind loss = spec.loss() == v1::LOSS_KIND_UNSPECIFIED ? v1::MSE : spec.loss();
  const v1::OptimizerKind optimizer = spec.optimizer().kind() == v1::OPTIMIZER_KIND_UNSPECIFIED
                                          ? v1::SGD
                                          : spec.optimizer().kind();
  std::string training = absl::AsciiStrToLower(
      absl::StrCat(v1::LossKind_Name(loss), ", ", v1::OptimizerKind_Name(optimizer), " lr ",
                   absl::StrFormat("%g", spec.optimizer().lr())));
  if (spec.lr_schedule().kind() != v1::CONSTANT &&
      spec.lr_schedule().kind() != v1::LR_SCHEDULE_KIND_UNSPECIFIED) {
    absl::StrAppend(&training, ", ",
                    absl::AsciiStrToLower(v1::LrScheduleKind_Name(spec.lr_schedule().kind())));
  }
  if (spec.has_eval_data()) absl::StrAppend(&training, ", evaluated");
  absl::StrAppend(&out, "training:   ", training, "\n");
  if (job.estimated_rank_memory_bytes() > 0) {
    absl::StrAppend(&out, "memory:     about ", FormatBytes(job.estimated_rank_memory_bytes()),
                    " per rank\n");
  }
  if (job.placement_size() > 0) {
    std::vector<std::vector<std::string>> rows = {
        {"RANK", "WORKER", "HOST", "DEVICE", "STEP", "CHECKSUM", "ERROR"}};
    for (const v1::RankPlacement& placement : job.placement()) {
      const v1::RankProgress* progress =
          placement.rank() < job.progress_size() ? &job.progress(placement.rank()) : nullptr;
      rows.push_back({absl::StrCat(placement.rank()), placement.worker_id(), placement.host(),
                      // A CPU rank has no device index: "-", not a 0 read as GPU 0.
                      spec.device() == v1::CPU ? "-" : absl::StrCat(placement.device_index()),
                      progress ? absl::StrCat(progress->step()) : "-",
                      progress && !progress->parameter_checksum().empty()
                          ? progress->parameter_checksum()
                          : "-",
                      progress ? progress->error() : ""});
    }
    out += FormatTable(rows);
  }
  if (job.has_latest_telemetry()) {
    absl::StrAppend(&out, "latest:     ", FormatTelemetryLine(job.latest_telemetry()), "\n");
  }
  // The latest record is usually not an evaluation step: the last evaluation, with its step.
  const v1::TelemetryRecord& evaluation = job.latest_evaluation();
  if (job.has_latest_evaluation() && !job.latest_telemetry().has_eval_loss()) {
    absl::StrAppendFormat(&out, "evaluated:  step %6d  eval_loss %.6f", evaluation.step(),
                          evaluation.eval_loss());
    if (evaluation.has_eval_accuracy()) {
      absl::StrAppendFormat(&out, "  eval_acc %.4f", evaluation.eval_accuracy());
    }
    out += "\n";
  }
  return out;
}

namespace {

std::string Gib(int64_t bytes) { return absl::StrFormat("%.1f", bytes / 1073741824.0); }

// "12.3/62.8 GiB" available of total, "n/a" when not read.
std::string FormatHostMemory(const v1::Worker& worker) {
  const v1::WorkerUsage& usage = worker.usage();
  if (worker.usage_unix_ms() == 0 || usage.memory_total_bytes() == 0) return "n/a";
  return absl::StrCat(Gib(usage.memory_available_bytes()), "/", Gib(usage.memory_total_bytes()),
                      " GiB");
}

// Per registered device: "0: 30.0/80.0 GiB 75%", or "0: n/a" (no reading of it); "-" for a
// worker without devices.
std::string FormatGpuUsage(const v1::Worker& worker) {
  std::vector<std::string> parts;
  for (const v1::DeviceInfo& device : worker.devices()) {
    const v1::DeviceUsage* reading = nullptr;
    if (worker.usage_unix_ms() > 0) {
      for (const v1::DeviceUsage& usage : worker.usage().devices()) {
        if (usage.index() == device.index() && usage.available()) reading = &usage;
      }
    }
    parts.push_back(reading == nullptr
                        ? absl::StrCat(device.index(), ": n/a")
                        : absl::StrCat(device.index(), ": ", Gib(reading->memory_used_bytes()),
                                       "/", Gib(reading->memory_total_bytes()), " GiB ",
                                       reading->utilization_percent(), "%"));
  }
  return parts.empty() ? "-" : absl::StrJoin(parts, ", ");
}

}  // namespace

std::string FormatWorkerTable(const std::vector<v1::Worker>& workers) {
  std::vector<std::vector<std::string>> rows = {{"WORKER", "HOST", "DEVICE", "SLOTS", "FREE",
                                                 "STATE", "MEM AVAIL", "DEVICES", "GPU USE"}};
  for (const v1::Worker& worker : workers) {
    std::vector<std::string> names;
    for (const auto& device : worker.devices()) names.push_back(device.name());
    rows.push_back({worker.worker_id(), worker.host(), Device(worker.device()),
                    absl::StrCat(worker.slots()), absl::StrCat(worker.free_slots()),
                    v1::WorkerState_Name(worker.state()), FormatHostMemory(worker),
                    names.empty() ? "-" : absl::StrJoin(names, ", "), FormatGpuUsage(worker)});
  }
  return FormatTable(rows);
}

std::string FormatJobSummary(const v1::Job& job) {
  std::vector<std::string> parts;
  const v1::TelemetryRecord& last = job.latest_telemetry();
  std::string steps = absl::StrCat(last.step(), "/", job.spec().steps(), " steps");
  if (job.started_unix_ms() > 0 && job.finished_unix_ms() >= job.started_unix_ms()) {
    absl::StrAppend(&steps, " in ", FormatDuration(job.finished_unix_ms() - job.started_unix_ms()));
  }
  if (job.restarts() > 0) absl::StrAppend(&steps, " (", job.restarts(), " restarts)");
  parts.push_back(steps);
  if (job.has_latest_telemetry()) {
    std::string loss = absl::StrFormat("final loss %.6f", last.loss());
    if (last.has_accuracy()) absl::StrAppendFormat(&loss, " (acc %.4f)", last.accuracy());
    const v1::TelemetryRecord& evaluation = job.latest_evaluation();
    if (job.has_latest_evaluation() && evaluation.has_eval_loss()) {
      absl::StrAppendFormat(&loss, ", eval_loss %.6f", evaluation.eval_loss());
      if (evaluation.has_eval_accuracy()) {
        absl::StrAppendFormat(&loss, " (acc %.4f)", evaluation.eval_accuracy());
      }
      absl::StrAppendFormat(&loss, " at step %d", evaluation.step());
    }
    parts.push_back(loss);
    if (last.skipped_total() > 0) parts.push_back(absl::StrCat(last.skipped_total(), " skipped"));
  }
  if (job.state() == v1::SUCCEEDED && job.progress_size() > 0) {
    // SUCCEEDED means the coordinator found every rank's checksum equal.
    const std::string& checksum = job.progress(0).parameter_checksum();
    parts.push_back(absl::StrCat(job.progress_size(), " ranks, identical parameters",
                                 checksum.empty() ? ""
                                                  : absl::StrCat(" (checksum ",
                                                                 checksum.substr(0, 16), ")")));
  }
  if (!job.latest_checkpoint_path().empty()) {
    parts.push_back(absl::StrCat("checkpoint of step ", job.latest_checkpoint_step(), ": ",
                                 job.latest_checkpoint_path()));
  }
  if (!job.spec().output_checkpoint().empty() && job.state() == v1::SUCCEEDED) {
    parts.push_back(absl::StrCat("output ", job.spec().output_checkpoint()));
  }
  return absl::StrJoin(parts, "; ");
}

std::string FormatTelemetryLine(const v1::TelemetryRecord& record) {
  std::string line = absl::StrFormat(
      "step %6d  loss %.6f  grad_norm %.6g  scale %g  skipped %s (%d total)  %.3f ms  "
      "%.0f samples/s",
      record.step(), record.loss(), record.grad_norm(), record.loss_scale(),
      record.skipped() ? "yes" : "no", record.skipped_total(), record.step_time_ms(),
      record.samples_per_second());
  absl::StrAppendFormat(&line, "  lr %.6g", record.lr());  // 0 too: a warm-up's first step.
  if (record.has_accuracy()) absl::StrAppendFormat(&line, "  acc %.4f", record.accuracy());
  if (record.has_eval_loss()) absl::StrAppendFormat(&line, "  eval_loss %.6f", record.eval_loss());
  if (record.has_eval_accuracy()) {
    absl::StrAppendFormat(&line, "  eval_acc %.4f", record.eval_accuracy());
  }
  return line;
}

}  // namespace mptrain
