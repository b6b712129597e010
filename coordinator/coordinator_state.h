#pragma once

// The coordinator's state machine: a thin front over its parts, each owning its own state:
// WorkerRegistry (workers, liveness, slots), JobRecord (one job and its transitions, its
// key-value store and event log), FailurePolicy (root cause, restart or end), placement (pure)
// and the JobStore (what survives a restart). The front holds the one lock, the job table and
// the queue, and runs every change as one Mutation: schedule, commit, then wake exactly the
// waiters of what changed. No gRPC types here: the service layer converts RPCs into these
// calls, and tests drive this class directly with a fake clock.
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

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "coordinator/failure_policy.h"
#include "coordinator/job_record.h"
#include "coordinator/store/job_store.h"
#include "coordinator/store/store_writer.h"
#include "coordinator/worker_registry.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

struct CoordinatorOptions {
  int64_t heartbeat_timeout_ms = 10'000;
  // Live workers at once (--max_live_workers); a registration past it is refused with a retry
  // delay.
  int max_live_workers = kDefaultMaxLiveWorkers;
  // Telemetry records and watch events kept per job; older ones are dropped.
  size_t max_events_per_job = 10'000;
  // Returns milliseconds since the Unix epoch; tests replace it.
  std::function<int64_t()> now_ms;
  // A monotonic clock in milliseconds (steady_clock when unset): a jump of it between two
  // liveness checks is a stall of the coordinator itself (a stopped process, a paused VM).
  std::function<int64_t()> monotonic_ms;
  // Job-scoped key-value store bounds (per job; freed when the attempt ends).
  size_t max_kv_keys_per_job = 10'000;
  size_t max_kv_bytes_per_job = 64 << 20;
  // Queued jobs beyond this are refused (RESOURCE_EXHAUSTED).
  size_t max_pending_jobs = 10'000;
  // Of them, one owner's (principal) at most.
  size_t max_pending_jobs_per_owner = 1'000;
  // What queued jobs may hold in memory together (a small job ~3 KiB whatever its world
  // size, a bigger spec counts its size), and one owner's of it; a submit past either is
  // RESOURCE_EXHAUSTED. A restart's requeue is never refused (its job was admitted).
  int64_t max_pending_bytes = int64_t{256} << 20;
  int64_t max_pending_bytes_per_owner = int64_t{32} << 20;
  // Finished jobs kept for GetJob/ListJobs: the newest this many, none older than this.
  size_t max_finished_jobs = 1'000;
  int64_t finished_job_retention_ms = int64_t{7} * 24 * 3600 * 1000;
  // Events (telemetry, state changes) kept of a finished job.
  size_t max_events_per_finished_job = 1'000;
  // Events the job store keeps of a running job (the history `trainctl export` reads).
  size_t max_stored_events_per_job = 1'000'000;
  // Lost workers kept for ListWorkers: the newest this many, none lost longer ago than this.
  // A worker that registers again under its name replaces its lost entry at once.
  size_t max_lost_workers = 1'000;
  int64_t lost_worker_retention_ms = 3'600'000;
  // Where every mutation is written, in order, by a writer thread (not owned; null: nothing
  // survives a restart).
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

// Who reads a job. A principal reads its own jobs; `all` (admins, viewers, and every caller when
// tokens are off: the admin "anonymous") reads every job. A job the reader may not read is
// answered as an unknown one (NOT_FOUND, the same message), so that its existence, owner and
// spec are not revealed.
struct JobReader {
  std::string principal = "anonymous";
  bool all = true;

  static JobReader Owner(std::string principal) { return {std::move(principal), false}; }
  bool MayRead(const v1::Job& job) const { return all || job.owner() == principal; }
};

// Sizes of what clients send, answered with INVALID_ARGUMENT naming the limit.
// A real spec is at most ~30 KB (seven paths of at most 4 KiB, small fields); every rank's
// assignment carries a copy.
inline constexpr size_t kMaxSpecBytes = 64 << 10;
// What one PollAssignments answer carries of new assignments, well under a worker's 4 MiB
// receive limit; the rest come with the next poll, answered at once (at least one per answer).
inline constexpr size_t kMaxPollAnswerBytes = 2 << 20;
inline constexpr size_t kMaxKvValueBytes = 1 << 20;
inline constexpr size_t kMaxKvKeyBytes = 256;
inline constexpr size_t kMaxRequestIdBytes = 128;

// A stop handed to a worker for a rank it still runs is repeated after this long (in case it
// was lost), not at every poll.
inline constexpr int64_t kStopResendMs = 5'000;

class CoordinatorState {
 public:
  explicit CoordinatorState(CoordinatorOptions options);
  ~CoordinatorState();  // Writes what is queued for the store.

