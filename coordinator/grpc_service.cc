#include "coordinator/grpc_service.h"

#include <algorithm>
#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "coordinator/advertised_host.h"

namespace mptrain {
namespace {

using Clock = WaitSet::Clock;
using Reason = WaitSet::Reason;

// A watch waits this long between looks at a job that is quiet, then simply waits again.
constexpr auto kWatchRecheck = std::chrono::minutes(10);
// A long call re-evaluated this many times in a row by its own notifications stops and waits.
constexpr int kMaxEvaluationsInARow = 16;

// One unary call's typed messages over the raw buffers gRPC hands the handler (see
// CoordinatorBase in the header).
template <typename Req, typename Resp>
struct Frame {
  Req request;
  Resp response;
  grpc::ByteBuffer* out = nullptr;
  // The status to finish with, the response serialized into the call's buffer when OK.
  grpc::Status Seal(grpc::Status status) {
    if (!status.ok()) return status;
    bool own_buffer = false;
    return grpc::SerializationTraits<Resp>::Serialize(response, out, &own_buffer);
  }
};

// Parses the request and runs `handle(frame)`, which returns the call's reactor; bytes that do
// not parse are answered INVALID_ARGUMENT at once.
template <typename Req, typename Resp, typename Handle>
grpc::ServerUnaryReactor* Dispatch(grpc::CallbackServerContext* context,
                                   const grpc::ByteBuffer* in, grpc::ByteBuffer* out,
                                   Handle handle) {
  auto frame = std::make_shared<Frame<Req, Resp>>();
  frame->out = out;
  grpc::ByteBuffer copy(*in);  // Deserialize consumes its buffer.
  if (!grpc::SerializationTraits<Req>::Deserialize(&copy, &frame->request).ok()) {
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status(
        grpc::StatusCode::INVALID_ARGUMENT,
        absl::StrCat("the request is not a valid ", Req::descriptor()->full_name(),
                     " (its bytes do not parse as that protobuf message)")));
    return reactor;
  }
  // Fields this build does not know (a newer worker's, or padding a hostile caller adds) would
  // be kept and copied — into the job's telemetry history, the worker registry — while meaning
  // nothing here: dropped. A job spec's are refused instead (ValidateJobSpec): a setting the
  // user asked for must not be ignored silently.
  if constexpr (!std::is_same_v<Req, v1::SubmitJobRequest>) frame->request.DiscardUnknownFields();
  // This is one of gRPC's few callback threads: the state's calls record what they would wait
  // for (a store write) and the answer goes out once it is done (AnswerNow, LongCall).
  CoordinatorState::DeferWrites defer;
  return handle(frame);
}

// Finishes with `status` (through `finish`) once what `deferred` waits for is written, and
// wakes its waiters then; at once when there is nothing to wait for.
void FinishAfterWrite(const std::function<void(const grpc::Status&)>& finish,
                      grpc::Status status, CoordinatorState::Deferred deferred) {
  const CoordinatorState* state = deferred.state;
  if (state == nullptr) {
    finish(status);
    return;
  }
  state->AfterWrite(std::move(deferred),
                    [finish, status = std::move(status)] { finish(status); });
}

// The same for `reactor` (alive until its Finish).
void FinishAfterWrite(grpc::ServerUnaryReactor* reactor, grpc::Status status,
                      CoordinatorState::Deferred deferred) {
  FinishAfterWrite([reactor](const grpc::Status& s) { reactor->Finish(s); }, std::move(status),
                   std::move(deferred));
}

// The same for what the calls made so far on this thread changed or showed
// (CoordinatorState::DeferWrites).
void FinishAfterWrite(grpc::ServerUnaryReactor* reactor, grpc::Status status) {
  FinishAfterWrite(reactor, std::move(status), CoordinatorState::TakeDeferred());
}

// Answers at once with `result` (its value into `out` when OK).
template <typename Req, typename Resp, typename T>
grpc::ServerUnaryReactor* AnswerNow(grpc::CallbackServerContext* context,
                                    Frame<Req, Resp>& frame, const absl::StatusOr<T>& result,
                                    T* out) {
  if (result.ok()) *out = *result;
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishAfterWrite(reactor,
                   frame.Seal(result.ok() ? grpc::Status::OK : ToGrpcStatus(result.status())));
  return reactor;
}

template <typename Req, typename Resp>
grpc::ServerUnaryReactor* AnswerNow(grpc::CallbackServerContext* context,
                                    Frame<Req, Resp>& frame, const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  FinishAfterWrite(reactor, frame.Seal(ToGrpcStatus(status)));
  return reactor;
}

// The wait of a long unary call, answered when `attempt` has an answer: at once, after each
// notification of `key`, and at the deadline, when attempt(final = true) must answer; Cancel
// (the client went away) and the wait set's shutdown end it too. `finish` gets the answer once
// (sealed: the response serialized), after what the attempt changed is written. This is the
// one place long unary calls wait, time out and get cancelled, whichever gRPC API serves them.
class LongWait {
 public:
  using Attempt = std::function<std::optional<grpc::Status>(bool final)>;
  // Turns the answer into the status to finish with (serializes the response).
  using Seal = std::function<grpc::Status(const grpc::Status&)>;
  using Finish = std::function<void(const grpc::Status&)>;

