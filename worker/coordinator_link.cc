#include "worker/coordinator_link.h"

#include <utility>

namespace mptrain {

CoordinatorLink::CoordinatorLink(std::shared_ptr<Stub> stub,
                                 std::function<std::shared_ptr<Stub>()> fresh)
    : fresh_(std::move(fresh)), current_{std::move(stub), 0} {}

CoordinatorLink::Endpoint CoordinatorLink::Current() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_;
}

CoordinatorLink::Endpoint CoordinatorLink::Candidate() {
  std::shared_ptr<Stub> stub = fresh_ ? fresh_() : nullptr;  // Outside the lock: may resolve.
  std::lock_guard<std::mutex> lock(mu_);
  if (stub == nullptr) return current_;
  return Endpoint{std::move(stub), next_generation_++};
}

void CoordinatorLink::Answered(const Endpoint& endpoint) {
  std::lock_guard<std::mutex> lock(mu_);
  // An older one answering late (its retransmissions reached the coordinator after all) does
  // not take the place of the newer one that answered first.
  if (endpoint.stub == nullptr || endpoint.generation <= current_.generation) return;
  current_ = endpoint;
  for (Call* call : calls_) {
    if (call->endpoint_.generation < current_.generation) {
      call->superseded_ = true;
      call->context_->TryCancel();
    }
  }
}

CoordinatorLink::Call::Call(CoordinatorLink* link, grpc::ClientContext* context)
    : link_(link), context_(context) {
  std::lock_guard<std::mutex> lock(link_->mu_);
  endpoint_ = link_->current_;
  link_->calls_.insert(this);
}

CoordinatorLink::Call::~Call() {
  std::lock_guard<std::mutex> lock(link_->mu_);
  link_->calls_.erase(this);
}

bool CoordinatorLink::Call::superseded() const {
  std::lock_guard<std::mutex> lock(link_->mu_);
  return superseded_;
}

}  // namespace mptrain
