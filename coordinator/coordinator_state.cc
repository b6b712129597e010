#include "coordinator/coordinator_state.h"

#include <malloc.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstring>
#include <limits>
#include <set>
#include <tuple>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/path_rules.h"
#include "common/tenant_paths.h"
#include "common/resource_estimate.h"
#include "common/rpc_limits.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "coordinator/placement.h"
#include "google/protobuf/util/message_differencer.h"
#include "spdlog/spdlog.h"

namespace mptrain {
namespace {

// WorkerKey(id): the wait key of a worker's polls.
constexpr absl::string_view kWorkerKeyPrefix = "worker:";

// Unix milliseconds that never jump: the wall clock read once, then advanced by the
// monotonic clock. Every timeout (heartbeats, progress, the queue, adoption) is measured on
// it, so a step of the wall clock (NTP, `date -s`, a resumed VM) neither declares every worker
// lost (a 30 s forward step did) nor delays noticing a dead one (a 60 s backward step made a
// 10 s timeout take 70 s). Shown times drift from the wall clock only by such steps, until
// the coordinator restarts.
int64_t SystemNowMs() {
  using namespace std::chrono;
  static const auto anchor = std::make_pair(system_clock::now(), steady_clock::now());
  return duration_cast<milliseconds>(anchor.first.time_since_epoch() +
                                     (steady_clock::now() - anchor.second))
      .count();
}

// Client-supplied identifiers echoed in errors are cut short (they may be megabytes).
std::string Quote(const std::string& text) { return TruncateForError(text, 128); }

}  // namespace

CoordinatorState::CoordinatorState(CoordinatorOptions options)
    : options_(std::move(options)),
      policy_(options_.heartbeat_timeout_ms),
      workers_(WorkerRegistry::Options{options_.heartbeat_timeout_ms,
                                       options_.lost_worker_retention_ms,
                                       options_.max_lost_workers,
                                       options_.max_live_workers}) {
  if (!options_.now_ms) options_.now_ms = SystemNowMs;
  if (!options_.monotonic_ms) {
    options_.monotonic_ms = [] {
      return std::chrono::duration_cast<std::chrono::milliseconds>(
                 std::chrono::steady_clock::now().time_since_epoch())
          .count();
    };
  }
  started_ms_ = options_.now_ms();
  if (options_.store != nullptr) writer_ = std::make_unique<StoreWriter>(options_.store);
}

CoordinatorState::~CoordinatorState() = default;

// ---------------------------------------------------------------------------------------------
// Mutations and the job store
// ---------------------------------------------------------------------------------------------

void CoordinatorState::Effects::JobChanged(const JobRecord& job, bool workers_too) {
  dirty_jobs.insert(job.id());
  // Whoever waits on the job (a watch, a key-value get) looks again, and, when its placement,
  // state or ranks changed, so do the workers that run it.
  wake_keys.insert(JobKey(job.id()));
  if (!workers_too) return;
  for (const v1::RankPlacement& placement : job.job().placement()) {
    wake_keys.insert(WorkerKey(placement.worker_id()));
  }
}

void CoordinatorState::Effects::EventAppended(const JobRecord& job,
                                              const v1::WatchJobEvent& event) {
  batch.events.push_back({job.number(), event});
}

void CoordinatorState::Effects::EventsTrimmed(const JobRecord& job, int64_t sequence) {
  batch.keep_events_after[job.number()] = sequence;
}

void CoordinatorState::Effects::RankLogKept(const JobRecord& job, store::StoredRankLog log) {
  batch.rank_logs.emplace_back(job.number(), std::move(log));
}

void CoordinatorState::Effects::KvWritten(const JobRecord& job, const std::string& key,
                                          const std::string& value) {
  batch.kv_writes.push_back({job.number(), JobStore::KvEntry{job.attempt(), key, value}});
}

void CoordinatorState::Effects::KvCleared(const JobRecord& job) {
  // Keys written earlier in this mutation go too (the store clears before it writes).
  auto& writes = batch.kv_writes;
  writes.erase(std::remove_if(writes.begin(), writes.end(),
                              [&](const auto& write) { return write.first == job.number(); }),
               writes.end());
  batch.kv_cleared.insert(job.number());
}

CoordinatorState::Finished CoordinatorState::FinishMutation() {
  if (effects_.schedule) {
    effects_.schedule = false;
    TrySchedule();
  }
  Finished finished;
  if (writer_ != nullptr && (!effects_.dirty_jobs.empty() || !effects_.batch.empty())) {
    for (const std::string& job_id : effects_.dirty_jobs) {
      if (const JobRecord* record = FindJob(job_id)) {
        effects_.batch.jobs.push_back(record->ToStored());
      }
    }
    // The jobs this batch changes: their events and key-value entries are shown from when it
    // is written, and whoever waits on them is woken then (this mutation's notify).
    std::set<std::string> touched(effects_.dirty_jobs.begin(), effects_.dirty_jobs.end());
    auto touch = [&](int64_t number) {
      if (auto it = job_order_.find(number); it != job_order_.end()) touched.insert(it->second);
    };
    const JobStore::Batch& batch = effects_.batch;
    for (const auto& event : batch.events) touch(event.first);
    for (const auto& write : batch.kv_writes) touch(write.first);
    for (int64_t number : batch.kv_cleared) touch(number);
    for (const auto& log : batch.rank_logs) touch(log.first);
    for (const auto& trimmed : batch.keep_events_after) touch(trimmed.first);
    // Under the lock, so that batches are written in the order of the mutations.
    finished.ticket = writer_->Enqueue(std::move(effects_.batch));
    for (const std::string& job_id : touched) {
      if (JobRecord* record = FindJob(job_id)) {
        record->set_store_ticket(finished.ticket);
        effects_.wake_keys.insert(JobKey(job_id));
      }
    }
    // The workers whose assignments this changed: their polls hand it out only once written.
    for (const std::string& key : effects_.wake_keys) {
      if (!absl::StartsWith(key, kWorkerKeyPrefix)) continue;
      if (WorkerRecord* worker = workers_.Find(key.substr(kWorkerKeyPrefix.size()))) {
        worker->assignments_ticket = finished.ticket;
      }
    }
  } else {
    finished.ticket = effects_.wait_ticket;
  }
  finished.keys.assign(effects_.wake_keys.begin(), effects_.wake_keys.end());
  effects_ = Effects();
  return finished;
}

namespace {
thread_local CoordinatorState::Deferred* t_deferred = nullptr;  // The innermost DeferWrites.
}  // namespace

CoordinatorState::DeferWrites::DeferWrites() : outer_(t_deferred) { t_deferred = &deferred_; }

CoordinatorState::DeferWrites::~DeferWrites() {
  t_deferred = outer_;
  if (deferred_.state != nullptr) deferred_.state->AfterWrite(Take(), nullptr);
}

CoordinatorState::Deferred CoordinatorState::DeferWrites::Take() {
  Deferred taken = std::move(deferred_);
  deferred_ = Deferred();
  return taken;
}

CoordinatorState::Deferred CoordinatorState::TakeDeferred() {
  if (t_deferred == nullptr) return Deferred();
  Deferred taken = std::move(*t_deferred);
  *t_deferred = Deferred();
  return taken;
}

bool CoordinatorState::Defer(const CoordinatorState* state, uint64_t ticket,
                             std::vector<std::string>* keys) {
  if (t_deferred == nullptr) return false;
  if (ticket == 0 && (keys == nullptr || keys->empty())) return true;
  t_deferred->state = state;
  t_deferred->ticket = std::max(t_deferred->ticket, ticket);
  if (keys != nullptr) {
    for (std::string& key : *keys) t_deferred->keys.push_back(std::move(key));
  }
  return true;
}

void CoordinatorState::AfterWrite(Deferred deferred, std::function<void()> then) const {
  auto run = [this, keys = std::move(deferred.keys), then = std::move(then)] {
    if (options_.notify && !keys.empty()) options_.notify(keys);
    if (then) then();
  };
  if (deferred.ticket == 0 || writer_ == nullptr) {
    run();
  } else {
    writer_->WhenWritten(deferred.ticket, std::move(run));
  }
}

std::string CoordinatorState::WorkerKey(const std::string& worker_id) {
  return std::string(kWorkerKeyPrefix) + worker_id;
}

std::string CoordinatorState::JobKey(const std::string& job_id) { return "job:" + job_id; }

std::string CoordinatorState::RequestKey(const std::string& owner,
                                         const std::string& request_id) {
  return absl::StrCat(owner.size(), ":", owner, request_id);
}

JobLimits CoordinatorState::job_limits() const {
  return JobLimits{options_.max_kv_keys_per_job, options_.max_kv_bytes_per_job,
                   options_.max_events_per_job, options_.max_events_per_finished_job,
                   options_.max_stored_events_per_job};
}

namespace {

// Job numbers a store may hold: far beyond any real count, far below overflow.
constexpr int64_t kMaxJobNumber = int64_t{1} << 48;

// A stored job as this build writes it, or DATA_LOSS naming what is wrong: the store is a
// file, and a hand-edited, corrupt or foreign one must not be trusted (a duplicate number or
// id, a spec no submission could have, progress that does not match the ranks, an id that is
// not the number's would each crash the coordinator or reach the workers).
absl::Status CheckStoredJob(const store::StoredJob& stored, const JobStore::Snapshot& snapshot,
                            const std::set<int64_t>& numbers_seen) {
  const int64_t number = stored.number();
  auto refuse = [number](const std::string& why) {
    return absl::DataLossError(absl::StrCat(
        "the job store holds a job (number ", number, ") this coordinator did not write: ", why,
        "; refusing to start (move the store aside to start empty)"));
  };
  if (number < 1 || number >= kMaxJobNumber) return refuse("its number is out of range");
  if (numbers_seen.count(number) != 0) return refuse("its number appears twice");
  if (stored.job().job_id() != absl::StrFormat("job-%04d", number)) {
    return refuse(absl::StrCat("its id is not job-", absl::StrFormat("%04d", number)));
  }
  auto spec = snapshot.specs.find(number);
  if (spec == snapshot.specs.end()) return refuse("it has no spec");
  // What the records are sized by; the rest of the spec is checked once restored (a job that
  // an older build accepted and this one would not is failed, not the whole store refused).
  const int world_size = spec->second.world_size();
  if (world_size < 1 || world_size > kMaxWorldSize) {
    return refuse(absl::StrCat("its world_size ", world_size, " is out of range"));
  }
  // A job never placed has no per-rank progress yet (JobRecord::StartAttempt makes it).
  const bool never_placed = stored.attempt() == 0 && stored.job().progress_size() == 0;
  if (!never_placed && stored.job().progress_size() != world_size) {
    return refuse(absl::StrCat("it has progress for ", stored.job().progress_size(),
                               " ranks and a world of ", world_size));
  }
  for (int rank = 0; rank < stored.job().progress_size(); ++rank) {
    if (stored.job().progress(rank).rank() != rank) return refuse("its progress is out of order");
  }
  // Attempts are at most max_restarts + 1 (<= 101); the bound only keeps a hostile value out.
  constexpr int kMaxStoredAttempt = 1'000;
  if (stored.attempt() < 0 || stored.attempt() > kMaxStoredAttempt) {
    return refuse(absl::StrCat("its attempt ", stored.attempt(), " is out of range"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CoordinatorState::Restore() {
  if (options_.store == nullptr) return absl::OkStatus();
  absl::StatusOr<JobStore::Snapshot> snapshot = options_.store->Load();
  if (!snapshot.ok()) return snapshot.status();
  if (snapshot->next_job_number < 0 || snapshot->next_job_number > kMaxJobNumber) {
    return absl::DataLossError(absl::StrCat("the job store's next job number ",
                                            snapshot->next_job_number,
                                            " is out of range; refusing to start"));
  }
  std::set<int64_t> numbers;
  for (const store::StoredJob& stored : snapshot->jobs) {
    RETURN_IF_ERROR(CheckStoredJob(stored, *snapshot, numbers));
    numbers.insert(stored.number());
  }
  Mutation mutation(this);
  const int64_t now = options_.now_ms();
  next_job_number_ = std::max<int64_t>(next_job_number_, snapshot->next_job_number);
  std::vector<JobRecord*> finished;
  int running = 0;
  for (store::StoredJob& stored : snapshot->jobs) {
    auto record = std::make_unique<JobRecord>(stored, snapshot->specs[stored.number()],
                                              std::move(snapshot->events[stored.number()]),
                                              snapshot->rank_logs[stored.number()],
                                              snapshot->kv[stored.number()], now, job_limits(),
                                              &effects_);
    next_job_number_ = std::max(next_job_number_, record->number() + 1);
    const std::string job_id = record->id();
    if (!record->job().request_id().empty()) {
      job_by_request_id_[RequestKey(record->job().owner(), record->job().request_id())] = job_id;
    }
    if (!record->spec().name().empty()) {
      // The latest job of each name is the one that may still be live.
      auto [named, added] = job_by_owner_name_.try_emplace(
          RequestKey(record->job().owner(), record->spec().name()), job_id);
      if (!added && jobs_.at(named->second)->number() < record->number()) named->second = job_id;
    }
    job_order_[record->number()] = job_id;
    JobRecord* raw = record.get();
    jobs_[job_id] = std::move(record);
    if (!raw->terminal()) {
      if (absl::Status valid = ValidateJobSpec(raw->spec()); !valid.ok()) {
        // Accepted by another build, not by this one: ended, with the reason, not run.
        FailJob(raw, absl::StrCat("its spec is not valid for this coordinator: ",
                                  valid.message()),
                /*restartable=*/false);  // Listed among the finished by FailJob.
        continue;
      }
    }
    if (raw->state() == v1::PENDING) {
      pending_.push_back(job_id);
      ChargeQueue(*raw);
    } else if (raw->terminal()) {
      finished.push_back(raw);
    } else if (raw->running()) {
      // Its ranks may well be training still: their workers will report them.
      ++running;
      raw->AwaitAdoption(now + options_.adopt_grace_ms);
      adoptions_may_be_open_ = true;
      if (raw->awaiting_adoption().empty()) {
        // Every rank had reported before the restart: end the job as it would have ended.
        if (std::optional<std::string> error = raw->FirstRankError()) {
          FailJob(raw, *error);
        } else {
          MaybeFinishJob(raw);
        }
      }
    }
  }
  std::sort(finished.begin(), finished.end(), [](const JobRecord* a, const JobRecord* b) {
    return a->job().finished_unix_ms() < b->job().finished_unix_ms();
  });
  for (const JobRecord* record : finished) finished_.push_back(record->id());
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
    if (record == nullptr || !record->running() || record->attempt() != running.attempt() ||
        !record->awaiting_adoption().count(running.rank()) ||
        // Proof that this worker runs the rank: it holds the rank's secret.
        !record->CheckRankSecret(running.attempt(), running.rank(), running.rank_secret())
             .ok()) {
      continue;
    }
    const int slot = running.device_index();
    if (!workers_.Occupy(worker, slot,
                         BusySlot{record->id(), running.rank(), record->attempt(),
                                  record->rank_memory_bytes()})) {
      continue;
    }
    record->Adopt(PlacedRank{running.rank(), worker->info.worker_id(), worker->name,
                             worker->info.host(), slot});
  }
}

void CoordinatorState::ExpireAdoptions(int64_t now) {
  for (auto& [id, record] : jobs_) {
    if (!record->running() || record->awaiting_adoption().empty() ||
        now < record->adopt_deadline_ms()) {
      continue;
    }
    std::string ranks;
    for (int rank : record->AbandonAdoption()) {
      absl::StrAppend(&ranks, ranks.empty() ? "" : ", ", rank);
    }
    FailJob(record.get(),
            absl::StrFormat("rank %s did not come back within adopt_grace_s %g after the "
                            "coordinator restarted",
                            ranks, options_.adopt_grace_ms / 1000.0));
    effects_.schedule = true;
  }
}

JobRecord* CoordinatorState::FindJob(const std::string& job_id) {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const JobRecord* CoordinatorState::FindJob(const std::string& job_id) const {
  auto it = jobs_.find(job_id);
  return it == jobs_.end() ? nullptr : it->second.get();
}

const JobRecord* CoordinatorState::FindReadableJob(const std::string& job_id,
                                                   const JobReader& reader) const {
  const JobRecord* record = FindJob(job_id);
  return record != nullptr && reader.MayRead(record->job()) ? record : nullptr;
}

// ---------------------------------------------------------------------------------------------
// Jobs
// ---------------------------------------------------------------------------------------------

absl::StatusOr<v1::SubmitJobResponse> CoordinatorState::SubmitJob(
    const v1::SubmitJobRequest& request, const std::string& owner, bool owner_is_admin) {
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
  // A repeated request first: a retry after a coordinator restart must find its job even
  // before the workers whose roots admitted its paths have registered again.
  if (!request.request_id().empty()) {
    auto it = job_by_request_id_.find(RequestKey(owner, request.request_id()));
    if (it != job_by_request_id_.end()) {
      // The same request again, or a mistake: a retry sends the same spec; a different spec
      // under a used id would silently never run. (Ids are the principal's own: another's
      // cannot collide with them, nor learn its jobs through them.)
      const JobRecord& earlier = *jobs_.at(it->second);
      v1::JobSpec earlier_spec = earlier.spec();
      ApplyJobSpecDefaults(&earlier_spec);  // As this build would (its defaults may be newer).
      if (!google::protobuf::util::MessageDifferencer::Equals(earlier_spec, spec)) {
        return absl::AlreadyExistsError(absl::StrCat(
            "request_id ", Quote(request.request_id()), " was used for ",
            earlier.id(), " with another spec: a repeated request must send the same spec "
            "(choose a new request_id for a new job)"));
      }
      // Answered only once the job it made is written (the first submit may still wait
      // for its write: a retry must not be told OK for a job a crash would lose).
      effects_.wait_ticket = earlier.store_ticket();
      v1::SubmitJobResponse response;
      response.set_job_id(it->second);
      response.set_state(earlier.state());
      return response;
    }
  }
  if (!spec.name().empty()) {
    // Names are how a user refers to a job (trainctl, dashboards): one owner's live jobs have
    // distinct ones. Another owner may use the same name; an ended job's name is free again.
    auto it = job_by_owner_name_.find(RequestKey(owner, spec.name()));
    const JobRecord* holder = it == job_by_owner_name_.end() ? nullptr : FindJob(it->second);
    if (holder != nullptr && !holder->terminal()) {
      return absl::AlreadyExistsError(absl::StrCat(
          "name ", Quote(spec.name()), " is taken by ", holder->id(), " (",
          absl::AsciiStrToLower(v1::JobState_Name(holder->state())), "): job names are unique among an owner's "
          "jobs that have not ended; choose another name or cancel ", holder->id()));
    }
  }
  if (absl::Status status = CheckSpecPaths(spec, Tenancy{owner, owner_is_admin}); !status.ok()) {
    return status;
  }
  EvictOldRecords(options_.now_ms());
  if (pending_.size() >= options_.max_pending_jobs) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full (", pending_.size(), " jobs wait; the limit is ",
        options_.max_pending_jobs, "): try again when some have been placed"));
  }
  // One submitter cannot take the whole queue: its own jobs waiting are bounded too. (Counted
  // only when the queue is that long: at most max_pending_jobs lookups, under the lock.)
  const size_t owned =
      pending_.size() < options_.max_pending_jobs_per_owner
          ? 0
          : static_cast<size_t>(std::count_if(
                pending_.begin(), pending_.end(), [&](const std::string& pending_id) {
                  return jobs_.at(pending_id)->job().owner() == owner;
                }));
  if (owned >= options_.max_pending_jobs_per_owner) {
    return absl::ResourceExhaustedError(absl::StrCat(
        owner.empty() ? "anonymous" : owner, " has ", owned, " jobs waiting, the most one "
        "submitter may have (--max_pending_jobs_per_principal): try again when some have been "
        "placed"));
  }
  // What the job will hold while it waits, known before its record exists (what
  // JobRecord::MemoryBytes would say of it, and its entries here): it is charged that.
  const int64_t queued_bytes = static_cast<int64_t>(
      kQueueEntryBytes + sizeof(JobRecord) + sizeof(v1::Job) + spec.SpaceUsedLong() +
      kJobIdAndUidBytes + owner.size() + request.request_id().size());
  if (absl::Status status = CheckQueueBytes(owner, queued_bytes); !status.ok()) return status;
  // A job no live worker could ever hold is refused now rather than queued for ever. (With no
  // worker of its kind yet, it waits: workers may still come.)
  const int64_t largest = workers_.LargestSlotMemory(spec.device());
  if (largest >= 0 && memory.total > largest) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model does not fit: a rank needs about ", memory.Describe(), "; the largest ",
        v1::DeviceKind_Name(spec.device()), " worker offers ", FormatBytes(largest),
        " per rank (model, micro_batch_size and accumulation_steps set the need)"));
  }
  const int64_t number = next_job_number_++;
  auto record = std::make_unique<JobRecord>(number, spec, Tenancy{owner, owner_is_admin},
                                            request.request_id(), memory.total,
                                            options_.now_ms(), job_limits(), &effects_);
  const std::string job_id = record->id();
  if (!request.request_id().empty()) {
    job_by_request_id_[RequestKey(owner, request.request_id())] = job_id;
  }
  if (!spec.name().empty()) job_by_owner_name_[RequestKey(owner, spec.name())] = job_id;
  job_order_[number] = job_id;
  jobs_[job_id] = std::move(record);
  pending_.push_back(job_id);
  ChargeQueue(*jobs_.at(job_id), queued_bytes);
  submitted_total_ += 1;
  spdlog::info("job {} submitted: {} ranks on {}", job_id, spec.world_size(),
               v1::DeviceKind_Name(spec.device()));
  effects_.batch.new_specs[number] = spec;
  effects_.batch.next_job_number = next_job_number_;
  TrySchedule();  // Now, so that the answer says whether it was placed.