  // Loads the store's jobs (call once, before serving): PENDING jobs queue again, ended jobs
  // keep their records and history, RUNNING jobs wait up to adopt_grace_ms for their ranks to
  // be reported by re-registered workers. FAILED_PRECONDITION: the store cannot be read.
  absl::Status Restore();

  // ---- User-facing ----

  // INVALID_ARGUMENT: the spec breaks a rule or a size limit (message names the field).
  // PERMISSION_DENIED: a path field lies outside the roots of every live worker of the job's
  // device kind, or (for an owner who is not an admin) a written path outside the owner's part
  // of those output roots, or a read one in another principal's part (common/tenant_paths.h).
  // A repeated non-empty request_id returns the job created by the first call.
  // `owner` is the caller's principal; `owner_is_admin` whether it is an admin (authentication
  // off: the admin "anonymous").
  absl::StatusOr<v1::SubmitJobResponse> SubmitJob(const v1::SubmitJobRequest& request,
                                                  const std::string& owner = "anonymous",
                                                  bool owner_is_admin = true);
  // NOT_FOUND: unknown job id.
  // What a read shows. kWritten, for clients: only changes already in the store (the read
  // waits for the writes of what it saw), so that nothing a client is shown is undone by a
  // crash. kLive, for monitoring (the dashboard's JSON, /metrics): memory as it is, at once,
  // so that it still answers while a store write hangs.
  enum class View { kWritten, kLive };
  // Every read of a job takes its reader (JobReader: NOT_FOUND for another's job).
  absl::StatusOr<v1::Job> GetJob(const std::string& job_id, View view = View::kWritten,
                                 const JobReader& reader = {}) const;
  // A page of the jobs `reader` may read, oldest first, specs trimmed to what a listing shows.
  // INVALID_ARGUMENT: page_size outside [0, 1000] or a malformed page_token.
  absl::StatusOr<v1::ListJobsResponse> ListJobs(const v1::ListJobsRequest& request,
                                                View view = View::kWritten,
                                                const JobReader& reader = {}) const;
  // NOT_FOUND: unknown job id, or a job of another principal when `principal` is not an admin
  // (as a read of it would answer). FAILED_PRECONDITION: the job already ended.
  absl::StatusOr<v1::JobState> CancelJob(const std::string& job_id,
                                         const std::string& principal = "anonymous",
                                         bool admin = true);
  std::vector<v1::Worker> ListWorkers() const;

  // Watch support. Returns the snapshot event (sequence = the job's latest sequence) to start a
  // watch. NOT_FOUND: unknown job id.
  absl::StatusOr<v1::WatchJobEvent> WatchSnapshot(const std::string& job_id,
                                                  const JobReader& reader = {}) const;
  // The job's events after `after_sequence` (possibly none: wait on JobKey and ask again) and
  // whether the watch is complete (the terminal state change was among them or earlier).
  // The events are shown only once `ticket` is written (IsWritten; until then hold them: the
  // write's caller wakes JobKey when it is done) — a watcher is never shown a change that a
  // crash of the coordinator would undo.
  struct WatchBatch {
    std::vector<v1::WatchJobEvent> events;
    bool finished = false;
    uint64_t ticket = 0;
  };
  absl::StatusOr<WatchBatch> JobEventsSince(const std::string& job_id,
                                            int64_t after_sequence) const;
  // GetJobEvents: a page of the job's history after `after_sequence`, from memory or, for
  // what memory no longer holds, from the store. NOT_FOUND, INVALID_ARGUMENT (max_events).
  absl::StatusOr<v1::GetJobEventsResponse> GetJobEvents(const v1::GetJobEventsRequest& request,
                                                        View view = View::kWritten,
                                                        const JobReader& reader = {}) const;

