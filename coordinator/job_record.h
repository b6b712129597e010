#pragma once

// One job as the coordinator holds it: its public record (v1::Job), its attempts and their
// rank secrets, what each rank of the current attempt reported, the attempt's key-value store
// and the job's event log. It owns its state transitions:
//
//   PENDING --StartAttempt--> RUNNING --End--> SUCCEEDED | FAILED | CANCELLED
//      ^                         |
//      +--------Requeue----------+   (a restart: a new attempt resumes from the checkpoint)
//   PENDING --End--> FAILED | CANCELLED   (queue timeout, cancel)
//
// Every change is reported to a JobChanges sink, which the coordinator turns into one store
// transaction and one round of wake-ups per mutation. Slots and workers are not its business:
// the caller frees them. Not thread-safe: CoordinatorState's lock guards it. No clocks.

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/tenant_paths.h"
#include "coordinator/job_event_log.h"
#include "coordinator/job_kv.h"
#include "coordinator/placement.h"
#include "coordinator/rank_logs.h"
#include "coordinator/store/job_store.h"
#include "coordinator/store/stored_job.pb.h"
#include "proto/mptrain.pb.h"

namespace mptrain {

class JobRecord;

// Where a job's changes go (see CoordinatorState::Mutation).
class JobChanges {
 public:
  virtual ~JobChanges() = default;
  // The record changed: write it, wake its waiters, and, when `workers_too` (placement, state
  // or exits changed), the polls of the workers that run it.
  virtual void JobChanged(const JobRecord& job, bool workers_too) = 0;
  virtual void EventAppended(const JobRecord& job, const v1::WatchJobEvent& event) = 0;
  // The job ended: the store keeps only its events after `sequence`.
  virtual void EventsTrimmed(const JobRecord& job, int64_t sequence) = 0;
  // A rank's kept output is worth writing (its process ended, or the job did).
  virtual void RankLogKept(const JobRecord& job, store::StoredRankLog log) = 0;
  // The key-value store gained a key (the store writes it alone, not the whole record), or
  // lost every key (a new attempt, a restart, the end).
  virtual void KvWritten(const JobRecord& job, const std::string& key,
                         const std::string& value) = 0;
  virtual void KvCleared(const JobRecord& job) = 0;
};

// What one rank of the current attempt has told the coordinator.
struct RankRecord {
  bool result_reported = false;
  bool exited = false;
  std::string checksum;
  int64_t step = -1;             // Last reported optimizer step (-1: none yet).
  int64_t work_units = 0;        // Last reported evaluation batches + sampled tokens.
  int64_t last_report_ms = 0;    // Any telemetry report (the rank process is alive).
  int64_t last_progress_ms = 0;  // When `step` or `work_units` last advanced.
};

struct JobLimits {
  size_t max_kv_keys = 10'000;
  size_t max_kv_bytes = 64 << 20;
  size_t max_events = 10'000;
  size_t max_events_finished = 1'000;
  // Events the job store keeps of a running job (its export history); older ones are dropped
  // in steps of kStoredEventsTrimStep, so that a long job's rows stay bounded.
  size_t max_stored_events = 1'000'000;
};
inline constexpr int64_t kStoredEventsTrimStep = 10'000;

// Where a rank was placed: worker id, its host, the slot.
struct PlacedRank {
  int rank = 0;
  std::string worker_id;
  std::string worker_name;
  std::string host;
  int slot = 0;
};

bool IsTerminal(v1::JobState state);

class JobRecord {
 public:
  // A new PENDING job; `spec` has its defaults applied and is valid.
  JobRecord(int64_t number, v1::JobSpec spec, const Tenancy& owner,
            const std::string& request_id, int64_t rank_memory_bytes, int64_t now,
            const JobLimits& limits, JobChanges* changes);
  // A job as the store kept it; RUNNING ranks count as reporting at `now`. `kv`: the key-value
  // entries stored for it (those of its current attempt are kept).
  JobRecord(const store::StoredJob& stored, v1::JobSpec spec,
            std::vector<v1::WatchJobEvent> events,
            const std::vector<store::StoredRankLog>& rank_logs,
            const std::vector<JobStore::KvEntry>& kv, int64_t now, const JobLimits& limits,
            JobChanges* changes);
  store::StoredJob ToStored() const;
  // About what the record holds in memory (its messages, per-rank state and secrets; not its
  // event log or rank logs, which a queued job has next to none of): what a queued job is
  // charged against the queue's byte bounds.
  int64_t MemoryBytes() const;

  const v1::Job& job() const { return job_; }
  const std::string& id() const { return job_.job_id(); }
  const v1::JobSpec& spec() const { return job_.spec(); }
  v1::JobState state() const { return job_.state(); }
  bool terminal() const { return IsTerminal(job_.state()); }
  bool running() const { return job_.state() == v1::RUNNING; }
  int64_t number() const { return number_; }
  int attempt() const { return attempt_; }
  // The store ticket of the last write that carries a change of this job (0: none since this
  // coordinator started): its events and key-value entries are shown only once it is written.
  uint64_t store_ticket() const { return store_ticket_; }
  void set_store_ticket(uint64_t ticket) { store_ticket_ = ticket; }
  int64_t queued_since_ms() const { return queued_since_ms_; }
  int64_t rank_memory_bytes() const { return rank_memory_bytes_; }
  int world_size() const { return job_.spec().world_size(); }
  // Per-rank state exists from the first placement on (a queued job stays small). Before it no
  // rank has a secret, so no rank's call gets this far.
  const RankRecord& rank(int rank) const { return ranks_[rank]; }
  bool ValidRank(int rank) const { return rank >= 0 && rank < world_size(); }
  const JobEventLog& events() const { return events_; }
  const JobKv& kv() const { return kv_; }
  // JobKv::Set, and the store told of a new key.
  absl::Status SetKv(const std::string& key, const std::string& value);
  // The tails of its ranks' output. The store gets a copy of a rank's tail when its process
  // ends, of every tail when the job ends or restarts, and of each tail that grows after that.
  const RankLogs& logs() const { return logs_; }

