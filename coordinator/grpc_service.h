#pragma once

// The thin gRPC layer: each handler unpacks a request, calls CoordinatorState and packs the
// answer. No decisions are made here. Which roles may call a method was decided before the
// handler runs (TokenAuthProcessor); handlers only pass the caller's principal on.

#include <memory>

#include "coordinator/auth.h"
#include "coordinator/coordinator_state.h"
#include "proto/mptrain.grpc.pb.h"

namespace mptrain {

class CoordinatorService final : public v1::Coordinator::Service {
 public:
  CoordinatorService(CoordinatorState* state, std::shared_ptr<const Authenticator> auth)
      : state_(state), auth_(std::move(auth)) {}

  grpc::Status SubmitJob(grpc::ServerContext*, const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  grpc::Status GetJob(grpc::ServerContext*, const v1::GetJobRequest* request,
                      v1::GetJobResponse* response) override;
  grpc::Status ListJobs(grpc::ServerContext*, const v1::ListJobsRequest* request,
                        v1::ListJobsResponse* response) override;
  grpc::Status CancelJob(grpc::ServerContext*, const v1::CancelJobRequest* request,
                         v1::CancelJobResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext*, const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context, const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::WatchJobEvent>* writer) override;

 private:
  CoordinatorState* state_;
  std::shared_ptr<const Authenticator> auth_;  // Who is calling (the gate already ran).
};

class WorkerControlService final : public v1::WorkerControl::Service {
 public:
  WorkerControlService(CoordinatorState* state, std::shared_ptr<const Authenticator> auth)
      : state_(state), auth_(std::move(auth)) {}

  grpc::Status RegisterWorker(grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status Heartbeat(grpc::ServerContext*, const v1::HeartbeatRequest* request,
                         v1::HeartbeatResponse* response) override;
  grpc::Status DeregisterWorker(grpc::ServerContext*, const v1::DeregisterWorkerRequest* request,
                                v1::DeregisterWorkerResponse* response) override;
  grpc::Status PollAssignments(grpc::ServerContext* context,
                               const v1::PollAssignmentsRequest* request,
                               v1::PollAssignmentsResponse* response) override;
  grpc::Status ReportRankExit(grpc::ServerContext*, const v1::ReportRankExitRequest* request,
                              v1::ReportRankExitResponse* response) override;
  grpc::Status KeyValueSet(grpc::ServerContext*, const v1::KeyValueSetRequest* request,
                           v1::KeyValueSetResponse* response) override;
  grpc::Status KeyValueGet(grpc::ServerContext* context, const v1::KeyValueGetRequest* request,
                           v1::KeyValueGetResponse* response) override;
  grpc::Status ReportTelemetry(grpc::ServerContext*, const v1::ReportTelemetryRequest* request,
                               v1::ReportTelemetryResponse* response) override;
  grpc::Status ReportRankResult(grpc::ServerContext*, const v1::ReportRankResultRequest* request,
                                v1::ReportRankResultResponse* response) override;

 private:
  CoordinatorState* state_;
  std::shared_ptr<const Authenticator> auth_;  // Who is calling (the gate already ran).
};

}  // namespace mptrain
