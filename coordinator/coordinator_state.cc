#include "coordinator/coordinator_state.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/path_rules.h"
#include "common/resource_estimate.h"
#include "common/secrets.h"
#include "coordinator/placement.h"
#include "spdlog/spdlog.h"

namespace mptrain {
namespace {

int64_t SystemNowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

std::string AssignmentKey(const std::string& job_id, int rank, int attempt) {
  return absl::StrCat(job_id, "/", rank, "/", attempt);
}

// Client-supplied identifiers echoed in errors are cut short (they may be megabytes).
std::string Quote(const std::string& text) { return TruncateForError(text, 128); }

bool IsWorkerName(const std::string& name) {
  if (name.empty() || name.size() > 128) return false;
  for (char c : name) {
    bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '-' || c == '_' || c == '.' || c == ':' || c == '@';
    if (!ok) return false;
  }
  return true;
}

absl::Status CheckRoots(const char* field, const google::protobuf::RepeatedPtrField<std::string>& roots) {
  if (roots.size() > kMaxRootsPerKind) {
    return absl::InvalidArgumentError(absl::StrCat(field, " may list at most ", kMaxRootsPerKind,
                                                   " directories, got ", roots.size()));
  }
  for (int i = 0; i < roots.size(); ++i) {
    if (absl::Status status = CheckPathSyntax(absl::StrCat(field, "[", i, "]"), roots[i]);
        !status.ok()) {
      return status;
    }
  }
  return absl::OkStatus();
}

// The path fields of a spec: (field, path, whether the rank writes it).
struct SpecPath {
  std::string field;
  std::string path;
  bool write = false;
};

std::vector<SpecPath> SpecPaths(const v1::JobSpec& spec) {
  std::vector<SpecPath> paths;
  if (spec.data().has_npy()) {
    paths.push_back({"data.npy.features_path", spec.data().npy().features_path(), false});
    paths.push_back({"data.npy.targets_path", spec.data().npy().targets_path(), false});
  }
  if (!spec.init_checkpoint().empty()) {
    paths.push_back({"init_checkpoint", spec.init_checkpoint(), false});
  }
  if (!spec.output_checkpoint().empty()) {
    paths.push_back({"output_checkpoint", spec.output_checkpoint(), true});
  }
  if (!spec.checkpoint_dir().empty()) {
    paths.push_back({"checkpoint_dir", spec.checkpoint_dir(), true});
  }
  return paths;
}

}  // namespace

CoordinatorState::CoordinatorState(CoordinatorOptions options) : options_(std::move(options)) {
  if (!options_.now_ms) options_.now_ms = SystemNowMs;
}

// ---------------------------------------------------------------------------------------------
// Mutations and the job store
// ---------------------------------------------------------------------------------------------

std::vector<std::string> CoordinatorState::FinishMutation() {
  if (schedule_) {
    schedule_ = false;
    TrySchedule();
  }
  if (options_.store != nullptr && (!dirty_jobs_.empty() || !pending_batch_.empty())) {
    for (const std::string& job_id : dirty_jobs_) {
      if (const JobRecord* record = FindJob(job_id)) {
        pending_batch_.jobs.push_back(ToStored(*record));
      }
    }
    if (absl::Status status = options_.store->Commit(pending_batch_); !status.ok()) {
      // The state in memory is still right; what a restart would lose is said loudly.
      spdlog::error("could not write the job store (a coordinator restart would lose the "
                    "last changes): {}",
                    status.ToString());
    }
  }
  dirty_jobs_.clear();
  pending_batch_ = JobStore::Batch();
  std::vector<std::string> keys(wake_keys_.begin(), wake_keys_.end());
  wake_keys_.clear();
  return keys;
}

std::string CoordinatorState::WorkerKey(const std::string& worker_id) {
  return "worker:" + worker_id;
}

std::string CoordinatorState::JobKey(const std::string& job_id) { return "job:" + job_id; }

store::StoredJob CoordinatorState::ToStored(const JobRecord& record) const {
  store::StoredJob stored;
  *stored.mutable_job() = record.job;
  stored.mutable_job()->clear_spec();  // Written once, when the job was new.
  stored.set_number(record.number);
  stored.set_queued_since_ms(record.queued_since_ms);
  stored.set_rank_memory_bytes(record.rank_memory_bytes);
  stored.set_attempt(record.attempt);
  for (const auto& [attempt, secrets] : record.rank_secrets) {
    auto& out = (*stored.mutable_rank_secrets())[attempt];
    for (const std::string& secret : secrets) out.add_secret(secret);
  }
  for (const auto& [key, value] : record.kv.values()) (*stored.mutable_kv())[key] = value;
  stored.set_last_sequence(record.events.last_sequence());
  return stored;
}

absl::Status CoordinatorState::Restore() {
  if (options_.store == nullptr) return absl::OkStatus();
  absl::StatusOr<JobStore::Snapshot> snapshot = options_.store->Load();
  if (!snapshot.ok()) return snapshot.status();
  Mutation mutation(this);
  const int64_t now = options_.now_ms();
  next_job_number_ = std::max<int64_t>(next_job_number_, snapshot->next_job_number);
  std::vector<JobRecord*> finished;
  int running = 0;
  for (store::StoredJob& stored : snapshot->jobs) {
    auto record = std::make_unique<JobRecord>(options_);
    record->job = stored.job();
    *record->job.mutable_spec() = snapshot->specs[stored.number()];
    record->number = stored.number();
    record->queued_since_ms = stored.queued_since_ms();
    record->rank_memory_bytes = stored.rank_memory_bytes();
    record->attempt = stored.attempt();
    for (const auto& [attempt, secrets] : stored.rank_secrets()) {
      record->rank_secrets[attempt].assign(secrets.secret().begin(), secrets.secret().end());
    }
    for (const auto& [key, value] : stored.kv()) record->kv.Set(key, value).IgnoreError();
    auto& events = snapshot->events[stored.number()];
    record->events.Restore(std::move(events), stored.last_sequence());
    record->ranks.resize(record->job.spec().world_size());
    for (const v1::RankProgress& progress : record->job.progress()) {
      if (progress.rank() < 0 || progress.rank() >= static_cast<int>(record->ranks.size())) {
        continue;
      }
      RankRecord& rank = record->ranks[progress.rank()];
      rank.result_reported = progress.finished() || !progress.error().empty();
      rank.checksum = progress.parameter_checksum();
      rank.step = progress.step();
      rank.last_report_ms = rank.last_progress_ms = now;
    }
    next_job_number_ = std::max(next_job_number_, record->number + 1);
    const std::string job_id = record->job.job_id();
    if (!record->job.request_id().empty()) job_by_request_id_[record->job.request_id()] = job_id;
    job_order_[record->number] = job_id;
    JobRecord* raw = record.get();
    jobs_[job_id] = std::move(record);
    if (raw->job.state() == v1::PENDING) {
      pending_.push_back(job_id);
    } else if (IsTerminal(raw->job.state())) {
      finished.push_back(raw);
    } else if (raw->job.state() == v1::RUNNING) {
      // Its ranks may well be training still: their workers will report them.
      ++running;
      for (size_t rank = 0; rank < raw->ranks.size(); ++rank) {
        if (!raw->ranks[rank].result_reported) raw->awaiting_adoption.insert(rank);
      }
      raw->adopt_deadline_ms = now + options_.adopt_grace_ms;
      if (raw->awaiting_adoption.empty()) {
        // Every rank had reported before the restart: end the job as it would have ended.
        std::string error;
        for (const v1::RankProgress& progress : raw->job.progress()) {
          if (error.empty() && !progress.error().empty()) {
            error = absl::StrCat(DescribeRank(*raw, progress.rank()), " failed: ",
                                 progress.error());
          }
        }
        if (error.empty()) {
          MaybeFinishJob(raw);
        } else {
          FailJob(raw, error);
        }
      }
    }
  }
  std::sort(finished.begin(), finished.end(), [](const JobRecord* a, const JobRecord* b) {
    return a->job.finished_unix_ms() < b->job.finished_unix_ms();
  });
  for (const JobRecord* record : finished) finished_.push_back(record->job.job_id());
  spdlog::info("restored {} job(s) from the job store: {} running (awaiting their ranks for up "
               "to {} s), {} pending, {} ended; next job number {}",
               jobs_.size(), running, options_.adopt_grace_ms / 1000.0, pending_.size(),
               finished_.size(), next_job_number_);
  return absl::OkStatus();
}

void CoordinatorState::AdoptRunningRanks(WorkerRecord* worker,
                                         const v1::PollAssignmentsRequest& request) {
  for (const v1::Assignment& running : request.running()) {
    JobRecord* record = FindJob(running.job_id());
    if (record == nullptr || record->job.state() != v1::RUNNING ||
        record->attempt != running.attempt() ||
        !record->awaiting_adoption.count(running.rank()) ||
        // Proof that this worker runs the rank: it holds the rank's secret.
        !CheckRankSecret(*record, running.attempt(), running.rank(), running.rank_secret())
             .ok()) {
      continue;
    }
    const int slot = running.device_index();
    if (slot < 0 || slot >= worker->info.slots() || worker->busy_slots.count(slot)) continue;
    worker->busy_slots[slot] = BusySlot{record->job.job_id(), running.rank(), record->attempt};
    for (v1::RankPlacement& placement : *record->job.mutable_placement()) {
      if (placement.rank() != running.rank()) continue;
      placement.set_worker_id(worker->info.worker_id());
      placement.set_host(worker->info.host());
      placement.set_device_index(slot);
    }
    record->awaiting_adoption.erase(running.rank());
    spdlog::info("job {}: rank {} re-adopted on worker {}{}", record->job.job_id(),
                 running.rank(), worker->info.worker_id(),
                 record->awaiting_adoption.empty() ? " (every rank is back)" : "");
    Touch(record);
  }
}

void CoordinatorState::ExpireAdoptions(int64_t now) {
  for (auto& [id, record] : jobs_) {
    if (record->job.state() != v1::RUNNING || record->awaiting_adoption.empty() ||
        now < record->adopt_deadline_ms) {
      continue;
    }
    std::string ranks;
    for (int rank : record->awaiting_adoption) {
      absl::StrAppend(&ranks, ranks.empty() ? "" : ", ", rank);
    }
    record->awaiting_adoption.clear();
    FailJob(record.get(),
            absl::StrFormat("rank %s did not come back within adopt_grace_s %g after the "
                            "coordinator restarted",
                            ranks, options_.adopt_grace_ms / 1000.0));
    schedule_ = true;
  }
}

bool CoordinatorState::IsTerminal(v1::JobState state) const {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

CoordinatorState::JobRecord* CoordinatorState::FindJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const CoordinatorState::JobRecord* CoordinatorState::FindJob(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

absl::StatusOr<CoordinatorState::WorkerRecord*> CoordinatorState::FindLiveWorker(
    const std::string& worker_id, uint64_t incarnation, const std::string& secret) {
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(
        absl::StrCat("unknown worker ", Quote(worker_id), "; register again"));
  }
  WorkerRecord& worker = it->second;
  // The secret first: without it nothing about the worker is revealed or changed.
  if (!SecretsEqual(worker.secret, secret)) {
    return absl::PermissionDeniedError(
        absl::StrCat("the worker secret does not match worker ", Quote(worker_id)));
  }
  if (worker.info.incarnation() != incarnation) {
    return absl::NotFoundError(absl::StrCat("worker ", worker_id, " has incarnation ",
                                            worker.info.incarnation(), ", not ", incarnation,
                                            "; register again"));
  }
  if (worker.info.state() != v1::ALIVE) {
    return absl::NotFoundError(
        absl::StrCat("worker ", worker_id, " was marked lost; register again"));
  }
  return &worker;
}

// ---------------------------------------------------------------------------------------------
// Jobs
// ---------------------------------------------------------------------------------------------

absl::StatusOr<v1::SubmitJobResponse> CoordinatorState::SubmitJob(
    const v1::SubmitJobRequest& request, const std::string& owner) {
  if (const size_t bytes = request.spec().ByteSizeLong(); bytes > kMaxSpecBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("spec is ", bytes, " bytes; the limit is ", kMaxSpecBytes));
  }
  if (request.request_id().size() > kMaxRequestIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("request_id is ", request.request_id().size(),
                                                   " bytes; the limit is ", kMaxRequestIdBytes));
  }
  v1::JobSpec spec = request.spec();
  ApplyJobSpecDefaults(&spec);
  if (absl::Status status = ValidateJobSpec(spec); !status.ok()) return status;