  static std::shared_ptr<LongWait> Start(WaitSet* waits, std::string key, int64_t wait_ms,
                                         Attempt attempt, Seal seal, Finish finish) {
    auto wait = std::shared_ptr<LongWait>(new LongWait());
    Core& core = *wait->core_;
    core.finish = std::move(finish);
    core.seal = std::move(seal);
    core.waits = waits;
    core.key = std::move(key);
    core.deadline = Clock::now() + std::chrono::milliseconds(std::max<int64_t>(0, wait_ms));
    core.attempt = std::move(attempt);
    core.Evaluate(wait_ms <= 0);
    return wait;
  }

  void Cancel() { core_->Answer(grpc::Status::CANCELLED); }

 private:
  // Outlives the LongWait while a wait callback may still run.
  struct Core : std::enable_shared_from_this<Core> {
    std::recursive_mutex mu;
    Finish finish;
    WaitSet* waits = nullptr;
    std::string key;
    Clock::time_point deadline;
    Attempt attempt;
    Seal seal;
    bool finished = false;
    bool evaluating = false;
    bool rerun = false;
    bool rerun_final = false;
    uint64_t wait_id = 0;

    void Evaluate(bool final) {
      std::lock_guard<std::recursive_mutex> lock(mu);
      if (finished) return;
      if (evaluating) {  // A notification this very evaluation caused: look once more after.
        rerun = true;
        rerun_final |= final;
        return;
      }
      evaluating = true;
      for (int round = 0; round < kMaxEvaluationsInARow && !finished; ++round) {
        rerun = false;
        if (!final) {
          // Wait first, then look: a change between the two still wakes this call.
          std::shared_ptr<Core> self = shared_from_this();
          wait_id = waits->Wait(key, deadline, [self](Reason reason) { self->OnWake(reason); });
          if (finished) break;  // The wait set is shutting down.
        }
        // What the attempt changed or showed is written before it is answered (and its
        // waiters woken), without this thread waiting for the store.
        std::optional<grpc::Status> answer;
        CoordinatorState::Deferred deferred;
        {
          CoordinatorState::DeferWrites defer;
          answer = attempt(final);
          deferred = defer.Take();
        }
        if (answer.has_value() || final) {
          Answer(answer.value_or(grpc::Status::OK), std::move(deferred));
          break;
        }
        if (const CoordinatorState* state = deferred.state) {
          state->AfterWrite(std::move(deferred), nullptr);
        }
        if (!rerun) break;
        final = rerun_final;
      }
      // Stopped re-evaluating with its last wait consumed: wait again (deadline included).
      if (!finished && wait_id == 0 && !final) {
        std::shared_ptr<Core> self = shared_from_this();
        wait_id = waits->Wait(key, deadline, [self](Reason reason) { self->OnWake(reason); });
      }
      evaluating = false;
    }

    void OnWake(Reason reason) {
      std::lock_guard<std::recursive_mutex> lock(mu);
      if (finished) return;
      wait_id = 0;  // Consumed.
      switch (reason) {
        case Reason::kNotified:
          Evaluate(false);
          break;
        case Reason::kDeadline:
          Evaluate(true);
          break;
        case Reason::kCancelled:
          Answer(grpc::Status::CANCELLED);
          break;
        case Reason::kShutdown:
          Answer(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is stopping"));
          break;
      }
    }

    void Answer(const grpc::Status& status, CoordinatorState::Deferred deferred = {}) {
      // The answer may end the call's owner on another thread at once (its last reference to
      // this Core): this one keeps it until the lock below is released.
      std::shared_ptr<Core> self = shared_from_this();
      std::lock_guard<std::recursive_mutex> lock(mu);
      if (finished) return;
      finished = true;
      if (wait_id != 0) {
        const uint64_t id = wait_id;
        wait_id = 0;
        waits->Cancel(id);  // Its callback sees `finished` and does nothing.
      }
      FinishAfterWrite(finish, status.ok() ? seal(status) : status, std::move(deferred));
    }
  };