  v1::SubmitJobResponse response;
  response.set_job_id(job_id);
  response.set_state(jobs_.at(job_id)->state());
  return response;
}

absl::StatusOr<v1::Job> CoordinatorState::GetJob(const std::string& job_id, View view,
                                                 const JobReader& reader) const {
  Read read(this, view);
  const JobRecord* record = FindReadableJob(job_id, reader);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  return record->job();
}

absl::StatusOr<v1::ListJobsResponse> CoordinatorState::ListJobs(
    const v1::ListJobsRequest& request, View view, const JobReader& reader) const {
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
  if (absl::Status selector = ValidateLabels(request.label_selector(), "label_selector");
      !selector.ok()) {
    return selector;
  }
  auto selected = [&request](const v1::Job& job) {
    for (const auto& [key, value] : request.label_selector()) {
      auto label = job.spec().labels().find(key);
      if (label == job.spec().labels().end() || label->second != value) return false;
    }
    return true;
  };
  Read read(this, view);
  v1::ListJobsResponse response;
  for (auto it = job_order_.upper_bound(after); it != job_order_.end(); ++it) {
    const v1::Job& job = jobs_.at(it->second)->job();
    if (request.state() != v1::JOB_STATE_UNSPECIFIED && job.state() != request.state()) continue;
    if (!selected(job)) continue;
    if (!reader.MayRead(job)) continue;
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
    *brief.mutable_labels() = job.spec().labels();  // Bounded: 16 of 63 + 63 bytes.
    *listed->mutable_spec() = std::move(brief);
  }
  return response;
}

absl::StatusOr<v1::JobState> CoordinatorState::CancelJob(const std::string& job_id,
                                                         const std::string& principal,
                                                         bool admin) {
  Mutation mutation(this);
  JobRecord* record = FindJob(job_id);
  // Another's job is unknown to a non-admin, as its reads answer: the refusal does not reveal
  // that it exists, nor its owner.
  if (record == nullptr || (!admin && record->job().owner() != principal)) {
    return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  }
  if (record->terminal()) {
    effects_.wait_ticket = record->store_ticket();  // The end it names is written.
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " already ended as ", v1::JobState_Name(record->state())));
  }
  EndJob(record, v1::CANCELLED, absl::StrCat("cancelled by ", principal));
  effects_.schedule = true;
  return record->state();
}