  const RankMemoryEstimate memory = EstimateRankMemory(spec);

  Mutation mutation(this);
  if (absl::Status status = CheckSpecPaths(spec); !status.ok()) return status;
  if (!request.request_id().empty()) {
    auto it = job_by_request_id_.find(request.request_id());
    if (it != job_by_request_id_.end()) {
      v1::SubmitJobResponse response;
      response.set_job_id(it->second);
      response.set_state(jobs_.at(it->second)->job.state());
      return response;
    }
  }
  EvictOldRecords(options_.now_ms());
  if (pending_.size() >= options_.max_pending_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full (", pending_.size(), " jobs wait; the limit is ",
        options_.max_pending_jobs, "): try again when some have been placed"));
  }
  // A job no live worker could ever hold is refused now rather than queued for ever. (With no
  // worker of its kind yet, it waits: workers may still come.)
  int64_t largest = -1;
  for (const auto& [id, worker] : workers_) {
    if (worker.info.state() != v1::ALIVE || worker.info.device() != spec.device()) continue;
    for (int slot = 0; slot < worker.info.slots(); ++slot) {
      const int64_t capacity = SlotMemory(worker, slot);
      largest = capacity == 0 ? std::numeric_limits<int64_t>::max() : std::max(largest, capacity);
    }
  }
  if (largest >= 0 && memory.total > largest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model does not fit: a rank needs about ", memory.Describe(), "; the largest ",
        v1::DeviceKind_Name(spec.device()), " worker offers ", FormatBytes(largest),
        " per rank (model, micro_batch_size and accumulation_steps set the need)"));
  }
  auto record = std::make_unique<JobRecord>(options_);
  record->number = next_job_number_++;
  record->queued_since_ms = options_.now_ms();
  record->rank_memory_bytes = memory.total;
  std::string job_id = absl::StrFormat("job-%04d", record->number);
  record->job.set_job_id(job_id);
  *record->job.mutable_spec() = spec;
  record->job.set_state(v1::PENDING);
  record->job.set_submitted_unix_ms(options_.now_ms());
  record->job.set_request_id(request.request_id());
  record->job.set_owner(owner);
  record->job.set_estimated_rank_memory_bytes(memory.total);
  record->ranks.resize(spec.world_size());
  for (int rank = 0; rank < spec.world_size(); ++rank) {
    record->job.add_progress()->set_rank(rank);
  }
  if (!request.request_id().empty()) job_by_request_id_[request.request_id()] = job_id;
  job_order_[record->number] = job_id;
  jobs_[job_id] = std::move(record);
  pending_.push_back(job_id);
  spdlog::info("job {} submitted: {} ranks on {}", job_id, spec.world_size(),
               v1::DeviceKind_Name(spec.device()));
  JobRecord* created = FindJob(job_id);
  pending_batch_.new_specs[created->number] = spec;
  pending_batch_.next_job_number = next_job_number_;
  Touch(created);
  TrySchedule();  // Now, so that the answer says whether it was placed.

  v1::SubmitJobResponse response;
  response.set_job_id(job_id);
  response.set_state(jobs_.at(job_id)->job.state());
  return response;
}

