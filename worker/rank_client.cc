#include "worker/rank_client.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/rpc_limits.h"
#include "spdlog/spdlog.h"

namespace mptrain {
namespace {

constexpr auto kRpcDeadline = std::chrono::seconds(10);
// While the coordinator is away (a restart), telemetry waits in a bounded queue (the oldest
// records go first) and the final result is retried for this long: long enough for a
// coordinator to come back and re-adopt the job.
constexpr size_t kMaxQueuedRecords = kMaxTelemetryRecordsPerReport;
constexpr auto kResultRetryFor = std::chrono::seconds(180);
constexpr auto kFinalFlushRetryFor = std::chrono::seconds(60);
constexpr auto kRendezvousRetryFor = std::chrono::seconds(60);

void SetDeadline(grpc::ClientContext* context, std::chrono::milliseconds extra = {}) {
  context->set_deadline(std::chrono::system_clock::now() + kRpcDeadline + extra);
}

}  // namespace

absl::Status GrpcKeyValueStore::Set(const std::string& key, const std::string& value) {
  v1::KeyValueSetRequest request;
  request.set_job_id(identity_.job_id);
  request.set_attempt(identity_.attempt);
  request.set_rank(identity_.rank);
  request.set_rank_secret(identity_.secret);
  request.set_key(key);
  request.set_value(value);
  // The store is write-once and a repeated set of the same value is fine, so a set is retried
  // while the coordinator is away (restarting), for as long as a rendezvous would wait anyway.
  const auto give_up = std::chrono::steady_clock::now() + kRendezvousRetryFor;
  while (true) {
    v1::KeyValueSetResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    grpc::Status status = stub_->KeyValueSet(&context, request, &response);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        std::chrono::steady_clock::now() >= give_up) {
      return FromGrpcStatus(status);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
}

absl::StatusOr<std::string> GrpcKeyValueStore::Get(const std::string& key, int64_t timeout_ms) {
  v1::KeyValueGetRequest request;
  request.set_job_id(identity_.job_id);
  request.set_attempt(identity_.attempt);
  request.set_rank(identity_.rank);
  request.set_rank_secret(identity_.secret);
  request.set_key(key);
  // Waits in the coordinator up to timeout_ms in all; an unreachable coordinator (restarting)
  // is tried again until then, and so is one whose places for this rank's waiting calls are
  // taken (RESOURCE_EXHAUSTED: calls of this rank it has not noticed ended yet, or a
  // stranger's): a rendezvous must not fail on what clears in a moment.
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  while (true) {
    const int64_t left_ms = std::max<int64_t>(
        0, std::chrono::duration_cast<std::chrono::milliseconds>(
               give_up - std::chrono::steady_clock::now())
               .count());
    request.set_timeout_ms(left_ms);
    v1::KeyValueGetResponse response;
    grpc::ClientContext context;
    SetDeadline(&context, std::chrono::milliseconds(left_ms));
    grpc::Status status = stub_->KeyValueGet(&context, request, &response);
    if (status.ok()) return response.value();
    const bool transient = status.error_code() == grpc::StatusCode::UNAVAILABLE ||
                           status.error_code() == grpc::StatusCode::RESOURCE_EXHAUSTED;
    if (!transient || left_ms == 0) return FromGrpcStatus(status);
    std::this_thread::sleep_for(std::chrono::milliseconds(std::min<int64_t>(500, left_ms)));
  }
}

TelemetryReporter::TelemetryReporter(std::shared_ptr<v1::WorkerControl::StubInterface> stub,
                                     RankIdentity identity, StopToken* stop,
                                     int64_t flush_interval_ms)
    : stub_(std::move(stub)),
      identity_(std::move(identity)),
      flush_interval_ms_(flush_interval_ms),
      stop_(stop),
      thread_([this] { Run(); }) {}

TelemetryReporter::~TelemetryReporter() { Flush(); }

void TelemetryReporter::OnCheckpoint(int64_t step, const std::string& path) {
  std::lock_guard<std::mutex> lock(mu_);
  checkpoint_step_ = step;
  checkpoint_path_ = path;
  spdlog::info("checkpoint of step {} written to {}", step, path);
}

std::string TelemetryReporter::StopReason() {
  std::string reason = stop_->reason();
  return reason.empty() ? "a stop was requested" : reason;
}

v1::TelemetryRecord ToTelemetryRecord(const StepTelemetry& step) {
  v1::TelemetryRecord record;
  record.set_step(step.step);
  record.set_loss(step.loss);
  record.set_grad_norm(step.grad_norm);
  record.set_loss_scale(step.loss_scale);
  record.set_skipped(step.skipped);
  record.set_skipped_total(step.skipped_total);
  record.set_step_time_ms(step.step_time_ms);
  record.set_samples_per_second(step.samples_per_second);
  record.set_lr(step.lr);
  if (step.has_accuracy) record.set_accuracy(step.accuracy);
  if (step.has_eval) {
    record.set_eval_loss(step.eval_loss);
    if (step.has_accuracy) record.set_eval_accuracy(step.eval_accuracy);
  }
  return record;
}

void TelemetryReporter::OnStep(int64_t step, const StepTelemetry* record) {
  std::lock_guard<std::mutex> lock(mu_);
  step_ = step;
  // Only rank 0 sends records: after the allreduce every rank holds the same values.
  if (record == nullptr || identity_.rank != 0) return;
  // Bounded while the coordinator cannot keep up: the oldest go first.
  if (queued_.size() >= kMaxQueuedRecords) queued_.erase(queued_.begin());
  queued_.push_back(ToTelemetryRecord(*record));
  // The first step goes out at once (trainctl watch, the dashboard and "first step after
  // submit" see it then, not up to a flush interval later); the rest in batches.
  if (!first_record_queued_) {
    first_record_queued_ = true;
    send_now_ = true;
    wake_.notify_one();
  }
  spdlog::info(
      "step {:>6} loss {:.6f} grad_norm {:.6g} scale {:g} skipped {} ({} total) "
      "{:.3f} ms {:.0f} samples/s",
      record->step, record->loss, record->grad_norm, record->loss_scale,
      record->skipped ? "yes" : "no", record->skipped_total, record->step_time_ms,
      record->samples_per_second);
}

void TelemetryReporter::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    wake_.wait_for(lock, std::chrono::milliseconds(flush_interval_ms_),
                   [&] { return stopping_ || send_now_; });
    send_now_ = false;
    bool stopping = stopping_;
    lock.unlock();
    bool sent = SendBatch();
    // A whole report's worth queued again (a job faster than a report per flush interval):
    // on at once rather than falling behind.
    while (sent && !stopping && QueuedRecords() >= size_t{kMaxTelemetryRecordsPerReport}) {
      sent = SendBatch();
    }
    // The last batch (before the result that ends the job) is worth waiting for.
    const auto give_up = std::chrono::steady_clock::now() + kFinalFlushRetryFor;
    while (stopping && !sent && std::chrono::steady_clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      sent = SendBatch();
    }
    lock.lock();
    if (stopping) return;
  }
}