std::vector<v1::Worker> CoordinatorState::ListWorkers() const {
  Read read(this);
  return workers_.List();
}

void CoordinatorState::DescribeRefusals(v1::ListWorkersResponse* response) const {
  std::lock_guard<std::mutex> lock(mu_);  // Memory as it is: nothing here is stored.
  auto capacity = workers_.RefusedTotals().find("capacity");
  response->set_registrations_refused_for_capacity(
      capacity == workers_.RefusedTotals().end() ? 0 : capacity->second);
  response->set_max_live_workers(options_.max_live_workers);
  response->set_last_refusal(workers_.last_refusal());
}

absl::StatusOr<v1::WatchJobEvent> CoordinatorState::WatchSnapshot(
    const std::string& job_id, const JobReader& reader) const {
  Read read(this);
  const JobRecord* record = FindReadableJob(job_id, reader);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  v1::WatchJobEvent event;
  event.set_sequence(record->events().last_sequence());
  *event.mutable_snapshot() = record->job();
  return event;
}

absl::StatusOr<CoordinatorState::WatchBatch> CoordinatorState::JobEventsSince(
    const std::string& job_id, int64_t after_sequence) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobRecord* record = FindJob(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  WatchBatch batch;
  // A bounded batch: a watcher far behind catches up over several fetches.
  constexpr size_t kMaxWatchBatch = 1'000;
  batch.events = record->events().Since(after_sequence, kMaxWatchBatch);
  // The terminal state change is always the job's last event.
  batch.finished = record->terminal() &&
                   (batch.events.empty() ||
                    batch.events.back().sequence() == record->events().last_sequence());
  batch.ticket = record->store_ticket();
  return batch;
}