absl::StatusOr<v1::Job> CoordinatorState::GetJob(const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobRecord* record = FindJob(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  return record->job;
}

absl::StatusOr<v1::ListJobsResponse> CoordinatorState::ListJobs(
    const v1::ListJobsRequest& request) const {
  if (request.page_size() < 0 || request.page_size() > kMaxListPageSize) {
    return absl::InvalidArgumentError(absl::StrCat("page_size must be in [0, ", kMaxListPageSize,
                                                   "] (0 = ", kDefaultListPageSize, "), got ",
                                                   request.page_size()));
  }
  const int page_size = request.page_size() == 0 ? kDefaultListPageSize : request.page_size();
  // The token is the number of the last job of the previous page.
  int64_t after = 0;
  if (!request.page_token().empty() &&
      (request.page_token().size() > 18 ||
       request.page_token().find_first_not_of("0123456789") != std::string::npos ||
       !absl::SimpleAtoi(request.page_token(), &after))) {
    return absl::InvalidArgumentError("page_token is malformed: pass next_page_token back as is");
  }
  std::lock_guard<std::mutex> lock(mu_);
  v1::ListJobsResponse response;
  for (auto it = job_order_.upper_bound(after); it != job_order_.end(); ++it) {
    const v1::Job& job = jobs_.at(it->second)->job;
    if (request.state() != v1::JOB_STATE_UNSPECIFIED && job.state() != request.state()) continue;
    if (response.jobs_size() == page_size) {
      response.set_next_page_token(std::to_string(std::prev(it)->first));
      break;
    }
    v1::Job* listed = response.add_jobs();
    *listed = job;
    // A spec may be a megabyte; a listing shows a few of its fields (GetJob has it all).
    v1::JobSpec brief;
    brief.set_name(job.spec().name());
    brief.set_world_size(job.spec().world_size());
    brief.set_device(job.spec().device());
    brief.set_steps(job.spec().steps());
    brief.set_precision(job.spec().precision());
    *listed->mutable_spec() = std::move(brief);
  }
  return response;
}

absl::StatusOr<v1::JobState> CoordinatorState::CancelJob(const std::string& job_id,
                                                         const std::string& principal,
                                                         bool admin) {
  Mutation mutation(this);
  JobRecord* record = FindJob(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  if (!admin && record->job.owner() != principal) {
    return absl::PermissionDeniedError(
        absl::StrCat("job ", job_id, " belongs to ", record->job.owner(), "; ", principal,
                     " may not cancel it (cancelling another principal's job needs admin)"));
  }
  if (IsTerminal(record->job.state())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " already ended as ", v1::JobState_Name(record->job.state())));
  }
  SetJobState(record, v1::CANCELLED, absl::StrCat("cancelled by ", principal));
  schedule_ = true;
  return record->job.state();
}

std::vector<v1::Worker> CoordinatorState::ListWorkers() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<v1::Worker> workers;
  for (const auto& [id, worker] : workers_) {
    v1::Worker info = worker.info;
    info.set_free_slots(worker.info.state() == v1::ALIVE
                            ? worker.info.slots() - static_cast<int>(worker.busy_slots.size())
                            : 0);
    workers.push_back(info);
  }
  return workers;
}

absl::StatusOr<v1::WatchJobEvent> CoordinatorState::WatchSnapshot(
    const std::string& job_id) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobRecord* record = FindJob(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  v1::WatchJobEvent event;
  event.set_sequence(record->events.last_sequence());
  *event.mutable_snapshot() = record->job;
  return event;
}

absl::StatusOr<CoordinatorState::WatchBatch> CoordinatorState::JobEventsSince(
    const std::string& job_id, int64_t after_sequence) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobRecord* record = FindJob(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  WatchBatch batch;
  batch.events = record->events.Since(after_sequence);
  // The terminal state change is always the job's last event.
  batch.finished = IsTerminal(record->job.state()) &&
                   (batch.events.empty() ||
                    batch.events.back().sequence() == record->events.last_sequence());
  return batch;
}

void CoordinatorState::AppendEvent(JobRecord* record, v1::WatchJobEvent event) {
  // A state change concerns the job's workers too; telemetry only its watchers.
  const bool state_change = event.has_state_change();
  pending_batch_.events.push_back({record->number, record->events.Append(std::move(event))});
  Touch(record, state_change);
}

void CoordinatorState::Touch(JobRecord* record, bool workers_too) {
  dirty_jobs_.insert(record->job.job_id());
  // Whoever waits on the job (a watch, a key-value get) looks again, and, when its placement,
  // state or ranks changed, so do the workers that run it.
  wake_keys_.insert(JobKey(record->job.job_id()));
  if (!workers_too) return;
  for (const v1::RankPlacement& placement : record->job.placement()) {
    wake_keys_.insert(WorkerKey(placement.worker_id()));
  }
}

