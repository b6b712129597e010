#pragma once

// The worker daemon's connection to the coordinator, shared by every call it makes.
//
// After a network outage the connection in use may have backed off its TCP retransmissions
// for about as long as the outage lasted: its calls (a rank's exit report, the long poll) then
// get through seconds after the link is back, too late for the coordinator, which names the
// cause of a job's failure only within a bounded wait. So, while the coordinator is silent, the
// heartbeat loop tries candidate connections of their own (Candidate); the first newer one
// answered replaces the connection in use (Answered), and the calls still waiting on an older
// one are cancelled: their callers see Call::SendAgain() and send them at once on the new one.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>

#include <grpcpp/grpcpp.h>

#include "proto/mptrain.grpc.pb.h"

namespace mptrain {

class CoordinatorLink {
 public:
  using Stub = v1::WorkerControl::StubInterface;

  // A stub and its age: a higher generation was made later.
  struct Endpoint {
    std::shared_ptr<Stub> stub;
    uint64_t generation = 0;
    uint64_t answers_seen = 0;  // Answers on the connection in use when this one was made.
  };

  // `fresh` makes a stub on a connection of its own (may be null: no candidates, the first
  // stub is used for ever; a call to it may return null on failure).
  CoordinatorLink(std::shared_ptr<Stub> stub, std::function<std::shared_ptr<Stub>()> fresh);

  // The connection in use.
  Endpoint Current() const;

  // A new candidate connection, or the one in use when none can be made.
  Endpoint Candidate();

  // The coordinator answered a call on `endpoint` (any answer it produced, an error included:
  // the connection works). A candidate replaces the connection in use if it is newer and the
  // one in use has not answered since the candidate was made (a slow coordinator answering
  // late on it is no reason to move); calls waiting on older ones are then cancelled.
  // Callable from any thread.
  void Answered(const Endpoint& endpoint);

  // Whether a status is the coordinator's answer, not the transport's or a deadline's.
  static bool IsAnswer(const grpc::Status& status);

  // A call superseded this many times in a row (a newer connection answered each time) is given
  // up on as unanswered: each resend waits for a new connection at most once an interval, but a
  // link that keeps being replaced must not hold its caller (the reaper) for ever.
  static constexpr int kMaxSends = 5;

  // One blocking unary call, `invoke(stub, context)`, within `timeout`, sent again on the newer
  // connection while one replaces its own before it is answered (kMaxSends in all).
  grpc::Status Send(std::chrono::milliseconds timeout,
                    const std::function<grpc::Status(Stub*, grpc::ClientContext*)>& invoke);

  // One blocking call on the connection in use, with its context; the link can cancel it.
  class Call {
   public:
    Call(CoordinatorLink* link, std::chrono::system_clock::time_point deadline);
    ~Call();
    Call(const Call&) = delete;
    Call& operator=(const Call&) = delete;

    Stub* operator->() const { return endpoint_.stub.get(); }
    grpc::ClientContext* context() { return &context_; }
    const Endpoint& endpoint() const { return endpoint_; }
    // Called once the call ended with `status`: a coordinator's answer counts for this
    // call's connection (it works: a candidate made before is not needed). True when it was
    // not answered because a newer connection replaced its own: send it again, on that one.
    bool SendAgain(const grpc::Status& status);

   private:
    friend class CoordinatorLink;
    CoordinatorLink* link_;
    grpc::ClientContext context_;
    Endpoint endpoint_;
    bool superseded_ = false;  // Guarded by link_->mu_.
  };

 private:
  std::function<std::shared_ptr<Stub>()> fresh_;
  mutable std::mutex mu_;
  Endpoint current_;
  // Answers on the connection in use, whichever it was at the time: a candidate made when
  // this was N is not needed once it is more.
  uint64_t current_answers_ = 0;
  uint64_t next_generation_ = 1;
  std::set<Call*> calls_;
};

}  // namespace mptrain