CoordinatorState::Overview CoordinatorState::GetOverview(const JobReader& reader) const {
  // Monitoring (/metrics, the workers page) sees memory as it is, without waiting for the
  // store: it must still answer while a write hangs (mptrain_store_write_failures_total).
  std::lock_guard<std::mutex> lock(mu_);
  Overview overview;
  const int64_t now = options_.now_ms();
  auto trimmed = [](v1::Job job) {
    v1::JobSpec brief;
    brief.set_name(job.spec().name());
    brief.set_world_size(job.spec().world_size());
    brief.set_steps(job.spec().steps());
    *job.mutable_spec() = std::move(brief);
    return job;
  };
  std::vector<const JobRecord*> ended;
  for (const auto& [id, record] : jobs_) {
    overview.jobs[record->state()] += 1;
    if (!reader.MayRead(record->job())) continue;
    if (record->running()) {
      overview.running.push_back(trimmed(record->job()));
    } else if (record->terminal() &&
               now - record->job().finished_unix_ms() <= Overview::kEndedJobMetricsMs) {
      ended.push_back(record.get());
    }
  }
  const size_t kept = std::min(ended.size(), Overview::kMaxEndedJobMetrics);
  std::partial_sort(ended.begin(), ended.begin() + kept, ended.end(),
                    [](const JobRecord* a, const JobRecord* b) {
                      return a->job().finished_unix_ms() > b->job().finished_unix_ms();
                    });
  for (size_t i = 0; i < kept; ++i) overview.recently_ended.push_back(trimmed(ended[i]->job()));
  overview.queued = static_cast<int>(pending_.size());
  overview.queued_bytes = queued_bytes_;
  for (v1::Worker& worker : workers_.List()) {
    const double age_s = (now - worker.last_heartbeat_unix_ms()) / 1000.0;
    const double usage_age_s =
        worker.usage_unix_ms() > 0 ? (now - worker.usage_unix_ms()) / 1000.0 : 0;
    overview.workers.push_back({std::move(worker), age_s, usage_age_s});
  }
  overview.submitted_total = submitted_total_;
  overview.ended_total = ended_total_;
  overview.restarts_total = restarts_total_;
  overview.store_write_failures_total = writer_ == nullptr ? 0 : writer_->failures();
  overview.worker_registrations_refused_total = workers_.RefusedTotals();
  overview.max_live_workers = options_.max_live_workers;
  overview.workers_refused_recently = workers_.RecentlyRefusedForCapacity();
  overview.last_worker_refusal = workers_.last_refusal();
  return overview;
}

absl::StatusOr<v1::GetJobEventsResponse> CoordinatorState::GetJobEvents(
    const v1::GetJobEventsRequest& request, View view, const JobReader& reader) const {
  constexpr int kDefaultEvents = 1'000, kMaxEvents = 10'000;
  if (request.max_events() < 0 || request.max_events() > kMaxEvents) {
    return absl::InvalidArgumentError(absl::StrCat("max_events must be in [0, ", kMaxEvents,
                                                   "] (0 = ", kDefaultEvents, "), got ",
                                                   request.max_events()));
  }
  const size_t limit = request.max_events() == 0 ? kDefaultEvents : request.max_events();
  // (after + 1 is taken below: the largest sequence asked after is one below the maximum.)
  const int64_t after = std::clamp<int64_t>(request.after_sequence(), 0,
                                            std::numeric_limits<int64_t>::max() - 1);
  v1::GetJobEventsResponse response;
  int64_t number = 0, oldest_held = 0, last = 0;
  bool terminal = false;
  {
    Read read(this, view);
    const JobRecord* record = FindReadableJob(request.job_id(), reader);
    if (record == nullptr) {
      return absl::NotFoundError(absl::StrCat("unknown job ", Quote(request.job_id())));
    }
    number = record->number();
    last = record->events().last_sequence();
    terminal = record->terminal();
    const auto& held = record->events().events();
    oldest_held = held.empty() ? last + 1 : held.front().sequence();
    if (after + 1 >= oldest_held || options_.store == nullptr) {
      for (v1::WatchJobEvent& event : record->events().Since(after, limit)) {
        *response.add_events() = std::move(event);
      }
    }
  }
  if (after + 1 < oldest_held && options_.store != nullptr) {
    // Older than memory holds: the store has it (read without the state's lock).
    auto stored = options_.store->LoadEvents(number, after, static_cast<int>(limit));
    if (!stored.ok()) return stored.status();
    for (v1::WatchJobEvent& event : *stored) *response.add_events() = std::move(event);
  }
  const int64_t returned_last =
      response.events_size() == 0 ? after : response.events().rbegin()->sequence();
  response.set_finished(terminal && returned_last >= last);
  return response;
}

void CoordinatorState::EndJob(JobRecord* record, v1::JobState state, const std::string& error) {
  if (record->terminal()) return;
  ended_total_[state] += 1;
  pending_.erase(std::remove(pending_.begin(), pending_.end(), record->id()), pending_.end());
  ReleaseQueueCharge(*record);
  record->End(state, error, options_.now_ms());
  FreeExitedSlots(*record);
  finished_.push_back(record->id());
  // Not this job: callers still hold it. Older ones go at the next housekeeping pass.
}

std::string CoordinatorState::BlameRecentStall(const std::string& error) const {
  // A short stall (a tick late on a loaded machine) only delays loss detection; one of half
  // the timeout or more may have made workers fence their ranks (a worker's last answer may
  // have come an interval or two before it began): that one is named.
  if (last_stall_ended_ms_ == 0 || last_stall_ms_ < options_.heartbeat_timeout_ms / 2 ||
      options_.now_ms() - last_stall_ended_ms_ > options_.heartbeat_timeout_ms) {
    return error;
  }
  return absl::StrFormat(
      "the coordinator did not run for %.1f s (stopped or starved: its clock jumped between two "
      "liveness checks), so its workers heard nothing from it; then %s",
      last_stall_ms_ / 1000.0, error);
}

void CoordinatorState::FailJob(JobRecord* record, const std::string& cause, bool restartable) {
  if (record->terminal()) return;
  const std::string error = BlameRecentStall(cause);
  const FailurePolicy::Decision decision = policy_.Decide(*record, error, restartable);
  record->TakeConsequence();
  record->AddFailure(decision.error);
  if (decision.restart) {
    // A new attempt (fresh key-value namespace, fresh NCCL unique id) resumes from the latest
    // checkpoint. The old attempt's ranks fall out of their workers' desired sets and are
    // stopped; their slots drain.
    FreeExitedSlots(*record);
    record->Requeue(decision.note, options_.now_ms());
    restarts_total_ += 1;
    pending_.push_front(record->id());
    ChargeQueue(*record);
    return;
  }
  EndJob(record, v1::FAILED, decision.error);
}

void CoordinatorState::FreeExitedSlots(const JobRecord& record) {
  workers_.ReleaseExited(record.id(), record.attempt(),
                         [&record](int rank) { return record.rank(rank).exited; });
}

bool CoordinatorState::SlotIsCurrent(const BusySlot& slot) const {
  const JobRecord* record = FindJob(slot.job_id);
  return record != nullptr && record->running() && record->attempt() == slot.attempt;
}

absl::StatusOr<std::set<std::string>> CoordinatorState::Rank0Workers(
    const JobRecord& record) const {
  const v1::Job& job = record.job();
  if (job.latest_checkpoint_path().empty() || job.latest_checkpoint_worker().empty() ||
      record.spec().checkpoint_dir_shared()) {
    return std::set<std::string>();
  }
  std::set<std::string> holders;
  bool known_lost = false;
  for (const std::string& id : workers_.IdsOfName(job.latest_checkpoint_worker())) {
    const WorkerRecord& worker = *workers_.Find(id);
    if (worker.alive()) {
      holders.insert(id);
    } else {
      known_lost = true;
    }
  }
  // A worker this coordinator never saw may still register (after a coordinator restart); one
  // it saw die has taken the checkpoint with it.
  const bool settled =
      known_lost || options_.now_ms() - started_ms_ > options_.heartbeat_timeout_ms;
  if (holders.empty() && settled) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot resume: the checkpoint of step ", job.latest_checkpoint_step(), " (",
        job.latest_checkpoint_path(), ") is on worker ", job.latest_checkpoint_worker(),
        ", which is not alive, and checkpoint_dir is not declared shared "
        "(checkpoint_dir_shared: true when every worker sees it)"));
  }
  return holders;
}