  LongWait() : core_(std::make_shared<Core>()) {}
  std::shared_ptr<Core> core_;
};

// A long unary call on the callback API: its LongWait finishes the reactor.
class LongCall final : public grpc::ServerUnaryReactor {
 public:
  // `done` (optional) runs once when gRPC is done with the call, however it ended.
  static grpc::ServerUnaryReactor* Start(WaitSet* waits, std::string key, int64_t wait_ms,
                                         LongWait::Attempt attempt, LongWait::Seal seal,
                                         std::function<void()> done = nullptr) {
    auto* call = new LongCall();
    call->done_ = std::move(done);
    // The reactor lives until OnDone, which comes only after its Finish.
    call->wait_ = LongWait::Start(waits, std::move(key), wait_ms, std::move(attempt),
                                  std::move(seal),
                                  [call](const grpc::Status& status) { call->Finish(status); });
    return call;
  }

  void OnCancel() override { wait_->Cancel(); }
  void OnDone() override {
    if (done_) done_();
    delete this;
  }

 private:
  std::shared_ptr<LongWait> wait_;
  std::function<void()> done_;
};

// WatchJob: the snapshot, then each event in order, one write at a time, until the job's
// terminal state change has been written (or the client goes away).
class WatchCall final : public grpc::ServerWriteReactor<v1::WatchJobEvent> {
 public:
  static grpc::ServerWriteReactor<v1::WatchJobEvent>* Start(CoordinatorState* state,
                                                            WaitSet* waits, CallQuota* quota,
                                                            const JobReader& reader,
                                                            const std::string& job_id) {
    const std::string& principal = reader.principal;
    auto* call = new WatchCall();
    Core& core = *call->core_;
    core.reactor = call;
    core.state = state;
    core.waits = waits;
    core.job_id = job_id;
    // Their number is bounded (RESOURCE_EXHAUSTED past it, until some end).
    if (absl::Status admitted = quota->Acquire(principal); !admitted.ok()) {
      std::lock_guard<std::recursive_mutex> lock(core.mu);
      core.finished = true;
      call->Finish(ToGrpcStatus(admitted));
      return call;
    }
    call->quota_ = quota;
    call->principal_ = principal;
    absl::StatusOr<v1::WatchJobEvent> snapshot;
    CoordinatorState::Deferred deferred;
    {
      CoordinatorState::DeferWrites defer;  // A callback thread: it must not wait for a write.
      snapshot = state->WatchSnapshot(job_id, reader);  // The owner never changes after.
      deferred = defer.Take();
    }
    std::lock_guard<std::recursive_mutex> lock(core.mu);
    if (!snapshot.ok()) {
      core.finished = true;
      call->Finish(ToGrpcStatus(snapshot.status()));
      return call;
    }
    core.last_sequence = snapshot->sequence();
    const v1::JobState job_state = snapshot->snapshot().state();
    core.complete = job_state == v1::SUCCEEDED || job_state == v1::FAILED ||
                    job_state == v1::CANCELLED;
    // Sent once what it shows is written (at once, usually).
    std::shared_ptr<Core> shared = call->core_;
    state->AfterWrite(std::move(deferred), [shared, event = std::move(*snapshot)]() mutable {
      // Possibly on the store writer's thread, which must never take the state's lock (a
      // mutation may hold it, waiting for room in the writer's queue): the write is started
      // here; Pump, which reads the state, runs from OnWriteDone on gRPC's thread.
      std::lock_guard<std::recursive_mutex> lock(shared->mu);
      if (shared->finished) return;
      shared->queue.push_back(std::move(event));
      if (!shared->writing) {
        shared->writing = true;
        shared->reactor->StartWrite(&shared->queue.front());
      }
    });
    return call;
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::recursive_mutex> lock(core_->mu);
    core_->writing = false;
    if (!core_->queue.empty()) core_->queue.pop_front();
    if (!ok) {
      core_->End(grpc::Status::CANCELLED);
      return;
    }
    core_->Pump();
  }
  void OnCancel() override { core_->End(grpc::Status::CANCELLED); }
  void OnDone() override {
    if (quota_ != nullptr) quota_->Release(principal_);
    delete this;
  }

