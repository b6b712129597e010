#include "comm/stop_token.h"

#include <cassert>

namespace mptrain {

StopToken::Registration::~Registration() { token_->Unregister(id_); }

StopToken::~StopToken() { assert(callbacks_.empty()); }

void StopToken::RequestStop(const std::string& reason) {
  std::lock_guard<std::mutex> lock(mu_);
  if (stopped_.load(std::memory_order_relaxed)) return;
  reason_ = reason;
  stopped_.store(true, std::memory_order_release);
  // Under the lock: a Registration being destroyed on another thread waits for its callback.
  for (auto& [id, callback] : callbacks_) callback(reason_);
}

std::string StopToken::reason() const {
  std::lock_guard<std::mutex> lock(mu_);
  return reason_;
}

std::unique_ptr<StopToken::Registration> StopToken::OnStop(Callback callback) {
  std::lock_guard<std::mutex> lock(mu_);
  const uint64_t id = next_id_++;
  if (stopped_.load(std::memory_order_relaxed)) {
    callback(reason_);
  } else {
    callbacks_.emplace(id, std::move(callback));
  }
  return std::unique_ptr<Registration>(new Registration(this, id));
}

void StopToken::Unregister(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  callbacks_.erase(id);
}

}  // namespace mptrain
