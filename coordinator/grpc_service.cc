#include "coordinator/grpc_service.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"

namespace mptrain {
namespace {

// Long-polls are cut into slices so that a cancelled or expired call is noticed promptly.
constexpr int64_t kWaitSliceMs = 500;
constexpr int64_t kMaxPollWaitMs = 30'000;
// A rendezvous wait is bounded too: a waiting call holds a server thread.
constexpr int64_t kMaxKeyValueWaitMs = 600'000;

// Copies an OK StatusOr into *out; returns the gRPC status either way.
template <typename T>
grpc::Status Answer(const absl::StatusOr<T>& result, T* out) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *out = *result;
  return grpc::Status::OK;
}

}  // namespace

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext* context,
                                           const v1::SubmitJobRequest* request,
                                           v1::SubmitJobResponse* response) {
  return Answer(state_->SubmitJob(*request, auth_->Identify(*context).principal), response);
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                        v1::GetJobResponse* response) {
  return Answer(state_->GetJob(request->job_id()), response->mutable_job());
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                                          v1::ListJobsResponse* response) {
  return Answer(state_->ListJobs(*request), response);
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext* context,
                                           const v1::CancelJobRequest* request,
                                           v1::CancelJobResponse* response) {
  const CallerIdentity caller = auth_->Identify(*context);
  auto state = state_->CancelJob(request->job_id(), caller.principal, caller.admin);
  if (!state.ok()) return ToGrpcStatus(state.status());
  response->set_state(*state);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest*,
                                             v1::ListWorkersResponse* response) {
  for (v1::Worker& worker : state_->ListWorkers()) *response->add_workers() = std::move(worker);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::WatchJob(grpc::ServerContext* context,
                                          const v1::WatchJobRequest* request,
                                          grpc::ServerWriter<v1::WatchJobEvent>* writer) {
  auto snapshot = state_->WatchSnapshot(request->job_id());
  if (!snapshot.ok()) return ToGrpcStatus(snapshot.status());
  if (!writer->Write(*snapshot)) return grpc::Status::CANCELLED;
  int64_t last_sequence = snapshot->sequence();
  // The snapshot already shows a terminal state: nothing more will come.
  const v1::JobState state = snapshot->snapshot().state();
  if (state == v1::SUCCEEDED || state == v1::FAILED || state == v1::CANCELLED) {
    return grpc::Status::OK;
  }
  while (!context->IsCancelled()) {
    auto batch = state_->WaitForJobEvents(request->job_id(), last_sequence, kWaitSliceMs);
    if (!batch.ok()) return ToGrpcStatus(batch.status());
    for (const v1::WatchJobEvent& event : batch->events) {
      if (!writer->Write(event)) return grpc::Status::CANCELLED;
      last_sequence = event.sequence();
    }
    if (batch->finished) return grpc::Status::OK;
  }
  return grpc::Status::CANCELLED;
}

grpc::Status WorkerControlService::RegisterWorker(grpc::ServerContext* context,
                                                  const v1::RegisterWorkerRequest* request,
                                                  v1::RegisterWorkerResponse* response) {
  return Answer(state_->RegisterWorker(*request, auth_->Identify(*context).principal), response);
}

grpc::Status WorkerControlService::Heartbeat(grpc::ServerContext*,
                                             const v1::HeartbeatRequest* request,
                                             v1::HeartbeatResponse*) {
  return ToGrpcStatus(state_->Heartbeat(*request));
}

grpc::Status WorkerControlService::DeregisterWorker(grpc::ServerContext*,
                                                    const v1::DeregisterWorkerRequest* request,
                                                    v1::DeregisterWorkerResponse*) {
  return ToGrpcStatus(state_->DeregisterWorker(*request));
}

grpc::Status WorkerControlService::PollAssignments(grpc::ServerContext* context,
                                                   const v1::PollAssignmentsRequest* request,
                                                   v1::PollAssignmentsResponse* response) {
  int64_t remaining_ms = std::clamp<int64_t>(request->wait_ms(), 0, kMaxPollWaitMs);
  v1::PollAssignmentsRequest slice = *request;
  while (true) {
    slice.set_wait_ms(std::min(remaining_ms, kWaitSliceMs));
    auto result = state_->PollAssignments(slice);
    if (!result.ok()) return ToGrpcStatus(result.status());
    remaining_ms -= slice.wait_ms();
    if (result->start_size() > 0 || result->stop_size() > 0 || remaining_ms <= 0 ||
        context->IsCancelled()) {
      *response = *result;
      return grpc::Status::OK;
    }
  }
}

grpc::Status WorkerControlService::ReportRankExit(grpc::ServerContext*,
                                                  const v1::ReportRankExitRequest* request,
                                                  v1::ReportRankExitResponse*) {
  return ToGrpcStatus(state_->ReportRankExit(*request));
}

grpc::Status WorkerControlService::KeyValueSet(grpc::ServerContext*,
                                               const v1::KeyValueSetRequest* request,
                                               v1::KeyValueSetResponse*) {
  return ToGrpcStatus(state_->KeyValueSet(*request));
}

grpc::Status WorkerControlService::KeyValueGet(grpc::ServerContext* context,
                                               const v1::KeyValueGetRequest* request,
                                               v1::KeyValueGetResponse* response) {
  int64_t remaining_ms = std::clamp<int64_t>(request->timeout_ms(), 0, kMaxKeyValueWaitMs);
  while (true) {
    int64_t slice_ms = std::min(remaining_ms, kWaitSliceMs);
    auto value = state_->KeyValueGet(*request, slice_ms);
    remaining_ms -= slice_ms;
    if (value.ok()) {
      response->set_value(*value);
      return grpc::Status::OK;
    }
    if (value.status().code() != absl::StatusCode::kDeadlineExceeded || remaining_ms <= 0) {
      if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return ToGrpcStatus(absl::DeadlineExceededError(
            absl::StrCat("key ", TruncateForError(request->key(), 128), " of job ",
                         TruncateForError(request->job_id(), 128), " not set within ",
                         request->timeout_ms(), " ms")));
      }
      return ToGrpcStatus(value.status());
    }
    if (context->IsCancelled()) return grpc::Status::CANCELLED;
  }
}

grpc::Status WorkerControlService::ReportTelemetry(grpc::ServerContext*,
                                                   const v1::ReportTelemetryRequest* request,
                                                   v1::ReportTelemetryResponse* response) {
  return Answer(state_->ReportTelemetry(*request), response);
}

grpc::Status WorkerControlService::ReportRankResult(grpc::ServerContext*,
                                                    const v1::ReportRankResultRequest* request,
                                                    v1::ReportRankResultResponse*) {
  return ToGrpcStatus(state_->ReportRankResult(*request));
}

}  // namespace mptrain