  // What /metrics and the dashboard show of the whole coordinator, taken under the lock once.
  struct Overview {
    std::map<v1::JobState, int> jobs;  // Jobs held (running, queued, recently ended).
    int queued = 0;
    int64_t queued_bytes = 0;  // What the queued jobs are charged (max_pending_bytes).
    struct WorkerLine {
      v1::Worker worker;  // free_slots filled in.
      double heartbeat_age_s = 0;
      double usage_age_s = 0;  // Since its usage was read (when worker.usage_unix_ms > 0).
    };
    std::vector<WorkerLine> workers;
    // RUNNING jobs the reader may read, specs trimmed to name, world size, steps. (The counts
    // above and below are of every job: they name none.)
    std::vector<v1::Job> running;
    // Jobs the reader may read that ended at most kEndedJobMetricsMs ago, newest first, at most
    // kMaxEndedJobMetrics, trimmed as `running`: their final values stay scrapable for a while
    // (a job shorter than the scrape interval would otherwise never be seen).
    std::vector<v1::Job> recently_ended;
    static constexpr int64_t kEndedJobMetricsMs = 10 * 60 * 1000;
    static constexpr size_t kMaxEndedJobMetrics = 64;
    // Since this coordinator started.
    uint64_t submitted_total = 0;
    std::map<v1::JobState, uint64_t> ended_total;
    uint64_t restarts_total = 0;
    uint64_t store_write_failures_total = 0;
    std::map<std::string, uint64_t> worker_registrations_refused_total;  // By reason.
    int max_live_workers = 0;
    size_t workers_refused_recently = 0;  // Distinct ones, for capacity, lately.
    std::string last_worker_refusal;
  };
  Overview GetOverview(const JobReader& reader = {}) const;

  // Nothing here blocks. A long call that has nothing to answer yet waits (see WaitSet) on the
  // key of what it waits for, and asks again when CoordinatorOptions::notify names that key.
  static std::string WorkerKey(const std::string& worker_id);  // its assignments
  static std::string JobKey(const std::string& job_id);        // its events and key-value store

  // ---- Worker-facing ----

  // INVALID_ARGUMENT: no slots or no device kind, a malformed name or root.
  // ALREADY_EXISTS: a live worker holds the name (it frees when that worker is lost or
  // deregisters). `principal` is the caller's. The answer carries the worker secret.
  // The refusals part of ListWorkers' answer (counts, limit, the last refusal).
  void DescribeRefusals(v1::ListWorkersResponse* response) const;

  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request, const std::string& principal = "anonymous");
  // NOT_FOUND: unknown worker, lost worker or stale incarnation.
  // PERMISSION_DENIED: the worker secret does not match (also for every call below that
  // carries one). INVALID_ARGUMENT: its usage breaks a bound (ValidateWorkerUsage, naming the
  // field); the heartbeat still counts, the usage is not kept. A valid usage replaces the
  // worker's (ListWorkers, the overview), read usage_age_ms before now.
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
  // Whether the caller is who it says, before a long call is given one of its holder's places
  // (so that a stranger's calls cannot use up a worker's or a rank's): the worker's secret, the
  // rank's secret of its job. PERMISSION_DENIED / NOT_FOUND as the calls themselves answer.
  absl::Status CheckWorkerCaller(const std::string& worker_id, const std::string& secret) const;
  absl::Status CheckRankCaller(const std::string& job_id, int attempt, int rank,
                               const std::string& secret) const;
  // The value, or nullopt while the key is not set (the caller waits on JobKey). As a watch's
  // events, the value is handed out only once `ticket` is written (a key is set once per
  // attempt, so the caller may hold it meanwhile). ABORTED: the attempt is over. NOT_FOUND:
  // unknown job.
  struct KeyValueRead {
    std::optional<std::string> value;
    uint64_t ticket = 0;
  };
  absl::StatusOr<KeyValueRead> KeyValueGet(const v1::KeyValueGetRequest& request) const;
  // Whether the store write of `ticket` is done (always, without a store).
  bool IsWritten(uint64_t ticket) const;

  // NOT_FOUND: unknown job. The response says abort when the attempt is over.
  // INVALID_ARGUMENT: a checkpoint path outside the job's checkpoint_dir.
  absl::StatusOr<v1::ReportTelemetryResponse> ReportTelemetry(
      const v1::ReportTelemetryRequest& request);
  // NOT_FOUND: unknown job.
  absl::Status ReportRankResult(const v1::ReportRankResultRequest& request);

