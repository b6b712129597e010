#include "coordinator/job_record.h"

#include "common/rpc_limits.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/path_rules.h"
#include "common/secrets.h"
#include "common/status_macros.h"
#include "spdlog/spdlog.h"

namespace mptrain {

bool IsTerminal(v1::JobState state) {
  return state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED;
}

JobRecord::JobRecord(int64_t number, v1::JobSpec spec, const Tenancy& owner,
                     const std::string& request_id, int64_t rank_memory_bytes, int64_t now,
                     const JobLimits& limits, JobChanges* changes)
    : changes_(changes),
      limits_(limits),
      number_(number),
      queued_since_ms_(now),
      rank_memory_bytes_(rank_memory_bytes),
      kv_(limits.max_kv_keys, limits.max_kv_bytes),
      events_(limits.max_events) {
  job_.set_job_id(absl::StrFormat("job-%04d", number));
  job_.set_uid(RandomSecret());
  *job_.mutable_spec() = std::move(spec);
  job_.set_state(v1::PENDING);
  job_.set_submitted_unix_ms(now);
  job_.set_request_id(request_id);
  job_.set_owner(owner.principal);
  job_.set_owner_is_admin(owner.admin);
  job_.set_estimated_rank_memory_bytes(rank_memory_bytes);
  // No per-rank state yet (ranks_, progress): a queued job of 1,024 ranks held 140 KiB of it,
  // and 10,000 of them took 1.4 GB. StartAttempt makes it.
  Changed(/*workers_too=*/false);
}

JobRecord::JobRecord(const store::StoredJob& stored, v1::JobSpec spec,
                     std::vector<v1::WatchJobEvent> events,
                     const std::vector<store::StoredRankLog>& rank_logs,
                     const std::vector<JobStore::KvEntry>& kv, int64_t now,
                     const JobLimits& limits, JobChanges* changes)
    : changes_(changes),
      limits_(limits),
      job_(stored.job()),
      number_(stored.number()),
      queued_since_ms_(stored.queued_since_ms()),
      rank_memory_bytes_(stored.rank_memory_bytes()),
      attempt_(stored.attempt()),
      kv_(limits.max_kv_keys, limits.max_kv_bytes),
      events_(limits.max_events) {
  *job_.mutable_spec() = std::move(spec);
  for (const auto& [attempt, secrets] : stored.rank_secrets()) {
    rank_secrets_[attempt].assign(secrets.secret().begin(), secrets.secret().end());
  }
  for (const JobStore::KvEntry& entry : kv) {
    if (entry.attempt == attempt_) kv_.Set(entry.key, entry.value).IgnoreError();
  }
  if (!stored.kv().empty()) {
    // An older build's store kept the store inside the record: it moves to the kv table.
    for (const auto& [key, value] : stored.kv()) SetKv(key, value).IgnoreError();
    Changed(/*workers_too=*/false);  // Rewritten without it.
  }
  if (job_.uid().empty()) {
    // Stored by a build before uids: one now (its files, stamped with the id alone, are then
    // never taken for its own — the safe side).
    job_.set_uid(RandomSecret());
    Changed(/*workers_too=*/false);
  }
  events_.Restore(std::move(events), stored.last_sequence());
  if (terminal()) events_.Shrink(limits.max_events_finished);
  for (const store::StoredRankLog& log : rank_logs) logs_.Restore(log);
  if (terminal()) logs_.Shrink(job_.spec().world_size());
  // A job never placed has none (an older build's store may still hold its progress rows).
  if (attempt_ > 0 || job_.progress_size() > 0) {
    ranks_.resize(std::max(0, job_.spec().world_size()));
  }
  for (const v1::RankProgress& progress : job_.progress()) {
    if (!ValidRank(progress.rank())) continue;
    RankRecord& rank = ranks_[progress.rank()];
    rank.result_reported = progress.finished() || !progress.error().empty();
    rank.checksum = progress.parameter_checksum();
    rank.step = progress.step();
    rank.last_report_ms = rank.last_progress_ms = now;
  }
}

int64_t JobRecord::MemoryBytes() const {
  // Protobuf counts what its messages hold; the rest is this record's own.
  int64_t bytes = sizeof(JobRecord) + static_cast<int64_t>(job_.SpaceUsedLong()) +
                  static_cast<int64_t>(ranks_.capacity() * sizeof(RankRecord));
  for (const auto& [attempt, secrets] : rank_secrets_) {
    bytes += static_cast<int64_t>(secrets.capacity() * (sizeof(std::string) + 64));
  }
  return bytes;
}

store::StoredJob JobRecord::ToStored() const {
  store::StoredJob stored;
  *stored.mutable_job() = job_;
  stored.mutable_job()->clear_spec();  // Written once, when the job was new.
  stored.set_number(number_);
  stored.set_queued_since_ms(queued_since_ms_);
  stored.set_rank_memory_bytes(rank_memory_bytes_);
  stored.set_attempt(attempt_);
  for (const auto& [attempt, secrets] : rank_secrets_) {
    auto& out = (*stored.mutable_rank_secrets())[attempt];
    for (const std::string& secret : secrets) out.add_secret(secret);
  }
  stored.set_last_sequence(events_.last_sequence());
  return stored;
}

// ---------------------------------------------------------------------------------------------
// Transitions
// ---------------------------------------------------------------------------------------------

void JobRecord::StartAttempt(const std::vector<PlacedRank>& placement, int64_t now) {
  if (ranks_.empty()) ranks_.resize(world_size());
  if (job_.progress_size() == 0) {
    for (int rank = 0; rank < world_size(); ++rank) job_.add_progress()->set_rank(rank);
  }
  attempt_ += 1;
  ClearKv();
  std::vector<std::string>& secrets = rank_secrets_[attempt_];
  for (int rank = 0; rank < world_size(); ++rank) secrets.push_back(RandomSecret());
  rank_secrets_.erase(rank_secrets_.begin(),
                      rank_secrets_.lower_bound(attempt_ - kAttemptsWithSecrets + 1));
  job_.clear_placement();
  for (const PlacedRank& placed : placement) {
    v1::RankPlacement* out = job_.add_placement();
    out->set_rank(placed.rank);
    out->set_worker_id(placed.worker_id);
    out->set_host(placed.host);
    out->set_device_index(placed.slot);
  }
  for (RankRecord& rank : ranks_) {
    rank = RankRecord{};
    rank.last_report_ms = rank.last_progress_ms = now;
  }
  for (v1::RankProgress& progress : *job_.mutable_progress()) {
    progress.set_finished(false);
    progress.clear_parameter_checksum();
    progress.clear_error();
  }
  consequence_error_.clear();
  consequence_deadline_ms_ = 0;
  SetState(v1::RUNNING, "", now);
}

void JobRecord::Requeue(const std::string& note, int64_t now) {
  job_.set_restarts(job_.restarts() + 1);
  ClearKv();
  job_.set_state(v1::PENDING);
  queued_since_ms_ = now;
  KeepRankLogs();  // The failed attempt's output, for `trainctl logs --attempt`.
  spdlog::warn("job {}: {}", id(), note);
  v1::WatchJobEvent event;
  event.mutable_state_change()->set_state(v1::PENDING);
  event.mutable_state_change()->set_error(note);
  Append(std::move(event));
}

void JobRecord::End(v1::JobState state, const std::string& error, int64_t now) {
  if (terminal()) return;
  SetState(state, error, now);
}

void JobRecord::SetState(v1::JobState state, const std::string& error, int64_t now) {
  if (job_.state() == state) return;
  job_.set_state(state);
  if (!error.empty()) job_.set_error(error);
  if (state == v1::RUNNING) job_.set_started_unix_ms(now);
  if (state != v1::PENDING) job_.clear_pending_reason();
  if (IsTerminal(state)) {
    job_.set_finished_unix_ms(now);
    ClearKv();
    logs_.Shrink(world_size());
    KeepRankLogs();
  }
  if (state == v1::FAILED) {
    spdlog::warn("job {} FAILED: {}", id(), error);
  } else {
    spdlog::info("job {} {}{}", id(), v1::JobState_Name(state), error.empty() ? "" : ": " + error);
  }
  v1::WatchJobEvent event;
  event.mutable_state_change()->set_state(state);
  event.mutable_state_change()->set_error(error);
  Append(std::move(event));
  if (IsTerminal(state)) {
    // Nobody reports to a finished job any more: memory keeps its recent history only; the
    // store keeps as much as a running job holds (for export).
    events_.Shrink(limits_.max_events_finished);
    changes_->EventsTrimmed(
        *this, std::max<int64_t>(0, events_.last_sequence() -
                                        static_cast<int64_t>(limits_.max_events)));
  }
}

void JobRecord::SetPendingReason(const std::string& reason) {
  if (job_.pending_reason() == reason) return;
  job_.set_pending_reason(reason);
  Changed(/*workers_too=*/false);
}

void JobRecord::AddFailure(const std::string& error) {
  job_.add_failures(error);
  Changed(/*workers_too=*/false);
}

void JobRecord::Append(v1::WatchJobEvent event) {
  // A state change concerns the job's workers too; telemetry only its watchers.
  const bool state_change = event.has_state_change();
  changes_->EventAppended(*this, events_.Append(std::move(event)));
  // The store's history of a running job is bounded too: every kStoredEventsTrimStep events
  // past the limit, the oldest are dropped there (memory holds far fewer anyway).
  const int64_t last = events_.last_sequence();
  const int64_t kept = static_cast<int64_t>(limits_.max_stored_events);
  if (last > kept && last % kStoredEventsTrimStep == 0) changes_->EventsTrimmed(*this, last - kept);
  Changed(state_change);
}

// ---------------------------------------------------------------------------------------------
// Ranks
// ---------------------------------------------------------------------------------------------

absl::Status JobRecord::SetKv(const std::string& key, const std::string& value) {
  const bool is_new = !kv_.Contains(key);
  RETURN_IF_ERROR(kv_.Set(key, value));
  if (is_new) changes_->KvWritten(*this, key, value);
  return absl::OkStatus();
}

void JobRecord::ClearKv() {
  kv_.Clear();
  changes_->KvCleared(*this);
}

absl::Status JobRecord::CheckRankSecret(int attempt, int rank, const std::string& secret) const {
  if (attempt > 0 && !rank_secrets_.empty() && attempt < rank_secrets_.begin()->first) {
    return absl::FailedPreconditionError(
        absl::StrCat("job ", id(), " attempt ", attempt, " is long over"));
  }
  auto secrets = rank_secrets_.find(attempt);
  if (secrets == rank_secrets_.end() || rank < 0 ||
      rank >= static_cast<int>(secrets->second.size()) ||
      !SecretsEqual(secrets->second[rank], secret)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "the rank secret does not match job ", id(), " attempt ", attempt, " rank ", rank));
  }
  return absl::OkStatus();
}