 private:
  struct Core : std::enable_shared_from_this<Core> {
    std::recursive_mutex mu;
    WatchCall* reactor = nullptr;
    CoordinatorState* state = nullptr;
    WaitSet* waits = nullptr;
    std::string job_id;
    std::deque<v1::WatchJobEvent> queue;  // front() is being written while `writing`
    // Events read but not yet in the store: sent once `held_ticket` is written (its writer
    // wakes the job's key then), with `held_complete` taking effect with them.
    std::vector<v1::WatchJobEvent> held;
    uint64_t held_ticket = 0;
    bool held_complete = false;
    int64_t last_sequence = 0;
    bool complete = false;  // The terminal state change is queued or written.
    bool writing = false;
    bool finished = false;
    uint64_t wait_id = 0;

    // Moves the held events to the queue once their write is done; false while it is not.
    bool Release() {
      if (held.empty() && !held_complete) return true;
      if (!state->IsWritten(held_ticket)) return false;
      for (v1::WatchJobEvent& event : held) queue.push_back(std::move(event));
      held.clear();
      complete = held_complete;
      held_complete = false;
      return true;
    }

    // Writes the next event, ends the call, or waits for the job to change (mu held).
    void Pump() {
      if (finished || writing) return;
      Release();
      if (!queue.empty()) {
        writing = true;
        reactor->StartWrite(&queue.front());
        return;
      }
      if (complete) {
        End(grpc::Status::OK);
        return;
      }
      if (wait_id == 0) {
        std::shared_ptr<Core> self = shared_from_this();
        wait_id = waits->Wait(CoordinatorState::JobKey(job_id), Clock::now() + kWatchRecheck,
                              [self](Reason reason) { self->OnWake(reason); });
        if (finished) return;  // The wait set is shutting down: the call just ended.
      }
      Fetch();  // Anything that arrived (or was written) before the wait was registered.
    }

    void Fetch() {
      if (finished) return;
      if (held.empty() && !held_complete) {
        auto batch = state->JobEventsSince(job_id, last_sequence);
        if (!batch.ok()) {
          End(ToGrpcStatus(batch.status()));
          return;
        }
        for (v1::WatchJobEvent& event : batch->events) {
          last_sequence = event.sequence();
          held.push_back(std::move(event));
        }
        held_complete = batch->finished;
        held_ticket = batch->ticket;
      }
      if (!Release()) return;  // The job's key is woken once the write is done.
      if (!queue.empty() && !writing) {
        writing = true;
        reactor->StartWrite(&queue.front());
      } else if (queue.empty() && complete) {
        End(grpc::Status::OK);
      }
    }

    void OnWake(Reason reason) {
      std::lock_guard<std::recursive_mutex> lock(mu);
      if (finished) return;
      wait_id = 0;
      if (reason == Reason::kCancelled) return End(grpc::Status::CANCELLED);
      if (reason == Reason::kShutdown) {
        return End(grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is stopping"));
      }
      Pump();
    }

    void End(const grpc::Status& status) {
      std::lock_guard<std::recursive_mutex> lock(mu);
      if (finished) return;
      finished = true;
      if (wait_id != 0) {
        const uint64_t id = wait_id;
        wait_id = 0;
        waits->Cancel(id);
      }
      reactor->Finish(status);
    }
  };