  // A chunk of a rank's output from its worker. PERMISSION_DENIED: the worker secret does not
  // match or the rank was never placed on that worker; INVALID_ARGUMENT: chunk too big.
  absl::Status ReportRankLog(const v1::ReportRankLogRequest& request);
  // What the job keeps of a rank's output (restored from the store after a restart); an ended
  // job's is complete. NOT_FOUND: unknown job; no output yet (a job not ended: ask again); or
  // none kept of an ended job (the message says it ended). INVALID_ARGUMENT: rank out of range.
  absl::StatusOr<v1::GetRankLogResponse> GetRankLog(const v1::GetRankLogRequest& request,
                                                    const JobReader& reader = {}) const;

  // The rank secret of (job, attempt, rank), or "" (tests act as the rank with it).
  // The worker registry's indexes against its records (WorkerRegistry::CheckIndexes).
  absl::Status CheckWorkerIndexesForTesting() const;
  std::string RankSecretForTesting(const std::string& job_id, int attempt, int rank) const;

  // ---- Answering after the write, without waiting for it ----
  // A call's answer must not go out before what it changed (or showed) is written, and its
  // waiters are woken only then. By default the calling thread waits for that. Inside a
  // DeferWrites scope it does not: the call records what to wait for here, and the caller
  // answers through AfterWrite — the gRPC layer, whose callback threads are few and must not
  // wait for a disk (a slow commit stalled every RPC, heartbeats included, and workers were
  // declared lost).
  struct Deferred {
    const CoordinatorState* state = nullptr;  // Null: nothing to wait for, nobody to wake.
    uint64_t ticket = 0;                      // The write to wait for (0: none).
    std::vector<std::string> keys;            // The waits to wake once it is written.
  };
  class DeferWrites {
   public:
    DeferWrites();
    ~DeferWrites();  // Anything not taken is woken after its write, answering nobody.
    DeferWrites(const DeferWrites&) = delete;
    DeferWrites& operator=(const DeferWrites&) = delete;
    // What the calls made in this scope so far wait for; empties it.
    Deferred Take();

   private:
    Deferred deferred_;
    Deferred* outer_;
  };
  // Take() of the innermost DeferWrites of this thread (an empty Deferred outside any).
  static Deferred TakeDeferred();
  // Wakes `deferred`'s keys and runs `then` once its write is done: at once when it is (or
  // when there is nothing to wait for), else on the store writer's thread.
  void AfterWrite(Deferred deferred, std::function<void()> then) const;

  // ---- Housekeeping ----

  // Marks workers silent past the heartbeat timeout as LOST and fails their jobs. The server
  // calls it periodically; tests call it after moving the fake clock.
  //
  // When the coordinator itself did not run for more than a heartbeat interval between two
  // checks (its monotonic clock jumped: a stopped process, a paused VM, a starved machine),
  // the silence was its own: the heartbeats that queued meanwhile are read first, and nobody
  // is declared lost (nor a job failed for silence) for one heartbeat interval after it
  // resumed. A job failing within a heartbeat timeout after a stall of half the timeout or
  // more names the stall first (its workers may have self-fenced because of it).
  void CheckLiveness();


 private:
  // Every change happens inside one: it holds the lock and, when it ends, places what can be
  // placed, writes what changed to the store in one transaction and wakes the waiters of what
  // changed, once.
  class Mutation {
   public:
    explicit Mutation(CoordinatorState* state) : state_(state), lock_(state->mu_) {}
    ~Mutation() {
      Finished finished = state_->FinishMutation();
      lock_.unlock();
      if (Defer(state_, finished.ticket, &finished.keys)) return;
      // The caller's answer waits for the write (off the lock): what a client is told
      // survives a crash; and the waiters are woken only then (a woken poll must not hand a
      // worker an assignment a restart would not know). A call that changed nothing answers at
      // once, but for a poll handing out a change still being written (Effects::wait_ticket).
      if (finished.ticket != 0) state_->writer_->WaitWritten(finished.ticket);
      if (state_->options_.notify && !finished.keys.empty()) {
        state_->options_.notify(finished.keys);
      }
    }

