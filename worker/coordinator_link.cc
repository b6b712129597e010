#include "worker/coordinator_link.h"

#include <utility>

namespace mptrain {

CoordinatorLink::CoordinatorLink(std::shared_ptr<Stub> stub,
                                 std::function<std::shared_ptr<Stub>()> fresh)
    : fresh_(std::move(fresh)), current_{std::move(stub), 0, 0} {}

CoordinatorLink::Endpoint CoordinatorLink::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

CoordinatorLink::Endpoint CoordinatorLink::Candidate() {
  std::shared_ptr<Stub> stub = fresh_ ? fresh_() : nullptr;  // Outside the lock: may resolve.
  std::lock_guard<std::mutex> lock(mu_);
  if (stub == nullptr) return current_;
  return Endpoint{std::move(stub), next_generation_++, current_answers_};
}

bool CoordinatorLink::IsAnswer(const grpc::Status& status) {
  switch (status.error_code()) {
    case grpc::StatusCode::UNAVAILABLE:
    case grpc::StatusCode::DEADLINE_EXCEEDED:
    case grpc::StatusCode::CANCELLED:
    case grpc::StatusCode::UNKNOWN:
      return false;
    default:
      return true;
  }
}

void CoordinatorLink::Answered(const Endpoint& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  if (endpoint.stub == nullptr) return;
  if (endpoint.generation == current_.generation) {
    ++current_answers_;
    return;
  }
  // An older one answering late does not take the place of a newer one; nor does a candidate
  // made before the connection in use last answered (it works: a late answer on it was a
  // slow coordinator, or another candidate already replaced it).
  if (endpoint.generation < current_.generation || endpoint.answers_seen < current_answers_) {
    return;
  }
  current_ = endpoint;
  ++current_answers_;  // This answer (a count over every connection in use: never reset).
  for (Call* call : calls_) {
    if (call->endpoint_.generation < current_.generation) {
      call->superseded_ = true;
      call->context_.TryCancel();
    }
  }
}

grpc::Status CoordinatorLink::Send(
    std::chrono::milliseconds timeout,
    const std::function<grpc::Status(Stub*, grpc::ClientContext*)>& invoke) {
  grpc::Status status;
  for (int sends = 0; sends < kMaxSends; ++sends) {
    Call call(this, std::chrono::system_clock::now() + timeout);
    status = invoke(call.operator->(), call.context());
    if (!call.SendAgain(status)) break;
  }
  return status;
}

CoordinatorLink::Call::Call(CoordinatorLink* link, std::chrono::system_clock::time_point deadline)
    : link_(link) {
  context_.set_deadline(deadline);
  std::lock_guard<std::mutex> lock(link_->mu_);
  endpoint_ = link_->current_;
  link_->calls_.insert(this);
}

CoordinatorLink::Call::~Call() {
  std::lock_guard<std::mutex> lock(link_->mu_);
  link_->calls_.erase(this);
}

bool CoordinatorLink::Call::SendAgain(const grpc::Status& status) {
  if (IsAnswer(status)) {
    link_->Answered(endpoint_);
    return false;  // Answered (even if superseded meanwhile): nothing to send again.
  }
  std::lock_guard<std::mutex> lock(link_->mu_);
  return superseded_;
}

}  // namespace mptrain