void CoordinatorState::TrySchedule() {
  // Registrations come thousands a second at start-up: with nothing queued, a pass must not
  // walk the worker table at all.
  if (pending_.empty()) return;
  // First-in first-out among the jobs that can be placed now: a job that must wait for slots
  // (or for workers that do not exist yet) does not hold back the jobs behind it.
  // With thousands of workers and queued jobs, a pass must not cost workers x jobs: free slots
  // are counted once per device kind (a job needing more waits without a look at the
  // workers), and a reason is worked out once per kind of job.
  // Counted per kind when a queued job of that kind is first looked at.
  std::map<v1::DeviceKind, int> free_slots;
  std::map<std::tuple<v1::DeviceKind, int, int64_t>, std::string> reasons;
  auto reason_for = [&](const v1::JobSpec& spec, int64_t memory) -> const std::string& {
    auto key = std::make_tuple(spec.device(), spec.world_size(), memory);
    auto it = reasons.find(key);
    if (it == reasons.end()) {
      it = reasons.emplace(key, workers_.PendingReason(spec.device(), spec.world_size(), memory))
               .first;
    }
    return it->second;
  };
  std::vector<std::pair<JobRecord*, std::string>> unplaceable;
  for (auto it = pending_.begin(); it != pending_.end();) {
    JobRecord* record = FindJob(*it);
    const v1::JobSpec& spec = record->spec();
    absl::StatusOr<std::set<std::string>> rank0_workers = Rank0Workers(*record);
    if (!rank0_workers.ok()) {
      unplaceable.emplace_back(record, std::string(rank0_workers.status().message()));
      ++it;
      continue;
    }
    std::optional<std::vector<RankSlot>> placement;
    auto free = free_slots.find(spec.device());
    if (free == free_slots.end()) {
      free = free_slots.emplace(spec.device(), workers_.FreeSlots(spec.device())).first;
    }
    if (free->second >= spec.world_size()) {
      placement = workers_.Place(spec.device(), spec.world_size(), record->rank_memory_bytes(),
                                 *rank0_workers);
    }
    if (!placement) {
      std::string reason = reason_for(spec, record->rank_memory_bytes());
      if (!record->job().latest_checkpoint_worker().empty() && !rank0_workers->empty()) {
        absl::StrAppend(&reason, "; rank 0 must go to worker ",
                        record->job().latest_checkpoint_worker(),
                        " (it holds the checkpoint to resume from)");
      } else if (!record->job().latest_checkpoint_worker().empty() &&
                 !spec.checkpoint_dir_shared()) {
        absl::StrAppend(&reason, "; waiting for worker ", record->job().latest_checkpoint_worker(),
                        " (it holds the checkpoint to resume from)");
      }
      record->SetPendingReason(reason);
      ++it;
      continue;
    }
    it = pending_.erase(it);
    ReleaseQueueCharge(*record);
    std::vector<PlacedRank> placed;
    for (const RankSlot& rank_slot : *placement) {
      const WorkerRecord* worker = workers_.Find(rank_slot.worker_id);
      placed.push_back(PlacedRank{rank_slot.rank, rank_slot.worker_id, worker->name,
                                  worker->info.host(), rank_slot.slot});
    }
    record->StartAttempt(placed, options_.now_ms());
    for (const PlacedRank& rank : placed) {
      workers_.Occupy(workers_.Find(rank.worker_id), rank.slot,
                      BusySlot{record->id(), rank.rank, record->attempt(),
                               record->rank_memory_bytes()});
    }
    free_slots[spec.device()] -= spec.world_size();
    reasons.clear();  // Fewer free slots: the reasons change.
  }
  for (auto& [record, error] : unplaceable) FailJob(record, error, /*restartable=*/false);
}

void CoordinatorState::ChargeQueue(const JobRecord& record, int64_t bytes) {
  if (bytes < 0) bytes = record.MemoryBytes() + kQueueEntryBytes;
  ReleaseQueueCharge(record);  // Never twice.
  queue_charges_[record.id()] = bytes;
  queued_bytes_ += bytes;
  queued_bytes_by_owner_[record.job().owner()] += bytes;
}

void CoordinatorState::ReleaseQueueCharge(const JobRecord& record) {
  auto charge = queue_charges_.find(record.id());
  if (charge == queue_charges_.end()) return;
  queued_bytes_ -= charge->second;
  auto owner = queued_bytes_by_owner_.find(record.job().owner());
  if (owner != queued_bytes_by_owner_.end() && (owner->second -= charge->second) <= 0) {
    queued_bytes_by_owner_.erase(owner);
  }
  queue_charges_.erase(charge);
}

absl::Status CoordinatorState::CheckQueueBytes(const std::string& owner, int64_t bytes) const {
  if (queued_bytes_ + bytes > options_.max_pending_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the queue is full: its waiting jobs hold ", FormatBytes(queued_bytes_), " and this one "
        "needs ", FormatBytes(bytes), "; the limit is ", FormatBytes(options_.max_pending_bytes),
        " (--max_pending_mib): try again when some have been placed"));
  }
  auto owned = queued_bytes_by_owner_.find(owner);
  const int64_t owned_bytes = owned == queued_bytes_by_owner_.end() ? 0 : owned->second;
  if (owned_bytes + bytes > options_.max_pending_bytes_per_owner) {
    return absl::ResourceExhaustedError(absl::StrCat(
        owner.empty() ? "anonymous" : owner, "'s waiting jobs hold ", FormatBytes(owned_bytes),
        " and this one needs ", FormatBytes(bytes), "; the most one submitter may have is ",
        FormatBytes(options_.max_pending_bytes_per_owner),
        " (--max_pending_mib_per_principal): try again when some have been placed"));
  }
  return absl::OkStatus();
}

void CoordinatorState::ExpireQueuedJobs(int64_t now) {
  std::vector<JobRecord*> expired;
  for (const std::string& job_id : pending_) {
    JobRecord* record = FindJob(job_id);
    const double timeout_s = record->spec().queue_timeout_s();
    if (timeout_s > 0 &&
        now - record->queued_since_ms() > static_cast<int64_t>(timeout_s * 1000)) {
      expired.push_back(record);
    }
  }
  for (JobRecord* record : expired) {
    FailJob(record,
            absl::StrFormat("not placed within queue_timeout_s %g: %s",
                            record->spec().queue_timeout_s(),
                            workers_.PendingReason(record->spec().device(),
                                                   record->spec().world_size(),
                                                   record->rank_memory_bytes())),
            /*restartable=*/false);
  }
}

void CoordinatorState::EvictOldRecords(int64_t now) {
  while (!finished_.empty()) {
    const JobRecord* oldest = FindJob(finished_.front());
    if (oldest != nullptr && finished_.size() <= options_.max_finished_jobs &&
        now - oldest->job().finished_unix_ms() <= options_.finished_job_retention_ms) {
      break;
    }
    if (oldest != nullptr) {
      freed_since_trim_ += oldest->MemoryBytes();
      effects_.batch.deleted.push_back(oldest->number());
      effects_.dirty_jobs.erase(oldest->id());
      if (!oldest->job().request_id().empty()) {
        job_by_request_id_.erase(RequestKey(oldest->job().owner(), oldest->job().request_id()));
      }
      if (auto name = job_by_owner_name_.find(
              RequestKey(oldest->job().owner(), oldest->spec().name()));
          name != job_by_owner_name_.end() && name->second == oldest->id()) {
        job_by_owner_name_.erase(name);  // A later job of that name keeps its entry.
      }
      job_order_.erase(oldest->number());
      jobs_.erase(finished_.front());
    }
    finished_.pop_front();
  }
  workers_.PruneLost(now);
}

void CoordinatorState::MaybeFinishJob(JobRecord* record) {
  if (record->terminal() || !record->AllResultsIn()) return;
  if (std::optional<std::string> mismatch = record->ChecksumMismatch()) {
    FailJob(record, *mismatch, /*restartable=*/false);
    return;
  }
  EndJob(record, v1::SUCCEEDED, "");
  effects_.schedule = true;
}

// ---------------------------------------------------------------------------------------------
// Workers
// ---------------------------------------------------------------------------------------------

absl::StatusOr<v1::RegisterWorkerResponse> CoordinatorState::RegisterWorker(
    const v1::RegisterWorkerRequest& request, const std::string& principal) {
  Mutation mutation(this);
  // Ranks await adoption only after a restart, until their workers are back or the grace
  // passes: once none does, none will, and a registration no longer walks every job.
  bool adoptions_open = false;
  if (adoptions_may_be_open_) {
    for (const auto& [id, record] : jobs_) adoptions_open |= !record->awaiting_adoption().empty();
    adoptions_may_be_open_ = adoptions_open;
  }
  absl::StatusOr<v1::RegisterWorkerResponse> response =
      workers_.Register(request, principal, adoptions_open, options_.now_ms());
  if (response.ok()) effects_.schedule = true;
  return response;
}