std::string JobRecord::RankSecret(int attempt, int rank) const {
  auto secrets = rank_secrets_.find(attempt);
  if (secrets == rank_secrets_.end() || rank < 0 ||
      rank >= static_cast<int>(secrets->second.size())) {
    return "";
  }
  return secrets->second[rank];
}

absl::Status JobRecord::RecordTelemetry(const v1::ReportTelemetryRequest& request,
                                        const std::string& worker_name, int64_t now) {
  if (!ValidRank(request.rank())) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", request.rank(), " out of range"));
  }
  const std::string& checkpoint = request.checkpoint_path();
  if (!checkpoint.empty() &&
      (spec().checkpoint_dir().empty() || !IsUnderRoot(checkpoint, spec().checkpoint_dir()) ||
       !CheckPathSyntax("checkpoint_path", checkpoint).ok())) {
    // The next attempt's rank 0 reads this path: it must be one of the job's own checkpoints.
    return absl::InvalidArgumentError("checkpoint_path must lie in the job's checkpoint_dir");
  }
  job_.mutable_progress(request.rank())->set_step(request.step());
  RankRecord& rank = ranks_[request.rank()];
  rank.last_report_ms = now;
  // Progress: a step, or an evaluation batch or sampled token between steps.
  if (request.step() > rank.step || request.work_units() > rank.work_units) {
    rank.last_progress_ms = now;
  }
  rank.step = std::max(rank.step, request.step());
  rank.work_units = std::max(rank.work_units, request.work_units());
  if (!checkpoint.empty() && request.checkpoint_step() > job_.latest_checkpoint_step()) {
    job_.set_latest_checkpoint_step(request.checkpoint_step());
    job_.set_latest_checkpoint_path(checkpoint);
    // Rank 0 writes checkpoints on its own worker's disk: a restart reads it there.
    job_.set_latest_checkpoint_worker(worker_name);
  }
  for (v1::TelemetryRecord telemetry : request.records()) {
    // An attempt's steps are recorded once: a report re-sent because its answer was lost (the
    // coordinator died between writing it and answering) is not recorded twice. The latest
    // record is part of the stored job, so this holds across coordinator restarts. The steps a
    // restart runs again from its checkpoint are recorded again, with their attempt.
    telemetry.set_attempt(attempt_);
    // When the coordinator recorded it (a rank's own clock is not trusted, nor set).
    telemetry.set_unix_ms(now);
    if (job_.has_latest_telemetry() && job_.latest_telemetry().attempt() == attempt_ &&
        telemetry.step() <= job_.latest_telemetry().step()) {
      continue;
    }
    *job_.mutable_latest_telemetry() = telemetry;
    // Evaluations are rarer than telemetry: the latest one stays until the next.
    if (telemetry.has_eval_loss() || telemetry.has_eval_accuracy()) {
      *job_.mutable_latest_evaluation() = telemetry;
    }
    v1::WatchJobEvent event;
    *event.mutable_telemetry() = telemetry;
    Append(std::move(event));
  }
  for (const v1::RankNote& reported : request.notes()) RecordNote(request.rank(), reported);
  Changed(/*workers_too=*/false);
  return absl::OkStatus();
}