void CoordinatorState::SetJobState(JobRecord* record, v1::JobState state,
                                   const std::string& error) {
  if (record->job.state() == state) return;
  record->job.set_state(state);
  if (!error.empty()) record->job.set_error(error);
  if (state == v1::RUNNING) record->job.set_started_unix_ms(options_.now_ms());
  if (state != v1::PENDING) record->job.clear_pending_reason();
  if (IsTerminal(state)) {
    record->job.set_finished_unix_ms(options_.now_ms());
    pending_.erase(std::remove(pending_.begin(), pending_.end(), record->job.job_id()),
                   pending_.end());
    ReleaseSlots(record);
    record->kv.Clear();
    finished_.push_back(record->job.job_id());
  }
  if (state == v1::FAILED) {
    spdlog::warn("job {} FAILED: {}", record->job.job_id(), error);
  } else {
    spdlog::info("job {} {}{}", record->job.job_id(), v1::JobState_Name(state),
                 error.empty() ? "" : ": " + error);
  }
  v1::WatchJobEvent event;
  event.mutable_state_change()->set_state(state);
  event.mutable_state_change()->set_error(error);
  AppendEvent(record, std::move(event));
  if (IsTerminal(state)) {
    // Nobody reports to a finished job any more: keep its recent history only.
    record->events.Shrink(options_.max_events_per_finished_job);
    pending_batch_.keep_events_after[record->number] = std::max<int64_t>(
        0, record->events.last_sequence() -
               static_cast<int64_t>(options_.max_events_per_finished_job));
    // Not this job: callers still hold it. Older ones go at the next housekeeping pass.
  }
}

void CoordinatorState::FailJob(JobRecord* record, const std::string& error, bool restartable) {
  if (IsTerminal(record->job.state())) return;
  std::string full = error;
  if (!record->consequence_error.empty() && record->consequence_error != error) {
    absl::StrAppend(&full, "; then ", record->consequence_error);
  }
  record->consequence_error.clear();
  record->consequence_deadline_ms = 0;
  record->job.add_failures(full);
  if (restartable && record->job.state() == v1::RUNNING &&
      record->job.restarts() < record->job.spec().max_restarts()) {
    // Like torchrun's --max-restarts: place the job again (new attempt: fresh key-value
    // namespace, fresh NCCL unique id); its ranks resume from the latest checkpoint. The old
    // attempt's ranks fall out of their workers' desired sets and are stopped.
    record->job.set_restarts(record->job.restarts() + 1);
    ReleaseSlots(record);
    record->kv.Clear();
    record->job.set_state(v1::PENDING);
    record->queued_since_ms = options_.now_ms();
    pending_.push_front(record->job.job_id());
    const std::string note = absl::StrCat(
        "restart ", record->job.restarts(), " of ", record->job.spec().max_restarts(),
        record->job.latest_checkpoint_path().empty()
            ? " from the beginning"
            : absl::StrCat(" from the checkpoint of step ", record->job.latest_checkpoint_step()),
        " after: ", full);
    spdlog::warn("job {}: {}", record->job.job_id(), note);
    v1::WatchJobEvent event;
    event.mutable_state_change()->set_state(v1::PENDING);
    event.mutable_state_change()->set_error(note);
    AppendEvent(record, std::move(event));
    return;
  }
  SetJobState(record, v1::FAILED, full);
}

void CoordinatorState::CheckProgress(JobRecord* record, int64_t now) {
  const int64_t timeout_ms =
      static_cast<int64_t>(record->job.spec().progress_timeout_s() * 1000);
  if (timeout_ms <= 0) return;
  // Ranks report every half second while alive, progress or not. A rank that stopped
  // reporting (hung or stopped process) is the root cause; ranks that report but do not
  // advance are waiting for it in a collective. So once any rank has made no progress for the
  // timeout, the rank silent the longest (past a few report intervals) is named first.
  const int64_t silent_ms = std::clamp<int64_t>(timeout_ms / 2, 1'500, 10'000);
  int silent = -1, stalled = -1;
  for (size_t rank = 0; rank < record->ranks.size(); ++rank) {
    const RankRecord& r = record->ranks[rank];
    if (r.result_reported || r.exited) continue;
    if (now - r.last_progress_ms > timeout_ms && stalled < 0) stalled = static_cast<int>(rank);
    const int64_t quiet = now - r.last_report_ms;
    if (quiet > silent_ms &&
        (silent < 0 || r.last_report_ms < record->ranks[silent].last_report_ms)) {
      silent = static_cast<int>(rank);
    }
  }
  if (stalled < 0 && (silent < 0 || now - record->ranks[silent].last_report_ms <= timeout_ms)) {
    return;
  }
  if (silent >= 0) {
    const RankRecord& r = record->ranks[silent];
    FailJob(record, absl::StrFormat("%s stopped responding: no report for %.1f s (last step %d; "
                                    "progress_timeout_s %g)",
                                    DescribeRank(*record, silent),
                                    (now - r.last_report_ms) / 1000.0, r.step,
                                    record->job.spec().progress_timeout_s()));
  } else if (stalled >= 0) {
    const RankRecord& r = record->ranks[stalled];
    FailJob(record, absl::StrFormat("%s made no progress for %.1f s (stuck after step %d; "
                                    "progress_timeout_s %g)",
                                    DescribeRank(*record, stalled),
                                    (now - r.last_progress_ms) / 1000.0, r.step,
                                    record->job.spec().progress_timeout_s()));
  }
}

void CoordinatorState::ReleaseSlots(JobRecord* record) {
  for (auto& [id, worker] : workers_) {
    for (auto it = worker.busy_slots.begin(); it != worker.busy_slots.end();) {
      const BusySlot& slot = it->second;
      const bool gone = slot.job_id == record->job.job_id() && slot.attempt == record->attempt &&
                        record->ranks[slot.rank].exited;
      it = gone ? worker.busy_slots.erase(it) : std::next(it);
    }
  }
}

bool CoordinatorState::SlotIsCurrent(const BusySlot& slot) const {
  const JobRecord* record = FindJob(slot.job_id);
  return record != nullptr && record->job.state() == v1::RUNNING &&
         record->attempt == slot.attempt;
}

bool CoordinatorState::FreeDrainingSlots(WorkerRecord* worker, const std::set<std::string>* running,
                                         const std::string& exited_key) {
  bool freed = false;
  for (auto it = worker->busy_slots.begin(); it != worker->busy_slots.end();) {
    const BusySlot& slot = it->second;
    const std::string key = AssignmentKey(slot.job_id, slot.rank, slot.attempt);
    const bool gone = !SlotIsCurrent(slot) &&
                      (key == exited_key || (running != nullptr && !running->count(key)));
    if (gone) {
      it = worker->busy_slots.erase(it);
      freed = true;
    } else {
      ++it;
    }
  }
  return freed;
}

std::string CoordinatorState::DescribeRank(const JobRecord& record, int rank) const {
  for (const v1::RankPlacement& placement : record.job.placement()) {
    if (placement.rank() == rank) {
      return absl::StrCat("rank ", rank, " on worker ", placement.worker_id(), " (",
                          placement.host(), ")");
    }
  }
  return absl::StrCat("rank ", rank);
}