  // ---- Transitions ----

  // PENDING -> RUNNING: a new attempt on `placement`, with fresh rank secrets, an empty
  // key-value store and no rank reports.
  void StartAttempt(const std::vector<PlacedRank>& placement, int64_t now);
  // RUNNING -> PENDING: a restart. `note` says why (the watch event's error).
  void Requeue(const std::string& note, int64_t now);
  // -> SUCCEEDED, FAILED or CANCELLED (no-op when already there).
  void End(v1::JobState state, const std::string& error, int64_t now);
  void SetPendingReason(const std::string& reason);
  void AddFailure(const std::string& error);

  // ---- What the ranks report ----

  // PERMISSION_DENIED unless `secret` is the rank secret of (attempt, rank); FAILED_PRECONDITION
  // for an attempt older than the two whose secrets are kept.
  absl::Status CheckRankSecret(int attempt, int rank, const std::string& secret) const;
  // "" when there is none.
  std::string RankSecret(int attempt, int rank) const;
  // INVALID_ARGUMENT: a checkpoint outside the job's checkpoint_dir, a rank out of range.
  // `worker_name` is the worker whose disk holds a checkpoint that rank 0 reports.
  // Each of the request's notes becomes an event (RankNote; at most kMaxNotesPerAttempt per
  // attempt, each cut to kMaxNoteBytes, control characters but newline and tab replaced).
  absl::Status RecordTelemetry(const v1::ReportTelemetryRequest& request,
                               const std::string& worker_name, int64_t now);
  void RecordSuccess(int rank, const std::string& checksum);
  void RecordError(int rank, const std::string& error);
  void RecordExit(int rank);
  // A chunk of a rank's output (see RankLogs::Append).
  absl::Status AppendRankLog(int attempt, int rank, int64_t offset, const std::string& data);
  // Every rank of the attempt has reported a result.
  bool AllResultsIn() const;
  // Why the ranks' parameters differ, if they do (call once all results are in).
  std::optional<std::string> ChecksumMismatch() const;
  // The first rank error reported, described, if any.
  std::optional<std::string> FirstRankError() const;
  // "rank 1 on worker w#2 (h2)".
  std::string DescribeRank(int rank) const;

  // ---- After a coordinator restart ----

  // The ranks not yet reported by a re-registered worker, and until when they may come back.
  const std::set<int>& awaiting_adoption() const { return awaiting_adoption_; }
  int64_t adopt_deadline_ms() const { return adopt_deadline_ms_; }
  void AwaitAdoption(int64_t deadline_ms);
  // Binds `rank` to where a worker says it runs.
  void Adopt(const PlacedRank& where);
  // `rank` will not come back: its worker reported its exit (ReportRankExit with its secret).
  void StopAwaitingAdoption(int rank) { awaiting_adoption_.erase(rank); }
  // Gives up waiting; returns the ranks that did not come back.
  std::set<int> AbandonAdoption();

  // ---- A collective failure waits for its root cause (see FailurePolicy) ----
  const std::string& consequence_error() const { return consequence_error_; }
  int64_t consequence_deadline_ms() const { return consequence_deadline_ms_; }
  void HoldConsequence(const std::string& error, int64_t deadline_ms);
  std::string TakeConsequence();

 private:
  void SetState(v1::JobState state, const std::string& error, int64_t now);
  void Append(v1::WatchJobEvent event);
  void RecordNote(int rank, const v1::RankNote& reported);
  void Changed(bool workers_too) { changes_->JobChanged(*this, workers_too); }
  // Hands the store the tail of (attempt, rank), or every tail held.
  void KeepRankLog(int attempt, int rank);
  void KeepRankLogs();
  void ClearKv();

  JobChanges* changes_;
  JobLimits limits_;
  v1::Job job_;
  int64_t number_ = 0;           // job-<number>: the order of submission.
  int64_t queued_since_ms_ = 0;  // When it last entered the queue (submit or restart).
  int64_t rank_memory_bytes_ = 0;
  int attempt_ = 0;
  // The attempt whose notes are being counted, and how many it has had (kMaxNotesPerAttempt;
  // not stored: a coordinator restart lets an attempt say as much again).
  std::pair<int, int> notes_this_attempt_ = {-1, 0};
  uint64_t store_ticket_ = 0;
  std::vector<RankRecord> ranks_;
  JobKv kv_;  // Cleared on each new attempt and at the end.
  // Rank secrets of the current attempt and the one before (attempt -> rank -> secret), so
  // that a late call of the earlier attempt (its ranks' last output) is recognised as such and
  // anything else is refused; older ones are dropped, so that the record stays the size of
  // two attempts however often a job restarts.
  static constexpr int kAttemptsWithSecrets = 2;
  std::map<int, std::vector<std::string>> rank_secrets_;
  JobEventLog events_;
  RankLogs logs_;
  std::set<int> awaiting_adoption_;
  int64_t adopt_deadline_ms_ = 0;
  std::string consequence_error_;
  int64_t consequence_deadline_ms_ = 0;
};

}  // namespace mptrain
