#pragma once

// Self-fencing: a worker cut off from the coordinator stops its ranks once the coordinator
// would have declared it lost (the heartbeat timeout), so that no rank of an attempt the
// coordinator has failed — and may already run again elsewhere — trains on. Only a full
// timeout of continuous silence fences: a coordinator that restarts and answers again sooner
// finds the ranks still running and re-adopts them.
//
// The decision only; the clock is the caller's (milliseconds on a steady clock), so tests drive
// it without waiting. Thread-safe.

#include <cstdint>
#include <mutex>

namespace mptrain {

class SelfFence {
 public:
  // fence_after_ms <= 0 disables fencing. The silence is counted from `now_ms`.
  SelfFence(int64_t fence_after_ms, int64_t now_ms);

  // The coordinator's own heartbeat timeout, when it says (RegisterWorkerResponse); ignored
  // when fencing is disabled or `fence_after_ms` <= 0.
  void UseCoordinatorTimeout(int64_t fence_after_ms);
  int64_t fence_after_ms() const;
  bool enabled() const;

  // A successful heartbeat, poll or registration: the silence ends. Returns how long it had
  // lasted when it had led to fencing (so the caller can say so), 0 otherwise.
  int64_t OnContact(int64_t now_ms);

  // True once per silence, when it has lasted fence_after_ms: stop the ranks now.
  bool ShouldFence(int64_t now_ms);

  int64_t SilentMs(int64_t now_ms) const;

 private:
  mutable std::mutex mu_;
  const bool enabled_;
  int64_t fence_after_ms_;
  int64_t last_contact_ms_;
  bool fenced_ = false;  // In the current silence.
};

}  // namespace mptrain