int64_t CoordinatorState::SlotMemory(const WorkerRecord& worker, int slot) const {
  if (worker.info.device() == v1::CUDA) {
    for (const v1::DeviceInfo& device : worker.info.devices()) {
      if (device.index() == slot) return device.memory_bytes();
    }
    return 0;
  }
  // CPU ranks of one worker share its memory.
  return worker.info.memory_bytes() / std::max(1, worker.info.slots());
}

std::string CoordinatorState::PendingReason(const JobRecord& record) const {
  const v1::JobSpec& spec = record.job.spec();
  const std::string kind = absl::AsciiStrToLower(v1::DeviceKind_Name(spec.device()));
  int total = 0, free = 0, too_small = 0, workers = 0;
  for (const auto& [id, worker] : workers_) {
    if (worker.info.state() != v1::ALIVE || worker.info.device() != spec.device()) continue;
    ++workers;
    for (int slot = 0; slot < worker.info.slots(); ++slot) {
      const int64_t capacity = SlotMemory(worker, slot);
      if (capacity != 0 && capacity < record.rank_memory_bytes) {
        ++too_small;
        continue;
      }
      ++total;
      if (!worker.busy_slots.count(slot)) ++free;
    }
  }
  if (workers == 0) return absl::StrCat("no live ", kind, " worker");
  const std::string small =
      too_small == 0 ? ""
                     : absl::StrCat(" (", too_small, " more have less than the ",
                                    FormatBytes(record.rank_memory_bytes), " a rank needs)");
  if (total < spec.world_size()) {
    return absl::StrCat("needs ", spec.world_size(), " ", kind, " slots; ", total, " exist",
                        small);
  }
  return absl::StrCat("needs ", spec.world_size(), " free ", kind, " slots; ", free, " of ",
                      total, " are free", small);
}

void CoordinatorState::TrySchedule() {
  // First-in first-out among the jobs that can be placed now: a job that must wait for slots
  // (or for workers that do not exist yet) does not hold back the jobs behind it.
  for (auto it = pending_.begin(); it != pending_.end();) {
    JobRecord* record = FindJob(*it);
    const v1::JobSpec& spec = record->job.spec();
    std::vector<WorkerSlots> candidates;
    for (const auto& [id, worker] : workers_) {
      if (worker.info.state() != v1::ALIVE || worker.info.device() != spec.device() ||
          worker.awaiting_first_poll) {
        continue;
      }
      WorkerSlots slots{id, {}};
      for (int slot = 0; slot < worker.info.slots(); ++slot) {
        const int64_t capacity = SlotMemory(worker, slot);
        const bool fits = capacity == 0 || capacity >= record->rank_memory_bytes;
        if (fits && !worker.busy_slots.count(slot)) slots.free_slots.push_back(slot);
      }
      candidates.push_back(std::move(slots));
    }
    auto placement = PlaceRanks(spec.world_size(), candidates);
    if (!placement) {
      record->job.set_pending_reason(PendingReason(*record));
      ++it;
      continue;
    }
    it = pending_.erase(it);
    record->attempt += 1;
    record->kv.Clear();
    std::vector<std::string>& secrets = record->rank_secrets[record->attempt];
    for (int rank = 0; rank < spec.world_size(); ++rank) secrets.push_back(RandomSecret());
    record->job.clear_placement();
    for (const RankSlot& rank_slot : *placement) {
      WorkerRecord& worker = workers_.at(rank_slot.worker_id);
      worker.busy_slots[rank_slot.slot] =
          BusySlot{record->job.job_id(), rank_slot.rank, record->attempt};
      v1::RankPlacement* out = record->job.add_placement();
      out->set_rank(rank_slot.rank);
      out->set_worker_id(rank_slot.worker_id);
      out->set_host(worker.info.host());
      out->set_device_index(rank_slot.slot);
    }
    for (RankRecord& rank : record->ranks) {
      rank = RankRecord{};
      rank.last_report_ms = rank.last_progress_ms = options_.now_ms();
    }
    for (v1::RankProgress& progress : *record->job.mutable_progress()) {
      progress.set_finished(false);
      progress.clear_parameter_checksum();
      progress.clear_error();
    }
    record->consequence_error.clear();
    record->consequence_deadline_ms = 0;
    SetJobState(record, v1::RUNNING, "");
  }
}

void CoordinatorState::ExpireQueuedJobs(int64_t now) {
  std::vector<JobRecord*> expired;
  for (const std::string& job_id : pending_) {
    JobRecord* record = FindJob(job_id);
    const double timeout_s = record->job.spec().queue_timeout_s();
    if (timeout_s > 0 && now - record->queued_since_ms > static_cast<int64_t>(timeout_s * 1000)) {
      expired.push_back(record);
    }
  }
  for (JobRecord* record : expired) {
    FailJob(record,
            absl::StrFormat("not placed within queue_timeout_s %g: %s",
                            record->job.spec().queue_timeout_s(), PendingReason(*record)),
            /*restartable=*/false);
  }
}

void CoordinatorState::EvictOldRecords(int64_t now) {
  while (!finished_.empty()) {
    const JobRecord* oldest = FindJob(finished_.front());
    if (oldest != nullptr && finished_.size() <= options_.max_finished_jobs &&
        now - oldest->job.finished_unix_ms() <= options_.finished_job_retention_ms) {
      break;
    }
    if (oldest != nullptr) {
      pending_batch_.deleted.push_back(oldest->number);
      dirty_jobs_.erase(oldest->job.job_id());
      if (!oldest->job.request_id().empty()) job_by_request_id_.erase(oldest->job.request_id());
      job_order_.erase(oldest->number);
      jobs_.erase(finished_.front());
    }
    finished_.pop_front();
  }
  while (lost_workers_.size() > options_.max_lost_workers) {
    workers_.erase(lost_workers_.front());
    lost_workers_.pop_front();
  }
}

void CoordinatorState::MaybeFinishJob(JobRecord* record) {
  if (IsTerminal(record->job.state())) return;
  for (const RankRecord& rank : record->ranks) {
    if (!rank.result_reported) return;
  }
  const std::string& reference = record->ranks[0].checksum;
  for (size_t rank = 1; rank < record->ranks.size(); ++rank) {
    if (record->ranks[rank].checksum != reference) {
      FailJob(record,
              absl::StrCat("parameters diverged across ranks: rank 0 has checksum ", reference,
                           ", rank ", rank, " has ", record->ranks[rank].checksum),
              /*restartable=*/false);
      return;
    }
  }
  SetJobState(record, v1::SUCCEEDED, "");
  schedule_ = true;
}

// ---------------------------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------------------------