bool TelemetryReporter::SendBatch() {
  v1::ReportTelemetryRequest request;
  {
    std::lock_guard<std::mutex> lock(mu_);
    request.set_job_id(identity_.job_id);
    request.set_rank(identity_.rank);
    request.set_attempt(identity_.attempt);
    request.set_rank_secret(identity_.secret);
    request.set_step(step_);
    request.set_work_units(work_units_);
    // The oldest first, at most a report's worth; the rest go with the next report.
    const size_t sent = std::min(queued_.size(), size_t{kMaxTelemetryRecordsPerReport});
    for (size_t i = 0; i < sent; ++i) *request.add_records() = std::move(queued_[i]);
    queued_.erase(queued_.begin(), queued_.begin() + static_cast<std::ptrdiff_t>(sent));
    request.set_checkpoint_step(checkpoint_step_);
    request.set_checkpoint_path(checkpoint_path_);
    const size_t notes = std::min(notes_.size(), size_t{kMaxNotesPerReport});
    for (size_t i = 0; i < notes; ++i) *request.add_notes() = std::move(notes_[i]);
    notes_.erase(notes_.begin(), notes_.begin() + static_cast<std::ptrdiff_t>(notes));
  }
  v1::ReportTelemetryResponse response;
  grpc::ClientContext context;
  SetDeadline(&context);
  grpc::Status status = stub_->ReportTelemetry(&context, request, &response);
  if (!status.ok()) {
    spdlog::warn("telemetry not delivered ({} records kept for the next try): {}",
                 request.records_size(), status.error_message());
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<v1::TelemetryRecord> kept(request.records().begin(), request.records().end());
    for (auto& record : queued_) kept.push_back(std::move(record));
    if (kept.size() > kMaxQueuedRecords) {
      kept.erase(kept.begin(), kept.end() - kMaxQueuedRecords);
    }
    queued_ = std::move(kept);
    std::vector<v1::RankNote> kept_notes(request.notes().begin(), request.notes().end());
    for (auto& note : notes_) kept_notes.push_back(std::move(note));
    if (kept_notes.size() > size_t{kMaxNotesPerAttempt}) kept_notes.resize(kMaxNotesPerAttempt);
    notes_ = std::move(kept_notes);
    return false;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    acknowledged_checkpoint_step_ =
        std::max(acknowledged_checkpoint_step_, request.checkpoint_step());
  }
  if (response.abort() && !stop_->stop_requested()) {
    spdlog::warn("the coordinator ended this job: stopping");
    stop_->RequestStop("the coordinator ended the job");
  }
  return true;
}

