#pragma once

// The thin gRPC layer, on gRPC's callback (reactor) API: each handler unpacks a request, calls
// CoordinatorState and packs the answer; no decisions are made here. Which roles may call a
// method was decided before the handler runs (TokenAuthProcessor); handlers only pass the
// caller's principal on.
//
// Long calls (PollAssignments, KeyValueGet, WatchJob) hold no thread while they wait: when the
// state has nothing to answer yet they wait in the WaitSet on the key of what they wait for, and
// look again when the state names that key, when their deadline passes, or never (the client
// cancelled). Deadlines and cancellation are handled in one place (LongWait in the .cc).
//
// PollAssignments alone is served on gRPC's asynchronous API, from completion queues of its
// own (WorkerControlService::AddPollQueues): every live worker holds one poll open, and
// Debian's gRPC, built without NDEBUG, walks a completion queue's list of outstanding
// operations at every completion (cq_check_tag). On the callback API all calls share one
// process-wide queue (epoll1 has no background poller: CallbackAlternativeCQ), and at 50,000
// workers that walk took most of a core and registrations stopped converging; split over
// kPollQueues queues each walk is that much shorter, and the other calls' queue holds only
// the calls being answered.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator_state.h"
#include "coordinator/wait_set.h"
#include "grpcpp/server_builder.h"
#include "grpcpp/support/byte_buffer.h"
#include "proto/mptrain.grpc.pb.h"