absl::StatusOr<v1::RegisterWorkerResponse> CoordinatorState::RegisterWorker(
    const v1::RegisterWorkerRequest& request, const std::string& principal) {
  if (request.slots() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("slots must be >= 1, got ", request.slots()));
  }
  if (request.device() != v1::CPU && request.device() != v1::CUDA) {
    return absl::InvalidArgumentError("device must be cpu or cuda");
  }
  if (request.host().empty() || request.host().size() > 255) {
    return absl::InvalidArgumentError("host must be set, at most 255 bytes");
  }
  std::string name = request.name().empty() ? request.host() : request.name();
  if (!IsWorkerName(name)) {
    return absl::InvalidArgumentError(
        "name must be 1 to 128 characters of [A-Za-z0-9._:@-]");
  }
  if (absl::Status status = CheckRoots("data_roots", request.data_roots()); !status.ok()) {
    return status;
  }
  if (absl::Status status = CheckRoots("output_roots", request.output_roots()); !status.ok()) {
    return status;
  }

  Mutation mutation(this);
  for (auto& [id, worker] : workers_) {
    if (worker.name == name && worker.info.state() == v1::ALIVE &&
        worker.info.incarnation() == request.incarnation() &&
        !request.registration_nonce().empty() &&
        SecretsEqual(worker.registration_nonce, request.registration_nonce())) {
      // The same daemon again: its first answer was lost (a client-side deadline).
      v1::RegisterWorkerResponse response;
      response.set_worker_id(id);
      response.set_heartbeat_interval_ms(
          std::max<int64_t>(100, options_.heartbeat_timeout_ms / 3));
      response.set_worker_secret(worker.secret);
      return response;
    }
    if (worker.name == name && worker.info.state() == v1::ALIVE) {
      // Taking over a live worker's name would hand its ranks' slots to whoever asks.
      return absl::AlreadyExistsError(absl::StrCat(
          "worker name ", name, " is held by live worker ", id,
          "; it frees when that worker deregisters or misses heartbeats for ",
          options_.heartbeat_timeout_ms / 1000.0, " s"));
    }
  }
  WorkerRecord worker;
  worker.name = name;
  worker.secret = RandomSecret();
  worker.registration_nonce = request.registration_nonce();
  for (const auto& [id, record] : jobs_) {
    worker.awaiting_first_poll |= !record->awaiting_adoption.empty();
  }
  std::string worker_id = absl::StrCat(name, "#", next_worker_number_++);
  worker.info.set_worker_id(worker_id);
  worker.info.set_host(request.host());
  worker.info.set_device(request.device());
  worker.info.set_slots(request.slots());
  *worker.info.mutable_devices() = request.devices();
  worker.info.set_incarnation(request.incarnation());
  worker.info.set_state(v1::ALIVE);
  worker.info.set_last_heartbeat_unix_ms(options_.now_ms());
  *worker.info.mutable_data_roots() = request.data_roots();
  *worker.info.mutable_output_roots() = request.output_roots();
  worker.info.set_memory_bytes(std::max<int64_t>(0, request.memory_bytes()));
  worker.info.set_principal(principal);
  const std::string secret = worker.secret;
  workers_[worker_id] = std::move(worker);
  spdlog::info("worker {} registered: host {}, {} {} slot(s)", worker_id, request.host(),
               request.slots(), v1::DeviceKind_Name(request.device()));
  schedule_ = true;

  v1::RegisterWorkerResponse response;
  response.set_worker_id(worker_id);
  // A third of the timeout: two heartbeats can be lost before the worker is declared lost.
  response.set_heartbeat_interval_ms(std::max<int64_t>(100, options_.heartbeat_timeout_ms / 3));
  response.set_worker_secret(secret);
  return response;
}

absl::Status CoordinatorState::Heartbeat(const v1::HeartbeatRequest& request) {
  Mutation mutation(this);
  auto worker =
      FindLiveWorker(request.worker_id(), request.incarnation(), request.worker_secret());
  if (!worker.ok()) return worker.status();
  (*worker)->info.set_last_heartbeat_unix_ms(options_.now_ms());
  return absl::OkStatus();
}

absl::Status CoordinatorState::DeregisterWorker(const v1::DeregisterWorkerRequest& request) {
  Mutation mutation(this);
  auto worker =
      FindLiveWorker(request.worker_id(), request.incarnation(), request.worker_secret());
  if (!worker.ok()) return worker.status();
  const std::string& reason = request.reason();
  MarkWorkerLost(*worker, absl::StrCat("worker ", request.worker_id(), " (",
                                       (*worker)->info.host(), ") left: ",
                                       reason.empty() ? "shut down" : TruncateForError(reason, 256)));
  schedule_ = true;
  return absl::OkStatus();
}

void CoordinatorState::MarkWorkerLost(WorkerRecord* worker, const std::string& why) {
  worker->info.set_state(v1::LOST);
  lost_workers_.push_back(worker->info.worker_id());
  spdlog::warn("{}", why);
  std::map<std::string, std::vector<int>> affected;  // job -> its ranks here
  for (const auto& [index, slot] : worker->busy_slots) {
    if (SlotIsCurrent(slot)) affected[slot.job_id].push_back(slot.rank);
  }
  // The worker's processes are gone with it (or will be): nothing here drains any more.
  worker->busy_slots.clear();
  for (const auto& [job_id, ranks] : affected) {
    std::string rank_list;
    for (int rank : ranks) absl::StrAppend(&rank_list, rank_list.empty() ? "" : ", ", rank);
    FailJob(FindJob(job_id), absl::StrCat(why, "; it held rank ", rank_list, " of this job"));
  }
  wake_keys_.insert(WorkerKey(worker->info.worker_id()));  // Its poll answers NOT_FOUND now.
}

void CoordinatorState::CheckLiveness() {
  Mutation mutation(this);
  int64_t now = options_.now_ms();
  bool lost_any = false;
  for (auto& [id, worker] : workers_) {
    if (worker.info.state() != v1::ALIVE) continue;
    int64_t silent_ms = now - worker.info.last_heartbeat_unix_ms();
    if (silent_ms > options_.heartbeat_timeout_ms) {
      MarkWorkerLost(&worker, absl::StrFormat("worker %s (%s) lost: no heartbeat for %.1f s",
                                              id, worker.info.host(), silent_ms / 1000.0));
      lost_any = true;
    }
  }
  // Collective failures with no root cause in time become the job's error.
  for (auto& [id, record] : jobs_) {
    if (record->job.state() != v1::RUNNING) continue;
    if (record->consequence_deadline_ms > 0 && now >= record->consequence_deadline_ms) {
      std::string error = record->consequence_error;
      record->consequence_error.clear();
      FailJob(record.get(), error);
      lost_any = true;
      continue;
    }
    CheckProgress(record.get(), now);
    if (record->job.state() != v1::RUNNING) lost_any = true;
  }
  ExpireQueuedJobs(now);
  ExpireAdoptions(now);
  if (lost_any) schedule_ = true;
  EvictOldRecords(now);
}