  WatchCall() : core_(std::make_shared<Core>()) {}
  CallQuota* quota_ = nullptr;  // Set once admitted: OnDone gives the place back.
  std::string principal_;
  std::shared_ptr<Core> core_;
};

// Whose jobs the caller's reads show.
JobReader ReaderOf(const CallerIdentity& caller) {
  return {caller.principal, caller.reads_all_jobs};
}

}  // namespace

absl::Status CallQuota::Acquire(const std::string& holder) {
  std::lock_guard<std::mutex> lock(mu_);
  if (total_ >= limits_.total) {
    return absl::ResourceExhaustedError(absl::StrCat("the coordinator serves at most ",
                                                     limits_.total, " ", what_,
                                                     " at once: try again later"));
  }
  int& mine = per_holder_[holder];
  if (mine >= limits_.per_holder) {
    return absl::ResourceExhaustedError(absl::StrCat(holder, " has ", mine, " ", what_,
                                                     " open, the most one may have", hint_));
  }
  ++mine;
  ++total_;
  return absl::OkStatus();
}

void CallQuota::Release(const std::string& holder) {
  std::lock_guard<std::mutex> lock(mu_);
  --total_;
  auto it = per_holder_.find(holder);
  if (it != per_holder_.end() && --it->second <= 0) per_holder_.erase(it);
}

int CallQuota::open() const {
  std::lock_guard<std::mutex> lock(mu_);
  return total_;
}

// ---- Coordinator ----

using SubmitFrame = Frame<v1::SubmitJobRequest, v1::SubmitJobResponse>;

grpc::ServerUnaryReactor* CoordinatorService::SubmitJob(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return Dispatch<v1::SubmitJobRequest, v1::SubmitJobResponse>(
      context, request, response, [&](std::shared_ptr<SubmitFrame> frame) {
        const CallerIdentity caller = auth_->Identify(*context);
        return AnswerNow(context, *frame,
                         state_->SubmitJob(frame->request, caller.principal, caller.admin),
                         &frame->response);
      });
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const grpc::ByteBuffer* request,
                                                     grpc::ByteBuffer* response) {
  return Dispatch<v1::GetJobRequest, v1::GetJobResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame,
                         state_->GetJob(frame->request.job_id(), CoordinatorState::View::kWritten,
                                        ReaderOf(auth_->Identify(*context))),
                         frame->response.mutable_job());
      });
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* context,
                                                       const grpc::ByteBuffer* request,
                                                       grpc::ByteBuffer* response) {
  return Dispatch<v1::ListJobsRequest, v1::ListJobsResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame,
                         state_->ListJobs(frame->request, CoordinatorState::View::kWritten,
                                          ReaderOf(auth_->Identify(*context))),
                         &frame->response);
      });
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const grpc::ByteBuffer* request,
                                                        grpc::ByteBuffer* response) {
  return Dispatch<v1::CancelJobRequest, v1::CancelJobResponse>(
      context, request, response, [&](auto frame) {
        const CallerIdentity caller = auth_->Identify(*context);
        auto state =
            state_->CancelJob(frame->request.job_id(), caller.principal, caller.admin);
        if (state.ok()) frame->response.set_state(*state);
        return AnswerNow(context, *frame, state.status());
      });
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Dispatch<v1::ListWorkersRequest, v1::ListWorkersResponse>(
      context, request, response, [&](auto frame) {
        for (v1::Worker& worker : state_->ListWorkers()) {
          *frame->response.add_workers() = std::move(worker);
        }
        state_->DescribeRefusals(&frame->response);
        return AnswerNow(context, *frame, absl::OkStatus());
      });
}

grpc::ServerUnaryReactor* CoordinatorService::GetJobEvents(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Dispatch<v1::GetJobEventsRequest, v1::GetJobEventsResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame,
                         state_->GetJobEvents(frame->request, CoordinatorState::View::kWritten,
                                              ReaderOf(auth_->Identify(*context))),
                         &frame->response);
      });
}

grpc::ServerUnaryReactor* CoordinatorService::GetRankLog(grpc::CallbackServerContext* context,
                                                         const grpc::ByteBuffer* request,
                                                         grpc::ByteBuffer* response) {
  return Dispatch<v1::GetRankLogRequest, v1::GetRankLogResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame,
                         state_->GetRankLog(frame->request, ReaderOf(auth_->Identify(*context))),
                         &frame->response);
      });
}

grpc::ServerWriteReactor<v1::WatchJobEvent>* CoordinatorService::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  return WatchCall::Start(state_, waits_, &watches_, ReaderOf(auth_->Identify(*context)),
                          request->job_id());
}

// ---- WorkerControl ----

grpc::ServerUnaryReactor* WorkerControlService::RegisterWorker(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Dispatch<v1::RegisterWorkerRequest, v1::RegisterWorkerResponse>(
      context, request, response, [&](auto frame) {
        if (absl::Status status = CheckAdvertisedHost(frame->request.host(), context->peer());
            !status.ok()) {
          return AnswerNow(context, *frame, status);
        }
        // The name the registry will use (NameOfId's part before "#N").
        const std::string& name =
            frame->request.name().empty() ? frame->request.host() : frame->request.name();
        if (absl::Status status = auth_->CheckWorkerCaller(*context, name); !status.ok()) {
          return AnswerNow(context, *frame, status);
        }
        absl::StatusOr<v1::RegisterWorkerResponse> registered =
            state_->RegisterWorker(frame->request, auth_->Identify(*context).principal);
        // A refusal for capacity says when to ask again; the daemon backs off from it.
        if (const int64_t retry_after_ms = WorkerRegistry::RetryAfterOf(registered.status());
            retry_after_ms > 0) {
          context->AddTrailingMetadata(kRetryAfterMetadataKey, absl::StrCat(retry_after_ms));
        }
        return AnswerNow(context, *frame, registered, &frame->response);
      });
}