   private:
    CoordinatorState* state_;
    std::unique_lock<std::mutex> lock_;
  };
  // Inside a DeferWrites scope of this thread: records the wait (and takes `keys`, if any)
  // there and returns true; else leaves everything as it is and returns false.
  static bool Defer(const CoordinatorState* state, uint64_t ticket,
                    std::vector<std::string>* keys);
  // Every read that answers a client holds one: it holds the lock and, when it ends, waits
  // (off the lock) until every change it could have seen is written, so that what a client is
  // shown survives a crash as what it is told does. Long calls answered from the wait set's
  // thread do not block: they hold what they read until its ticket is written (WatchBatch,
  // KeyValueRead).
  class Read {
   public:
    explicit Read(const CoordinatorState* state, View view = View::kWritten)
        : state_(state),
          lock_(state->mu_),
          ticket_(state->writer_ != nullptr && view == View::kWritten
                      ? state->writer_->LastTicket()
                      : 0) {}
    ~Read() {
      lock_.unlock();
      if (Defer(state_, ticket_, nullptr)) return;
      if (ticket_ != 0) state_->writer_->WaitWritten(ticket_);
    }

   private:
    const CoordinatorState* state_;
    std::unique_lock<std::mutex> lock_;
    uint64_t ticket_;
  };
  // What the current mutation changed (JobRecord reports here; see JobChanges).
  class Effects : public JobChanges {
   public:
    void JobChanged(const JobRecord& job, bool workers_too) override;
    void EventAppended(const JobRecord& job, const v1::WatchJobEvent& event) override;
    void EventsTrimmed(const JobRecord& job, int64_t sequence) override;
    void RankLogKept(const JobRecord& job, store::StoredRankLog log) override;
    void KvWritten(const JobRecord& job, const std::string& key,
                   const std::string& value) override;
    void KvCleared(const JobRecord& job) override;
    void Wake(const std::string& key) { wake_keys.insert(key); }

    bool schedule = false;
    // A store ticket the answer must wait for although this call writes nothing (a poll
    // answering with starts or stops of a change not yet written); 0: none.
    uint64_t wait_ticket = 0;
    std::set<std::string> wake_keys;
    std::set<std::string> dirty_jobs;
    JobStore::Batch batch;
  };
  // Schedules and hands what changed to the store writer; returns the keys to notify and the
  // write's ticket (0: nothing to write).
  struct Finished {
    std::vector<std::string> keys;
    uint64_t ticket = 0;
  };
  Finished FinishMutation();

  JobRecord* FindJob(const std::string& job_id);
  const JobRecord* FindJob(const std::string& job_id) const;
  // The job, when `reader` may read it; else null, as for an unknown one.
  const JobRecord* FindReadableJob(const std::string& job_id, const JobReader& reader) const;
  JobLimits job_limits() const;
  // Whether `slot` belongs to the current attempt of a RUNNING job.
  bool SlotIsCurrent(const BusySlot& slot) const;
  std::function<bool(const BusySlot&)> IsCurrent() const {
    return [this](const BusySlot& slot) { return SlotIsCurrent(slot); };
  }
  // Path fields of `spec` against the roots of live workers of its device kind, as `owner` may
  // use them.
  absl::Status CheckSpecPaths(const v1::JobSpec& spec, const Tenancy& owner) const;
  // Re-binds the ranks a re-registered worker reports running to jobs awaiting adoption.
  void AdoptRunningRanks(WorkerRecord* worker, const v1::PollAssignmentsRequest& request);

