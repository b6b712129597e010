#pragma once

// The coordinator's state machine: workers, the job queue, placement, the job-scoped key-value
// store, telemetry and final results. No gRPC types here: the service layer converts RPCs into
// these calls, and tests drive this class directly with a fake clock.
//
// The protocol, step by step:
//   1. A worker daemon registers (host, device kind, slots, random incarnation) and heartbeats.
//   2. SubmitJob validates the spec (and that some worker could hold a rank, by the memory
//      estimate) and queues the job (PENDING). Queued jobs are placed first-in first-out among
//      those that can be placed now: a job waiting for slots does not hold back a smaller one
//      behind it (backfill), and shows why it waits (pending_reason). A placed job becomes
//      RUNNING and its attempt number grows by one.
//   3. Each worker long-polls PollAssignments with the ranks it runs; the answer is the
//      difference between what it runs and what it should run (start / stop lists), so a lost
//      answer is repaired by the next poll.
//   4. The ranks rendezvous through the job's key-value store (rank 0 publishes the NCCL unique
//      id or gloo addresses; the others block in KeyValueGet), train, and report telemetry in
//      batches and a final result (parameter checksum or error).
//   5. All ranks succeeded with equal checksums -> SUCCEEDED; different checksums -> FAILED
//      ("parameters diverged across ranks"); any rank error, a rank process that exits without
//      a result, or a worker silent past the heartbeat timeout -> FAILED naming rank and worker.
//      A terminal job's ranks appear in their workers' stop lists, and its slots are freed.
//
// Capabilities: RegisterWorker hands out a worker secret that the worker's later calls must
// carry; each placement hands every rank of the attempt a fresh rank secret, which the rank's
// store, telemetry and result calls must carry. Roles (who may call which RPC at all) are
// checked before any of this, by the gRPC layer (coordinator/auth.h).

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/job_event_log.h"
#include "coordinator/job_kv.h"
#include "coordinator/store/job_store.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

struct CoordinatorOptions {
  int64_t heartbeat_timeout_ms = 10'000;
  // Telemetry records and watch events kept per job; older ones are dropped.
  size_t max_events_per_job = 10'000;
  // Returns milliseconds since the Unix epoch; tests replace it.
  std::function<int64_t()> now_ms;
  // Job-scoped key-value store bounds (per job; freed when the attempt ends).
  size_t max_kv_keys_per_job = 10'000;
  size_t max_kv_bytes_per_job = 64 << 20;
  // Queued jobs beyond this are refused (RESOURCE_EXHAUSTED).
  size_t max_pending_jobs = 10'000;
  // Finished jobs kept for GetJob/ListJobs: the newest this many, none older than this.
  size_t max_finished_jobs = 1'000;
  int64_t finished_job_retention_ms = int64_t{7} * 24 * 3600 * 1000;
  // Events (telemetry, state changes) kept of a finished job.
  size_t max_events_per_finished_job = 1'000;
  // Lost workers kept for ListWorkers (the newest).
  size_t max_lost_workers = 1'000;
  // Where every mutation is written (not owned; null: nothing survives a restart).
  JobStore* store = nullptr;
  // Called after each mutation, outside the lock, with the keys (WorkerKey, JobKey) of what it
  // changed: the server wakes exactly the calls waiting on them.
  std::function<void(const std::vector<std::string>& keys)> notify;
  // After a restart, how long the ranks of a RUNNING job have to come back through their
  // workers' polls before the job fails (and restarts per max_restarts).
  int64_t adopt_grace_ms = 60'000;
};

inline constexpr int kDefaultListPageSize = 100;
inline constexpr int kMaxListPageSize = 1'000;

// Sizes of what clients send, answered with INVALID_ARGUMENT naming the limit.
inline constexpr size_t kMaxSpecBytes = 1 << 20;
inline constexpr size_t kMaxKvValueBytes = 1 << 20;
inline constexpr size_t kMaxKvKeyBytes = 256;
inline constexpr size_t kMaxRequestIdBytes = 128;
inline constexpr int kMaxRootsPerKind = 32;