int64_t TelemetryReporter::AcknowledgedCheckpointStep() {
  std::lock_guard<std::mutex> lock(mu_);
  return acknowledged_checkpoint_step_;
}

void TelemetryReporter::OnSetUp(double model_built_ms, double initialised_ms) {
  spdlog::info("model built in {:.0f} ms, parameters initialised at {:.0f} ms",
               model_built_ms, initialised_ms);
}

void TelemetryReporter::OnWarning(const std::string& message) {
  spdlog::warn("{}", message);  // The rank's log: the worker's, and trainctl logs.
  // And the job's events (trainctl watch, the dashboard), bounded while the coordinator is away.
  std::lock_guard<std::mutex> lock(mu_);
  AddNote(v1::RankNote::WARNING, step_, message);
}

void TelemetryReporter::OnSample(int64_t step, const std::string& text) {
  std::lock_guard<std::mutex> lock(mu_);
  AddNote(v1::RankNote::SAMPLE, step, text);
}

void TelemetryReporter::OnWorkUnit() {
  std::lock_guard<std::mutex> lock(mu_);
  ++work_units_;
}

void TelemetryReporter::AddNote(v1::RankNote::Kind kind, int64_t step, const std::string& text) {
  if (notes_.size() >= size_t{kMaxNotesPerAttempt}) return;
  v1::RankNote note;
  note.set_kind(kind);
  note.set_step(step);
  // Cut at a character boundary (a proto string must be valid UTF-8).
  size_t end = std::min(text.size(), kMaxNoteBytes);
  while (end < text.size() && end > 0 &&
         (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) {
    --end;
  }
  note.set_text(text.substr(0, end));
  notes_.push_back(std::move(note));
}

size_t TelemetryReporter::QueuedRecords() {
  std::lock_guard<std::mutex> lock(mu_);
  return queued_.size();
}

void TelemetryReporter::Flush() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

absl::Status ReportRankResult(v1::WorkerControl::StubInterface* stub, const RankIdentity& identity,
                              const absl::StatusOr<std::string>& checksum) {
  v1::ReportRankResultRequest request;
  request.set_job_id(identity.job_id);
  request.set_rank(identity.rank);
  request.set_attempt(identity.attempt);
  request.set_rank_secret(identity.secret);
  if (checksum.ok()) {
    request.set_parameter_checksum(*checksum);
  } else {
    request.set_error(checksum.status().ToString());
    // Consequences, held back by the coordinator until a root cause is named: collectives
    // report lost or missing peers as UNAVAILABLE / DEADLINE_EXCEEDED, and a rank stopped
    // from outside (its worker's SIGTERM: a self-fence after losing the coordinator, the daemon
    // stopping) is ABORTED — the cause is whatever made them stop it (before, a fenced rank's
    // "the worker stopped this rank" arrived first and was taken for the cause).
    request.set_collective_failure(
        checksum.status().code() == absl::StatusCode::kUnavailable ||
        checksum.status().code() == absl::StatusCode::kDeadlineExceeded ||
        checksum.status().code() == absl::StatusCode::kAborted);
  }
  grpc::Status status;
  const auto give_up = std::chrono::steady_clock::now() + kResultRetryFor;
  for (int attempt = 0;; ++attempt) {
    v1::ReportRankResultResponse response;
    grpc::ClientContext context;
    SetDeadline(&context);
    status = stub->ReportRankResult(&context, request, &response);
    if (status.error_code() != grpc::StatusCode::UNAVAILABLE ||
        std::chrono::steady_clock::now() >= give_up) {
      break;
    }
    if (attempt == 0) spdlog::warn("the coordinator is unreachable; retrying the result");
    std::this_thread::sleep_for(
        std::chrono::milliseconds(std::min(200 << std::min(attempt, 3), 1000)));
  }
  return FromGrpcStatus(status);
}

}  // namespace mptrain
