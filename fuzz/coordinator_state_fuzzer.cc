// Fuzzes the coordinator's state machine: the input decodes into a sequence of worker, user and
// rank calls (right or wrong secrets, a fake clock that jumps, liveness checks), and after every
// call the public view (GetJob, ListJobs, ListWorkers) must still hold together:
//   - every ALIVE worker has 0 <= free_slots <= slots, and at least as many busy slots as the
//     RUNNING ranks placed on it; once every worker has reported its running ranks (Quiesce),
//     exactly as many (a slot held beyond that has leaked);
//   - a RUNNING job has world_size placements, ranks 0..world_size-1 each once, on distinct
//     (worker, device) pairs of ALIVE workers, with device indices inside the worker's slots;
//     no (worker, device) pair is used by two RUNNING jobs;
//   - ListJobs pages list every known job exactly once, oldest first, in a valid state;
//   - a job that ended never comes back, an evicted job never reappears, restarts never exceed
//     max_restarts;
//   - a call with a wrong worker or rank secret never succeeds;
//   - CoordinatorOptions::notify is called outside the lock (it calls back into the state).
// Nothing here may block (PollAssignments is asked for wait_ms 0 all the same).

#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "coordinator/coordinator_state.h"
#include "spdlog/spdlog.h"

namespace mptrain {
namespace {

constexpr int64_t kHeartbeatTimeoutMs = 10'000;
constexpr size_t kMaxOperations = 96;

// Reports the broken invariant, then crashes so that libFuzzer saves the input.
#define FUZZ_CHECK(condition)                                                            \
  do {                                                                                   \
    if (!(condition)) {                                                                  \
      fprintf(stderr, "%s:%d: invariant violated: %s\n", __FILE__, __LINE__, #condition); \
      abort();                                                                           \
    }                                                                                    \
  } while (0)

// MPTRAIN_FUZZ_TRACE=1 prints each call and its outcome (to read a reproducer).
bool Tracing() {
  static const bool tracing = getenv("MPTRAIN_FUZZ_TRACE") != nullptr;
  return tracing;
}

void Note(const char* call, const absl::Status& status) {
  if (Tracing()) fprintf(stderr, "  %s: %s\n", call, status.ToString().c_str());
}

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

std::string AssignmentKey(const v1::Assignment& assignment) {
  return assignment.job_id() + "/" + std::to_string(assignment.rank()) + "/" +
         std::to_string(assignment.attempt());
}

// A worker the harness registered; `running` is what its fake daemon runs.
struct WorkerHandle {
  std::string id;
  std::string secret;
  uint64_t incarnation = 0;
  std::map<std::string, v1::Assignment> running;  // AssignmentKey -> assignment
};

// Where a rank call goes: (job, attempt, rank).
struct RankTarget {
  std::string job_id;
  int attempt = 0;
  int rank = 0;
};

enum Operation {
  kRegisterWorker,
  kHeartbeat,
  kPollAssignments,
  kDeregisterWorker,
  kSubmitJob,
  kCancelJob,
  kReportRankExit,
  kReportTelemetry,
  kReportRankResult,
  kKeyValueSet,
  kKeyValueGet,
  kAdvanceClock,
  kTick,
  kCheckLiveness,
  kListJobsBadArguments,
  kWatch,
  kQuiesce,
  kLastOperation = kQuiesce,
};

class Harness {
 public:
  explicit Harness(const uint8_t* data, size_t size) : input_(data, size) {
    CoordinatorOptions options;
    options.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
    options.now_ms = [this] { return now_ms_; };
    // Called outside the lock: a call back in must not deadlock (libFuzzer's -timeout catches
    // one).
    options.notify = [this](const std::vector<std::string>&) {
      if (state_ != nullptr) (void)state_->ListWorkers();
    };
    // Small bounds, so that short inputs reach them.
    options.max_events_per_job = 16;
    options.max_kv_keys_per_job = 4;
    options.max_kv_bytes_per_job = 256;
    options.max_pending_jobs = 6;
    options.max_finished_jobs = 4;
    options.finished_job_retention_ms = 60'000;
    options.max_events_per_finished_job = 4;
    options.max_lost_workers = 3;
    state_ = std::make_unique<CoordinatorState>(options);
  }

  void Run() {
    for (size_t i = 0; i < kMaxOperations && input_.remaining_bytes() > 0; ++i) {
      const int operation = input_.ConsumeIntegralInRange<int>(0, kLastOperation);
      if (Tracing()) fprintf(stderr, "t=%lld op %d\n", static_cast<long long>(now_ms_), operation);
      switch (operation) {
        case kRegisterWorker: RegisterWorker(); break;
        case kHeartbeat: Heartbeat(); break;
        case kPollAssignments: PollAssignments(); break;
        case kDeregisterWorker: DeregisterWorker(); break;
        case kSubmitJob: SubmitJob(); break;
        case kCancelJob: CancelJob(); break;
        case kReportRankExit: ReportRankExit(); break;
        case kReportTelemetry: ReportTelemetry(); break;
        case kReportRankResult: ReportRankResult(); break;
        case kKeyValueSet: KeyValueSet(); break;
        case kKeyValueGet: KeyValueGet(); break;
        case kAdvanceClock:
          now_ms_ += input_.ConsumeIntegralInRange<int64_t>(0, 3 * kHeartbeatTimeoutMs / 2);
          state_->CheckLiveness();
          break;
        case kTick: Tick(); break;
        case kCheckLiveness: state_->CheckLiveness(); break;
        case kListJobsBadArguments: ListJobsBadArguments(); break;
        case kWatch: Watch(); break;
        case kQuiesce: Quiesce(); break;
      }
      CheckInvariants();
    }
    Quiesce();
    CheckInvariants();
    if (Tracing()) {
      for (const std::string& job_id : jobs_) {
        absl::StatusOr<v1::Job> job = state_->GetJob(job_id);
        fprintf(stderr, "%s: %s %s\n", job_id.c_str(),
                job.ok() ? v1::JobState_Name(job->state()).c_str() : "evicted",
                job.ok() ? job->error().c_str() : "");
      }
    }
  }

 private:
  // ---- Choices ----

  // nullptr when no worker was registered yet.
  WorkerHandle* PickWorker() {
    if (workers_.empty()) return nullptr;
    return &workers_[input_.ConsumeIntegralInRange<size_t>(0, workers_.size() - 1)];
  }

  // A known job mostly, sometimes an unknown id.
  std::string PickJobId() {
    if (jobs_.empty() || input_.ConsumeIntegralInRange<int>(0, 15) == 15) return "job-9999";
    return jobs_[input_.ConsumeIntegralInRange<size_t>(0, jobs_.size() - 1)];
  }

  // The right secret when the input runs out; otherwise sometimes a wrong one.
  std::pair<std::string, bool> MaybeWrong(const std::string& right) {
    switch (input_.ConsumeIntegralInRange<int>(0, 7)) {
      case 6: return {"", right.empty()};
      case 7: return {right + "0", false};
      default: return {right, true};
    }
  }

  // A rank that some worker runs, or any (job, attempt, rank).
  RankTarget PickRankTarget() {
    std::vector<const v1::Assignment*> running;
    for (const WorkerHandle& worker : workers_) {
      for (const auto& [key, assignment] : worker.running) running.push_back(&assignment);
    }
    if (!running.empty() && !input_.ConsumeBool()) {
      const v1::Assignment* assignment =
          running[input_.ConsumeIntegralInRange<size_t>(0, running.size() - 1)];
      return {assignment->job_id(), assignment->attempt(), assignment->rank()};
    }
    RankTarget target;
    target.job_id = PickJobId();
    target.attempt = input_.ConsumeIntegralInRange<int>(0, 4);
    target.rank = input_.ConsumeIntegralInRange<int>(-1, 4);
    return target;
  }

  // ---- Worker calls ----

  void RegisterWorker() {
    static const char* const kNames[] = {"w0", "w1", "w2", "w3", "bad name"};
    static const int64_t kMemory[] = {0, int64_t{64} << 20, int64_t{1} << 30, int64_t{64} << 30};
    v1::RegisterWorkerRequest request;
    const int name = input_.ConsumeIntegralInRange<int>(0, 4);
    request.set_name(kNames[name]);
    request.set_host("10.0.0." + std::to_string(name));
    request.set_device(input_.ConsumeBool() ? v1::CUDA : v1::CPU);
    request.set_slots(input_.ConsumeIntegralInRange<int>(0, 4));
    request.set_incarnation(input_.ConsumeIntegralInRange<uint64_t>(1, 3));
    request.set_memory_bytes(kMemory[input_.ConsumeIntegralInRange<int>(0, 3)]);
    if (request.device() == v1::CUDA && input_.ConsumeBool()) {
      for (int index = 0; index < request.slots(); ++index) {
        v1::DeviceInfo* device = request.add_devices();
        device->set_index(index);
        device->set_name("gpu");
        device->set_memory_bytes(kMemory[input_.ConsumeIntegralInRange<int>(0, 3)]);
      }
    }
    if (input_.ConsumeBool()) {
      request.add_data_roots("/data");
      request.add_output_roots("/out");
    }
    absl::StatusOr<v1::RegisterWorkerResponse> response = state_->RegisterWorker(request, "ops");
    Note("RegisterWorker", response.status());
    if (!response.ok()) return;
    FUZZ_CHECK(!response->worker_secret().empty());
    workers_.push_back({response->worker_id(), response->worker_secret(), request.incarnation(),
                        {}});
  }

  void Heartbeat() {
    WorkerHandle* worker = PickWorker();
    if (worker == nullptr) return;
    v1::HeartbeatRequest request;
    request.set_worker_id(worker->id);
    request.set_incarnation(worker->incarnation + (input_.ConsumeIntegralInRange(0, 7) == 7));
    auto [secret, right] = MaybeWrong(worker->secret);
    request.set_worker_secret(secret);
    if (input_.ConsumeBool()) AddUsage(&request);
    absl::Status status = state_->Heartbeat(request);
    Note("Heartbeat", status);
    if (!right) FUZZ_CHECK(!status.ok());
  }

  // A usage reading, sensible or hostile: negative, huge or inconsistent figures, utilization
  // past 100 %, devices repeated, unregistered or past the bound, a stale age.
  void AddUsage(v1::HeartbeatRequest* request) {
    auto figure = [&] {
      switch (input_.ConsumeIntegralInRange(0, 3)) {
        case 0: return input_.ConsumeIntegralInRange<int64_t>(0, int64_t{1} << 40);
        case 1: return -input_.ConsumeIntegralInRange<int64_t>(1, int64_t{1} << 40);
        case 2: return std::numeric_limits<int64_t>::max();
        default: return int64_t{0};
      }
    };
    v1::WorkerUsage* usage = request->mutable_usage();
    usage->set_memory_available_bytes(figure());
    usage->set_memory_total_bytes(figure());
    const int devices = input_.ConsumeIntegralInRange(0, 3) == 3
                            ? input_.ConsumeIntegralInRange(0, 100)
                            : input_.ConsumeIntegralInRange(0, 3);
    for (int d = 0; d < devices; ++d) {
      v1::DeviceUsage* device = usage->add_devices();
      device->set_index(input_.ConsumeIntegralInRange(-2, 1100));
      device->set_available(input_.ConsumeBool());
      device->set_memory_used_bytes(figure());
      device->set_memory_total_bytes(figure());
      device->set_utilization_percent(input_.ConsumeIntegralInRange(-5, 105));
    }
    request->set_usage_age_ms(input_.ConsumeIntegralInRange<int64_t>(-10, 70'000));
  }

  void PollAssignments() {
    WorkerHandle* worker = PickWorker();
    if (worker == nullptr) return;
    v1::PollAssignmentsRequest request;
    request.set_worker_id(worker->id);
    request.set_incarnation(worker->incarnation);
    auto [secret, right] = MaybeWrong(worker->secret);
    request.set_worker_secret(secret);
    request.set_wait_ms(0);
    // What the daemon says it runs: all of it, nothing (its ranks died unreported), all but
    // one, or an extra rank it should not have.
    std::map<std::string, v1::Assignment> reported = worker->running;
    switch (input_.ConsumeIntegralInRange<int>(0, 7)) {
      case 5:
        reported.clear();
        break;
      case 6:
        if (!reported.empty()) {
          auto it = reported.begin();
          std::advance(it, input_.ConsumeIntegralInRange<size_t>(0, reported.size() - 1));
          reported.erase(it);
        }
        break;
      case 7: {
        v1::Assignment extra;
        extra.set_job_id(PickJobId());
        extra.set_rank(input_.ConsumeIntegralInRange<int>(-1, 4));
        extra.set_attempt(input_.ConsumeIntegralInRange<int>(0, 4));
        reported[AssignmentKey(extra)] = extra;
        break;
      }
      default:
        break;
    }
    for (const auto& [key, assignment] : reported) *request.add_running() = assignment;
    absl::StatusOr<v1::PollAssignmentsResponse> response = state_->PollAssignments(request);
    Note("PollAssignments", response.status());
    if (!right) {
      FUZZ_CHECK(!response.ok());
      return;
    }
    if (!response.ok()) return;
    worker->running = std::move(reported);
    for (const v1::Assignment& stop : response->stop()) worker->running.erase(AssignmentKey(stop));
    for (const v1::Assignment& start : response->start()) {
      absl::StatusOr<v1::Job> job = state_->GetJob(start.job_id());
      FUZZ_CHECK(job.ok() && job->state() == v1::RUNNING);
      FUZZ_CHECK(start.rank() >= 0 && start.rank() < job->spec().world_size());
      FUZZ_CHECK(start.world_size() == job->spec().world_size());
      FUZZ_CHECK(!start.rank_secret().empty());
      FUZZ_CHECK(start.rank_secret() ==
                 state_->RankSecretForTesting(start.job_id(), start.attempt(), start.rank()));
      worker->running[AssignmentKey(start)] = start;
    }
  }

  void DeregisterWorker() {
    WorkerHandle* worker = PickWorker();
    if (worker == nullptr) return;
    v1::DeregisterWorkerRequest request;
    request.set_worker_id(worker->id);
    request.set_incarnation(worker->incarnation);
    request.set_reason(input_.ConsumeBool() ? "" : "maintenance");
    auto [secret, right] = MaybeWrong(worker->secret);
    request.set_worker_secret(secret);
    absl::Status status = state_->DeregisterWorker(request);
    Note("DeregisterWorker", status);
    if (!right) FUZZ_CHECK(!status.ok());
  }

  // Worker-side: a rank process of `worker` exited (its daemon reports it once).
  void ReportRankExit() {
    WorkerHandle* worker = PickWorker();
    if (worker == nullptr) return;
    v1::ReportRankExitRequest request;
    request.set_worker_id(worker->id);
    if (!worker->running.empty() && !input_.ConsumeBool()) {
      auto it = worker->running.begin();
      std::advance(it, input_.ConsumeIntegralInRange<size_t>(0, worker->running.size() - 1));
      request.set_job_id(it->second.job_id());
      request.set_rank(it->second.rank());
      request.set_attempt(it->second.attempt());
    } else {
      const RankTarget target = PickRankTarget();
      request.set_job_id(target.job_id);
      request.set_rank(target.rank);
      request.set_attempt(target.attempt);
    }
    switch (input_.ConsumeIntegralInRange<int>(0, 3)) {
      case 0: request.set_exit_code(0); break;
      case 1: request.set_exit_code(1); break;
      case 2: request.set_term_signal(9); break;
      case 3: request.set_term_signal(input_.ConsumeIntegral<int32_t>()); break;
    }
    auto [secret, right] = MaybeWrong(worker->secret);
    request.set_worker_secret(secret);
    const std::string key = request.job_id() + "/" + std::to_string(request.rank()) + "/" +
                            std::to_string(request.attempt());
    absl::Status status = state_->ReportRankExit(request);
    Note("ReportRankExit", status);
    if (!right) {
      FUZZ_CHECK(!status.ok());
      return;
    }
    if (status.ok()) worker->running.erase(key);
  }

  // ---- User calls ----

  void SubmitJob() {
    v1::SubmitJobRequest request;
    v1::JobSpec* spec = request.mutable_spec();
    // A few names: a live job's name refuses another of its owner (ALREADY_EXISTS).
    spec->set_name("fuzz-" + std::to_string(input_.ConsumeIntegralInRange<int>(0, 7)));
    spec->set_world_size(input_.ConsumeIntegralInRange<int>(1, 4));
    spec->set_device(input_.ConsumeBool() ? v1::CUDA : v1::CPU);
    spec->mutable_model()->set_input_dim(4);
    spec->mutable_model()->set_output_dim(2);
    spec->mutable_data()->mutable_synthetic()->set_seed(0);
    spec->set_micro_batch_size(2);
    spec->set_accumulation_steps(1);
    spec->set_steps(1);
    spec->mutable_optimizer()->set_lr(0.1);
    const uint8_t flags = input_.ConsumeIntegral<uint8_t>();
    if (flags & 0x01) spec->set_queue_timeout_s(input_.ConsumeIntegralInRange<int>(1, 30));
    if (flags & 0x02) spec->set_max_restarts(input_.ConsumeIntegralInRange<int>(0, 2));
    if (flags & 0x04) spec->set_progress_timeout_s(input_.ConsumeIntegralInRange<int>(1, 20));
    if (flags & 0x08) {
      // About 1.2 GiB per CPU rank: too big for the smaller workers.
      spec->mutable_model()->add_hidden_dims(8192);
      spec->mutable_model()->add_hidden_dims(8192);
    }
    if (flags & 0x10) {
      spec->set_init_checkpoint("/data/init.safetensors");
      spec->set_checkpoint_dir("/out/ckpt");
      spec->set_checkpoint_every(1);
    }
    if (flags & 0x20) request.set_request_id("req-" + std::to_string(flags >> 6));
    if ((flags & 0xc0) == 0xc0) {
      // Invalid: a rule broken, or a path outside every root.
      if (input_.ConsumeBool()) {
        spec->mutable_model()->add_hidden_dims(0);
      } else {
        spec->set_output_checkpoint("/etc/out.safetensors");
      }
    }
    const std::string owner = input_.ConsumeBool() ? "bob" : "alice";
    absl::StatusOr<v1::SubmitJobResponse> response = state_->SubmitJob(request, owner);
    Note("SubmitJob", response.status());
    if (!response.ok()) return;
    FUZZ_CHECK(response->state() == v1::PENDING || response->state() == v1::RUNNING ||
               !request.request_id().empty());
    if (known_jobs_.insert(response->job_id()).second) {
      FUZZ_CHECK(jobs_.empty() || jobs_.back() < response->job_id());
      jobs_.push_back(response->job_id());
    }
  }

  void CancelJob() {
    const std::string job_id = PickJobId();
    const std::string principal = input_.ConsumeBool() ? "bob" : "alice";
    const bool admin = input_.ConsumeBool();
    absl::StatusOr<v1::JobState> state = state_->CancelJob(job_id, principal, admin);
    Note("CancelJob", state.status());
    if (state.ok()) FUZZ_CHECK(*state == v1::CANCELLED);
  }

  // ---- Rank calls ----

  void ReportTelemetry() {
    const RankTarget target = PickRankTarget();
    v1::ReportTelemetryRequest request;
    request.set_job_id(target.job_id);
    request.set_attempt(target.attempt);
    request.set_rank(target.rank);
    request.set_step(input_.ConsumeIntegralInRange<int64_t>(-1, 10));
    const int records = input_.ConsumeIntegralInRange<int>(0, 2);
    for (int i = 0; i < records; ++i) {
      v1::TelemetryRecord* record = request.add_records();
      record->set_step(request.step());
      record->set_loss(0.5);
    }
    switch (input_.ConsumeIntegralInRange<int>(0, 3)) {
      case 1: request.set_checkpoint_path("/out/ckpt/step-00000001.safetensors"); break;
      case 2: request.set_checkpoint_path("/out/elsewhere.safetensors"); break;
      case 3: request.set_checkpoint_path("/out/ckpt/../../etc/x"); break;
      default: break;
    }
    if (!request.checkpoint_path().empty()) request.set_checkpoint_step(request.step());
    auto [secret, right] =
        MaybeWrong(state_->RankSecretForTesting(target.job_id, target.attempt, target.rank));
    request.set_rank_secret(secret);
    absl::StatusOr<v1::ReportTelemetryResponse> response = state_->ReportTelemetry(request);
    Note("ReportTelemetry", response.status());
    if (!right) FUZZ_CHECK(!response.ok());
  }

  void ReportRankResult() {
    const RankTarget target = PickRankTarget();
    v1::ReportRankResultRequest request;
    request.set_job_id(target.job_id);
    request.set_attempt(target.attempt);
    request.set_rank(target.rank);
    switch (input_.ConsumeIntegralInRange<int>(0, 5)) {
      case 4: request.set_error("CUDA error: out of memory"); break;
      case 5:
        request.set_error("allreduce timed out");
        request.set_collective_failure(true);
        break;
      default: request.set_parameter_checksum(input_.ConsumeBool() ? "ffff" : "abcd"); break;
    }
    auto [secret, right] =
        MaybeWrong(state_->RankSecretForTesting(target.job_id, target.attempt, target.rank));
    request.set_rank_secret(secret);
    absl::Status status = state_->ReportRankResult(request);
    Note("ReportRankResult", status);
    if (!right) FUZZ_CHECK(!status.ok());
  }

  std::string PickKey() {
    static const char* const kKeys[] = {"nccl_id", "addr/0", "addr/1", "addr/2", ""};
    return kKeys[input_.ConsumeIntegralInRange<int>(0, 4)];
  }

  void KeyValueSet() {
    const RankTarget target = PickRankTarget();
    v1::KeyValueSetRequest request;
    request.set_job_id(target.job_id);
    request.set_attempt(target.attempt);
    request.set_rank(target.rank);
    request.set_key(PickKey());
    request.set_value(std::string(input_.ConsumeIntegralInRange<size_t>(0, 300),
                                  input_.ConsumeBool() ? 'a' : 'b'));
    auto [secret, right] =
        MaybeWrong(state_->RankSecretForTesting(target.job_id, target.attempt, target.rank));
    request.set_rank_secret(secret);
    absl::Status status = state_->KeyValueSet(request);
    Note("KeyValueSet", status);
    if (!right) FUZZ_CHECK(!status.ok());
  }

  void KeyValueGet() {
    const RankTarget target = PickRankTarget();
    v1::KeyValueGetRequest request;
    request.set_job_id(target.job_id);
    request.set_attempt(target.attempt);
    request.set_rank(target.rank);
    request.set_key(PickKey());
    auto [secret, right] =
        MaybeWrong(state_->RankSecretForTesting(target.job_id, target.attempt, target.rank));
    request.set_rank_secret(secret);
    auto value = state_->KeyValueGet(request);
    Note("KeyValueGet", value.status());
    if (!right) FUZZ_CHECK(!value.ok());
  }

  // ---- Housekeeping and reads ----

  // Time passes with every worker heartbeating (so that jobs outlive the heartbeat timeout).
  void Tick() {
    now_ms_ += input_.ConsumeIntegralInRange<int64_t>(1'000, 5'000);
    for (const WorkerHandle& worker : workers_) {
      v1::HeartbeatRequest request;
      request.set_worker_id(worker.id);
      request.set_incarnation(worker.incarnation);
      request.set_worker_secret(worker.secret);
      (void)state_->Heartbeat(request);  // NOT_FOUND for lost or evicted workers.
    }
    state_->CheckLiveness();
  }

  void ListJobsBadArguments() {
    v1::ListJobsRequest request;
    if (input_.ConsumeBool()) {
      request.set_page_size(input_.ConsumeBool() ? -1 : kMaxListPageSize + 1);
    } else {
      static const char* const kTokens[] = {"x", "-1", "1e3", "99999999999999999999", " 1"};
      request.set_page_token(kTokens[input_.ConsumeIntegralInRange<int>(0, 4)]);
    }
    FUZZ_CHECK(state_->ListJobs(request).status().code() == absl::StatusCode::kInvalidArgument);
  }

  void Watch() {
    const std::string job_id = PickJobId();
    absl::StatusOr<v1::WatchJobEvent> snapshot = state_->WatchSnapshot(job_id);
    if (!snapshot.ok()) return;
    absl::StatusOr<CoordinatorState::WatchBatch> batch =
        state_->JobEventsSince(job_id, input_.ConsumeIntegralInRange<int64_t>(0, 40));
    FUZZ_CHECK(batch.ok());
    int64_t previous = -1;
    for (const v1::WatchJobEvent& event : batch->events) {
      FUZZ_CHECK(event.sequence() > previous);
      previous = event.sequence();
    }
  }

  // Every worker reports exactly the ranks it runs, then nothing drains any more: each live
  // worker's busy slots are then exactly the RUNNING ranks placed on it.
  void Quiesce() {
    for (WorkerHandle& worker : workers_) {
      v1::PollAssignmentsRequest request;
      request.set_worker_id(worker.id);
      request.set_incarnation(worker.incarnation);
      request.set_worker_secret(worker.secret);
      request.set_wait_ms(0);
      for (const auto& [key, assignment] : worker.running) *request.add_running() = assignment;
      absl::StatusOr<v1::PollAssignmentsResponse> response = state_->PollAssignments(request);
      if (!response.ok()) {
        worker.running.clear();  // Lost: its processes are gone with it.
        continue;
      }
      for (const v1::Assignment& stop : response->stop()) worker.running.erase(AssignmentKey(stop));
      for (const v1::Assignment& start : response->start()) {
        worker.running[AssignmentKey(start)] = start;
      }
    }
    // Stopped ranks are gone now, and so are the ranks of jobs that ended (a rank that
    // reported success is not stopped: it exits by itself). One more round frees their slots.
    for (WorkerHandle& worker : workers_) {
      for (auto it = worker.running.begin(); it != worker.running.end();) {
        absl::StatusOr<v1::Job> job = state_->GetJob(it->second.job_id());
        const bool running = job.ok() && job->state() == v1::RUNNING;
        it = running ? std::next(it) : worker.running.erase(it);
      }
      v1::PollAssignmentsRequest request;
      request.set_worker_id(worker.id);
      request.set_incarnation(worker.incarnation);
      request.set_worker_secret(worker.secret);
      request.set_wait_ms(0);
      for (const auto& [key, assignment] : worker.running) *request.add_running() = assignment;
      absl::StatusOr<v1::PollAssignmentsResponse> response = state_->PollAssignments(request);
      if (!response.ok()) continue;
      for (const v1::Assignment& start : response->start()) {
        worker.running[AssignmentKey(start)] = start;
      }
    }
    CheckInvariants(/*exact_slots=*/true);
  }

  // ---- Invariants ----

  void CheckInvariants(bool exact_slots = false) {
    // The registry's indexes (free slots, placement order, heartbeat order, machines, jobs)
    // agree with its records after whatever sequence came before.
    FUZZ_CHECK(state_->CheckWorkerIndexesForTesting().ok());
    std::map<std::string, v1::Worker> workers;
    for (const v1::Worker& worker : state_->ListWorkers()) {
      FUZZ_CHECK(workers.emplace(worker.worker_id(), worker).second);
      FUZZ_CHECK(worker.state() == v1::ALIVE || worker.state() == v1::LOST);
      FUZZ_CHECK(worker.free_slots() >= 0 && worker.free_slots() <= worker.slots());
      // Whatever heartbeats carried, what is kept is within the documented bounds.
      const v1::WorkerUsage& usage = worker.usage();
      FUZZ_CHECK(usage.memory_available_bytes() >= 0 && usage.memory_total_bytes() >= 0);
      if (usage.memory_total_bytes() > 0) {
        FUZZ_CHECK(usage.memory_available_bytes() <= usage.memory_total_bytes());
      }
      FUZZ_CHECK(usage.devices_size() <= 64);
      std::set<int> indices;
      for (const v1::DeviceUsage& device : usage.devices()) {
        FUZZ_CHECK(indices.insert(device.index()).second);
        FUZZ_CHECK(device.memory_used_bytes() >= 0 && device.memory_total_bytes() >= 0);
        FUZZ_CHECK(device.utilization_percent() >= 0 && device.utilization_percent() <= 100);
        if (device.memory_total_bytes() > 0) {
          FUZZ_CHECK(device.memory_used_bytes() <= device.memory_total_bytes());
        }
      }
    }

    // Every job the harness knows, by GetJob.
    std::map<std::string, v1::Job> jobs;
    for (const std::string& job_id : jobs_) {
      absl::StatusOr<v1::Job> job = state_->GetJob(job_id);
      if (!job.ok()) {
        FUZZ_CHECK(job.status().code() == absl::StatusCode::kNotFound);
        evicted_.insert(job_id);
        continue;
      }
      FUZZ_CHECK(!evicted_.count(job_id));  // Evicted jobs never come back.
      FUZZ_CHECK(job->job_id() == job_id);
      FUZZ_CHECK(v1::JobState_IsValid(job->state()) && job->state() != v1::JOB_STATE_UNSPECIFIED);
      if (terminal_.count(job_id)) FUZZ_CHECK(IsTerminal(job->state()));
      if (IsTerminal(job->state())) terminal_.insert(job_id);
      FUZZ_CHECK(job->restarts() >= 0 && job->restarts() <= job->spec().max_restarts());
      // A job never placed holds no per-rank state yet (a queued job stays small); one placed
      // once has a row per rank from then on.
      FUZZ_CHECK(job->progress_size() == 0 || job->progress_size() == job->spec().world_size());
      if (job->state() == v1::RUNNING) FUZZ_CHECK(job->progress_size() == job->spec().world_size());
      jobs.emplace(job_id, *std::move(job));
    }

    // Placements of RUNNING jobs.
    std::map<std::string, int> placed;  // worker id -> RUNNING ranks on it
    std::set<std::pair<std::string, int>> devices;
    for (const auto& [job_id, job] : jobs) {
      if (job.state() != v1::RUNNING) continue;
      FUZZ_CHECK(job.placement_size() == job.spec().world_size());
      std::set<int> ranks;
      for (const v1::RankPlacement& placement : job.placement()) {
        FUZZ_CHECK(ranks.insert(placement.rank()).second);
        FUZZ_CHECK(placement.rank() >= 0 && placement.rank() < job.spec().world_size());
        auto worker = workers.find(placement.worker_id());
        FUZZ_CHECK(worker != workers.end());
        FUZZ_CHECK(worker->second.state() == v1::ALIVE);
        FUZZ_CHECK(worker->second.device() == job.spec().device());
        FUZZ_CHECK(placement.device_index() >= 0 &&
                   placement.device_index() < worker->second.slots());
        // Distinct (worker, device) pairs within the job and across RUNNING jobs.
        FUZZ_CHECK(devices.emplace(placement.worker_id(), placement.device_index()).second);
        ++placed[placement.worker_id()];
      }
    }
    for (const auto& [id, worker] : workers) {
      if (worker.state() != v1::ALIVE) continue;
      const int busy = worker.slots() - worker.free_slots();
      FUZZ_CHECK(busy >= placed[id]);
      if (exact_slots) {
        if (busy != placed[id]) {
          fprintf(stderr, "worker %s: %d busy slots, %d RUNNING ranks placed\n", id.c_str(), busy,
                  placed[id]);
        }
        FUZZ_CHECK(busy == placed[id]);  // Nothing leaked.
      }
    }

    // ListJobs, page by page: each known job once, oldest first, as GetJob says.
    v1::ListJobsRequest request;
    request.set_page_size(input_.ConsumeIntegralInRange<int>(0, 4));
    std::set<std::string> listed;
    std::string last;
    for (int page = 0;; ++page) {
      FUZZ_CHECK(page <= static_cast<int>(jobs_.size()) + 1);
      absl::StatusOr<v1::ListJobsResponse> response = state_->ListJobs(request);
      FUZZ_CHECK(response.ok());
      for (const v1::Job& job : response->jobs()) {
        FUZZ_CHECK(listed.insert(job.job_id()).second);
        FUZZ_CHECK(last < job.job_id());
        last = job.job_id();
        auto known = jobs.find(job.job_id());
        FUZZ_CHECK(known != jobs.end());
        FUZZ_CHECK(known->second.state() == job.state());
      }
      if (response->next_page_token().empty()) break;
      FUZZ_CHECK(response->jobs_size() > 0);
      request.set_page_token(response->next_page_token());
    }
    FUZZ_CHECK(listed.size() == jobs.size());
  }

  FuzzedDataProvider input_;
  int64_t now_ms_ = 1'700'000'000'000;
  std::unique_ptr<CoordinatorState> state_;
  std::vector<WorkerHandle> workers_;
  std::vector<std::string> jobs_;  // Every job id SubmitJob returned, oldest first.
  std::set<std::string> known_jobs_;
  std::set<std::string> terminal_;  // Jobs seen in a terminal state.
  std::set<std::string> evicted_;   // Jobs GetJob no longer finds.
};

}  // namespace
}  // namespace mptrain

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  spdlog::set_level(spdlog::level::off);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  mptrain::Harness(data, size).Run();
  return 0;
}
