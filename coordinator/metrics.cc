#include "coordinator/metrics.h"

#include <algorithm>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "google/protobuf/descriptor.h"
#include "common/build_version.h"
#include "coordinator/metrics_process.h"
#include "coordinator/prometheus_text.h"
#include "coordinator/worker_registry.h"

namespace mptrain {
namespace {

std::string Lower(const std::string& name) { return absl::AsciiStrToLower(name); }

// "/mptrain.v1.Coordinator/GetJob" -> ("mptrain.v1.Coordinator", "GetJob").
std::pair<std::string, std::string> SplitMethod(const std::string& full) {
  const size_t slash = full.rfind('/');
  if (slash == std::string::npos || slash == 0) return {"", full};
  return {full.substr(1, slash - 1), full.substr(slash + 1)};
}

// Whether `full` names a method this server has: one of mptrain's services (their descriptors
// are linked in), gRPC's health check or server reflection.
bool IsServedMethod(const std::string& full) {
  static const std::set<std::string> kGrpcMethods = {
      "/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch",
      "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"};
  if (kGrpcMethods.count(full) > 0) return true;
  const auto [service, method] = SplitMethod(full);
  if (!absl::StartsWith(service, "mptrain.")) return false;
  const google::protobuf::ServiceDescriptor* descriptor =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(service);
  return descriptor != nullptr && descriptor->FindMethodByName(method) != nullptr;
}

#ifdef NDEBUG
constexpr char kAssertions[] = "off";
#else
constexpr char kAssertions[] = "on";
#endif

// Each live worker's latest usage (WorkerUsage, from its heartbeats): its host memory, and each
// GPU whose reading is available, labelled gpu (the device index); an unavailable reading, or
// none yet, has no series (absent, not 0). The GPU families hold at most kMaxGpuSeries series
// each (workers in id order; the readings left out are counted).
void AppendWorkerUsage(const CoordinatorState::Overview& overview, PrometheusText& text) {
  auto worker_labels = [](const v1::Worker& worker) -> Labels {
    return {{"worker", WorkerRegistry::NameOfId(worker.worker_id())}, {"host", worker.host()}};
  };
  auto has_usage = [](const v1::Worker& worker) {
    return worker.state() == v1::ALIVE && worker.usage_unix_ms() > 0;
  };
  text.Family("mptrain_worker_usage_age_seconds",
              "Time since each live worker's usage (memory, GPUs) was read.", "gauge");
  for (const auto& line : overview.workers) {
    if (has_usage(line.worker)) text.Sample(worker_labels(line.worker), line.usage_age_s);
  }
  text.Family("mptrain_worker_memory_available_bytes",
              "Host memory a live worker's ranks could take now: MemAvailable, or the room left "
              "under its cgroup's memory limit when smaller.",
              "gauge");
  for (const auto& line : overview.workers) {
    const v1::WorkerUsage& usage = line.worker.usage();
    if (!has_usage(line.worker) || usage.memory_total_bytes() == 0) continue;
    text.Sample(worker_labels(line.worker), static_cast<double>(usage.memory_available_bytes()));
  }
  text.Family("mptrain_worker_memory_total_bytes",
              "Host memory a live worker's ranks could have at most: MemTotal, or its cgroup's "
              "memory limit when smaller.",
              "gauge");
  for (const auto& line : overview.workers) {
    const v1::WorkerUsage& usage = line.worker.usage();
    if (!has_usage(line.worker) || usage.memory_total_bytes() == 0) continue;
    text.Sample(worker_labels(line.worker), static_cast<double>(usage.memory_total_bytes()));
  }

  struct GpuGauge {
    const char* name;
    const char* help;
    double (*value)(const v1::DeviceUsage&);
  };
  const GpuGauge gpu_gauges[] = {
      {"mptrain_worker_gpu_memory_used_bytes",
       "Memory in use on a live worker's GPU, by every process on it (NVML).",
       [](const v1::DeviceUsage& d) { return static_cast<double>(d.memory_used_bytes()); }},
      {"mptrain_worker_gpu_memory_total_bytes", "Memory of a live worker's GPU (NVML).",
       [](const v1::DeviceUsage& d) { return static_cast<double>(d.memory_total_bytes()); }},
      {"mptrain_worker_gpu_utilization_ratio",
       "Share of NVML's last sample period in which a kernel ran on a live worker's GPU (0 to "
       "1).",
       [](const v1::DeviceUsage& d) { return d.utilization_percent() / 100.0; }},
  };
  uint64_t omitted = 0;
  for (const GpuGauge& gauge : gpu_gauges) {
    text.Family(gauge.name, gauge.help, "gauge");
    size_t series = 0;
    omitted = 0;
    for (const auto& line : overview.workers) {
      if (!has_usage(line.worker)) continue;
      for (const v1::DeviceUsage& device : line.worker.usage().devices()) {
        if (!device.available()) continue;
        if (series == kMaxGpuSeries) {
          ++omitted;
          continue;
        }
        ++series;
        Labels labels = worker_labels(line.worker);
        labels.emplace_back("gpu", std::to_string(device.index()));
        text.Sample(labels, gauge.value(device));
      }
    }
  }
  text.Family("mptrain_worker_gpu_readings_omitted",
              "GPU readings left out of each mptrain_worker_gpu_* family, past its bound of "
              "series.",
              "gauge");
  text.Sample({}, static_cast<double>(omitted));
}

}  // namespace

void RpcMetrics::Record(const std::string& method, const std::string& code, double seconds) {
  const std::string& label = IsServedMethod(method) ? method : std::string(kUnknownMethod);
  std::lock_guard<std::mutex> lock(mu_);
  Method& m = methods_[label];
  m.calls_by_code[code] += 1;
  const size_t bucket =
      std::lower_bound(kBounds.begin(), kBounds.end(), seconds) - kBounds.begin();
  if (bucket < kBounds.size()) m.buckets[bucket] += 1;
  m.count += 1;
  m.sum += seconds;
}

std::map<std::string, RpcMetrics::Method> RpcMetrics::Snapshot() const {
  std::lock_guard<std::mutex> lock(mu_);
  return methods_;
}

std::string RenderMetrics(const CoordinatorState::Overview& overview, const RpcMetrics& rpcs) {
  PrometheusText text;

  text.Family("mptrain_build_info", "Always 1; the labels name the coordinator's build.",
              "gauge");
  // The version --version prints (git describe at build, common/build_version.h): the same
  // string in a scrape and on the command line.
  text.Sample({{"version", BuildVersion()}, {"assertions", kAssertions}}, 1);
  AppendProcessMetrics(text);

  text.Family("mptrain_jobs", "Jobs the coordinator holds, by state.", "gauge");
  for (v1::JobState state : {v1::PENDING, v1::RUNNING, v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    auto it = overview.jobs.find(state);
    text.Sample({{"state", Lower(v1::JobState_Name(state))}},
                it == overview.jobs.end() ? 0 : it->second);
  }
  text.Family("mptrain_jobs_submitted_total", "Jobs submitted since the coordinator started.",
              "counter");
  text.Sample({}, static_cast<double>(overview.submitted_total));
  text.Family("mptrain_jobs_ended_total", "Jobs that ended since the coordinator started.",
              "counter");
  for (v1::JobState state : {v1::SUCCEEDED, v1::FAILED, v1::CANCELLED}) {
    auto it = overview.ended_total.find(state);
    text.Sample({{"state", Lower(v1::JobState_Name(state))}},
                it == overview.ended_total.end() ? 0 : static_cast<double>(it->second));
  }
  text.Family("mptrain_jobs_restarted_total",
              "Restarts of jobs after failures (max_restarts) since the coordinator started.",
              "counter");
  text.Sample({}, static_cast<double>(overview.restarts_total));
  text.Family("mptrain_store_write_failures_total",
              "Job store commits that failed (a restart would lose those changes).", "counter");
  text.Sample({}, static_cast<double>(overview.store_write_failures_total));
  text.Family("mptrain_worker_registrations_refused_total",
              "Worker registrations refused, by reason (capacity: --max_live_workers were live; "
              "name_held: a live worker holds the name).",
              "counter");
  for (const char* reason : {"capacity", "name_held"}) {
    auto it = overview.worker_registrations_refused_total.find(reason);
    text.Sample({{"reason", reason}},
                it == overview.worker_registrations_refused_total.end()
                    ? 0
                    : static_cast<double>(it->second));
  }
  text.Family("mptrain_max_live_workers", "Live workers the coordinator admits at once.",
              "gauge");
  text.Sample({}, overview.max_live_workers);

  std::map<std::string, int> workers_by_state = {{"alive", 0}, {"lost", 0}};
  for (const auto& line : overview.workers) {
    workers_by_state[Lower(v1::WorkerState_Name(line.worker.state()))] += 1;
  }
  text.Family("mptrain_workers", "Worker daemons, by state.", "gauge");
  for (const auto& [state, count] : workers_by_state) text.Sample({{"state", state}}, count);
  const std::pair<const char*, int (v1::Worker::*)() const> slot_gauges[] = {
      {"mptrain_worker_slots", &v1::Worker::slots},
      {"mptrain_worker_free_slots", &v1::Worker::free_slots}};
  for (const auto& [name, slots] : slot_gauges) {
    text.Family(name, slots == &v1::Worker::slots ? "Slots of live workers."
                                                  : "Free slots of live workers.",
                "gauge");
    for (const auto& line : overview.workers) {
      if (line.worker.state() != v1::ALIVE) continue;
      text.Sample({{"worker", WorkerRegistry::NameOfId(line.worker.worker_id())},
                   {"host", line.worker.host()}, {"device", Lower(v1::DeviceKind_Name(line.worker.device()))}},
                  (line.worker.*slots)());
    }
  }
  text.Family("mptrain_worker_heartbeat_age_seconds",
              "Time since each live worker's last heartbeat.", "gauge");
  for (const auto& line : overview.workers) {
    if (line.worker.state() != v1::ALIVE) continue;
    text.Sample({{"worker", WorkerRegistry::NameOfId(line.worker.worker_id())},
                 {"host", line.worker.host()}},
                line.heartbeat_age_s);
  }
  AppendWorkerUsage(overview, text);

  // Per running job, and per job that ended in the last minutes (Overview::recently_ended, so
  // that a short job is scraped at least once): its latest telemetry record, and its latest
  // evaluation (kept until the next one, so that the eval gauges do not vanish between
  // evaluations). Labelled job_id, not job: `job` is the scrape target's own label.
  std::vector<const v1::Job*> jobs;
  for (const v1::Job& job : overview.running) jobs.push_back(&job);
  for (const v1::Job& job : overview.recently_ended) jobs.push_back(&job);
  auto job_labels = [](const v1::Job& job) -> Labels {
    return {{"job_id", job.job_id()}, {"name", job.spec().name()}};
  };
  struct JobMetric {
    const char* name;
    const char* help;
    const char* type;
    double (*value)(const v1::Job&);
  };
  const JobMetric metrics[] = {
      {"mptrain_job_step", "Latest optimizer step of a job.", "gauge",
       [](const v1::Job& j) { return static_cast<double>(j.latest_telemetry().step()); }},
      {"mptrain_job_steps", "Optimizer steps a job takes in all (JobSpec.steps).", "gauge",
       [](const v1::Job& j) { return static_cast<double>(j.spec().steps()); }},
      {"mptrain_job_loss", "Latest effective-batch loss, averaged over ranks.", "gauge",
       [](const v1::Job& j) { return j.latest_telemetry().loss(); }},
      {"mptrain_job_grad_norm", "Latest global gradient norm (unscaled, before clipping).",
       "gauge", [](const v1::Job& j) { return j.latest_telemetry().grad_norm(); }},
      {"mptrain_job_loss_scale", "Latest loss scale.", "gauge",
       [](const v1::Job& j) { return j.latest_telemetry().loss_scale(); }},
      {"mptrain_job_skipped_steps_total", "Optimizer steps skipped on overflow so far.",
       "counter",
       [](const v1::Job& j) { return static_cast<double>(j.latest_telemetry().skipped_total()); }},
      {"mptrain_job_samples_per_second", "Latest training throughput over all ranks.", "gauge",
       [](const v1::Job& j) { return j.latest_telemetry().samples_per_second(); }},
      {"mptrain_job_step_time_seconds", "Latest optimizer step's wall time.", "gauge",
       [](const v1::Job& j) { return j.latest_telemetry().step_time_ms() / 1000.0; }},
      {"mptrain_job_restarts_total", "Restarts of a job after failures so far.", "counter",
       [](const v1::Job& j) { return static_cast<double>(j.restarts()); }},
      {"mptrain_job_learning_rate", "The learning rate of the latest step.", "gauge",
       [](const v1::Job& j) { return j.latest_telemetry().lr(); }},
  };
  for (const JobMetric& metric : metrics) {
    text.Family(metric.name, metric.help, metric.type);
    for (const v1::Job* job : jobs) text.Sample(job_labels(*job), metric.value(*job));
  }
  text.Family("mptrain_job_ended_timestamp_seconds",
              "When a job that ended in the last minutes ended (Unix time); absent while it runs.",
              "gauge");
  for (const v1::Job& job : overview.recently_ended) {
    text.Sample(job_labels(job), job.finished_unix_ms() / 1000.0);
  }
  // Metrics a job has only when it computes them: training accuracy (classification; on every
  // record of such a job), and evaluation (JobSpec.eval_data; from the job's latest evaluation,
  // absent until its first).
  struct OptionalGauge {
    const char* name;
    const char* help;
    const v1::TelemetryRecord& (v1::Job::*record)() const;
    bool (v1::TelemetryRecord::*has)() const;
    double (*value)(const v1::TelemetryRecord&);
  };
  const OptionalGauge optional_gauges[] = {
      {"mptrain_job_accuracy", "Latest training-batch accuracy (classification).",
       &v1::Job::latest_telemetry, &v1::TelemetryRecord::has_accuracy,
       [](const v1::TelemetryRecord& r) { return r.accuracy(); }},
      {"mptrain_job_eval_step", "Optimizer step of the latest evaluation.",
       &v1::Job::latest_evaluation, &v1::TelemetryRecord::has_eval_loss,
       [](const v1::TelemetryRecord& r) { return static_cast<double>(r.step()); }},
      {"mptrain_job_eval_loss", "Loss over the held-out set at the latest evaluation.",
       &v1::Job::latest_evaluation, &v1::TelemetryRecord::has_eval_loss,
       [](const v1::TelemetryRecord& r) { return r.eval_loss(); }},
      {"mptrain_job_eval_accuracy", "Accuracy over the held-out set at the latest evaluation.",
       &v1::Job::latest_evaluation, &v1::TelemetryRecord::has_eval_accuracy,
       [](const v1::TelemetryRecord& r) { return r.eval_accuracy(); }},
  };
  for (const OptionalGauge& gauge : optional_gauges) {
    text.Family(gauge.name, gauge.help, "gauge");
    for (const v1::Job* job : jobs) {
      const v1::TelemetryRecord& record = (job->*gauge.record)();
      if (!(record.*gauge.has)()) continue;
      text.Sample(job_labels(*job), gauge.value(record));
    }
  }

  const std::map<std::string, RpcMetrics::Method> methods = rpcs.Snapshot();
  text.Family("mptrain_rpcs_total", "RPCs answered, by method and status code.", "counter");
  for (const auto& [full, method] : methods) {
    const auto [service, name] = SplitMethod(full);
    for (const auto& [code, calls] : method.calls_by_code) {
      text.Sample({{"service", service}, {"method", name}, {"code", code}},
                  static_cast<double>(calls));
    }
  }
  text.Family("mptrain_rpc_duration_seconds",
              "Time from a call's arrival to its answer (long polls include their wait).",
              "histogram");
  for (const auto& [full, method] : methods) {
    const auto [service, name] = SplitMethod(full);
    std::vector<uint64_t> cumulative;
    uint64_t running = 0;
    for (uint64_t count : method.buckets) cumulative.push_back(running += count);
    text.Histogram({{"service", service}, {"method", name}},
                   {RpcMetrics::kBounds.begin(), RpcMetrics::kBounds.end()}, cumulative,
                   method.sum, method.count);
  }
  return text.text();
}

}  // namespace mptrain