absl::Status CoordinatorState::Heartbeat(const v1::HeartbeatRequest& request) {
  Mutation mutation(this);
  auto worker =
      workers_.FindLive(request.worker_id(), request.incarnation(), request.worker_secret());
  if (!worker.ok()) return worker.status();
  const int64_t now = options_.now_ms();
  workers_.Touch(*worker, now);
  if (!request.has_usage()) return absl::OkStatus();  // Nothing new: the last one stays.
  // Checked after the touch: the call proved the worker alive, whatever its usage says.
  absl::Status usage =
      ValidateWorkerUsage(request.usage(), request.usage_age_ms(), (*worker)->info);
  if (!usage.ok()) return usage;
  workers_.RecordUsage(*worker, request.usage(), now - request.usage_age_ms());
  return absl::OkStatus();
}

absl::Status CoordinatorState::DeregisterWorker(const v1::DeregisterWorkerRequest& request) {
  Mutation mutation(this);
  auto worker =
      workers_.FindLive(request.worker_id(), request.incarnation(), request.worker_secret());
  if (!worker.ok()) return worker.status();
  const std::string& reason = request.reason();
  MarkWorkerLost(*worker,
                 absl::StrCat("worker ", request.worker_id(), " (", (*worker)->info.host(),
                              ") left: ",
                              reason.empty() ? "shut down" : TruncateForError(reason, 256)));
  effects_.schedule = true;
  return absl::OkStatus();
}

void CoordinatorState::MarkWorkerLost(WorkerRecord* worker, const std::string& why) {
  spdlog::warn("{}", why);
  const auto affected = workers_.MarkLost(worker, IsCurrent(), options_.now_ms());
  for (const auto& [job_id, ranks] : affected) {
    std::string rank_list;
    for (int rank : ranks) absl::StrAppend(&rank_list, rank_list.empty() ? "" : ", ", rank);
    FailJob(FindJob(job_id), absl::StrCat(why, "; it held rank ", rank_list, " of this job"));
  }
  effects_.Wake(WorkerKey(worker->info.worker_id()));  // Its poll answers NOT_FOUND now.
}

void CoordinatorState::CheckLiveness() {
  if (CheckLivenessLocked()) {
    // Many job records went (thousands of queued jobs cancelled, then evicted): glibc keeps
    // freed memory in its arenas, so the process stayed at its peak (1.46 GB after 10,000
    // jobs of 1,024 ranks were cancelled). Off the lock: it walks the heap.
    malloc_trim(0);
  }
}

bool CoordinatorState::CheckLivenessLocked() {
  Mutation mutation(this);
  const int64_t now = options_.now_ms();
  const int64_t monotonic = options_.monotonic_ms();
  const int64_t interval_ms = workers_.heartbeat_interval_ms();
  if (last_check_monotonic_ms_ >= 0 && monotonic - last_check_monotonic_ms_ > interval_ms) {
    // The silence was ours: what the workers sent meanwhile is still queued. Read it first.
    last_stall_ms_ = monotonic - last_check_monotonic_ms_;
    last_stall_ended_ms_ = now;
    stall_grace_until_ms_ = now + interval_ms;
    spdlog::warn(
        "the coordinator did not run for {:.1f} s (stopped or starved); no worker is declared "
        "lost for the next {:.1f} s while what they sent meanwhile is read",
        last_stall_ms_ / 1000.0, interval_ms / 1000.0);
  }
  last_check_monotonic_ms_ = monotonic;
  if (now < stall_grace_until_ms_) return false;
  bool changed = false;
  for (auto& [worker, silent_ms] : workers_.Silent(now)) {
    MarkWorkerLost(worker, absl::StrFormat("worker %s (%s) lost: no heartbeat for %.1f s",
                                           worker->info.worker_id(), worker->info.host(),
                                           silent_ms / 1000.0));
    changed = true;
  }
  for (auto& [id, record] : jobs_) {
    if (!record->running()) continue;
    // Collective failures with no root cause in time become the job's error.
    if (record->consequence_deadline_ms() > 0 && now >= record->consequence_deadline_ms()) {
      FailJob(record.get(), record->TakeConsequence());
      changed = true;
      continue;
    }
    if (std::optional<std::string> stall = policy_.StallError(*record, now)) {
      FailJob(record.get(), *stall);
      changed = true;
    }
  }
  ExpireQueuedJobs(now);
  ExpireAdoptions(now);
  // A job waiting for the worker that holds its checkpoint fails once that worker is known to
  // be gone, which is a matter of time after a coordinator restart.
  for (const std::string& job_id : pending_) {
    const JobRecord* record = FindJob(job_id);
    changed |= !record->job().latest_checkpoint_worker().empty() &&
               !record->spec().checkpoint_dir_shared();
  }
  if (changed) effects_.schedule = true;
  EvictOldRecords(now);
  if (freed_since_trim_ < kTrimAfterFreedBytes) return false;
  freed_since_trim_ = 0;
  return true;
}

std::vector<v1::Assignment> CoordinatorState::DesiredAssignments(
    const WorkerRecord& worker) const {
  std::vector<v1::Assignment> desired;
  for (const auto& [slot, busy] : worker.busy_slots()) {
    if (!SlotIsCurrent(busy)) continue;  // Draining.
    const JobRecord* record = FindJob(busy.job_id);
    if (record->rank(busy.rank).exited) continue;
    v1::Assignment assignment;
    assignment.set_job_id(record->id());
    assignment.set_rank(busy.rank);
    assignment.set_world_size(record->world_size());
    assignment.set_device_index(slot);
    *assignment.mutable_spec() = record->spec();
    assignment.set_attempt(record->attempt());
    assignment.set_resume_checkpoint(record->job().latest_checkpoint_path());
    assignment.set_rank_secret(record->RankSecret(record->attempt(), busy.rank));
    assignment.set_job_uid(record->job().uid());
    assignment.set_owner(record->job().owner());
    assignment.set_owner_is_admin(record->job().owner_is_admin());
    desired.push_back(std::move(assignment));
  }
  return desired;
}

bool CoordinatorState::RankIsFinishing(const v1::Assignment& assignment) const {
  // A rank that reported success exits by itself; stopping it would only race its exit.
  const JobRecord* record = FindJob(assignment.job_id());
  return record != nullptr && record->state() == v1::SUCCEEDED &&
         record->attempt() == assignment.attempt() && record->ValidRank(assignment.rank()) &&
         record->rank(assignment.rank()).result_reported;
}

absl::StatusOr<v1::PollAssignmentsResponse> CoordinatorState::PollAssignments(
    const v1::PollAssignmentsRequest& request) {
  Mutation mutation(this);
  auto worker =
      workers_.FindLive(request.worker_id(), request.incarnation(), request.worker_secret());
  if (!worker.ok()) return worker.status();
  // Any call the worker proves is its own shows it alive, not only a heartbeat: after a
  // network blip, whichever of its calls gets through first counts.
  workers_.Touch(*worker, options_.now_ms());
  // A worker runs at most a rank per slot (and one being stopped beside the next, at times):
  // a longer list would only make a stop list as long, under the lock.
  if (request.running_size() > 2 * (*worker)->info.slots()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "running lists ", request.running_size(), " ranks; this worker has ",
        (*worker)->info.slots(), " slots"));
  }
  AdoptRunningRanks(*worker, request);
  if ((*worker)->awaiting_first_poll()) {
    workers_.FirstPollDone(*worker);
    effects_.schedule = true;
  }
  std::set<std::string> running;
  for (const v1::Assignment& assignment : request.running()) {
    running.insert(AssignmentKey(assignment.job_id(), assignment.rank(), assignment.attempt()));
  }
  // Draining slots whose rank this worker no longer runs are free again, and may take a job
  // at once: schedule before answering.
  if (workers_.FreeDrainingSlots(*worker, IsCurrent(), &running, "")) effects_.schedule = true;
  if (effects_.schedule) {
    effects_.schedule = false;
    TrySchedule();
  }
  v1::PollAssignmentsResponse response;
  std::set<std::string> desired_keys;
  size_t start_bytes = 0;
  for (v1::Assignment& assignment : DesiredAssignments(**worker)) {
    std::string key = AssignmentKey(assignment.job_id(), assignment.rank(), assignment.attempt());
    desired_keys.insert(key);
    if (running.count(key)) continue;
    const size_t bytes = assignment.ByteSizeLong();
    if (response.start_size() > 0 && start_bytes + bytes > kMaxPollAnswerBytes) continue;
    start_bytes += bytes;
    *response.add_start() = std::move(assignment);
  }
  const int64_t now = options_.now_ms();
  std::map<std::string, int64_t> stops_sent;
  for (const v1::Assignment& assignment : request.running()) {
    if (RankIsFinishing(assignment)) continue;
    std::string key = AssignmentKey(assignment.job_id(), assignment.rank(), assignment.attempt());
    if (desired_keys.count(key)) continue;
    if (auto sent = (*worker)->stops_sent.find(key);
        sent != (*worker)->stops_sent.end() && now - sent->second < kStopResendMs) {
      stops_sent.insert(*sent);  // Told already: the poll waits for news instead.
      continue;
    }
    v1::Assignment* stop = response.add_stop();
    stop->set_job_id(assignment.job_id());
    stop->set_rank(assignment.rank());
    stop->set_attempt(assignment.attempt());
    stops_sent[std::move(key)] = now;
  }
  (*worker)->stops_sent = std::move(stops_sent);
  if (response.start_size() > 0 || response.stop_size() > 0) {
    effects_.wait_ticket = (*worker)->assignments_ticket;  // Not before it is written.
  }
  return response;
}