  // All of these require mu_ to be held (inside a Mutation).
  // Ends the job: frees its slots (those whose rank is gone; the others drain) and its queue
  // place, and keeps it among the finished.
  void EndJob(JobRecord* record, v1::JobState state, const std::string& error);
  // Fails the job, or, while restarts remain and `restartable`, queues it again to resume from
  // its latest checkpoint (FailurePolicy decides).
  void FailJob(JobRecord* record, const std::string& error, bool restartable = true);
  // A rank's result arrived: SUCCEEDED when every rank agrees.
  void MaybeFinishJob(JobRecord* record);
  void FreeExitedSlots(const JobRecord& record);
  void MarkWorkerLost(WorkerRecord* worker, const std::string& why);
  // Places every queued job that fits, oldest first; records why the others wait.
  void TrySchedule();
  // For a restart whose checkpoint lies on one worker's disk: the live workers (ids) that may
  // take rank 0; an error when that worker is known to be gone.
  absl::StatusOr<std::set<std::string>> Rank0Workers(const JobRecord& record) const;
  // CheckLiveness's work; returns whether enough was freed to hand memory back (malloc_trim).
  bool CheckLivenessLocked();
  static constexpr int64_t kTrimAfterFreedBytes = int64_t{4} << 20;
  // What a queued job costs beyond its record's MemoryBytes: its entries in the tables here
  // (jobs_, job_order_, pending_, queue_charges_) and its empty containers' first blocks (a
  // std::deque allocates one at construction); bench/pending_queue_memory measures ~1.2 KiB.
  static constexpr int64_t kQueueEntryBytes = 1'280;
  static constexpr int64_t kJobIdAndUidBytes = 96;  // "job-0001" and a 32-character uid.
  void ExpireQueuedJobs(int64_t now);
  // The queue's byte bounds: a job is charged when it enters the queue (at submit what the
  // submit checked; at a restart or a restore its MemoryBytes, `bytes` < 0) and released when
  // it leaves (placed, ended).
  void ChargeQueue(const JobRecord& record, int64_t bytes = -1);
  void ReleaseQueueCharge(const JobRecord& record);
  // RESOURCE_EXHAUSTED when `bytes` more of `owner`'s would pass a byte bound.
  absl::Status CheckQueueBytes(const std::string& owner, int64_t bytes) const;
  void ExpireAdoptions(int64_t now);
  // Drops the oldest finished jobs beyond the retention bounds, and old lost workers.
  void EvictOldRecords(int64_t now);
  std::vector<v1::Assignment> DesiredAssignments(const WorkerRecord& worker) const;
  bool RankIsFinishing(const v1::Assignment& assignment) const;

  CoordinatorOptions options_;
  FailurePolicy policy_;
  mutable std::mutex mu_;
  // The coordinator's own stalls (CheckLiveness): when it last checked (monotonic), until when
  // (Unix ms) workers get their grace, and the last stall (its length, when it ended).
  int64_t last_check_monotonic_ms_ = -1;
  int64_t stall_grace_until_ms_ = 0;
  int64_t last_stall_ms_ = 0;
  int64_t last_stall_ended_ms_ = 0;
  // Why the job fails at once when `rank`'s collective failure and a peer's name each other
  // while both their workers heartbeat: a partition between their hosts (FailurePolicy).
  std::optional<std::string> PartitionError(const JobRecord& record, int rank) const;
  // The error of a job failing now, with the coordinator's recent stall named first.
  std::string BlameRecentStall(const std::string& error) const;
  WorkerRegistry workers_;
  // False once no job awaits the adoption of its ranks (after a restart): none will again
  // until the next restore.
  bool adoptions_may_be_open_ = true;
  std::map<std::string, std::unique_ptr<JobRecord>> jobs_;
  std::map<int64_t, std::string> job_order_;  // job number -> id: submission order.
  std::deque<std::string> pending_;           // PENDING jobs, oldest first.
  std::map<std::string, int64_t> queue_charges_;   // Job id -> what it is charged, queued.
  int64_t queued_bytes_ = 0;
  std::map<std::string, int64_t> queued_bytes_by_owner_;
  // Bytes of job records freed (evicted) since memory was last handed back to the system.
  int64_t freed_since_trim_ = 0;
  std::deque<std::string> finished_;          // Terminal jobs in the order they ended.
  std::map<std::string, std::string> job_by_request_id_;  // RequestKey -> job id.
  // RequestKey(owner, spec.name) -> the latest job of that owner with that name. Names are
  // unique among an owner's jobs that have not ended: the entry is checked (the job may have
  // ended or gone since) rather than kept in step with every transition.
  std::map<std::string, std::string> job_by_owner_name_;
  // A submit's request id is its principal's own.
  static std::string RequestKey(const std::string& owner, const std::string& request_id);
  int64_t next_job_number_ = 1;
  int64_t started_ms_ = 0;
  // Counters for /metrics, since this coordinator started.
  uint64_t submitted_total_ = 0;
  std::map<v1::JobState, uint64_t> ended_total_;
  uint64_t restarts_total_ = 0;
  Effects effects_;  // Of the current mutation.
  std::unique_ptr<StoreWriter> writer_;  // Null without a store.
};

}  // namespace mptrain