void JobRecord::RecordNote(int rank, const v1::RankNote& reported) {
  if (notes_this_attempt_.first != attempt_) notes_this_attempt_ = {attempt_, 0};
  int& count = notes_this_attempt_.second;
  if (count > kMaxNotesPerAttempt) return;
  v1::WatchJobEvent event;
  v1::RankNote* note = event.mutable_note();
  note->set_kind(reported.kind() == v1::RankNote::SAMPLE ? v1::RankNote::SAMPLE
                                                          : v1::RankNote::WARNING);
  note->set_step(std::max<int64_t>(0, reported.step()));
  note->set_rank(rank);
  note->set_attempt(attempt_);
  if (++count > kMaxNotesPerAttempt) {
    note->set_kind(v1::RankNote::WARNING);
    note->set_text(absl::StrCat("further notes of this attempt are dropped (at most ",
                                kMaxNotesPerAttempt, " are kept)"));
  } else {
    // Bounded, and printable where a terminal shows it: control characters but newline and
    // tab become '?' (the text is the rank's, which may quote the spec's paths).
    const std::string& whole = reported.text();
    size_t end = whole.size();
    if (end > kMaxNoteBytes) {
      // Cut at a character boundary (the proto string must stay valid UTF-8).
      end = kMaxNoteBytes;
      while (end > 0 && (static_cast<unsigned char>(whole[end]) & 0xC0) == 0x80) --end;
    }
    std::string text = whole.substr(0, end);
    for (char& c : text) {
      const unsigned char u = static_cast<unsigned char>(c);
      if ((u < 0x20 && c != '\n' && c != '\t') || u == 0x7f) c = '?';
    }
    if (end < whole.size()) text += "...";
    note->set_text(std::move(text));
  }
  Append(std::move(event));
}