namespace mptrain {

class AsyncPoll;

// How long a long call may wait at most, whatever the client asks.
inline constexpr int64_t kMaxPollWaitMs = 30'000;
inline constexpr int64_t kMaxKeyValueWaitMs = 600'000;

// How many calls of one kind may be open at once, in all and per holder (a principal, a
// worker, a rank), so that one holder cannot take every place.
struct CallLimits {
  int total = 4'096;
  int per_holder = 512;
};

// WatchJob streams: each holds a snapshot and a queue and is woken by every event of its job.
// Per principal (--max_watches_per_principal).
inline constexpr CallLimits kDefaultWatchLimits{4'096, 512};
// Waiting PollAssignments and KeyValueGet calls: each holds a pending call and a wait. A worker
// has one poll open, a rank one KeyValueGet; a few more cover retries after a reconnect.
inline constexpr CallLimits kDefaultLongPollLimits{16'384, 16};

// The open calls of one kind, counted in all and per holder. Thread-safe.
class CallQuota {
 public:
  // `what` names the calls in errors ("watches"); `per_holder_hint` says how the per-holder
  // bound is set or what to do ("(--max_watches_per_principal): end one first").
  CallQuota(std::string what, CallLimits limits, std::string per_holder_hint)
      : what_(std::move(what)), limits_(limits), hint_(std::move(per_holder_hint)) {}
  // RESOURCE_EXHAUSTED naming the limit reached; OK: one more call of `holder`, until Release.
  absl::Status Acquire(const std::string& holder);
  void Release(const std::string& holder);
  int open() const;

 private:
  const std::string what_;
  const CallLimits limits_;
  const std::string hint_;
  mutable std::mutex mu_;
  int total_ = 0;
  std::map<std::string, int> per_holder_;  // Only holders with open calls.
};

// Unary methods are registered raw (ByteBuffer in, ByteBuffer out): their requests are parsed
// here, so bytes that are no protobuf message of the method's type are answered
// INVALID_ARGUMENT naming the type, not gRPC's own INTERNAL with no message.
using CoordinatorBase = v1::Coordinator::WithRawCallbackMethod_SubmitJob<
    v1::Coordinator::WithRawCallbackMethod_GetJob<v1::Coordinator::WithRawCallbackMethod_ListJobs<
        v1::Coordinator::WithRawCallbackMethod_CancelJob<
            v1::Coordinator::WithRawCallbackMethod_ListWorkers<
                v1::Coordinator::WithRawCallbackMethod_GetJobEvents<
                    v1::Coordinator::WithRawCallbackMethod_GetRankLog<
                        v1::Coordinator::CallbackService>>>>>>>;
// Over the plain Service, not CallbackService: every method is marked one by one, and
// PollAssignments' mark (raw asynchronous) only takes the handler away from a synchronous
// method, not from a callback one (gRPC's RpcServiceMethod::SetServerApiType).
using WorkerControlBase = v1::WorkerControl::WithRawCallbackMethod_RegisterWorker<
    v1::WorkerControl::WithRawCallbackMethod_Heartbeat<
        v1::WorkerControl::WithRawCallbackMethod_DeregisterWorker<
            v1::WorkerControl::WithRawMethod_PollAssignments<  // Asynchronous (see above).
                v1::WorkerControl::WithRawCallbackMethod_ReportRankExit<
                    v1::WorkerControl::WithRawCallbackMethod_KeyValueSet<
                        v1::WorkerControl::WithRawCallbackMethod_KeyValueGet<
                            v1::WorkerControl::WithRawCallbackMethod_ReportTelemetry<
                                v1::WorkerControl::WithRawCallbackMethod_ReportRankResult<
                                    v1::WorkerControl::WithRawCallbackMethod_ReportRankLog<
                                        v1::WorkerControl::Service>>>>>>>>>>;

class CoordinatorService final : public CoordinatorBase {
 public:
  CoordinatorService(CoordinatorState* state, WaitSet* waits,
                     std::shared_ptr<const Authenticator> auth,
                     CallLimits watch_limits = kDefaultWatchLimits)
      : state_(state),
        waits_(waits),
        auth_(std::move(auth)),
        watches_("watches", watch_limits,
                 "(--max_watches_per_principal): end one first") {}

  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetJob(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* request,
                                   grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListJobs(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* CancelJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListWorkers(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetJobEvents(grpc::CallbackServerContext* context,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetRankLog(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<v1::WatchJobEvent>* WatchJob(
      grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) override;

 private:
  CoordinatorState* state_;
  WaitSet* waits_;
  std::shared_ptr<const Authenticator> auth_;  // Who is calling (the gate already ran).
  CallQuota watches_;
};

// PollAssignments' completion queues (see the top of this file).
inline constexpr int kPollQueues = 8;

class WorkerControlService final : public WorkerControlBase {
 public:
  WorkerControlService(CoordinatorState* state, WaitSet* waits,
                       std::shared_ptr<const Authenticator> auth,
                       CallLimits long_poll_limits = kDefaultLongPollLimits)
      : state_(state),
        waits_(waits),
        auth_(std::move(auth)),
        long_polls_("waiting polls and key-value reads", long_poll_limits,
                    ": let one end first") {}
  ~WorkerControlService() override { StopPolls(); }

  // PollAssignments' queues, each with a thread: AddPollQueues on the builder this service is
  // registered with, before BuildAndStart; StartPolls once the server has started; StopPolls
  // after the server's Shutdown and before the server is destroyed (its pending request slots
  // refer to it): it waits up to `drain` for the polls still open to be answered, then shuts
  // the queues down and joins their threads. Later calls do nothing.
  void AddPollQueues(grpc::ServerBuilder* builder, int queues = kPollQueues);
  void StartPolls();
  void StopPolls(std::chrono::milliseconds drain = std::chrono::seconds(5));

  grpc::ServerUnaryReactor* RegisterWorker(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Heartbeat(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeregisterWorker(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportRankExit(grpc::CallbackServerContext* context,
                                           const grpc::ByteBuffer* request,
                                           grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* KeyValueSet(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* KeyValueGet(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportTelemetry(grpc::CallbackServerContext* context,
                                            const grpc::ByteBuffer* request,
                                            grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportRankResult(grpc::CallbackServerContext* context,
                                             const grpc::ByteBuffer* request,
                                             grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ReportRankLog(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;

 private:
  CoordinatorState* state_;
  WaitSet* waits_;
  std::shared_ptr<const Authenticator> auth_;
  // Per worker (its polls) and per rank (its key-value reads).
  CallQuota long_polls_;

  // PollAssignments on the asynchronous API (AsyncPoll in the .cc).
  friend class AsyncPoll;
  void PostPoll(grpc::ServerCompletionQueue* queue);  // One more request slot on `queue`.
  void PollGone(bool started);                        // An AsyncPoll is deleted.
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> poll_queues_;
  std::vector<std::thread> poll_threads_;
  std::atomic<bool> polls_stopping_{false};
  std::mutex polls_mu_;
  std::condition_variable polls_cv_;
  int64_t polls_started_ = 0;  // AsyncPoll objects a call arrived on, not yet deleted.
};

}  // namespace mptrain