std::vector<v1::Assignment> CoordinatorState::DesiredAssignments(
    const std::string& worker_id) const {
  std::vector<v1::Assignment> desired;
  const WorkerRecord& worker = workers_.at(worker_id);
  for (const auto& [slot, busy] : worker.busy_slots) {
    if (!SlotIsCurrent(busy)) continue;  // Draining.
    const JobRecord* record = FindJob(busy.job_id);
    if (record->ranks[busy.rank].exited) continue;
    v1::Assignment assignment;
    assignment.set_job_id(record->job.job_id());
    assignment.set_rank(busy.rank);
    assignment.set_world_size(record->job.spec().world_size());
    assignment.set_device_index(slot);
    *assignment.mutable_spec() = record->job.spec();
    assignment.set_attempt(record->attempt);
    assignment.set_resume_checkpoint(record->job.latest_checkpoint_path());
    assignment.set_rank_secret(record->rank_secrets.at(record->attempt)[busy.rank]);
    desired.push_back(std::move(assignment));
  }
  return desired;
}

bool CoordinatorState::RankIsFinishing(const v1::Assignment& assignment) const {
  // A rank that reported success exits by itself; stopping it would only race its exit.
  const JobRecord* record = FindJob(assignment.job_id());
  return record != nullptr && record->job.state() == v1::SUCCEEDED &&
         record->attempt == assignment.attempt() && assignment.rank() >= 0 &&
         assignment.rank() < static_cast<int>(record->ranks.size()) &&
         record->ranks[assignment.rank()].result_reported;
}

absl::StatusOr<v1::PollAssignmentsResponse> CoordinatorState::PollAssignments(
    const v1::PollAssignmentsRequest& request) {
  Mutation mutation(this);
  if (auto worker = FindLiveWorker(request.worker_id(), request.incarnation(),
                                   request.worker_secret());
      worker.ok()) {
    AdoptRunningRanks(*worker, request);
    if ((*worker)->awaiting_first_poll) {
      (*worker)->awaiting_first_poll = false;
      schedule_ = true;
    }
  }
  std::set<std::string> running;
  for (const v1::Assignment& assignment : request.running()) {
    running.insert(AssignmentKey(assignment.job_id(), assignment.rank(), assignment.attempt()));
  }
  while (true) {
    auto worker =
        FindLiveWorker(request.worker_id(), request.incarnation(), request.worker_secret());
    if (!worker.ok()) return worker.status();
    v1::PollAssignmentsResponse response;
    std::set<std::string> desired_keys;
    for (v1::Assignment& assignment : DesiredAssignments(request.worker_id())) {
      std::string key =
          AssignmentKey(assignment.job_id(), assignment.rank(), assignment.attempt());
      desired_keys.insert(key);
      if (!running.count(key)) *response.add_start() = std::move(assignment);
    }
    for (const v1::Assignment& assignment : request.running()) {
      if (RankIsFinishing(assignment)) continue;
      if (!desired_keys.count(
              AssignmentKey(assignment.job_id(), assignment.rank(), assignment.attempt()))) {
        v1::Assignment* stop = response.add_stop();
        stop->set_job_id(assignment.job_id());
        stop->set_rank(assignment.rank());
        stop->set_attempt(assignment.attempt());
      }
    }
    // Draining slots whose rank this worker no longer runs are free again.
    if (FreeDrainingSlots(*worker, &running, "")) {
      TrySchedule();
      continue;  // The freed slots may have started something here.
    }
    return response;
  }
}

absl::Status CoordinatorState::ReportRankExit(const v1::ReportRankExitRequest& request) {
  Mutation mutation(this);
  auto it = workers_.find(request.worker_id());
  if (it == workers_.end() || !SecretsEqual(it->second.secret, request.worker_secret())) {
    return absl::PermissionDeniedError(
        absl::StrCat("the worker secret does not match worker ", Quote(request.worker_id())));
  }
  // Only the worker that runs a rank speaks for its process.
  bool placed_here = false;
  for (const auto& [slot, busy] : it->second.busy_slots) {
    placed_here |= busy.job_id == request.job_id() && busy.rank == request.rank() &&
                   busy.attempt == request.attempt();
  }
  if (!placed_here) return absl::OkStatus();
  // Whatever the rank's job does next, its slot is free once its process is gone.
  struct FreeSlotOnReturn {
    CoordinatorState* state;
    const v1::ReportRankExitRequest& request;
    ~FreeSlotOnReturn() {
      auto worker = state->workers_.find(request.worker_id());
      if (worker == state->workers_.end()) return;
      if (state->FreeDrainingSlots(
              &worker->second, nullptr,
              AssignmentKey(request.job_id(), request.rank(), request.attempt()))) {
        state->schedule_ = true;
        state->wake_keys_.insert(WorkerKey(request.worker_id()));
      }
    }
  } free_slot{this, request};
  JobRecord* record = FindJob(request.job_id());
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown job ", Quote(request.job_id())));
  }
  if (request.attempt() != record->attempt || request.rank() < 0 ||
      request.rank() >= static_cast<int>(record->ranks.size())) {
    return absl::OkStatus();  // A late report from an earlier attempt: nothing to do.
  }
  // A job waiting for a restart has no current ranks: this exit belongs to the failed attempt.
  if (record->job.state() != v1::RUNNING) return absl::OkStatus();
  RankRecord& rank = record->ranks[request.rank()];
  rank.exited = true;
  Touch(record);
  // A rank that reported its result (success or error) is accounted for.
  if (rank.result_reported) return absl::OkStatus();
  std::string how =
      request.term_signal() != 0
          ? absl::StrCat("was killed by signal ", request.term_signal(), " (",
                         strsignal(request.term_signal()), ")")
          : absl::StrCat("exited with code ", request.exit_code());
  FailJob(record, absl::StrCat(DescribeRank(*record, request.rank()), " ", how,
                               " before reporting a result"));
  schedule_ = true;
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Key-value store, telemetry and results
// ---------------------------------------------------------------------------------------------

absl::Status CoordinatorState::CheckRankSecret(const JobRecord& record, int attempt, int rank,
                                               const std::string& secret) const {
  auto secrets = record.rank_secrets.find(attempt);
  if (secrets == record.rank_secrets.end() || rank < 0 ||
      rank >= static_cast<int>(secrets->second.size()) ||
      !SecretsEqual(secrets->second[rank], secret)) {
    return absl::PermissionDeniedError(absl::StrCat("the rank secret does not match job ",
                                                    record.job.job_id(), " attempt ", attempt,
                                                    " rank ", rank));
  }
  return absl::OkStatus();
}

std::string CoordinatorState::RankSecretForTesting(const std::string& job_id, int attempt,
                                                   int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobRecord* record = FindJob(job_id);
  if (record == nullptr) return "";
  auto secrets = record->rank_secrets.find(attempt);
  if (secrets == record->rank_secrets.end() || rank < 0 ||
      rank >= static_cast<int>(secrets->second.size())) {
    return "";
  }
  return secrets->second[rank];
}