grpc::ServerUnaryReactor* WorkerControlService::Heartbeat(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request,
                                                          grpc::ByteBuffer* response) {
  return Dispatch<v1::HeartbeatRequest, v1::HeartbeatResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame, state_->Heartbeat(frame->request));
      });
}

grpc::ServerUnaryReactor* WorkerControlService::DeregisterWorker(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Dispatch<v1::DeregisterWorkerRequest, v1::DeregisterWorkerResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame, state_->DeregisterWorker(frame->request));
      });
}

// One PollAssignments call on the asynchronous API, from its request slot to its end. Its
// three tags come back on its own queue's thread, one at a time: kArrived (a call took the
// slot: ok = false when the server shuts down first), kDone (gRPC is done with the call, or the
// client cancelled it: AsyncNotifyWhenDone) and kFinished (the answer went out). The answer
// itself may be sent from another thread (the wait set's, the store writer's). It is deleted
// once kDone and kFinished both came, or at kArrived with ok = false (a slot never taken gets
// no kDone).
class AsyncPoll {
 public:
  AsyncPoll(WorkerControlService* service, grpc::ServerCompletionQueue* queue)
      : service_(service), queue_(queue), responder_(&context_) {
    frame_->out = &response_bytes_;
  }

  void Post() {
    context_.AsyncNotifyWhenDone(&done_tag_);
    service_->RequestPollAssignments(&context_, &request_bytes_, &responder_, queue_, queue_,
                                     &arrived_tag_);
  }

  struct Tag {
    enum Kind { kArrived, kDone, kFinished };
    AsyncPoll* poll;
    Kind kind;
  };

  // On the queue's thread.
  void Proceed(Tag::Kind kind, bool ok) {
    switch (kind) {
      case Tag::kArrived:
        if (!ok) {
          Delete(/*started=*/false);
          return;
        }
        started_ = true;
        {
          std::lock_guard<std::mutex> lock(service_->polls_mu_);
          ++service_->polls_started_;
        }
        if (!service_->polls_stopping_.load()) service_->PostPoll(queue_);
        Arrived();
        break;
      case Tag::kDone: {
        done_ = true;
        std::shared_ptr<LongWait> wait;
        {
          std::lock_guard<std::mutex> lock(mu_);
          wait = wait_;
        }
        if (context_.IsCancelled() && wait != nullptr) wait->Cancel();
        break;
      }
      case Tag::kFinished:
        finished_ = true;
        break;
    }
    if (done_ && finished_) Delete(/*started=*/true);
  }