absl::Status CoordinatorState::ReportRankExit(const v1::ReportRankExitRequest& request) {
  Mutation mutation(this);
  WorkerRecord* worker = workers_.Find(request.worker_id());
  if (worker == nullptr || !SecretsEqual(worker->secret, request.worker_secret())) {
    return absl::PermissionDeniedError(
        absl::StrCat("the worker secret does not match worker ", Quote(request.worker_id())));
  }
  if (worker->alive()) workers_.Touch(worker, options_.now_ms());
  // Only the worker that runs a rank speaks for its process.
  bool placed_here = false;
  for (const auto& [slot, busy] : worker->busy_slots()) {
    placed_here |= busy.job_id == request.job_id() && busy.rank == request.rank() &&
                   busy.attempt == request.attempt();
  }
  JobRecord* record = FindJob(request.job_id());
  if (!placed_here) {
    // After a restart the coordinator waits for the job's ranks to be re-adopted; a rank that
    // died meanwhile is listed by no worker, and its worker (registered again) reports the exit
    // with the rank's secret as proof. Without it the job would wait out adopt_grace_s and
    // fail naming the wrong cause.
    const bool awaited = record != nullptr && record->running() &&
                         request.attempt() == record->attempt() &&
                         record->ValidRank(request.rank()) &&
                         record->awaiting_adoption().count(request.rank()) > 0 &&
                         record->CheckRankSecret(request.attempt(), request.rank(),
                                                 request.rank_secret())
                             .ok();
    if (!awaited) return absl::OkStatus();
  }
  const bool current = record != nullptr && record->running() &&
                       request.attempt() == record->attempt() &&
                       record->ValidRank(request.rank());
  if (current) {
    if (!placed_here) record->StopAwaitingAdoption(request.rank());
    record->RecordExit(request.rank());
    // A rank that reported its result (success or error) is accounted for.
    if (!record->rank(request.rank()).result_reported) {
      std::string how =
          request.term_signal() != 0
              ? absl::StrCat("was killed by signal ", request.term_signal(), " (",
                             strsignal(request.term_signal()), ")")
              : absl::StrCat("exited with code ", request.exit_code());
      // Stopped by its worker on its own (a self-fence): that is the cause.
      const std::string why =
          request.stop_reason().empty()
              ? std::string()
              : absl::StrCat(" (", TruncateForError(request.stop_reason(), 1024), ")");
      FailJob(record, absl::StrCat(record->DescribeRank(request.rank()), " ", how, why,
                                   " before reporting a result"));
      effects_.schedule = true;
    } else if (!request.stop_reason().empty() &&
               record->rank(request.rank()).checksum.empty()) {
      // It reported its stop (ABORTED, a consequence held back for a cause): this is the cause.
      // (A rank that reported success is done, whatever stopped its process.)
      FailJob(record, absl::StrCat(record->DescribeRank(request.rank()), " was stopped (",
                                   TruncateForError(request.stop_reason(), 1024), ")"));
      effects_.schedule = true;
    }
  }
  // Whatever the rank's job does next, its slot is free once its process is gone. (A job
  // waiting for a restart has no current ranks: this exit belonged to the failed attempt.)
  if (workers_.FreeDrainingSlots(
          worker, IsCurrent(), nullptr,
          AssignmentKey(request.job_id(), request.rank(), request.attempt()))) {
    effects_.schedule = true;
    effects_.Wake(WorkerKey(request.worker_id()));
  }
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown job ", Quote(request.job_id())));
  }
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// Key-value store, telemetry and results
// ---------------------------------------------------------------------------------------------

absl::Status CoordinatorState::ReportRankLog(const v1::ReportRankLogRequest& request) {
  if (request.data().size() > RankLogs::kMaxChunkBytes) {
    return absl::InvalidArgumentError(absl::StrCat("data is ", request.data().size(),
                                                   " bytes; the limit is ",
                                                   RankLogs::kMaxChunkBytes));
  }
  Mutation mutation(this);
  const WorkerRecord* worker = workers_.Find(request.worker_id());
  if (worker == nullptr || !SecretsEqual(worker->secret, request.worker_secret())) {
    return absl::PermissionDeniedError(
        absl::StrCat("the worker secret does not match worker ", Quote(request.worker_id())));
  }
  JobRecord* record = FindJob(request.job_id());
  // Only the worker that runs a rank speaks for its output; the job's placement says which.
  bool placed_here = false;
  if (record != nullptr && record->attempt() == request.attempt()) {
    for (const v1::RankPlacement& placement : record->job().placement()) {
      placed_here |= placement.rank() == request.rank() &&
                     placement.worker_id() == request.worker_id();
    }
  }
  if (!placed_here) {
    return absl::PermissionDeniedError(absl::StrCat(
        "rank ", request.rank(), " of job ", Quote(request.job_id()), " attempt ",
        request.attempt(), " does not run on worker ", Quote(request.worker_id())));
  }
  return record->AppendRankLog(request.attempt(), request.rank(), request.offset(),
                               request.data());
}

absl::StatusOr<v1::GetRankLogResponse> CoordinatorState::GetRankLog(
    const v1::GetRankLogRequest& request, const JobReader& reader) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobRecord* record = FindReadableJob(request.job_id(), reader);
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown job ", Quote(request.job_id())));
  }
  if (!record->ValidRank(request.rank())) {
    return absl::InvalidArgumentError(absl::StrCat("rank must be in [0, ", record->world_size(),
                                                   "), got ", request.rank()));
  }
  auto log = record->logs().Read(request.attempt(), request.rank(), request.after_offset());
  if (!log.ok() && record->terminal()) {
    // Not "yet": nothing more will come. (The rank never started, or its worker sent nothing.)
    return absl::NotFoundError(absl::StrCat(
        "job ", record->id(), " ended (", v1::JobState_Name(record->state()),
        ") and no output of rank ", request.rank(),
        request.attempt() == 0 ? "" : absl::StrCat(" attempt ", request.attempt()),
        " is kept: the rank wrote none, or never started"));
  }
  if (!log.ok()) {
    return absl::NotFoundError(absl::StrCat("job ", record->id(), ": ", log.status().message()));
  }
  // An ended job's ranks write nothing more, whether or not their exit was reported.
  if (record->terminal() || log->attempt() < record->attempt()) log->set_complete(true);
  return log;
}

absl::Status CoordinatorState::CheckWorkerIndexesForTesting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return workers_.CheckIndexes();
}

std::string CoordinatorState::RankSecretForTesting(const std::string& job_id, int attempt,
                                                   int rank) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobRecord* record = FindJob(job_id);
  return record == nullptr ? "" : record->RankSecret(attempt, rank);
}