absl::Status CoordinatorState::CheckSpecPaths(const v1::JobSpec& spec) const {
  std::vector<const WorkerRecord*> workers;
  for (const auto& [id, worker] : workers_) {
    if (worker.info.state() == v1::ALIVE && worker.info.device() == spec.device()) {
      workers.push_back(&worker);
    }
  }
  for (const SpecPath& path : SpecPaths(spec)) {
    if (absl::Status status = CheckPathSyntax(path.field, path.path); !status.ok()) {
      return status;
    }
    // With no worker of this kind yet, the workers check when the job is placed.
    if (workers.empty()) continue;
    bool accepted = false;
    for (const WorkerRecord* worker : workers) {
      const auto& roots = path.write ? worker->info.output_roots() : worker->info.data_roots();
      accepted |= IsUnderAnyRoot(path.path, {roots.begin(), roots.end()});
    }
    if (!accepted) {
      return absl::PermissionDeniedError(absl::StrCat(
          path.field, " is outside the ", path.write ? "output" : "data",
          " roots of every live ", v1::DeviceKind_Name(spec.device()),
          " worker (see trainctl workers; a worker allows more with --",
          path.write ? "output_root" : "data_root", ")"));
    }
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::KeyValueSet(const v1::KeyValueSetRequest& request) {
  if (request.key().empty() || request.key().size() > kMaxKvKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("key must be 1 to ", kMaxKvKeyBytes,
                                                   " bytes, got ", request.key().size()));
  }
  if (request.value().size() > kMaxKvValueBytes) {
    return absl::InvalidArgumentError(absl::StrCat("value is ", request.value().size(),
                                                   " bytes; the limit is ", kMaxKvValueBytes));
  }
  Mutation mutation(this);
  JobRecord* record = FindJob(request.job_id());
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown job ", Quote(request.job_id())));
  }
  if (absl::Status status =
          CheckRankSecret(*record, request.attempt(), request.rank(), request.rank_secret());
      !status.ok()) {
    return status;
  }
  if (record->job.state() != v1::RUNNING || record->attempt != request.attempt()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", request.job_id(), " attempt ",
                                                      request.attempt(), " is not running"));
  }
  if (absl::Status status = record->kv.Set(request.key(), request.value()); !status.ok()) {
    return absl::Status(status.code(), absl::StrCat("job ", request.job_id(), ": ",
                                                    status.message()));
  }
  Touch(record, /*workers_too=*/false);
  return absl::OkStatus();
}

absl::StatusOr<std::optional<std::string>> CoordinatorState::KeyValueGet(
    const v1::KeyValueGetRequest& request) const {
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& job_id = request.job_id();
  const JobRecord* record = FindJob(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  if (absl::Status status =
          CheckRankSecret(*record, request.attempt(), request.rank(), request.rank_secret());
      !status.ok()) {
    return status;
  }
  if (record->job.state() != v1::RUNNING || record->attempt != request.attempt()) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " attempt ", request.attempt(),
                                           " ended while waiting for key ",
                                           Quote(request.key())));
  }
  return record->kv.Get(request.key());
}

absl::StatusOr<v1::ReportTelemetryResponse> CoordinatorState::ReportTelemetry(
    const v1::ReportTelemetryRequest& request) {
  Mutation mutation(this);
  JobRecord* record = FindJob(request.job_id());
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown job ", Quote(request.job_id())));
  }
  if (absl::Status status =
          CheckRankSecret(*record, request.attempt(), request.rank(), request.rank_secret());
      !status.ok()) {
    return status;
  }
  v1::ReportTelemetryResponse response;
  if (record->job.state() != v1::RUNNING || record->attempt != request.attempt()) {
    response.set_abort(true);
    return response;
  }
  if (request.rank() < 0 || request.rank() >= record->job.progress_size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", request.rank(), " out of range"));
  }
  record->job.mutable_progress(request.rank())->set_step(request.step());
  RankRecord& rank = record->ranks[request.rank()];
  const int64_t now = options_.now_ms();
  rank.last_report_ms = now;
  if (request.step() > rank.step) {
    rank.step = request.step();
    rank.last_progress_ms = now;
  }
  if (!request.checkpoint_path().empty() &&
      (record->job.spec().checkpoint_dir().empty() ||
       !IsUnderRoot(request.checkpoint_path(), record->job.spec().checkpoint_dir()) ||
       !CheckPathSyntax("checkpoint_path", request.checkpoint_path()).ok())) {
    // The next attempt's rank 0 reads this path: it must be one of the job's own checkpoints.
    return absl::InvalidArgumentError("checkpoint_path must lie in the job's checkpoint_dir");
  }
  if (!request.checkpoint_path().empty() &&
      request.checkpoint_step() > record->job.latest_checkpoint_step()) {
    record->job.set_latest_checkpoint_step(request.checkpoint_step());
    record->job.set_latest_checkpoint_path(request.checkpoint_path());
  }
  for (const v1::TelemetryRecord& telemetry : request.records()) {
    *record->job.mutable_latest_telemetry() = telemetry;
    v1::WatchJobEvent event;
    *event.mutable_telemetry() = telemetry;
    AppendEvent(record, std::move(event));
  }
  Touch(record, /*workers_too=*/false);
  return response;
}

absl::Status CoordinatorState::ReportRankResult(const v1::ReportRankResultRequest& request) {
  Mutation mutation(this);
  JobRecord* record = FindJob(request.job_id());
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown job ", Quote(request.job_id())));
  }
  if (absl::Status status =
          CheckRankSecret(*record, request.attempt(), request.rank(), request.rank_secret());
      !status.ok()) {
    return status;
  }
  if (record->attempt != request.attempt() || record->job.state() != v1::RUNNING) {
    return absl::OkStatus();  // The attempt is over; the result no longer matters.
  }
  if (request.rank() < 0 || request.rank() >= static_cast<int>(record->ranks.size())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", request.rank(), " out of range"));
  }
  RankRecord& rank = record->ranks[request.rank()];
  rank.result_reported = true;
  v1::RankProgress* progress = record->job.mutable_progress(request.rank());
  if (request.result_case() == v1::ReportRankResultRequest::kError) {
    progress->set_error(TruncateForError(request.error(), 4096));
    Touch(record);
    if (request.collective_failure()) {
      if (record->consequence_error.empty()) {
        record->consequence_error =
            absl::StrCat(DescribeRank(*record, request.rank()), " failed: ",
                         TruncateForError(request.error(), 4096));
        record->consequence_deadline_ms = options_.now_ms() + options_.heartbeat_timeout_ms;
      }
      return absl::OkStatus();
    }
    FailJob(record, absl::StrCat(DescribeRank(*record, request.rank()), " failed: ",
                                 TruncateForError(request.error(), 4096)));
    schedule_ = true;
    return absl::OkStatus();
  }
  rank.checksum = request.parameter_checksum();
  progress->set_finished(true);
  progress->set_parameter_checksum(rank.checksum);
  MaybeFinishJob(record);
  Touch(record);
  return absl::OkStatus();
}


}  // namespace mptrain
