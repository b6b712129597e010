#pragma once

// The thin gRPC layer, on gRPC's callback (reactor) API: each handler unpacks a request, calls
// CoordinatorState and packs the answer; no decisions are made here. Which roles may call a
// method was decided before the handler runs (TokenAuthProcessor); handlers only pass the
// caller's principal on.
//
// Long calls (PollAssignments, KeyValueGet, WatchJob) hold no thread while they wait: when the
// state has nothing to answer yet they wait in the WaitSet on the key of what they wait for, and
// look again when the state names that key, when their deadline passes, or never (the client
// cancelled). Deadlines and cancellation are handled in one place (LongCall in the .cc).

#include <memory>

#include "coordinator/auth.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/wait_set.h"
#include "proto/mptrain.grpc.pb.h"

namespace mptrain {

// How long a long call may wait at most, whatever the client asks.
inline constexpr int64_t kMaxPollWaitMs = 30'000;
inline constexpr int64_t kMaxKeyValueWaitMs = 600'000;

class CoordinatorService final : public v1::Coordinator::CallbackService {
 public:
  CoordinatorService(CoordinatorState* state, WaitSet* waits,
                     std::shared_ptr<const Authenticator> auth)
      : state_(state), waits_(waits), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const v1::GetJobRequest* request,
                                   v1::GetJobResponse* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const v1::ListJobsRequest* request,
                                     v1::ListJobsResponse* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const v1::CancelJobRequest* request,
                                      v1::CancelJobResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const v1::ListWorkersRequest* request,
                                        v1::ListWorkersResponse* response) override;
  grpc::ServerWriteReactor<v1::WatchJobEvent>* WatchJob(
      grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) override;

 private:
  CoordinatorState* state_;
  WaitSet* waits_;
  std::shared_ptr<const Authenticator> auth_;  // Who is calling (the gate already ran).
};

class WorkerControlService final : public v1::WorkerControl::CallbackService {
 public:
  WorkerControlService(CoordinatorState* state, WaitSet* waits,
                       std::shared_ptr<const Authenticator> auth)
      : state_(state), waits_(waits), auth_(std::move(auth)) {}

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const v1::RegisterWorkerRequest* request,
                                           v1::RegisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const v1::HeartbeatRequest* request,
                                      v1::HeartbeatResponse* response) override;
  grpc::ServerUnaryReactor* DeregisterWorker(grpc::CallbackServerContext* context,
                                             const v1::DeregisterWorkerRequest* request,
                                             v1::DeregisterWorkerResponse* response) override;
  grpc::ServerUnaryReactor* PollAssignments(grpc::CallbackServerContext* context,
                                            const v1::PollAssignmentsRequest* request,
                                            v1::PollAssignmentsResponse* response) override;
  grpc::ServerUnaryReactor* ReportRankExit(grpc::CallbackServerContext* context,
                                           const v1::ReportRankExitRequest* request,
                                           v1::ReportRankExitResponse* response) override;
  grpc::ServerUnaryReactor* KeyValueSet(grpc::CallbackServerContext* context,
                                        const v1::KeyValueSetRequest* request,
                                        v1::KeyValueSetResponse* response) override;
  grpc::ServerUnaryReactor* KeyValueGet(grpc::CallbackServerContext* context,
                                        const v1::KeyValueGetRequest* request,
                                        v1::KeyValueGetResponse* response) override;
  grpc::ServerUnaryReactor* ReportTelemetry(grpc::CallbackServerContext* context,
                                            const v1::ReportTelemetryRequest* request,
                                            v1::ReportTelemetryResponse* response) override;
  grpc::ServerUnaryReactor* ReportRankResult(grpc::CallbackServerContext* context,
                                             const v1::ReportRankResultRequest* request,
                                             v1::ReportRankResultResponse* response) override;

 private:
  CoordinatorState* state_;
  WaitSet* waits_;
  std::shared_ptr<const Authenticator> auth_;
};

}  // namespace mptrain