void JobRecord::RecordSuccess(int rank, const std::string& checksum) {
  ranks_[rank].result_reported = true;
  ranks_[rank].checksum = checksum;
  v1::RankProgress* progress = job_.mutable_progress(rank);
  progress->set_finished(true);
  progress->set_parameter_checksum(checksum);
  Changed(/*workers_too=*/true);
}

void JobRecord::RecordError(int rank, const std::string& error) {
  ranks_[rank].result_reported = true;
  job_.mutable_progress(rank)->set_error(TruncateForError(error, 4096));
  Changed(/*workers_too=*/true);
}

void JobRecord::RecordExit(int rank) {
  ranks_[rank].exited = true;
  logs_.MarkComplete(attempt_, rank);
  KeepRankLog(attempt_, rank);
  Changed(/*workers_too=*/true);
}

absl::Status JobRecord::AppendRankLog(int attempt, int rank, int64_t offset,
                                      const std::string& data) {
  if (absl::Status status = logs_.Append(attempt, rank, offset, data); !status.ok()) {
    return status;
  }
  // A rank of a job that ended or restarts is stopping: what it sends now is its last words,
  // and nothing else will write them to the store.
  if (!running()) KeepRankLog(attempt, rank);
  return absl::OkStatus();
}

void JobRecord::KeepRankLog(int attempt, int rank) {
  if (std::optional<store::StoredRankLog> log = logs_.ToStored(attempt, rank)) {
    changes_->RankLogKept(*this, std::move(*log));
  }
}