absl::Status CoordinatorState::CheckSpecPaths(const v1::JobSpec& spec,
                                              const Tenancy& owner) const {
  const std::vector<SpecPath> paths = SpecPaths(spec);
  if (paths.empty()) return absl::OkStatus();  // Most specs: no list of the workers to build.
  const std::vector<const WorkerRecord*> workers = workers_.Live(spec.device());
  for (const SpecPath& path : paths) {
    if (absl::Status status = CheckPathSyntax(path.field, path.path); !status.ok()) {
      return status;
    }
    // With no worker of this kind yet, the workers check when the job is placed.
    if (workers.empty()) continue;
    bool accepted = false;
    bool others_part = false;  // Only outside the owner's part of some worker's output roots.
    for (const WorkerRecord* worker : workers) {
      if (path.write) {
        const std::vector<std::string> output(worker->info.output_roots().begin(),
                                              worker->info.output_roots().end());
        const bool own = MayWrite(path.path, output, owner);
        accepted |= own;
        others_part |= !own && IsUnderAnyRoot(path.path, output);
      } else {
        // Reads in another principal's part are refused by the worker, which sees the parts.
        const auto& data = worker->info.data_roots();
        accepted |= IsUnderAnyRoot(path.path, {data.begin(), data.end()});
      }
    }
    if (!accepted && others_part) {
      return absl::PermissionDeniedError(absl::StrCat(
          path.field, " lies outside ", owner.principal, "'s part of the workers' output roots (",
          DescribeTenancyRule(owner), ")"));
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
          record->CheckRankSecret(request.attempt(), request.rank(), request.rank_secret());
      !status.ok()) {
    return status;
  }
  if (!record->running() || record->attempt() != request.attempt()) {
    return absl::FailedPreconditionError(absl::StrCat("job ", request.job_id(), " attempt ",
                                                      request.attempt(), " is not running"));
  }
  if (absl::Status status = record->SetKv(request.key(), request.value()); !status.ok()) {
    return absl::Status(status.code(),
                        absl::StrCat("job ", request.job_id(), ": ", status.message()));
  }
  // Its waiters look again; the record itself is unchanged (the store writes the key alone).
  // A repeated set of the same value writes nothing: it waits for the write of the first.
  effects_.Wake(JobKey(record->id()));
  effects_.wait_ticket = record->store_ticket();
  return absl::OkStatus();
}

absl::Status CoordinatorState::CheckWorkerCaller(const std::string& worker_id,
                                                 const std::string& secret) const {
  std::lock_guard<std::mutex> lock(mu_);
  const WorkerRecord* worker = workers_.Find(worker_id);
  if (worker == nullptr || !SecretsEqual(worker->secret, secret)) {
    return absl::PermissionDeniedError(
        absl::StrCat("the worker secret does not match worker ", Quote(worker_id)));
  }
  return absl::OkStatus();
}

absl::Status CoordinatorState::CheckRankCaller(const std::string& job_id, int attempt, int rank,
                                               const std::string& secret) const {
  std::lock_guard<std::mutex> lock(mu_);
  const JobRecord* record = FindJob(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  return record->CheckRankSecret(attempt, rank, secret);
}

bool CoordinatorState::IsWritten(uint64_t ticket) const {
  return writer_ == nullptr || writer_->IsWritten(ticket);
}

absl::StatusOr<CoordinatorState::KeyValueRead> CoordinatorState::KeyValueGet(
    const v1::KeyValueGetRequest& request) const {
  // As for a set: a waiting get keeps its request, so its key is bounded too.
  if (request.key().empty() || request.key().size() > kMaxKvKeyBytes) {
    return absl::InvalidArgumentError(absl::StrCat("key must be 1 to ", kMaxKvKeyBytes,
                                                   " bytes, got ", request.key().size()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  const std::string& job_id = request.job_id();
  const JobRecord* record = FindJob(job_id);
  if (record == nullptr) return absl::NotFoundError(absl::StrCat("unknown job ", Quote(job_id)));
  if (absl::Status status =
          record->CheckRankSecret(request.attempt(), request.rank(), request.rank_secret());
      !status.ok()) {
    return status;
  }
  if (!record->running() || record->attempt() != request.attempt()) {
    return absl::AbortedError(absl::StrCat("job ", job_id, " attempt ", request.attempt(),
                                           " ended while waiting for key ",
                                           Quote(request.key())));
  }
  return KeyValueRead{record->kv().Get(request.key()), record->store_ticket()};
}

absl::StatusOr<v1::ReportTelemetryResponse> CoordinatorState::ReportTelemetry(
    const v1::ReportTelemetryRequest& request) {
  Mutation mutation(this);
  JobRecord* record = FindJob(request.job_id());
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown job ", Quote(request.job_id())));
  }
  if (absl::Status status =
          record->CheckRankSecret(request.attempt(), request.rank(), request.rank_secret());
      !status.ok()) {
    return status;
  }
  if (request.records_size() > kMaxTelemetryRecordsPerReport) {
    return absl::InvalidArgumentError(absl::StrCat(
        "records: at most ", kMaxTelemetryRecordsPerReport, " per report, got ",
        request.records_size()));
  }
  if (request.notes_size() > kMaxNotesPerReport) {
    return absl::InvalidArgumentError(absl::StrCat("notes: at most ", kMaxNotesPerReport,
                                                   " per report, got ", request.notes_size()));
  }
  v1::ReportTelemetryResponse response;
  if (!record->running() || record->attempt() != request.attempt()) {
    response.set_abort(true);
    return response;
  }
  // The worker whose disk a checkpoint is on: where the rank runs.
  std::string worker_name;
  for (const v1::RankPlacement& placement : record->job().placement()) {
    if (placement.rank() != request.rank()) continue;
    if (const WorkerRecord* worker = workers_.Find(placement.worker_id())) {
      worker_name = worker->name;
    } else {
      // A restarted coordinator hears from the rank before its worker registers again: the
      // holder must not become "" (a later restart would place rank 0 where the file is not).
      worker_name = WorkerRegistry::NameOfId(placement.worker_id());
    }
  }
  if (absl::Status status = record->RecordTelemetry(request, worker_name, options_.now_ms());
      !status.ok()) {
    return status;
  }
  return response;
}

std::optional<std::string> CoordinatorState::PartitionError(const JobRecord& record,
                                                            int rank) const {
  auto worker_of = [&](int r) -> const WorkerRecord* {
    for (const v1::RankPlacement& placement : record.job().placement()) {
      if (placement.rank() == r) return workers_.Find(placement.worker_id());
    }
    return nullptr;
  };
  // Alive: it heartbeats (within two intervals), so neither end is gone; the link between is.
  auto heartbeating = [&](const WorkerRecord* worker) {
    return worker != nullptr && worker->alive() &&
           options_.now_ms() - worker->info.last_heartbeat_unix_ms() <=
               2 * workers_.heartbeat_interval_ms();
  };
  const WorkerRecord* own = worker_of(rank);
  if (!heartbeating(own)) return std::nullopt;
  for (int peer : FailurePolicy::WaitedFor(record.job().progress(rank).error())) {
    if (!FailurePolicy::NameEachOther(record, rank, peer)) continue;
    const WorkerRecord* other = worker_of(peer);
    if (!heartbeating(other) || other == own) continue;
    return absl::StrCat("a partition between ", record.DescribeRank(rank), " and ",
                        record.DescribeRank(peer), ": each timed out waiting for the other "
                        "while both workers heartbeat (hosts ", own->info.host(), " and ",
                        other->info.host(), " cannot reach each other); ",
                        TruncateForError(record.job().progress(rank).error(), 1024));
  }
  return std::nullopt;
}

absl::Status CoordinatorState::ReportRankResult(const v1::ReportRankResultRequest& request) {
  Mutation mutation(this);
  JobRecord* record = FindJob(request.job_id());
  if (record == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown job ", Quote(request.job_id())));
  }
  if (absl::Status status =
          record->CheckRankSecret(request.attempt(), request.rank(), request.rank_secret());
      !status.ok()) {
    return status;
  }
  if (record->attempt() != request.attempt() || !record->running()) {
    return absl::OkStatus();  // The attempt is over; the result no longer matters.
  }
  if (!record->ValidRank(request.rank())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", request.rank(), " out of range"));
  }
  if (request.result_case() == v1::ReportRankResultRequest::kError) {
    record->RecordError(request.rank(), request.error());
    const std::string error = absl::StrCat(record->DescribeRank(request.rank()), " failed: ",
                                           TruncateForError(request.error(), 4096));
    if (request.collective_failure()) {
      if (std::optional<std::string> partition = PartitionError(*record, request.rank())) {
        FailJob(record, *partition);
        effects_.schedule = true;
        return absl::OkStatus();
      }
      record->HoldConsequence(error, policy_.ConsequenceDeadline(options_.now_ms()));
      return absl::OkStatus();
    }
    FailJob(record, error);
    effects_.schedule = true;
    return absl::OkStatus();
  }
  // ParameterChecksum's form is 16 hex digits; what is stored and persisted per rank stays that
  // small.
  const std::string& checksum = request.parameter_checksum();
  constexpr size_t kMaxChecksumBytes = 64;
  if (checksum.size() > kMaxChecksumBytes) {
    return absl::InvalidArgumentError(absl::StrCat("parameter_checksum must be at most ",
                                                   kMaxChecksumBytes, " bytes, got ",
                                                   checksum.size()));
  }
  record->RecordSuccess(request.rank(), checksum);
  MaybeFinishJob(record);
  return absl::OkStatus();
}

}  // namespace mptrain
