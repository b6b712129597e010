#include "worker/self_fence.h"

namespace mptrain {

SelfFence::SelfFence(int64_t fence_after_ms, int64_t now_ms)
    : enabled_(fence_after_ms > 0), fence_after_ms_(fence_after_ms), last_contact_ms_(now_ms) {}

void SelfFence::UseCoordinatorTimeout(int64_t fence_after_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (enabled_ && fence_after_ms > 0) fence_after_ms_ = fence_after_ms;
}

int64_t SelfFence::fence_after_ms() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fence_after_ms_;
}

bool SelfFence::enabled() const { return enabled_; }

int64_t SelfFence::OnContact(int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t silent_ms = now_ms - last_contact_ms_;
  const bool was_fenced = fenced_;
  // A contact never moves the clock back (answers of calls made in parallel may land late).
  if (now_ms > last_contact_ms_) last_contact_ms_ = now_ms;
  fenced_ = false;
  return was_fenced ? silent_ms : 0;
}

bool SelfFence::ShouldFence(int64_t now_ms) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!enabled_ || fenced_ || now_ms - last_contact_ms_ < fence_after_ms_) return false;
  fenced_ = true;
  return true;
}

int64_t SelfFence::SilentMs(int64_t now_ms) const {
  std::lock_guard<std::mutex> lock(mu_);
  return now_ms - last_contact_ms_;
}

}  // namespace mptrain