void JobRecord::KeepRankLogs() {
  for (store::StoredRankLog& log : logs_.ToStored()) {
    changes_->RankLogKept(*this, std::move(log));
  }
}

bool JobRecord::AllResultsIn() const {
  return std::all_of(ranks_.begin(), ranks_.end(),
                     [](const RankRecord& rank) { return rank.result_reported; });
}

std::optional<std::string> JobRecord::ChecksumMismatch() const {
  const std::string& reference = ranks_[0].checksum;
  for (int rank = 1; rank < world_size(); ++rank) {
    if (ranks_[rank].checksum != reference) {
      return absl::StrCat("parameters diverged across ranks: rank 0 has checksum ", reference,
                          ", rank ", rank, " has ", ranks_[rank].checksum);
    }
  }
  return std::nullopt;
}

std::optional<std::string> JobRecord::FirstRankError() const {
  for (const v1::RankProgress& progress : job_.progress()) {
    if (!progress.error().empty()) {
      return absl::StrCat(DescribeRank(progress.rank()), " failed: ", progress.error());
    }
  }
  return std::nullopt;
}

std::string JobRecord::DescribeRank(int rank) const {
  for (const v1::RankPlacement& placement : job_.placement()) {
    if (placement.rank() == rank) {
      return absl::StrCat("rank ", rank, " on worker ", placement.worker_id(), " (",
                          placement.host(), ")");
    }
  }
  return absl::StrCat("rank ", rank);
}

// ---------------------------------------------------------------------------------------------
// Adoption and held-back errors
// ---------------------------------------------------------------------------------------------

void JobRecord::AwaitAdoption(int64_t deadline_ms) {
  awaiting_adoption_.clear();
  for (int rank = 0; rank < world_size(); ++rank) {
    if (!ranks_[rank].result_reported) awaiting_adoption_.insert(rank);
  }
  adopt_deadline_ms_ = deadline_ms;
}

void JobRecord::Adopt(const PlacedRank& where) {
  for (v1::RankPlacement& placement : *job_.mutable_placement()) {
    if (placement.rank() != where.rank) continue;
    placement.set_worker_id(where.worker_id);
    placement.set_host(where.host);
    placement.set_device_index(where.slot);
  }
  awaiting_adoption_.erase(where.rank);
  spdlog::info("job {}: rank {} re-adopted on worker {}{}", id(), where.rank, where.worker_id,
               awaiting_adoption_.empty() ? " (every rank is back)" : "");
  Changed(/*workers_too=*/true);
}

std::set<int> JobRecord::AbandonAdoption() {
  std::set<int> missing;
  missing.swap(awaiting_adoption_);
  return missing;
}

void JobRecord::HoldConsequence(const std::string& error, int64_t deadline_ms) {
  if (!consequence_error_.empty()) return;  // The first one is the one that matters.
  consequence_error_ = error;
  consequence_deadline_ms_ = deadline_ms;
}

std::string JobRecord::TakeConsequence() {
  std::string error;
  error.swap(consequence_error_);
  consequence_deadline_ms_ = 0;
  return error;
}

}  // namespace mptrain
