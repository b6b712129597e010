#include "coordinator/grpc_service.h"

#include <algorithm>

#include "common/grpc_status.h"

namespace mptrain {
namespace {

// Long-polls are cut into slices so that a cancelled or expired call is noticed promptly.
constexpr int64_t kWaitSliceMs = 500;
constexpr int64_t kMaxPollWaitMs = 30'000;

// Copies an OK StatusOr into *out; returns the gRPC status either way.
template <typename T>
grpc::Status Answer(const absl::StatusOr<T>& result, T* out) {
  if (!result.ok()) return ToGrpcStatus(result.status());
  *out = *result;
  return grpc::Status::OK;
}

}  // namespace

grpc::Status CoordinatorService::SubmitJob(grpc::ServerContext*,
                                           const v1::SubmitJobRequest* request,
                                           v1::SubmitJobResponse* response) {
  return Answer(state_->SubmitJob(*request), response);
}

grpc::Status CoordinatorService::GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                                        v1::GetJobResponse* response) {
  return Answer(state_->GetJob(request->job_id()), response->mutable_job());
}

grpc::Status CoordinatorService::ListJobs(grpc::ServerContext*, const v1::ListJobsRequest*,
                                          v1::ListJobsResponse* response) {
  for (v1::Job& job : state_->ListJobs()) *response->add_jobs() = std::move(job);
  return grpc::Status::OK;
}

grpc::Status CoordinatorService::CancelJob(grpc::ServerContext*,
                                           const v1::CancelJobRequest* request,
                                           v1::CancelJobResponse* response) {
  auto state = state_->CancelJob(request->job_id());
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

grpc::Status WorkerControlService::RegisterWorker(grpc::ServerContext*,
                                                  const v1::RegisterWorkerRequest* request,
                                                  v1::RegisterWorkerResponse* response) {
  return Answer(state_->RegisterWorker(*request), response);
}

grpc::Status WorkerControlService::Heartbeat(grpc::ServerContext*,
                                             const v1::HeartbeatRequest* request,
                                             v1::HeartbeatResponse*) {
  return ToGrpcStatus(state_->Heartbeat(request->worker_id(), request->incarnation()));
}

grpc::Status WorkerControlService::DeregisterWorker(grpc::ServerContext*,
                                                    const v1::DeregisterWorkerRequest* request,
                                                    v1::DeregisterWorkerResponse*) {
  return ToGrpcStatus(
      state_->DeregisterWorker(request->worker_id(), request->incarnation(), request->reason()));
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
  return ToGrpcStatus(state_->KeyValueSet(request->job_id(), request->attempt(), request->key(),
                                          request->value()));
}

grpc::Status WorkerControlService::KeyValueGet(grpc::ServerContext* context,
                                               const v1::KeyValueGetRequest* request,
                                               v1::KeyValueGetResponse* response) {
  int64_t remaining_ms = std::max<int64_t>(0, request->timeout_ms());
  while (true) {
    int64_t slice_ms = std::min(remaining_ms, kWaitSliceMs);
    auto value = state_->KeyValueGet(request->job_id(), request->attempt(), request->key(),
                                     slice_ms);
    remaining_ms -= slice_ms;
    if (value.ok()) {
      response->set_value(*value);
      return grpc::Status::OK;
    }
    if (value.status().code() != absl::StatusCode::kDeadlineExceeded || remaining_ms <= 0) {
      if (value.status().code() == absl::StatusCode::kDeadlineExceeded) {
        return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                            "key " + request->key() + " of job " + request->job_id() +
                                " not set within " + std::to_string(request->timeout_ms()) +
                                " ms");
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