class CoordinatorState {
 public:
  explicit CoordinatorState(CoordinatorOptions options);

  // Loads the store's jobs (call once, before serving): PENDING jobs queue again, ended jobs
  // keep their records and history, RUNNING jobs wait up to adopt_grace_ms for their ranks to
  // be reported by re-registered workers. FAILED_PRECONDITION: the store cannot be read.
  absl::Status Restore();

  // ---- User-facing ----

  // INVALID_ARGUMENT: the spec breaks a rule or a size limit (message names the field).
  // PERMISSION_DENIED: a path field lies outside the roots of every live worker of the job's
  // device kind. A repeated non-empty request_id returns the job created by the first call.
  // `owner` is the caller's principal.
  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& request,
                                                  const std::string& owner = "anonymous");
  // NOT_FOUND: unknown job id.
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id) const;
  // A page of jobs, oldest first, specs trimmed to what a listing shows.
  // INVALID_ARGUMENT: page_size outside [0, 1000] or a malformed page_token.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request) const;
  // NOT_FOUND: unknown job id. FAILED_PRECONDITION: the job already ended.
  // PERMISSION_DENIED: `principal` does not own the job and is not an admin.
  absl::StatusOr<v1::JobState> CancelJob(const std::string& job_id,
                                         const std::string& principal = "anonymous",
                                         bool admin = true);
  std::vector<v1::Worker> ListWorkers() const;

  // Watch support. Returns the snapshot event (sequence = the job's latest sequence) to start a
  // watch. NOT_FOUND: unknown job id.
  absl::StatusOr<v1::WatchJobEvent> WatchSnapshot(const std::string& job_id) const;
  // The job's events after `after_sequence` (possibly none: wait on JobKey and ask again) and
  // whether the watch is complete (the terminal state change was among them or earlier).
  struct WatchBatch {
    std::vector<v1::WatchJobEvent> events;
    bool finished = false;
  };
  absl::StatusOr<WatchBatch> JobEventsSince(const std::string& job_id,
                                            int64_t after_sequence) const;

  // Nothing here blocks. A long call that has nothing to answer yet waits (see WaitSet) on the
  // key of what it waits for, and asks again when CoordinatorOptions::notify names that key.
  static std::string WorkerKey(const std::string& worker_id);  // its assignments
  static std::string JobKey(const std::string& job_id);        // its events and key-value store

  // ---- Worker-facing ----

  // INVALID_ARGUMENT: no slots or no device kind, a malformed name or root.
  // ALREADY_EXISTS: a live worker holds the name (it frees when that worker is lost or
  // deregisters). `principal` is the caller's. The answer carries the worker secret.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request, const std::string& principal = "anonymous");
  // NOT_FOUND: unknown worker, lost worker or stale incarnation.
  // PERMISSION_DENIED: the worker secret does not match (also for every call below that
  // carries one).
  absl::Status Heartbeat(const v1::HeartbeatRequest& request);
  // The daemon is shutting down: LOST now, its jobs fail. NOT_FOUND: as Heartbeat.
  absl::Status DeregisterWorker(const v1::DeregisterWorkerRequest& request);
  // What the worker should start and stop now (maybe nothing: the caller waits on WorkerKey).
  // NOT_FOUND: as Heartbeat.
  absl::StatusOr<v1::PollAssignmentsResponse> PollAssignments(
      const v1::PollAssignmentsRequest& request);
  // An exit of a rank that was never placed on the calling worker is ignored.
  absl::Status ReportRankExit(const v1::ReportRankExitRequest& request);

  // Rank calls: PERMISSION_DENIED when the rank secret does not match (job, attempt, rank).
  // NOT_FOUND: unknown job. FAILED_PRECONDITION: the attempt is over (job ended or restarted).
  // ALREADY_EXISTS: the key holds another value (keys are write-once per attempt).
  // INVALID_ARGUMENT: key or value over its limit. RESOURCE_EXHAUSTED: the job's store is full.
  absl::Status KeyValueSet(const v1::KeyValueSetRequest& request);
  // The value, or nullopt while the key is not set (the caller waits on JobKey).
  // ABORTED: the attempt is over. NOT_FOUND: unknown job.
  absl::StatusOr<std::optional<std::string>> KeyValueGet(
      const v1::KeyValueGetRequest& request) const;

  // NOT_FOUND: unknown job. The response says abort when the attempt is over.
  // INVALID_ARGUMENT: a checkpoint path outside the job's checkpoint_dir.
  absl::StatusOr<v1::ReportTelemetryResponse> ReportTelemetry(
      const v1::ReportTelemetryRequest& request);
  // NOT_FOUND: unknown job.
  absl::Status ReportRankResult(const v1::ReportRankResultRequest& request);

  // The rank secret of (job, attempt, rank), or "" (tests act as the rank with it).
  std::string RankSecretForTesting(const std::string& job_id, int attempt, int rank) const;

  // ---- Housekeeping ----

  // Marks workers silent past the heartbeat timeout as LOST and fails their jobs. The server
  // calls it periodically; tests call it after moving the fake clock.
  void CheckLiveness();


 private:
  // A slot is busy from placement until its rank process is known to be gone: the worker
  // reported its exit, or no longer lists it as running. After its job ends (or restarts) a
  // slot whose rank is still stopping is draining: not desired, not free.
  struct BusySlot {
    std::string job_id;
    int rank = 0;
    int attempt = 0;
  };
  struct WorkerRecord {
    v1::Worker info;
    std::string name;
    std::string secret;
    std::string registration_nonce;
    // After a coordinator restart, nothing is placed on a worker until its first poll has
    // reported (and re-adopted) the ranks it still runs: its slots only look free.
    bool awaiting_first_poll = false;
    std::map<int, BusySlot> busy_slots;  // slot index -> its rank
  };
  struct RankRecord {
    bool result_reported = false;
    bool exited = false;
    std::string checksum;
    int64_t step = -1;               // Last reported optimizer step (-1: none yet).
    int64_t last_report_ms = 0;      // Any telemetry report (the rank process is alive).
    int64_t last_progress_ms = 0;    // When `step` last advanced.
  };
  struct JobRecord {
    JobRecord(const CoordinatorOptions& options)
        : kv(options.max_kv_keys_per_job, options.max_kv_bytes_per_job),
          events(options.max_events_per_job) {}
    v1::Job job;
    int64_t number = 0;           // job-<number>: the order of submission.
    int64_t queued_since_ms = 0;  // When it last entered the queue (submit or restart).
    int64_t rank_memory_bytes = 0;
    int attempt = 0;
    std::vector<RankRecord> ranks;
    JobKv kv;  // Cleared on each new attempt and at the end.
    // Rank secrets of every attempt (attempt -> rank -> secret), so that a late call of an
    // earlier attempt is recognised as such and anything else is refused.
    std::map<int, std::vector<std::string>> rank_secrets;
    JobEventLog events;
    // After a coordinator restart: the ranks of this RUNNING attempt not yet reported by a
    // worker, and until when they may come back.
    std::set<int> awaiting_adoption;
    int64_t adopt_deadline_ms = 0;
    // A rank's collective failure, held back while a root cause may still arrive.
    std::string consequence_error;
    int64_t consequence_deadline_ms = 0;
  };

  // Every change happens inside one: it holds the lock and, when it ends, places what can be
  // placed, writes what changed to the store in one transaction and wakes the waiters, once.
  class Mutation {
   public:
    explicit Mutation(CoordinatorState* state) : state_(state), lock_(state->mu_) {}
    ~Mutation() {
      std::vector<std::string> keys = state_->FinishMutation();
      lock_.unlock();
      if (state_->options_.notify && !keys.empty()) state_->options_.notify(keys);
    }
    std::unique_lock<std::mutex>& lock() { return lock_; }

   private:
    CoordinatorState* state_;
    std::unique_lock<std::mutex> lock_;
  };
  // Schedules, persists; returns the keys to notify.
  std::vector<std::string> FinishMutation();
  // The job changed: write it at the end of the mutation, and wake waiters.
  // `workers_too`: also wake the polls of its workers (placement, state or exits changed);
  // telemetry and key-value sets concern only the job's own waiters.
  void Touch(JobRecord* record, bool workers_too = true);
  store::StoredJob ToStored(const JobRecord& record) const;
  // Re-binds the ranks a re-registered worker reports running to jobs awaiting adoption.
  void AdoptRunningRanks(WorkerRecord* worker, const v1::PollAssignmentsRequest& request);
  void ExpireAdoptions(int64_t now);

  bool IsTerminal(v1::JobState state) const;
  JobRecord* FindJob(const std::string& job_id);
  const JobRecord* FindJob(const std::string& job_id) const;
  absl::StatusOr<WorkerRecord*> FindLiveWorker(const std::string& worker_id, uint64_t incarnation,
                                               const std::string& secret);
  // PERMISSION_DENIED unless `secret` is the rank secret of (attempt, rank) of this job.
  absl::Status CheckRankSecret(const JobRecord& record, int attempt, int rank,
                               const std::string& secret) const;
  // Path fields of `spec` against the roots of live workers of its device kind.
  absl::Status CheckSpecPaths(const v1::JobSpec& spec) const;

  // All of these require mu_ to be held.
  void AppendEvent(JobRecord* record, v1::WatchJobEvent event);
  void SetJobState(JobRecord* record, v1::JobState state, const std::string& error);
  // Fails the job, or, while restarts remain and `restartable`, queues it again to resume from
  // its latest checkpoint.
  void FailJob(JobRecord* record, const std::string& error, bool restartable = true);
  void CheckProgress(JobRecord* record, int64_t now);
  // Frees the job's slots whose rank process is gone; the others drain (see BusySlot).
  void ReleaseSlots(JobRecord* record);
  // Whether `slot` belongs to the current attempt of a RUNNING job.
  bool SlotIsCurrent(const BusySlot& slot) const;
  // Frees draining slots of `worker` whose rank is not in `running`, or the one rank that just
  // exited. Returns whether any slot was freed.
  bool FreeDrainingSlots(WorkerRecord* worker, const std::set<std::string>* running,
                         const std::string& exited_key);
  void MarkWorkerLost(WorkerRecord* worker, const std::string& why);
  // Places every queued job that fits, oldest first; records why the others wait.
  void TrySchedule();
  // Memory one rank may use on `worker`'s `slot` (0: the worker did not say).
  int64_t SlotMemory(const WorkerRecord& worker, int slot) const;
  std::string PendingReason(const JobRecord& record) const;
  // Fails queued jobs past their queue_timeout_s.
  void ExpireQueuedJobs(int64_t now);
  // Drops the oldest finished jobs beyond the retention bounds, and old lost workers.
  void EvictOldRecords(int64_t now);
  void MaybeFinishJob(JobRecord* record);
  std::vector<v1::Assignment> DesiredAssignments(const std::string& worker_id) const;
  bool RankIsFinishing(const v1::Assignment& assignment) const;
  std::string DescribeRank(const JobRecord& record, int rank) const;

  CoordinatorOptions options_;
  mutable std::mutex mu_;
  std::map<std::string, WorkerRecord> workers_;
  std::map<std::string, std::unique_ptr<JobRecord>> jobs_;
  std::map<int64_t, std::string> job_order_;  // job number -> id: submission order.
  std::deque<std::string> pending_;           // PENDING jobs, oldest first.
  std::deque<std::string> finished_;          // Terminal jobs in the order they ended.
  std::deque<std::string> lost_workers_;      // In the order they were lost.
  std::map<std::string, std::string> job_by_request_id_;
  int64_t next_job_number_ = 1;
  // The current mutation's effects (see Mutation).
  bool schedule_ = false;
  std::set<std::string> wake_keys_;
  std::set<std::string> dirty_jobs_;
  JobStore::Batch pending_batch_;
  int64_t next_worker_number_ = 1;
};

}  // namespace mptrain