 private:
  void Arrived() {
    v1::PollAssignmentsRequest& request = frame_->request;
    grpc::ByteBuffer copy(request_bytes_);  // Deserialize consumes its buffer.
    if (!grpc::SerializationTraits<v1::PollAssignmentsRequest>::Deserialize(&copy, &request)
             .ok()) {
      Send(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "the request is not a valid mptrain.v1.PollAssignmentsRequest (its bytes "
                        "do not parse as that protobuf message)"));
      return;
    }
    request.DiscardUnknownFields();  // As Dispatch does for every other method.
    CoordinatorState::DeferWrites defer;  // This thread does not wait for the store.
    const int64_t wait_ms = std::clamp<int64_t>(request.wait_ms(), 0, kMaxPollWaitMs);
    if (absl::Status caller =
            service_->state_->CheckWorkerCaller(request.worker_id(), request.worker_secret());
        !caller.ok()) {
      SendAfterWrite(ToGrpcStatus(caller));
      return;
    }
    holder_ = absl::StrCat("worker ", TruncateForError(request.worker_id(), 128));
    if (absl::Status admitted = service_->long_polls_.Acquire(holder_); !admitted.ok()) {
      holder_.clear();
      SendAfterWrite(ToGrpcStatus(admitted));
      return;
    }
    std::shared_ptr<Frame<v1::PollAssignmentsRequest, v1::PollAssignmentsResponse>> frame =
        frame_;
    CoordinatorState* state = service_->state_;
    std::shared_ptr<LongWait> wait = LongWait::Start(
        service_->waits_, CoordinatorState::WorkerKey(request.worker_id()), wait_ms,
        [state, frame](bool final) -> std::optional<grpc::Status> {
          auto result = state->PollAssignments(frame->request);
          if (!result.ok()) return ToGrpcStatus(result.status());
          if (result->start_size() == 0 && result->stop_size() == 0 && !final) {
            return std::nullopt;
          }
          frame->response = std::move(*result);
          return grpc::Status::OK;
        },
        [frame](const grpc::Status& status) { return frame->Seal(status); },
        [this](const grpc::Status& status) { Send(status); });
    std::lock_guard<std::mutex> lock(mu_);
    if (!sent_) wait_ = std::move(wait);
  }

  void SendAfterWrite(grpc::Status status) {
    FinishAfterWrite([this](const grpc::Status& s) { Send(s); }, std::move(status),
                     CoordinatorState::TakeDeferred());
  }

  // Once, from any thread; the object stays until kFinished (and kDone) come back.
  void Send(const grpc::Status& status) {
    std::lock_guard<std::mutex> lock(mu_);
    if (sent_) return;
    sent_ = true;
    if (status.ok()) {
      responder_.Finish(response_bytes_, status, &finished_tag_);  // Sealed into it.
    } else {
      responder_.FinishWithError(status, &finished_tag_);
    }
  }

  void Delete(bool started) {
    // The answer's sender (another thread) may still be leaving Send when kFinished comes.
    { std::lock_guard<std::mutex> lock(mu_); }
    if (!holder_.empty()) service_->long_polls_.Release(holder_);
    WorkerControlService* service = service_;
    delete this;
    service->PollGone(started);
  }

  WorkerControlService* const service_;
  grpc::ServerCompletionQueue* const queue_;
  grpc::ServerContext context_;
  grpc::ByteBuffer request_bytes_;
  grpc::ByteBuffer response_bytes_;
  grpc::ServerAsyncResponseWriter<grpc::ByteBuffer> responder_;
  std::shared_ptr<Frame<v1::PollAssignmentsRequest, v1::PollAssignmentsResponse>> frame_ =
      std::make_shared<Frame<v1::PollAssignmentsRequest, v1::PollAssignmentsResponse>>();
  Tag arrived_tag_{this, Tag::kArrived};
  Tag done_tag_{this, Tag::kDone};
  Tag finished_tag_{this, Tag::kFinished};
  std::string holder_;  // Whose place in long_polls_ this holds (empty: none).
  // Only the queue's thread touches these.
  bool started_ = false;
  bool done_ = false;
  bool finished_ = false;
  // Guards the answer, which any thread may send.
  std::mutex mu_;
  bool sent_ = false;
  std::shared_ptr<LongWait> wait_;
};

void WorkerControlService::AddPollQueues(grpc::ServerBuilder* builder, int queues) {
  for (int i = 0; i < queues; ++i) poll_queues_.push_back(builder->AddCompletionQueue());
}

void WorkerControlService::PostPoll(grpc::ServerCompletionQueue* queue) {
  (new AsyncPoll(this, queue))->Post();
}

void WorkerControlService::PollGone(bool started) {
  if (!started) return;
  std::lock_guard<std::mutex> lock(polls_mu_);
  --polls_started_;
  polls_cv_.notify_all();
}

void WorkerControlService::StartPolls() {
  // A few request slots per queue, so that a burst of polls (every worker after a restart)
  // does not wait for one slot at a time to be posted again.
  constexpr int kSlotsPerQueue = 16;
  for (const auto& queue : poll_queues_) {
    for (int i = 0; i < kSlotsPerQueue; ++i) PostPoll(queue.get());
    poll_threads_.emplace_back([queue = queue.get()] {
      void* tag = nullptr;
      bool ok = false;
      while (queue->Next(&tag, &ok)) {
        auto* t = static_cast<AsyncPoll::Tag*>(tag);
        t->poll->Proceed(t->kind, ok);
      }
    });
  }
}

void WorkerControlService::StopPolls(std::chrono::milliseconds drain) {
  if (poll_queues_.empty() || polls_stopping_.exchange(true)) return;
  {
    // Calls still open (the server's shutdown cancelled them) finish first: an answer sent on
    // a queue already shut down would be gRPC's assertion.
    std::unique_lock<std::mutex> lock(polls_mu_);
    polls_cv_.wait_for(lock, drain, [this] { return polls_started_ == 0; });
  }
  for (const auto& queue : poll_queues_) queue->Shutdown();
  for (std::thread& thread : poll_threads_) thread.join();
  if (poll_threads_.empty()) {  // Never started: drained here (a queue must be, to go).
    for (const auto& queue : poll_queues_) {
      void* tag = nullptr;
      bool ok = false;
      while (queue->Next(&tag, &ok)) {
      }
    }
  }
  poll_threads_.clear();
}

grpc::ServerUnaryReactor* WorkerControlService::ReportRankExit(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Dispatch<v1::ReportRankExitRequest, v1::ReportRankExitResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame, state_->ReportRankExit(frame->request));
      });
}

grpc::ServerUnaryReactor* WorkerControlService::KeyValueSet(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return Dispatch<v1::KeyValueSetRequest, v1::KeyValueSetResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame, state_->KeyValueSet(frame->request));
      });
}

grpc::ServerUnaryReactor* WorkerControlService::KeyValueGet(grpc::CallbackServerContext* context,
                                                            const grpc::ByteBuffer* request,
                                                            grpc::ByteBuffer* response) {
  return Dispatch<v1::KeyValueGetRequest, v1::KeyValueGetResponse>(
      context, request, response, [&](auto frame) {
        const int64_t wait_ms =
            std::clamp<int64_t>(frame->request.timeout_ms(), 0, kMaxKeyValueWaitMs);
        if (absl::Status caller = state_->CheckRankCaller(
                frame->request.job_id(), frame->request.attempt(), frame->request.rank(),
                frame->request.rank_secret());
            !caller.ok()) {
          return AnswerNow(context, *frame, caller);
        }
        std::string holder =
            absl::StrCat("rank ", frame->request.rank(), " of job ",
                         TruncateForError(frame->request.job_id(), 128), " attempt ",
                         frame->request.attempt());
        if (absl::Status admitted = long_polls_.Acquire(holder); !admitted.ok()) {
          return AnswerNow(context, *frame, admitted);
        }
        return LongCall::Start(
            waits_, CoordinatorState::JobKey(frame->request.job_id()), wait_ms,
            [this, frame, held = std::optional<uint64_t>()](
                bool final) mutable -> std::optional<grpc::Status> {
              auto read = state_->KeyValueGet(frame->request);
              if (!read.ok()) return ToGrpcStatus(read.status());
              // Handed out once written (the write's caller wakes the job's key then); a key
              // is set once per attempt, so a value seen earlier is held meanwhile.
              if (read->value.has_value() && !held.has_value()) {
                frame->response.set_value(*read->value);
                held = read->ticket;
              }
              if (held.has_value()) {
                if (state_->IsWritten(*held)) return grpc::Status::OK;
                if (!final) return std::nullopt;
                // Its deadline came while the value was being written (this runs on the wait
                // set's thread, which must not wait for the store).
                return ToGrpcStatus(absl::DeadlineExceededError(absl::StrCat(
                    "key ", TruncateForError(frame->request.key(), 128), " of job ",
                    TruncateForError(frame->request.job_id(), 128),
                    " was still being written at the end of its ", frame->request.timeout_ms(),
                    " ms")));
              }
              if (!final) return std::nullopt;
              return ToGrpcStatus(absl::DeadlineExceededError(absl::StrCat(
                  "key ", TruncateForError(frame->request.key(), 128), " of job ",
                  TruncateForError(frame->request.job_id(), 128), " not set within ",
                  frame->request.timeout_ms(), " ms")));
            },
            [frame](const grpc::Status& status) { return frame->Seal(status); },
            [this, holder = std::move(holder)] { long_polls_.Release(holder); });
      });
}

grpc::ServerUnaryReactor* WorkerControlService::ReportTelemetry(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Dispatch<v1::ReportTelemetryRequest, v1::ReportTelemetryResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame, state_->ReportTelemetry(frame->request),
                         &frame->response);
      });
}

grpc::ServerUnaryReactor* WorkerControlService::ReportRankResult(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Dispatch<v1::ReportRankResultRequest, v1::ReportRankResultResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame, state_->ReportRankResult(frame->request));
      });
}

grpc::ServerUnaryReactor* WorkerControlService::ReportRankLog(
    grpc::CallbackServerContext* context, const grpc::ByteBuffer* request,
    grpc::ByteBuffer* response) {
  return Dispatch<v1::ReportRankLogRequest, v1::ReportRankLogResponse>(
      context, request, response, [&](auto frame) {
        return AnswerNow(context, *frame, state_->ReportRankLog(frame->request));
      });
}

}  // namespace mptrain
